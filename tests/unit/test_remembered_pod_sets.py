"""A pod template's pod set is remembered by the template as written (wrappers of one shape
share it): the remembered answer must be the one worked out afresh, for every template --
or the queue would count some wrapper's pods by another's template."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.kinds import InvalidItem, podspec
from dispatcher.review import Review, review
from tests.shared_files import MCAD_V1BETA1, missing

GPU = "nvidia.com/gpu"


def afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing remembered from here on: every template too long to be."""
    monkeypatch.setattr(podspec, "_LONGEST", -1)


def _reviews(objs: list[Any]) -> list[Review]:
    return [review(o, 0.0) for o in objs]


def test_every_mcad_manifest_reads_the_same_remembered_or_afresh(
        monkeypatch: pytest.MonkeyPatch) -> None:
    why = missing(MCAD_V1BETA1 / "manifests", "MCAD's AppWrappers", "MCAD_V1BETA1")
    if why:
        pytest.skip(why)
    objs = [d for path in sorted((MCAD_V1BETA1 / "manifests").iterdir())
            for d in yaml.safe_load_all(Path(path).read_text()) if d]
    remembered = _reviews(objs)
    again = _reviews(objs)  # every template met before: each answer remembered
    afresh(monkeypatch)
    assert again == remembered == _reviews(objs)
    assert any(r.queued is not None and r.queued.gang for r in remembered)


def _template(value: object, selector: dict[str, object], tolerate: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"limits": {GPU: value}}}],
                            "nodeSelector": selector}
    if tolerate:
        spec["tolerations"] = [{"key": GPU, "operator": "Exists"}]
    return {"spec": spec}


QUANTITIES = st.one_of(st.integers(-1, 3), st.sampled_from([1.0, 2.5, True, "1", "2", "1.0",
                                                          "500m", None, "x", [1]]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["main", "worker"]), st.integers(0, 3), QUANTITIES,
                          st.dictionaries(st.sampled_from(["zone", "rack"]),
                                          st.sampled_from(["a", "b", 1]), max_size=2),
                          st.booleans()), min_size=1, max_size=8))
def test_a_remembered_pod_set_is_the_one_its_template_gives(
        cases: list[tuple[str, int, object, dict[str, object], bool]]) -> None:
    for name, count, value, selector, tolerate in cases:
        template = _template(value, selector, tolerate)
        with pytest.MonkeyPatch.context() as m:
            afresh(m)
            try:
                expected: object = podspec.pod_set_from_template(name, count, template)
            except InvalidItem as e:
                expected = str(e)
        try:
            got: object = podspec.pod_set_from_template(name, count, template)
        except InvalidItem as e:
            got = str(e)
        assert got == expected
