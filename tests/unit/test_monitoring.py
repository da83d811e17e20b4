"""deploy/'s Grafana dashboard and Prometheus alerts: they parse, ask only for series the
dispatcher exports, and every alert is explained in docs/operations.md."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dispatcher.controller.metrics.prometheus import PrometheusObserver

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "dispatcher-dashboard.json"
MONITORING = REPO / "deploy" / "components" / "monitoring"
RULES = MONITORING / "prometheusrule.yaml"
METRIC = re.compile(r"\bdispatcher_[a-z_]+")


def series() -> set[str]:
    """Every series name the dispatcher's /metrics can have: counters with _total,
    histograms with _bucket, _sum and _count."""
    out = set()
    for f in text_string_to_metric_families(generate_latest(PrometheusObserver().registry)
                                            .decode()):
        if f.type == "counter":
            out.add(f"{f.name}_total")
        elif f.type == "histogram":
            out |= {f"{f.name}_{s}" for s in ("bucket", "sum", "count")}
        else:
            out.add(f.name)
    return out


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["kind"] == "PrometheusRule"
    return [r for group in doc["spec"]["groups"] for r in group["rules"]]


def test_the_dashboard_parses_and_asks_only_for_exported_series() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    used = set(METRIC.findall(json.dumps(dashboard["panels"])))
    assert used <= series(), used - series()
    # Quota and preemption have panels of their own, and so do the API client and webhook.
    assert {"dispatcher_quota_used", "dispatcher_quota_pending_appwrappers",
            "dispatcher_preemptions_total", "dispatcher_preemption_holds",
            "dispatcher_api_request_duration_seconds_bucket",
            "dispatcher_webhook_request_duration_seconds_bucket"} <= used


def test_dashboard_panels_have_unique_ids_and_do_not_overlap() -> None:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, (p["title"], cells[(x, y)])
                cells[(x, y)] = p["title"]


@pytest.mark.parametrize("rule", rules(), ids=lambda r: r["alert"])
def test_each_alert_asks_for_exported_series_and_says_what_to_do(rule: dict[str, Any]) -> None:
    used = set(METRIC.findall(rule["expr"]))
    assert used and used <= series(), used - series()
    assert rule["labels"]["severity"] in ("critical", "warning", "info")
    assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    assert rule["expr"].count("(") == rule["expr"].count(")")


def test_the_alerts_are_those_the_docs_describe() -> None:
    docs = (REPO / "docs" / "operations.md").read_text()
    described = set(re.findall(r"^\| `(Dispatcher\w+)` \|", docs, re.M))
    names = [r["alert"] for r in rules()]
    assert len(names) == len(set(names))
    assert set(names) == described
    # The two alerts the docs gave as queries from the start are among them.
    exprs = " ".join(r["expr"] for r in rules())
    assert "dispatcher_admission_cycle_last_timestamp_seconds) > 60" in exprs
    assert 'dispatcher_failures_total{reason="ItemCreationFailure"}[15m])) > 0' in exprs


def test_the_webhooks_service_monitor_selects_the_webhooks_service_and_port() -> None:
    monitor = yaml.safe_load((MONITORING / "servicemonitor-webhook.yaml").read_text())
    services = [d for d in yaml.safe_load_all((REPO / "deploy" / "base" / "webhook.yaml")
                                              .read_text()) if d and d["kind"] == "Service"]
    (service,) = [s for s in services
                  if monitor["spec"]["selector"]["matchLabels"].items()
                  <= s["metadata"]["labels"].items()]
    assert monitor["spec"]["endpoints"][0]["port"] in {
        p["name"] for p in service["spec"]["ports"]}
    assert monitor["spec"]["endpoints"][0]["scheme"] == "https"
    component = yaml.safe_load((MONITORING / "kustomization.yaml").read_text())
    assert set(component["resources"]) == {
        "servicemonitor.yaml", "servicemonitor-webhook.yaml", "prometheusrule.yaml"}
