"""Pods onto the room their gang holds: pod events into memory, placement by
lifting gates or by the pod webhook, and pods left past their grace deleted.
"""
