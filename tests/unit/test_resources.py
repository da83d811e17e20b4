"""Kubernetes quantities, resource arithmetic, words for users, effective pod requests."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from dispatcher.resources import (
    AMOUNT_BOUND,
    FREE_FLOOR,
    INT64_MAX,
    MAX_DIGITS,
    QuantityError,
    ResourceSpecError,
    add,
    bounded_free,
    bounded_request,
    canonical,
    fits,
    format_amount,
    format_resources,
    parse_quantity,
    pod_request,
    resource_list,
    scale,
    subtract,
)

Ki, Mi, Gi = 2**10, 2**20, 2**30
BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


# --- parse_quantity -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("1", 1),
        ("500m", Fraction(1, 2)),
        ("1.5", Fraction(3, 2)),
        ("1.", 1),
        (".5", Fraction(1, 2)),
        ("0.5", Fraction(1, 2)),
        ("007", 7),
        ("+2", 2),
        ("-2", -2),
        ("-1.5Gi", -3 * Gi // 2),
        ("100n", Fraction(100, 10**9)),
        ("100u", Fraction(100, 10**6)),
        ("1k", 1000),
        ("1M", 10**6),
        ("1G", 10**9),
        ("1T", 10**12),
        ("1P", 10**15),
        ("1E", 10**18),
        ("1Ki", Ki),
        ("1.5Gi", 3 * Gi // 2),
        ("128Mi", 128 * Mi),
        ("1e3", 1000),
        ("1E3", 1000),
        ("1e+3", 1000),
        ("1.5E-2", Fraction(15, 1000)),
        ("12e-1", Fraction(6, 5)),
        ("1e0", 1),
        (3, 3),
        (0.25, Fraction(1, 4)),
        (1e-05, Fraction(1, 100000)),
        (2.0, 2),
    ],
)
def test_valid_quantities(text: str | int | float, expected: Fraction | int) -> None:
    assert parse_quantity(text) == expected


def test_values_below_a_nano_round_up_to_one_nano_as_kubernetes_does() -> None:
    assert parse_quantity("0.1n") == Fraction(1, 10**9)
    assert parse_quantity("1e-12") == Fraction(1, 10**9)
    assert parse_quantity("1.0000000001") == 1 + Fraction(1, 10**9)
    assert parse_quantity("-0.1n") == -Fraction(1, 10**9)
    assert parse_quantity("0e-20") == 0


def test_binary_quantities_are_capped_at_int64_max_as_kubernetes_does() -> None:
    assert parse_quantity("8Ei") == INT64_MAX
    assert parse_quantity("7Ei") == 7 * 2**60


@pytest.mark.parametrize(
    "text",
    ["1.2.3", "10 Gi", " 1", "1 ", "abc", "", "1iB", "1e", "1K", "1KB", "1Gb", ".", "-", "+",
     "Mi", "m", "e3", "1e1.5", "1e+", "0x10", "1_000", "1,5", "\uff11", "1Gi1", "--1", "1m m"],
)
def test_garbage_is_rejected_with_a_hint(text: str) -> None:
    with pytest.raises(QuantityError) as e:
        parse_quantity(text)
    assert repr(text) in str(e.value)
    assert "not a Kubernetes quantity" in str(e.value)
    assert "500m" in str(e.value) and "16Gi" in str(e.value)


@pytest.mark.parametrize("value", [True, False, math.nan, math.inf, -math.inf, None, [1], {}])
def test_non_quantity_values_are_rejected(value: Any) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(value)


def test_absurd_exponents_are_refused_rather_than_computed() -> None:
    with pytest.raises(QuantityError, match="out of range"):
        parse_quantity("1e100000000")


@given(st.integers(min_value=MAX_DIGITS + 1, max_value=20_000),
       st.sampled_from(["{}", "0.{}", "{}.5", "{}Gi", "{}e3", "1e{}", "1e-{}", "1e+0{}"]),
       st.sampled_from("19"))
def test_an_overlong_quantity_is_refused_as_a_quantity(digits: int, form: str,
                                                       digit: str) -> None:
    # Python reads no integer of more than 4,300 digits: such a value must still be
    # refused with a quantity's message, which a wrapper's status can show.
    text = form.format(digit * digits)
    with pytest.raises(QuantityError, match=f"more than the {MAX_DIGITS} a quantity may "
                       "have|out of range") as e:
        parse_quantity(text)
    assert len(str(e.value)) < 200  # quotes the start of the value, not all of it


def test_digits_are_counted_as_written_and_an_exponent_without_its_leading_zeros() -> None:
    with pytest.raises(QuantityError, match=f"has 5000 digits, more than the {MAX_DIGITS}"):
        parse_quantity("0" * 5000)
    assert parse_quantity("0" * MAX_DIGITS + "Ki") == 0
    assert parse_quantity("1e" + "0" * 5000 + "3") == 1000
    assert parse_quantity("2e-" + "0" * 5000 + "3") == Fraction(2, 1000)


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(sorted(BINARY)))
def test_binary_suffix_round_trip(n: int, suffix: str) -> None:
    assert parse_quantity(f"{n}{suffix}") == min(n * BINARY[suffix], INT64_MAX)


@given(
    st.decimals(min_value=0, max_value=10**9, places=4, allow_nan=False, allow_infinity=False),
    st.sampled_from(sorted(DECIMAL)),
    st.sampled_from(["", "-", "+"]),
)
def test_decimal_suffix_agrees_with_decimal_arithmetic(
    number: Decimal, suffix: str, sign: str
) -> None:
    expected = Fraction(number) * Fraction(10) ** DECIMAL[suffix]
    if expected.denominator != 1:  # Kubernetes keeps nine decimal places, rounding up
        expected = Fraction(math.ceil(expected * 10**9), 10**9)
    assert parse_quantity(f"{sign}{number}{suffix}") == (-expected if sign == "-" else expected)


@given(st.integers(min_value=0, max_value=10**6), st.integers(min_value=-9, max_value=12))
def test_exponent_form_equals_decimal_shift(mantissa: int, exponent: int) -> None:
    expected = Fraction(mantissa) * Fraction(10) ** exponent
    assert parse_quantity(f"{mantissa}e{exponent}") == expected
    assert parse_quantity(f"{mantissa}E{exponent:+d}") == expected


@given(st.floats(min_value=0, max_value=1e12, allow_nan=False, allow_infinity=False))
def test_yaml_floats_mean_what_they_print_as(value: float) -> None:
    assert parse_quantity(value) == parse_quantity(repr(value))
    assert abs(parse_quantity(value) - Fraction(value)) <= Fraction(1, 10**9) + abs(
        Fraction(value) - Fraction(Decimal(repr(value)))
    )


# --- canonical units --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("cpu", "1", 1000),
        ("cpu", "2", 2000),
        ("cpu", "500m", 500),
        ("cpu", "0.5", 500),
        ("cpu", 1.5, 1500),
        ("cpu", "1m", 1),
        ("cpu", "0.1m", 1),  # MilliValue rounds up
        ("cpu", "100u", 1),
        ("cpu", "1.0001", 1001),
        ("cpu", "1e3", 1_000_000),
        ("memory", "1Gi", Gi),
        ("memory", "1.5Gi", 3 * Gi // 2),
        ("memory", "1G", 10**9),
        ("memory", "200Mi", 200 * Mi),
        ("memory", "0.5", 1),  # Value rounds up
        ("memory", "129e6", 129_000_000),
        ("memory", "500m", 1),
        ("ephemeral-storage", "10Gi", 10 * Gi),
        ("nvidia.com/gpu", "8", 8),
        ("nvidia.com/gpu", 4, 4),
        ("pods", "110", 110),
        ("memory", "0", 0),
        ("memory", "100E", INT64_MAX),
    ],
)
def test_canonical_units(name: str, value: str | int | float, expected: int) -> None:
    assert canonical(name, value) == expected


@pytest.mark.parametrize("name", ["cpu", "memory", "nvidia.com/gpu"])
def test_negative_amounts_are_errors_naming_the_resource(name: str) -> None:
    with pytest.raises(QuantityError, match=f"^{name} '-1' is negative"):
        canonical(name, "-1")


def test_a_malformed_value_error_names_the_resource() -> None:
    with pytest.raises(QuantityError, match=r"^memory '10 Gi' is not a Kubernetes quantity"):
        canonical("memory", "10 Gi")


def test_quantity_errors_are_value_errors() -> None:
    assert issubclass(QuantityError, ResourceSpecError)
    assert issubclass(QuantityError, ValueError)


# --- resource lists and arithmetic ------------------------------------------------------


def test_resource_list_converts_and_keeps_zeros() -> None:
    assert resource_list({"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": 0, "pods": 110}) == {
        "cpu": 2000, "memory": 4 * Gi, "nvidia.com/gpu": 0, "pods": 110,
    }
    assert resource_list(None) == {}
    assert resource_list({}) == {}


def test_resource_list_errors_say_where() -> None:
    with pytest.raises(QuantityError, match=r"^status\.allocatable\.cpu 'x' is not"):
        resource_list({"cpu": "x"}, "status.allocatable")
    with pytest.raises(ResourceSpecError, match="must be a map of resource name to quantity"):
        resource_list(["cpu"])  # type: ignore[arg-type]


def test_add_subtract_scale() -> None:
    a = {"cpu": 1000, "memory": 10}
    b = {"cpu": 500, "nvidia.com/gpu": 2}
    assert add(a, b) == {"cpu": 1500, "memory": 10, "nvidia.com/gpu": 2}
    assert subtract(a, b) == {"cpu": 500, "memory": 10, "nvidia.com/gpu": -2}
    assert scale(b, 3) == {"cpu": 1500, "nvidia.com/gpu": 6}
    assert a == {"cpu": 1000, "memory": 10}  # inputs untouched


@given(
    st.dictionaries(st.sampled_from(["cpu", "memory", "x/y"]), st.integers(0, 10**12)),
    st.dictionaries(st.sampled_from(["cpu", "memory", "x/y"]), st.integers(0, 10**12)),
)
def test_subtract_undoes_add(a: dict[str, int], b: dict[str, int]) -> None:
    back = subtract(add(a, b), b)
    assert {k: v for k, v in back.items() if v} == {k: v for k, v in a.items() if v}


# Amounts as Python holds them: a node's free amount, allocatable less what its pods ask,
# goes far outside 64 bits either way (each container may ask 2**63-1).
ANY_AMOUNT = st.one_of(st.integers(-4 * INT64_MAX, 4 * INT64_MAX),
                       st.integers(-AMOUNT_BOUND - 3, AMOUNT_BOUND + 3),
                       st.integers(-1000, 1000))


@given(ANY_AMOUNT, ANY_AMOUNT.filter(lambda v: v > 0))
def test_bounded_amounts_never_show_room_that_is_not_there(free: int, request: int) -> None:
    bounded = bounded_free(free)
    asked = bounded_request(request)
    assert FREE_FLOOR <= bounded <= AMOUNT_BOUND and 0 < asked <= AMOUNT_BOUND + 1
    if asked <= bounded:
        assert request <= free  # what fits bounded fits really
    if abs(free) <= AMOUNT_BOUND and request <= AMOUNT_BOUND:
        assert (asked <= bounded) == (request <= free)  # and amounts within compare exactly
    assert (bounded < 0) == (free < 0) and (bounded == 0) == (free == 0)


def test_the_bounds_leave_the_headroom_they_promise() -> None:
    """A floored free amount stays short of zero whatever fewer than 16,384 pods give
    back there (each at most one more than the bound, as the fit counts it); sums over
    32,767 nodes at the bound stay within 64 bits."""
    most = bounded_request(4 * INT64_MAX)
    assert bounded_free(-4 * INT64_MAX) + 16_383 * most < 0
    assert bounded_free(-4 * INT64_MAX) + 16_384 * most > 0
    assert 32_767 * bounded_free(4 * INT64_MAX) <= INT64_MAX < 32_768 * AMOUNT_BOUND


def test_fits() -> None:
    free = {"cpu": 4000, "memory": 8 * Gi, "nvidia.com/gpu": 8, "pods": 110}
    assert fits({"cpu": 4000, "nvidia.com/gpu": 8, "pods": 1}, free)
    assert not fits({"cpu": 4001}, free)
    assert not fits({"nvidia.com/gpu": 9}, free)
    # A resource the node does not have at all is 0 free...
    assert not fits({"example.com/fpga": 1}, free)
    # ...which is fine for a pod asking for none of it.
    assert fits({"example.com/fpga": 0, "cpu": 1}, free)
    assert fits({}, {})


# --- words for users --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "text"),
    [
        ("nvidia.com/gpu", 8, "8 nvidia.com/gpu"),
        ("cpu", 2000, "2 cpu"),
        ("cpu", 1500, "1.5 cpu"),
        ("cpu", 1250, "1.25 cpu"),
        ("cpu", 500, "500m cpu"),
        ("cpu", 1234, "1234m cpu"),
        ("cpu", 0, "0 cpu"),
        ("cpu", -1500, "-1.5 cpu"),
        ("memory", 16 * Gi, "16Gi memory"),
        ("memory", 3 * Gi // 2, "1.5Gi memory"),
        ("memory", 200 * Mi, "200Mi memory"),
        ("memory", 10**9, "1G memory"),
        ("memory", 512, "512 memory"),
        ("memory", 0, "0 memory"),
        ("memory", 1234567891, "~1.15Gi memory"),
        ("memory", -2 * Gi, "-2Gi memory"),
        ("ephemeral-storage", 10 * Gi, "10Gi ephemeral-storage"),
        ("hugepages-2Mi", 4 * Mi, "4Mi hugepages-2Mi"),
        ("pods", 1, "1 pod"),
        ("pods", 110, "110 pods"),
    ],
)
def test_format_amount(name: str, value: int, text: str) -> None:
    assert format_amount(name, value) == text


@given(st.integers(min_value=0, max_value=10**7))
def test_cpu_words_read_back_as_the_same_amount(millis: int) -> None:
    amount = format_amount("cpu", millis).removesuffix(" cpu")
    assert canonical("cpu", amount) == millis


@given(st.integers(min_value=0, max_value=2**50))
def test_exact_memory_words_read_back_as_the_same_amount(value: int) -> None:
    amount = format_amount("memory", value).removesuffix(" memory")
    if amount.startswith("~"):
        approx = parse_quantity(amount[1:])
        assert abs(approx - value) <= value / 100
    else:
        assert parse_quantity(amount) == value


@given(st.integers(min_value=1, max_value=2**20), st.sampled_from(sorted(BINARY)))
def test_whole_binary_sizes_print_exactly(n: int, suffix: str) -> None:
    value = n * BINARY[suffix]
    assume(value <= INT64_MAX)  # no amount is larger: Kubernetes caps quantities there
    text = format_amount("memory", value)
    assert not text.startswith("~")
    assert parse_quantity(text.removesuffix(" memory")) == value


def test_format_resources_order_is_extended_cpu_memory_others_pods() -> None:
    r = {"pods": 1, "memory": Gi, "cpu": 2000, "nvidia.com/gpu": 4, "ephemeral-storage": Gi,
         "amd.com/gpu": 1, "hugepages-2Mi": 0}
    assert format_resources(r) == (
        "1 amd.com/gpu, 4 nvidia.com/gpu, 2 cpu, 1Gi memory, 1Gi ephemeral-storage, 1 pod"
    )
    assert format_resources({"cpu": 0}) == "nothing"
    assert format_resources({}) == "nothing"


# --- effective pod request ------------------------------------------------------------


def container(name: str = "c", requests: dict[str, Any] | None = None,
              limits: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = requests
        devices = {k: v for k, v in requests.items() if "/" in k}
        if devices and limits is None:  # Kubernetes wants a device's limit, equal
            limits = devices
    if limits is not None:
        resources["limits"] = limits
    return {"name": name, "image": "x", "resources": resources, **extra}


def sidecar(name: str = "s", **kw: Any) -> dict[str, Any]:
    return container(name, restartPolicy="Always", **kw)


def test_empty_pod_still_takes_a_pod_slot() -> None:
    assert pod_request({}) == {"pods": 1}
    assert pod_request({"containers": [{"name": "c"}]}) == {"pods": 1}


def test_regular_containers_add_up() -> None:
    spec = {"containers": [
        container("a", {"cpu": "1", "memory": "1Gi"}),
        container("b", {"cpu": "500m", "nvidia.com/gpu": 2}),
    ]}
    assert pod_request(spec) == {"cpu": 1500, "memory": Gi, "nvidia.com/gpu": 2, "pods": 1}


def test_limits_only_container_requests_its_limits() -> None:
    spec = {"containers": [container(limits={"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": 8})]}
    assert pod_request(spec) == {"cpu": 2000, "memory": 4 * Gi, "nvidia.com/gpu": 8, "pods": 1}


def test_limit_defaults_only_the_missing_requests() -> None:
    spec = {"containers": [container(requests={"cpu": "1"}, limits={"cpu": "4", "memory": "2Gi"})]}
    assert pod_request(spec) == {"cpu": 1000, "memory": 2 * Gi, "pods": 1}


def test_a_larger_init_container_sets_the_request() -> None:
    spec = {
        "initContainers": [container("init", {"cpu": "4", "memory": "100Mi"})],
        "containers": [container("app", {"cpu": "1", "memory": "1Gi"})],
    }
    assert pod_request(spec) == {"cpu": 4000, "memory": Gi, "pods": 1}


def test_init_containers_run_one_at_a_time() -> None:
    spec = {
        "initContainers": [container("i1", {"cpu": "2"}), container("i2", {"cpu": "3"})],
        "containers": [container("app", {"cpu": "1"})],
    }
    assert pod_request(spec)["cpu"] == 3000


def test_init_container_limits_default_its_requests_too() -> None:
    spec = {"initContainers": [container("i", limits={"nvidia.com/gpu": 2})],
            "containers": [container("app", {"nvidia.com/gpu": 1})]}
    assert pod_request(spec)["nvidia.com/gpu"] == 2


def test_sidecars_run_beside_the_app_and_later_init_containers() -> None:
    spec = {
        "initContainers": [
            container("before", {"cpu": "2"}),       # runs alone: 2
            sidecar("proxy", requests={"cpu": "1"}),  # keeps running
            container("after", {"cpu": "2"}),         # runs beside proxy: 3
        ],
        "containers": [container("app", {"cpu": "1"})],  # beside proxy: 2
    }
    assert pod_request(spec)["cpu"] == 3000


def test_sidecar_adds_to_the_running_total() -> None:
    spec = {
        "initContainers": [sidecar("a", requests={"cpu": "1", "memory": "1Gi"}),
                           sidecar("b", limits={"cpu": "1"})],
        "containers": [container("app", {"cpu": "2", "memory": "1Gi"})],
    }
    assert pod_request(spec) == {"cpu": 4000, "memory": 2 * Gi, "pods": 1}


def test_restart_policy_other_than_always_is_a_normal_init_container() -> None:
    spec = {"initContainers": [container("i", {"cpu": "1"}, restartPolicy="OnFailure")],
            "containers": [container("app", {"cpu": "1"})]}
    assert pod_request(spec)["cpu"] == 1000


def test_pod_level_requests_replace_cpu_and_memory_only() -> None:
    spec = {
        "resources": {"requests": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": 99}},
        "containers": [container("a", {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": 4})],
    }
    assert pod_request(spec) == {"cpu": 8000, "memory": 32 * Gi, "nvidia.com/gpu": 4, "pods": 1}


def test_pod_level_requests_may_be_lower_than_containers() -> None:
    spec = {"resources": {"requests": {"cpu": "1"}},
            "containers": [container("a", {"cpu": "2"}), container("b", {"cpu": "2"})]}
    assert pod_request(spec)["cpu"] == 1000


def test_pod_level_request_for_one_resource_keeps_the_other_from_containers() -> None:
    spec = {"resources": {"requests": {"cpu": "4"}},
            "containers": [container("a", {"cpu": "1", "memory": "3Gi"})]}
    assert pod_request(spec) == {"cpu": 4000, "memory": 3 * Gi, "pods": 1}


def test_pod_level_limits_only_default_the_pod_level_requests() -> None:
    spec = {"resources": {"limits": {"cpu": "6", "memory": "8Gi"}},
            "containers": [container("a", {"cpu": "1"})]}
    assert pod_request(spec) == {"cpu": 6000, "memory": 8 * Gi, "pods": 1}


def test_overhead_comes_on_top_even_of_pod_level_requests() -> None:
    spec = {"overhead": {"cpu": "250m", "memory": "120Mi"},
            "resources": {"requests": {"cpu": "1"}},
            "containers": [container("a", {"cpu": "2", "memory": "1Gi"})]}
    assert pod_request(spec) == {"cpu": 1250, "memory": Gi + 120 * Mi, "pods": 1}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"containers": [container("trainer", {"memory": "10 Gi"})]},
         r"^containers\[0\] \(trainer\): resources\.requests\.memory '10 Gi' is not a Kubernetes"),
        ({"containers": [{"resources": {"limits": {"cpu": "1x"}}}]},
         r"^containers\[0\]: resources\.limits\.cpu '1x' is not"),
        ({"containers": [container("a"), container("b", {"nvidia.com/gpu": "-1"}, limits={})]},
         r"^containers\[1\] \(b\): resources\.requests\.nvidia\.com/gpu '-1' is negative"),
        ({"initContainers": [container("setup", limits={"memory": "1GB"})]},
         r"^initContainers\[0\] \(setup\): resources\.limits\.memory '1GB' is not"),
        ({"overhead": {"cpu": "lots"}}, r"^overhead\.cpu 'lots' is not"),
        ({"resources": {"requests": {"memory": "-1Gi"}}},
         r"^resources\.requests\.memory '-1Gi' is negative"),
    ],
)
def test_bad_quantities_name_the_container_and_resource(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(QuantityError, match=message):
        pod_request(spec)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"containers": {"name": "a"}}, r"^containers must be a list"),
        ({"containers": ["a"]}, r"^containers\[0\] must be a container"),
        ({"initContainers": [container("a")], "containers": [{"name": "b", "resources": 1}]},
         r"^containers\[0\] \(b\): resources must be a map"),
        ({"containers": [{"name": "b", "resources": {"requests": ["cpu"]}}]},
         r"^containers\[0\] \(b\): resources\.requests must be a map"),
    ],
)
def test_malformed_pod_specs_say_what_is_wrong(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ResourceSpecError, match=message):
        pod_request(spec)


# Properties over random pods: small amounts of two resources, some sidecars.
amounts = st.dictionaries(st.sampled_from(["cpu", "nvidia.com/gpu"]), st.integers(0, 16))
containers = st.lists(amounts, max_size=4)
inits = st.lists(st.tuples(amounts, st.booleans()), max_size=4)


def build(regular: list[dict[str, int]], init: list[tuple[dict[str, int], bool]]) -> dict[str, Any]:
    return {
        "containers": [container(f"c{i}", dict(r)) for i, r in enumerate(regular)],
        "initContainers": [
            sidecar(f"i{i}", requests=dict(r)) if is_sidecar else container(f"i{i}", dict(r))
            for i, (r, is_sidecar) in enumerate(init)
        ],
    }


def at_least(big: dict[str, int], small: dict[str, int]) -> bool:
    return all(big.get(k, 0) >= v for k, v in small.items())


@given(containers, inits)
def test_the_pod_request_covers_every_container(
    regular: list[dict[str, int]], init: list[tuple[dict[str, int], bool]]
) -> None:
    result = pod_request(build(regular, init))
    assert result["pods"] == 1
    for r in regular:
        assert at_least(result, {k: v * 1000 if k == "cpu" else v for k, v in r.items()})
    for r, _ in init:
        assert at_least(result, {k: v * 1000 if k == "cpu" else v for k, v in r.items()})
    # Sidecars and regular containers all run together.
    together = [r for r in regular] + [r for r, is_sidecar in init if is_sidecar]
    total: dict[str, int] = {}
    for r in together:
        total = add(total, {k: v * 1000 if k == "cpu" else v for k, v in r.items()})
    assert at_least(result, total)


@given(containers, inits)
def test_order_of_regular_containers_does_not_matter(
    regular: list[dict[str, int]], init: list[tuple[dict[str, int], bool]]
) -> None:
    assert pod_request(build(regular, init)) == pod_request(build(regular[::-1], init))


@given(containers)
def test_without_init_containers_the_request_is_the_sum(regular: list[dict[str, int]]) -> None:
    total: dict[str, int] = {"pods": 1}
    for r in regular:
        total = add(total, {k: v * 1000 if k == "cpu" else v for k, v in r.items()})
    assert pod_request(build(regular, [])) == total


@given(containers, inits, st.integers(0, 8))
def test_overhead_adds_exactly(
    regular: list[dict[str, int]], init: list[tuple[dict[str, int], bool]], extra: int
) -> None:
    spec = build(regular, init)
    base = pod_request(spec)
    with_overhead = pod_request({**spec, "overhead": {"cpu": extra}})
    assert with_overhead == add(base, {"cpu": extra * 1000})
