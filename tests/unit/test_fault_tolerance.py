"""codeflare's fault-tolerance annotations and the reset rules of v1beta2 wrappers."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.api.conversion import V1BETA2_FIELDS_ANNOTATION
from dispatcher.api.fault_tolerance import FaultTolerance, fault_tolerance, go_duration
from dispatcher.api.models import AppWrapper, parse_appwrapper
from dispatcher.config import ConfigError, DispatcherConfig, load_config
from dispatcher.kinds.completion import Outcome
from dispatcher.lifecycle import (
    AUTOPILOT_NO_EXECUTE,
    FAILED_PODS,
    MISSING_COMPONENT,
    PODS_NOT_PENDING,
    PODS_NOT_READY,
    PODS_UNPLACEABLE,
    RETRY_LIMIT_REACHED,
    WRAPPED_OBJECT_FAILED,
    PodCounts,
    Timing,
    forceful_deletion_grace,
    judge_v1beta2,
    leftover_step,
)

FT = "workload.codeflare.dev.appwrapper/"
T0 = 1000.0


@pytest.mark.parametrize("text,seconds", [
    ("10s", 10.0), ("1m", 60.0), ("5m", 300.0), ("1h30m", 5400.0), ("168h", 604800.0),
    ("500ms", 0.5), ("1.5h", 5400.0), ("0", 0.0), ("-2s", -2.0)])
def test_go_durations_read_as_go_reads_them(text: str, seconds: float) -> None:
    assert go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "10", "s", "1d", "1m x", "1 m", "--1s"])
def test_what_is_not_a_go_duration_is_refused(text: str) -> None:
    assert go_duration(text) is None


@given(st.integers(0, 99), st.integers(0, 59), st.integers(0, 59))
def test_hours_minutes_and_seconds_add_up(h: int, m: int, s: int) -> None:
    assert go_duration(f"{h}h{m}m{s}s") == h * 3600 + m * 60 + s


def test_annotations_override_the_defaults_and_bad_ones_say_why() -> None:
    ft, warnings = fault_tolerance({
        FT + "failureGracePeriodDuration": "10s", FT + "retryPausePeriodDuration": "1m",
        FT + "retryLimit": "1", FT + "successTTLDuration": "soon",
        FT + "warmupGracePeriodDuration": "-5s"})
    assert (ft.failure_grace, ft.retry_pause, ft.retry_limit) == (10.0, 60.0, 1)
    assert ft.success_ttl == 7 * 86400 and ft.warmup_grace == 300
    assert len(warnings) == 2
    assert "warmupGracePeriodDuration']: '-5s' is not a duration" in warnings[0]
    assert "successTTLDuration']: 'soon' is not a duration" in warnings[1]
    assert "the installation's 168h applies" in warnings[1]


def test_no_grace_period_exceeds_the_installations_maximum() -> None:
    base = FaultTolerance(grace_period_maximum=120.0)
    ft, warnings = fault_tolerance({FT + "admissionGracePeriodDuration": "1h",
                                    FT + "successTTLDuration": "200h"}, base)
    assert ft.admission_grace == 120.0
    assert "above the installation's maximum 2m" in warnings[0]
    assert ft.success_ttl == 7 * 86400  # the installation's success TTL is its maximum
    assert "above the installation's maximum 168h" in warnings[1]


def test_the_configuration_file_sets_the_defaults_and_refuses_what_it_cannot_read(
        tmp_path: Path) -> None:
    config = DispatcherConfig.model_validate(
        {"faultTolerance": {"retryPausePeriod": "30s", "retryLimit": 5,
                            "gracePeriodMaximum": "1h"}})
    ft = config.fault_tolerance
    assert (ft.retry_pause, ft.retry_limit, ft.grace_period_maximum) == (30.0, 5, 3600.0)
    path = tmp_path / "c.yaml"
    path.write_text("faultTolerance: {retryPausePeriod: 90}\n")
    with pytest.raises(ConfigError, match="retryPausePeriod"):
        load_config(path)


AW = parse_appwrapper({
    "apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
    "metadata": {"name": "a", "namespace": "n"},
    "spec": {"resources": {"GenericItems": [{"generictemplate": {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}}]}}})


def _aw(resets: int) -> AppWrapper:
    aw = AW.model_copy(deep=True)
    aw.status.numberOfRequeueings = resets
    return aw


pods = st.builds(PodCounts, st.integers(0, 4), st.integers(0, 4), st.integers(0, 4),
                 st.integers(0, 2))
settings = st.builds(FaultTolerance, admission_grace=st.integers(0, 100),
                     warmup_grace=st.integers(0, 300), failure_grace=st.integers(0, 100),
                     retry_pause=st.integers(0, 100), retry_limit=st.integers(0, 4))


@given(pods, st.integers(1, 4), st.sampled_from([None, "running", "failed", "succeeded"]),
       st.booleans(), st.integers(0, 1000), settings, st.integers(0, 5),
       st.one_of(st.none(), st.integers(0, 1000)), st.one_of(st.none(), st.integers(0, 1000)))
def test_reset_rules(counts: PodCounts, expected: int, outcome: Outcome | None, running: bool,
                     elapsed: int, ft: FaultTolerance, resets: int,
                     created_after: int | None, failed_after: int | None) -> None:
    now = T0 + elapsed
    created = None if created_after is None else min(T0 + created_after, now)
    failed_since = None if failed_after is None or not counts.failed \
        else min(T0 + failed_after, now)
    v = judge_v1beta2(_aw(resets), counts, expected, outcome, T0,
                      running, now, ft, created, failed_since)
    # A v1beta2 wrapper is never requeued: reset, or failed once its resets are spent.
    assert v.action != "requeue"
    if v.action == "reset":
        assert resets < ft.retry_limit
    if v.action == "failed":
        assert resets >= ft.retry_limit and v.reason == RETRY_LIMIT_REACHED
    if outcome == "failed":
        # A wrapped object that failed will not recover: no grace period.
        assert v.action in ("reset", "failed") and (v.action == "failed"
                                                    or v.reason == WRAPPED_OBJECT_FAILED)
    if v.action in ("reset", "failed") and outcome != "failed":
        # Pod-level trouble is reset only once it has lasted the failure grace period.
        if v.reason == FAILED_PODS or (counts.failed and outcome is None):
            assert failed_since is None or now >= failed_since + ft.failure_grace
        if PODS_NOT_READY in v.message or v.reason == PODS_NOT_READY:
            assert now >= T0 + ft.warmup_grace + ft.failure_grace
        if v.reason == PODS_NOT_PENDING:
            assert created is not None and now >= created + ft.admission_grace \
                + ft.failure_grace
    if v.action == "wait":
        assert v.check_at is not None and v.check_at > now  # it is looked at again


def test_a_failed_pod_waits_the_failure_grace_then_resets() -> None:
    ft = FaultTolerance(failure_grace=10, retry_pause=20, retry_limit=1)
    failed = PodCounts(running=0, failed=1)
    early = judge_v1beta2(AW, failed, 1, None, T0, True, T0 + 9, ft, T0, T0)
    assert early.action == "wait" and early.check_at == T0 + 10
    assert "reset in 1s unless it recovers" in early.message
    late = judge_v1beta2(AW, failed, 1, None, T0, True, T0 + 10, ft, T0, T0)
    assert late.action == "reset" and late.reason == FAILED_PODS
    assert "reset 1 of 1" in late.message and "after 20s" in late.message
    spent = judge_v1beta2(_aw(1), failed, 1, None, T0,
                          True, T0 + 10, ft, T0, T0)
    assert spent.action == "failed" and "already reset 1 time" in spent.message


@given(pods, settings, st.integers(0, 5), st.sampled_from([None, "running", "failed"]))
def test_a_wrapped_object_deleted_fails_it_at_once_without_retry(
        counts: PodCounts, ft: FaultTolerance, resets: int, outcome: Outcome | None) -> None:
    v = judge_v1beta2(_aw(resets), counts, 2, outcome, T0, True, T0, ft,
                      missing=["PyTorchJob 'train'"])
    assert (v.action, v.reason) == ("failed", MISSING_COMPONENT)
    assert v.message.startswith("PyTorchJob 'train' deleted") and "without retry" in v.message


def test_a_pod_on_an_evicting_node_resets_at_once_uncounted_until_the_retry_limit() -> None:
    ft = FaultTolerance(failure_grace=60, retry_limit=2)
    up = PodCounts(running=2)
    v = judge_v1beta2(_aw(1), up, 2, "running", T0, True, T0, ft, evicted=["n1"])
    assert (v.action, v.reason) == ("reset", AUTOPILOT_NO_EXECUTE)
    assert "NoExecute on n1" in v.message and "not counted" in v.message
    spent = judge_v1beta2(_aw(2), up, 2, "running", T0, True, T0, ft, evicted=["n1"])
    assert (spent.action, spent.reason) == ("failed", RETRY_LIMIT_REACHED)


def test_pods_not_created_or_not_running_in_time_are_unhealthy() -> None:
    ft = FaultTolerance(admission_grace=60, warmup_grace=300, failure_grace=30)
    none = PodCounts()
    assert judge_v1beta2(AW, none, 2, None, T0, False, T0 + 59, ft, T0).action == "wait"
    at = judge_v1beta2(AW, none, 2, None, T0, False, T0 + 90, ft, T0)
    assert at.action == "reset" and at.reason == PODS_NOT_PENDING
    pending = PodCounts(pending=2)
    assert judge_v1beta2(AW, pending, 2, None, T0, False, T0 + 329, ft, T0).action == "wait"
    slow = judge_v1beta2(AW, pending, 2, None, T0, False, T0 + 330, ft, T0)
    assert slow.action == "reset" and slow.reason == PODS_NOT_READY


@given(st.integers(0, 5), st.floats(0, 1e6), st.floats(0, 1e5), st.floats(0, 1e6))
def test_pods_left_after_a_deletion_are_deleted_at_once_only_past_the_forceful_grace(
        left: int, deleted_at: float, grace: float, later: float) -> None:
    now = deleted_at + later
    step, check_at = leftover_step(left, deleted_at, now, grace)
    if left == 0:
        assert (step, check_at) == ("gone", None)
    elif now >= deleted_at + grace:
        assert (step, check_at) == ("force", None)
    else:
        assert (step, check_at) == ("wait", deleted_at + grace)


def test_the_forceful_deletion_grace_is_the_annotations_capped_by_the_maximum() -> None:
    v2 = {V1BETA2_FIELDS_ANNOTATION: "{}"}  # written as v1beta2
    timing = Timing(fault_tolerance=FaultTolerance(forceful_deletion_grace=120.0,
                                                   grace_period_maximum=1800.0))
    assert forceful_deletion_grace(v2, timing) == 120.0  # the installation's default
    assert forceful_deletion_grace({**v2, FT + "forcefulDeletionGracePeriodDuration": "5s"},
                                   timing) == 5.0
    assert forceful_deletion_grace({**v2, FT + "forcefulDeletionGracePeriodDuration": "2h"},
                                   timing) == 1800.0  # capped
    assert forceful_deletion_grace({}, timing) is None  # written as v1beta1: MCAD's rules


def test_a_gang_with_a_pod_placed_nowhere_is_not_running_and_is_reset() -> None:
    """Written as v1beta2: one pod up (minAvailable 1 of 2), the other placed nowhere —
    not Running; unhealthy, then reset with PodsUnplaceable after the failure grace."""
    ft = FaultTolerance(failure_grace=10, retry_pause=20, retry_limit=1)
    why = "pod m-0 asks 4 nvidia.com/gpu: 2 nvidia.com/gpu more than its gang was admitted with"
    half = PodCounts(running=1, pending=1)
    scheduling = {"minAvailable": 1}
    aw = AW.model_copy(update={"spec": AW.spec.model_copy(update={
        "schedulingSpec": AW.spec.schedulingSpec.model_copy(update=scheduling)})})
    early = judge_v1beta2(aw, half, 2, None, T0, False, T0 + 5, ft, T0,
                          unplaced=(T0 + 1, why))
    assert early.action == "wait" and early.reason == PODS_UNPLACEABLE
    late = judge_v1beta2(aw, half, 2, None, T0, False, T0 + 11, ft, T0,
                         unplaced=(T0 + 1, why))
    assert late.action == "reset" and late.reason == PODS_UNPLACEABLE and why in late.message
    up = judge_v1beta2(aw, half, 2, None, T0, False, T0 + 5, ft, T0)
    assert up.action == "running"
