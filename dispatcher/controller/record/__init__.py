"""What the controller knows of each AppWrapper and what it owes the API: the
tracked record and the memory of the cluster, attention (who a cycle looks at),
ownership proofs, quota trees fed to admission, holds, the one status writer,
queue positions, the API steps under way and the observer hooks.
"""
