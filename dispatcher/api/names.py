"""Object names the API server accepts, checked before dispatch.

An AppWrapper whose item the API server would refuse for its name fails at dispatch
time, after it waited its turn; checking the same rules first says so at once, in the
user's terms. The rules are the API server's for each kind (most kinds: a DNS-1123
subdomain; Services: a DNS-1035 label), plus the lengths that labels impose where a
name becomes a label value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAX_LABEL_VALUE = 63
MAX_SUBDOMAIN = 253
# generateName gets this many characters appended (see controller.items.stable_name).
GENERATED_SUFFIX = 5

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")
_DNS1123_LABEL = re.compile(_LABEL)
_DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


@dataclass(frozen=True)
class NameRule:
    """What a name must look like: `syntax` (a description), `pattern`, and at most
    `max_length` characters, for the reason `why_length` when that is not the syntax's own."""

    syntax: str
    pattern: re.Pattern[str]
    max_length: int
    why_length: str = ""


SUBDOMAIN = NameRule(
    "a DNS-1123 subdomain: lower-case letters, digits, '-' and '.', starting and ending "
    "with a letter or digit", _DNS1123_SUBDOMAIN, MAX_SUBDOMAIN)
DNS1123_LABEL = NameRule(
    "a DNS-1123 label: lower-case letters, digits and '-', starting and ending with a "
    "letter or digit", _DNS1123_LABEL, MAX_LABEL_VALUE)
DNS1035_LABEL = NameRule(
    "a DNS-1035 label: lower-case letters, digits and '-', starting with a letter and "
    "ending with a letter or digit", _DNS1035_LABEL, MAX_LABEL_VALUE)
APPWRAPPER_NAME = NameRule(
    SUBDOMAIN.syntax, _DNS1123_SUBDOMAIN, MAX_LABEL_VALUE,
    "the objects it creates, and their pods, carry it as a label value")
JOB_NAME = NameRule(
    SUBDOMAIN.syntax, _DNS1123_SUBDOMAIN, MAX_LABEL_VALUE,
    "the Job's pods carry its name as a label value")


def item_name_rule(group: str, kind: str, template: Mapping[str, Any]) -> NameRule:
    """The API server's rule for the name of a `kind` object of API group `group`."""
    if (group, kind) == ("", "Service"):
        return DNS1035_LABEL
    if (group, kind) == ("", "Namespace"):
        return DNS1123_LABEL
    if (group, kind) == ("batch", "Job"):
        spec = template.get("spec")
        manual = isinstance(spec, Mapping) and spec.get("manualSelector") is True
        return SUBDOMAIN if manual else JOB_NAME
    return SUBDOMAIN


def name_problem(name: str, rule: NameRule, what: str, suggest: bool = True) -> str | None:
    """Why `name` breaks `rule`, for a message about `what` ("a StatefulSet name"), or None;
    with `suggest`, the message offers a close valid name when there is an easy one."""
    if not name:
        return f"must not be empty: {what} is {rule.syntax}"
    if len(name) <= rule.max_length and rule.pattern.fullmatch(name):
        return None
    hint = _suggest(name, rule) if suggest else ""
    if len(name) > rule.max_length:
        why = f" ({rule.why_length})" if rule.why_length else ""
        return f"is {len(name)} characters long; {what} has at most {rule.max_length}{why}{hint}"
    return f"{_quote(name)} is not valid: {what} is {rule.syntax}{hint}"


def is_label_value(value: str) -> bool:
    return len(value) <= MAX_LABEL_VALUE and _LABEL_VALUE.fullmatch(value) is not None


def _quote(name: str) -> str:
    return repr(name) if len(name) <= 60 else repr(name[:57] + "...")


def _suggest(name: str, rule: NameRule) -> str:
    """A close valid name, when one is easy to make."""
    dots = rule.pattern is _DNS1123_SUBDOMAIN
    fixed = re.sub(r"[^a-z0-9.-]" if dots else r"[^a-z0-9-]", "-", name.lower())
    fixed = re.sub(r"-{2,}", "-", fixed)[: rule.max_length].strip("-.")
    if rule.pattern is _DNS1035_LABEL:
        fixed = fixed.lstrip("0123456789-")
    if not fixed or fixed == name or not rule.pattern.fullmatch(fixed):
        return ""
    return f", e.g. {fixed!r}"
