"""`dispatcher run --manager`: one queue, gangs sent whole to worker clusters;
the pass, the WorkerClusters' links and status, the workers' look and quota, the copies,
heartbeats and metrics.
"""
