"""The read-only web view of the queue: what the loop knows gathered (facts),
shaped for the page (view, pure), and served behind Kubernetes tokens (api).
"""
