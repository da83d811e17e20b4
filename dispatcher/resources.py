"""Kubernetes quantities and the effective resource request of a pod.

Every amount is an `int` in a canonical unit: `cpu` in millicores (rounded up, as
`Quantity.MilliValue()`), every other resource in base units (rounded up, as
`Quantity.Value()`): bytes for memory and storage, a count for GPUs and `pods`.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any

from dispatcher.wording import counted

Resources = dict[str, int]

CPU = "cpu"
PODS = "pods"
GPU = "nvidia.com/gpu"  # the extended resource most AppWrappers are about
INT64_MAX = 2**63 - 1

QUANTITY_HINT = (
    "a quantity is a number with an optional suffix and no spaces, such as 2, 0.5, 500m, "
    "128Mi, 16Gi, 10G or 1e3 (binary suffixes Ki Mi Gi Ti Pi Ei; decimal n u m k M G T P E)"
)

_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<int>[0-9]*)(?:\.(?P<frac>[0-9]*))?"
    r"(?:(?P<bin>[KMGTPE]i)|[eE](?P<exp>[+-]?[0-9]+)|(?P<dec>[numkMGTPE]?))"
)
# Beyond this the value is capped or rounded anyway; refusing it keeps parsing cheap.
_MAX_EXPONENT = 1000
# Digits of a quantity as written, leading and trailing zeros included: no amount needs
# more (an int64 has 19, and a nano 9 after the point), and Python refuses to read an
# integer of more than 4,300 digits with an error that is not a quantity's.
MAX_DIGITS = 100
# How much of an over-long value a message quotes.
_QUOTED = 24
_NANO = Fraction(1, 10**9)


class ResourceSpecError(ValueError):
    """A resource list or pod spec that Kubernetes would not accept."""


class QuantityError(ResourceSpecError):
    """A value that is not a valid, non-negative Kubernetes quantity."""


def _not_a_quantity(value: object, label: str | None = None) -> QuantityError:
    what = f"{label} {value!r}" if label else repr(value)
    return QuantityError(f"{what} is not a Kubernetes quantity: {QUANTITY_HINT}")


def parse_quantity(value: str | int | float) -> Fraction:
    """The exact value of a Kubernetes quantity (`"500m"` -> 1/2, `"1Ki"` -> 1024).

    As `resource.ParseQuantity` does, non-zero values are rounded away from zero to a
    whole nano and binary-suffixed values are capped at 2**63-1.
    """
    if isinstance(value, bool):  # YAML `true` is an int to Python, not a quantity
        raise _not_a_quantity(value)
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _not_a_quantity(value)
        value = repr(value)  # the shortest text that reads back as this float
    if not isinstance(value, str):
        raise _not_a_quantity(value)
    m = _QUANTITY.fullmatch(value)
    if m is None or not (m["int"] or m["frac"]):
        raise _not_a_quantity(value)
    digits = (m["int"] or "") + (m["frac"] or "")
    if len(digits) > MAX_DIGITS:
        raise QuantityError(
            f"{_quoted(value)} has {len(digits)} digits, more than the {MAX_DIGITS} a "
            "quantity may have: write it with a suffix (16Gi, 2T) or an exponent (1e21)"
        )
    amount = Fraction(int(digits), 10 ** len(m["frac"] or ""))
    if m["bin"]:
        amount *= 2 ** _BINARY[m["bin"]]
    else:
        exponent = _exponent(value, m["exp"]) if m["exp"] is not None else _DECIMAL[m["dec"]]
        amount *= Fraction(10) ** exponent
    if amount and amount.denominator != 1:
        amount = math.ceil(amount / _NANO) * _NANO
    if m["bin"]:
        amount = min(amount, Fraction(INT64_MAX))
    return -amount if m["sign"] == "-" else amount


def _exponent(value: str, text: str) -> int:
    # Leading zeros dropped, and judged by length before it is read: a long exponent is
    # out of range, and may be too long to read.
    digits = text.lstrip("+-").lstrip("0") or "0"
    if len(digits) > len(str(_MAX_EXPONENT)) or int(digits) > _MAX_EXPONENT:
        raise QuantityError(
            f"{_quoted(value)} is out of range: the exponent may be at most {_MAX_EXPONENT}"
        )
    return -int(digits) if text.startswith("-") else int(digits)


def _quoted(value: str) -> str:
    return repr(value) if len(value) <= _QUOTED else repr(value[:_QUOTED]) + "…"


def _canonical(name: str, value: object, label: str) -> int:
    if not isinstance(value, str | int | float):
        raise _not_a_quantity(value, label)
    try:
        return _canonical_units(name, value)
    except QuantityError as e:
        raise QuantityError(f"{label} {e}") from None


# Every pod event parses its containers' requests, and they are the same few amounts:
# parsed once each.
# `typed`: True and 1 are different keys (a bool is not a quantity).
@functools.lru_cache(maxsize=4096, typed=True)
def _canonical_units(name: str, value: str | int | float) -> int:
    amount = parse_quantity(value)
    if amount < 0:
        raise QuantityError(
            f"{value!r} is negative: requests, limits and capacities are 0 or more"
        )
    scaled = math.ceil(amount * 1000) if name == CPU else math.ceil(amount)
    return min(scaled, INT64_MAX)


def canonical(name: str, value: str | int | float) -> int:
    """`value` of resource `name` in canonical units: millicores for cpu, else base units."""
    return _canonical(name, value, name)


def _resource_list(m: object, label: str) -> Resources:
    if m is None:
        return {}
    if not isinstance(m, Mapping):
        raise ResourceSpecError(
            f"{label or 'a resource list'} must be a map of resource name to quantity, "
            f"not {type(m).__name__}"
        )
    return {
        str(k): _canonical(str(k), v, f"{label}.{k}" if label else str(k)) for k, v in m.items()
    }


def resource_list(m: Mapping[str, Any] | None, label: str = "") -> Resources:
    """A ResourceList (`{"cpu": "2", "memory": "4Gi"}`) in canonical units; zeros kept.

    `label` is where the list is, for error messages (e.g. `"resources.requests"`).
    """
    return _resource_list(m, label)


def add(a: Mapping[str, int], b: Mapping[str, int]) -> Resources:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


def subtract(a: Mapping[str, int], b: Mapping[str, int]) -> Resources:
    """`a - b` per resource; may go negative (an over-committed node)."""
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) - v
    return out


def scale(a: Mapping[str, int], n: int) -> Resources:
    return {k: v * n for k, v in a.items()}


def maximum(a: Mapping[str, int], b: Mapping[str, int]) -> Resources:
    """The per-resource maximum of two resource lists."""
    out = dict(a)
    for k, v in b.items():
        out[k] = max(out.get(k, 0), v)
    return out


def fits(request: Mapping[str, int], free: Mapping[str, int]) -> bool:
    """Whether every positive request is within `free` (a missing resource is 0 free)."""
    return all(v <= free.get(k, 0) for k, v in request.items() if v > 0)


# --- amounts in 64-bit numbers ----------------------------------------------------------
#
# Amounts here are Python integers and never overflow, but the fit counts in a matrix of
# 64-bit integers (fit/capacity.py), and a sum there wraps round silently. A pod may ask
# up to 2**63-1 per container, so a node's free amount, allocatable less what its pods
# ask, can be far outside 64 bits: one bound pod asking 8E of a resource in two
# containers takes a node's free amount below -2**63. So amounts enter the matrix bounded:
#
# - a free amount above AMOUNT_BOUND counts as AMOUNT_BOUND: less room than the node has,
#   never more (no machine has that much of anything: 256 TiB of memory, 281 billion
#   cpus);
# - a request above AMOUNT_BOUND counts as AMOUNT_BOUND + 1: more than any node is
#   counted to have free, so it fits nowhere, as it would not (amounts up to the bound
#   compare exactly);
# - a free amount below FREE_FLOOR counts as FREE_FLOOR: still nothing free, and so deep
#   that giving back what pods there hold (at most AMOUNT_BOUND + 1 each) cannot make it
#   look free unless 16,384 such pods are given back on that one node.
#
# Sums of free amounts over nodes add only what is above zero: 32,767 nodes at the bound
# still add up within 64 bits.
AMOUNT_BOUND = 2**48
FREE_FLOOR = -(2**62)


def bounded_free(value: int) -> int:
    """A node's free amount as the 64-bit fit counts it (see AMOUNT_BOUND)."""
    return FREE_FLOOR if value < FREE_FLOOR else min(value, AMOUNT_BOUND)


