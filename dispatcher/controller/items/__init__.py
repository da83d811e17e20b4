"""The wrapped objects: shaped before creation (names, owner references, labels,
the scheduling gate), created, adopted and removed, and scaled for elastic gangs.
"""
