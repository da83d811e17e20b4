"""The bounds on an AppWrapper's depth and size, read from its JSON text."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from dispatcher.api.bounds import MAX_BYTES, shape_problems, text_depth_beyond

from .builders import nested

# Strings full of what a bracket counter could trip on.
tricky = st.text(alphabet='{}[]"\\ax', max_size=6)
values = st.recursive(st.none() | st.integers() | tricky,
                      lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(tricky, inner, max_size=3), max_leaves=25)


def depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


@given(values, st.integers(0, 8))
def test_the_depth_read_from_the_text_is_the_depth_of_the_value(value: Any, limit: int
                                                                 ) -> None:
    assert text_depth_beyond(json.dumps(value), limit) == (depth(value) > limit)


def test_text_that_is_not_json_is_left_to_its_parser() -> None:
    assert not text_depth_beyond("{not json", 1) and not text_depth_beyond("]]]}}", 0)
    # ... but brackets opened and never closed are as deep as they are open (the parser
    # recurses into them before it finds that they are not closed).
    assert text_depth_beyond("[" * 500, 100) and not text_depth_beyond("[" * 100, 100)


def test_what_is_too_deep_or_too_big_is_said() -> None:
    assert shape_problems({"spec": nested(98)}) == []
    assert "nests more than 100 levels deep" in shape_problems({"spec": nested(99)})[0]
    assert "nests more than 100 levels deep" in shape_problems(nested(5000))[0]
    big = {"metadata": {"annotations": {"a": "x" * MAX_BYTES}}}
    assert "more than the 1572864 one object may have" in shape_problems(big)[0]
    stash = {"metadata": {"annotations": {
        "workload.codeflare.dev/v1beta2": '{"a":' * 150 + "1" + "}" * 150}}}
    assert "metadata.annotations[workload.codeflare.dev/v1beta2] nests more than 100" \
        in shape_problems(stash)[0]
