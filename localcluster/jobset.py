"""The JobSet controller as a local process (url_webhooks.py): its mutating webhook
defaults every JobSet (success policy, startup policy, network)."""

from __future__ import annotations

from .url_webhooks import WebhookedOperator

JOBSET = WebhookedOperator(
    name="jobset-controller", wrapper="jobset", module="sigs.k8s.io/jobset",
    config_api_version="config.jobset.x-k8s.io/v1alpha1",
    webhook_dir="config/components/webhook", patches_dir="patches", name_prefix="jobset-")
