"""`dispatcher run --manager`: one queue, gangs sent whole to worker clusters;
the pass, the workers' look and quota, the copies, heartbeats and metrics.
"""