def bounded_request(value: int) -> int:
    """A request (or an amount taken or given back) as the 64-bit fit counts it: beyond
    AMOUNT_BOUND either way, one more than the bound (see AMOUNT_BOUND)."""
    return max(-AMOUNT_BOUND - 1, min(value, AMOUNT_BOUND + 1))


# --- words for users ------------------------------------------------------------------

_BYTE_RESOURCES = frozenset({"memory", "ephemeral-storage", "storage"})
_BINARY_UNITS = sorted(((2**e, s) for s, e in _BINARY.items()), reverse=True)
_DECIMAL_UNITS = [(10**e, s) for s, e in sorted(_DECIMAL.items(), key=lambda x: -x[1]) if e >= 3]


def _is_bytes(name: str) -> bool:
    return name in _BYTE_RESOURCES or name.startswith("hugepages-")


def _decimal_text(value: Fraction) -> str | None:
    """`value` with at most two decimals, or None when that would not be exact."""
    hundredths = abs(value) * 100
    if hundredths.denominator != 1:
        return None
    whole, cents = divmod(int(hundredths), 100)
    sign = "-" if value < 0 else ""
    if not cents:
        return f"{sign}{whole}"
    return f"{sign}{whole}.{cents:02d}".rstrip("0")


def _bytes_text(value: int) -> str:
    """The shortest exact rendering in binary or decimal units; `~` when none is short.

    Binary wins ties (memory is usually sized in Gi). A whole number of some unit is
    always exact (`16777215Ki`); otherwise more than six significant digits read as
    noise and the value is shown approximately, e.g. `~1.15Gi`.
    """
    candidates = [str(value)]
    for factor, suffix in [*_BINARY_UNITS, *_DECIMAL_UNITS]:
        if value >= factor and (text := _decimal_text(Fraction(value, factor))) is not None:
            candidates.append(text + suffix)
    best = min(candidates, key=len)  # min() keeps the first, binary, among equals
    whole_units = best[-1].isalpha() and "." not in best
    if whole_units or sum(c.isdigit() for c in best) <= 6:
        return best
    factor, suffix = next(((f, s) for f, s in _BINARY_UNITS if value >= f), (1, ""))
    return f"~{value / factor:.2f}".rstrip("0").rstrip(".") + suffix


