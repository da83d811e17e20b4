"""The Kubernetes API as the controller speaks it: the REST client and its pacing,
kubeconfigs, informers (list, watch, resume, relist), the leader Lease and the
leader's pod label, start-up and stop, what an API error means in words, the log format.
"""
