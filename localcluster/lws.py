"""The LeaderWorkerSet controller as a local process (url_webhooks.py): its mutating
webhooks default every LeaderWorkerSet and label its pods (leader, worker index), which its
controller reads to make each group's workers."""

from __future__ import annotations

from .url_webhooks import WebhookedOperator

LWS = WebhookedOperator(
    name="lws-controller", wrapper="lws", module="sigs.k8s.io/lws",
    config_api_version="config.lws.x-k8s.io/v1alpha1",
    webhook_dir="config/webhook", patches_dir="", name_prefix="lws-")