@functools.lru_cache(maxsize=4096)  # waiting messages say the same amounts over and over
def format_amount(name: str, value: int) -> str:
    """An amount in words: `8 nvidia.com/gpu`, `1.5 cpu`, `500m cpu`, `16Gi memory`."""
    if name == CPU:
        if value % 1000 == 0 or abs(value) >= 1000:
            text = _decimal_text(Fraction(value, 1000))
            if text is not None:
                return f"{text} cpu"
        return f"{value}m cpu"
    if _is_bytes(name):
        sign = "-" if value < 0 else ""
        return f"{sign}{_bytes_text(abs(value))} {name}"
    if name == PODS:
        return counted(value, "pod")
    return f"{value} {name}"


def amount_number(name: str, value: int) -> str:
    """An amount without its resource's name, as `format_amount` writes it: '12', '1.5',
    '500m', '2Gi'."""
    if name == PODS:
        return str(value)
    return format_amount(name, value).removesuffix(" " + name)


def is_extended(name: str) -> bool:
    """A GPU or another extended resource: a name with a domain (``nvidia.com/gpu``)."""
    return "/" in name


def resource_order(name: str) -> tuple[int, str]:
    # What users queue for (GPUs and other extended resources) reads first; pods last.
    if is_extended(name):
        group = 0
    elif name == CPU:
        group = 1
    elif name == "memory":
        group = 2
    elif name == PODS:
        group = 4
    else:
        group = 3
    return (group, name)


def format_resources(r: Mapping[str, int]) -> str:
    """Non-zero amounts, comma-joined: extended resources (sorted by name), cpu, memory,
    other standard resources (sorted), pods. `nothing` when every amount is zero."""
    parts = [format_amount(k, r[k]) for k in sorted(r, key=resource_order) if r[k]]
    return ", ".join(parts) if parts else "nothing"


# --- effective pod request ------------------------------------------------------------

POD_LEVEL_RESOURCES = frozenset({CPU, "memory"})


