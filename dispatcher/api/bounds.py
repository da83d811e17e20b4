"""How deep and how big an AppWrapper may be, checked before anything else reads it.

Python reads nested data recursively: a template nested a few hundred levels deep makes
the serializer, the deep copy or the JSON encoder raise, wherever it is first touched — the
dispatch step, the conversion webhook, `dispatcher plan`. Real objects are a few dozen
levels deep (a RayCluster in an AppWrapper is under 30), so one bound, checked without
recursion by the webhook, the controller's intake and `plan`, turns such input into a
clear refusal before any recursive code sees it. The size bound is etcd's for one object:
anything larger could not be stored anyway.

The two JSON annotations the conversion keeps (workload.codeflare.dev/v1beta1 and
v1beta2) are documents in their own right and are measured as what they hold.
"""

from __future__ import annotations

import json
import re
from array import array
from collections.abc import Mapping
from itertools import accumulate
from typing import Any

MAX_DEPTH = 100
MAX_BYTES = 1536 * 1024  # etcd's request limit (1.5 MiB)
STASH_ANNOTATIONS = ("workload.codeflare.dev/v1beta1", "workload.codeflare.dev/v1beta2")


# What is not a bracket of JSON's structure: strings (with their escapes), everything else.
_NOT_STRUCTURE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[^\[\]{}"]+')
# A bracket as a step of the depth (a signed byte): +1 opening, -1 closing; a stray quote
# (an unterminated string) is no step.
_STEPS = str.maketrans({"[": "\x01", "{": "\x01", "]": "\xff", "}": "\xff", '"': None})


def text_depth_beyond(text: str, limit: int = MAX_DEPTH) -> bool:
    """Whether mappings and lists nest deeper than `limit` in the JSON document `text`:
    whether, at some point, more than `limit` brackets are open. Read in one pass at C
    speed, whatever the width, and without recursion; brackets opened and never closed
    count too, since the JSON parser recurses into them before it finds the text is not
    JSON. Other text that is not JSON is left to its parser, which says what is wrong."""
    steps = array("b", _NOT_STRUCTURE.sub("", text).translate(_STEPS).encode("latin-1"))
    return max(accumulate(steps), default=0) > limit


def shape_problems(obj: Any, what: str = "the AppWrapper") -> list[str]:
    """Why `obj` is too deep or too big to be read, or nothing."""
    try:
        text = json.dumps(obj, separators=(",", ":"), default=str)
    except RecursionError:
        text = ""
    if not text or text_depth_beyond(text):
        return [f"{what} nests more than {MAX_DEPTH} levels deep (mappings and lists); "
                "no Kubernetes object needs that: flatten it"]
    size = len(text)
    if size > MAX_BYTES:
        return [f"{what} is {size} bytes as JSON, more than the {MAX_BYTES} one object "
                "may have: make it smaller"]
    annotations = (obj.get("metadata") or {}).get("annotations") \
        if isinstance(obj, Mapping) and isinstance(obj.get("metadata"), Mapping) else None
    if not isinstance(annotations, Mapping):
        return []
    return [p for key in STASH_ANNOTATIONS if isinstance(annotations.get(key), str)
            for p in _stash_problems(key, annotations[key])]


def _stash_problems(key: str, text: str) -> list[str]:
    if text_depth_beyond(text):
        return [f"metadata.annotations[{key}] nests more than {MAX_DEPTH} levels deep: "
                "remove the annotation"]
    return []  # not JSON: the review says so, as for any other wrapper
