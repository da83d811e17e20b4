"""Ordering and policies of the admission queue."""

from dispatcher.queue.policy import Policy, PolicyError, policy_from_mapping
from dispatcher.queue.queue import AdmissionQueue, QueuedWrapper, WrapperKey

__all__ = [
    "AdmissionQueue",
    "Policy",
    "PolicyError",
    "QueuedWrapper",
    "WrapperKey",
    "policy_from_mapping",
]