def _container_request(c: Mapping[str, Any], label: str) -> Resources:
    """Requests, each missing one defaulted to its limit (the API server's defaulting)."""
    resources = c.get("resources") or {}
    if not isinstance(resources, Mapping):
        raise ResourceSpecError(f"{label}: resources must be a map, not {type(resources).__name__}")
    limits = _resource_list(resources.get("limits"), f"{label}: resources.limits")
    requests = _resource_list(resources.get("requests"), f"{label}: resources.requests")
    refused = _refused_by_the_api_server(resources, limits, requests)
    if refused:
        raise ResourceSpecError(f"{label}: {refused} (the API server refuses such a pod)")
    return {**limits, **requests}


def _not_overcommitted(name: str) -> bool:
    """An extended resource (a device: nvidia.com/gpu) or hugepages: Kubernetes wants its
    request equal to its limit."""
    extended = "/" in name and not name.split("/")[0].endswith("kubernetes.io") \
        and not name.startswith("requests.")
    return extended or name.startswith("hugepages-")


def _refused_by_the_api_server(raw: Mapping[str, Any], limits: Resources,
                               requests: Resources) -> str | None:
    """What kube-apiserver's validation of a container's resources would say, in its
    words (ValidateResourceRequirements), or None when it would accept them."""
    for field, amounts in (("requests", raw.get("requests")), ("limits", raw.get("limits"))):
        for name, value in (amounts or {}).items():
            name = str(name)
            if "/" in name and _not_overcommitted(name) and \
                    parse_quantity(value).denominator != 1:
                return (f"resources.{field}[{name}]: Invalid value: {str(value)!r}: must be "
                        "an integer")
    for name, request in requests.items():
        limit = limits.get(name)
        if _not_overcommitted(name):
            if limit is None:
                return (f"resources.limits[{name}]: Required value: Limit must be set for "
                        "non overcommitable resources")
            if request != limit:
                return (f"resources.requests[{name}]: Invalid value: "
                        f"{amount_number(name, request)!r}: must be equal to {name} limit "
                        f"of {amount_number(name, limit)}")
        elif limit is not None and request > limit:
            return (f"resources.requests[{name}]: Invalid value: "
                    f"{amount_number(name, request)!r}: must be less than or equal to "
                    f"{name} limit of {amount_number(name, limit)}")
    return None


def _containers(spec: Mapping[str, Any], field: str) -> Iterable[tuple[Mapping[str, Any], str]]:
    items = spec.get(field)
    if items is None:
        return
    if not isinstance(items, list):
        raise ResourceSpecError(f"{field} must be a list of containers, not {type(items).__name__}")
    for i, c in enumerate(items):
        if not isinstance(c, Mapping):
            raise ResourceSpecError(f"{field}[{i}] must be a container, not {type(c).__name__}")
        name = c.get("name")
        yield c, f"{field}[{i}] ({name})" if name else f"{field}[{i}]"


def pod_request(spec: Mapping[str, Any]) -> Resources:
    """What kube-scheduler reserves on a node for one pod with this PodSpec, plus `pods: 1`.

    The rule of `resource.PodRequests` (Kubernetes 1.34): regular containers add up;
    init containers run one at a time beside the sidecars (`restartPolicy: Always`)
    started before them, and sidecars keep running beside everything after; the pod
    needs the larger of the two peaks. Pod-level `resources.requests` replace cpu and
    memory; `overhead` comes on top.
    """
    total: Resources = {}
    for c, label in _containers(spec, "containers"):
        total = add(total, _container_request(c, label))

    sidecars: Resources = {}
    init_peak: Resources = {}
    for c, label in _containers(spec, "initContainers"):
        request = _container_request(c, label)
        if c.get("restartPolicy") == "Always":
            total = add(total, request)
            sidecars = add(sidecars, request)
            init_peak = maximum(init_peak, sidecars)
        else:
            init_peak = maximum(init_peak, add(request, sidecars))
    result = maximum(total, init_peak)

    result.update(_pod_level_requests(spec))
    result = add(result, _resource_list(spec.get("overhead"), "overhead"))
    result[PODS] = result.get(PODS, 0) + 1
    return result


def _pod_level_requests(spec: Mapping[str, Any]) -> Resources:
    resources = spec.get("resources") or {}
    if not isinstance(resources, Mapping):
        raise ResourceSpecError(f"resources must be a map, not {type(resources).__name__}")
    limits = _resource_list(resources.get("limits"), "resources.limits")
    requests = _resource_list(resources.get("requests"), "resources.requests")
    merged = {**limits, **requests}
    return {k: v for k, v in merged.items() if k in POD_LEVEL_RESOURCES}
