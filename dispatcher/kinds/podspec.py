"""A pod template's demand: its effective request and the node rules it carries.

Constraints are normalised (sorted, duplicates dropped) because equal constraints
must compare and hash equal: fit answers are cached by them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from dispatcher.kinds.base import InvalidItem, Path, as_map, child_list, child_map, path_text
from dispatcher.kinds.podset import (
    PodConstraints,
    PodSet,
    Requirement,
    Toleration,
    TopologyRequest,
)
from dispatcher.resources import ResourceSpecError, pod_request

TOLERATION_OPERATORS = frozenset({"Equal", "Exists"})
SET_OPERATORS = frozenset({"In", "NotIn"})
EXISTENCE_OPERATORS = frozenset({"Exists", "DoesNotExist"})
NUMBER_OPERATORS = frozenset({"Gt", "Lt"})
# The only field kube-scheduler supports in matchFields; nodeName pins to it too.
NODE_NAME_FIELD = "metadata.name"
# Kueue's topology annotations (on a pod template, or on the AppWrapper for the whole gang).
REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"

Term = tuple[Requirement, ...]


def _split(path_str: str) -> Path:
    return (path_str,) if path_str else ()


def _tolerations(spec: Mapping[str, Any], path: Path) -> tuple[Toleration, ...]:
    found: set[Toleration] = set()
    for i, raw in enumerate(child_list(spec, "tolerations", path)):
        t = as_map(raw, (*path, "tolerations", i))
        operator = str(t.get("operator") or "Equal")
        if operator not in TOLERATION_OPERATORS:
            where = path_text((*path, "tolerations", i, "operator"))
            raise InvalidItem(f"{where} is {operator!r}: use Equal or Exists")
        found.add(Toleration(
            key=str(t.get("key") or ""),
            operator=operator,
            value=str(t.get("value") or ""),
            effect=str(t.get("effect") or ""),
        ))
    return tuple(sorted(found, key=lambda t: (t.key, t.operator, t.value, t.effect)))


def _requirement(raw: object, path: Path, fields: bool) -> Requirement:
    r = as_map(raw, path)
    key = str(r.get("key") or "")
    operator = str(r.get("operator") or "")
    values = [str(v) for v in child_list(r, "values", path)]
    if fields and key != NODE_NAME_FIELD:
        raise InvalidItem(
            f"{path_text((*path, 'key'))} is {key!r}: matchFields supports only {NODE_NAME_FIELD}"
        )
    allowed = SET_OPERATORS if fields else (SET_OPERATORS | EXISTENCE_OPERATORS | NUMBER_OPERATORS)
    if operator not in allowed:
        raise InvalidItem(
            f"{path_text((*path, 'operator'))} is {operator!r}: use one of "
            + ", ".join(sorted(allowed))
        )
    if operator in SET_OPERATORS:
        return Requirement(key, operator, tuple(sorted(set(values))))
    if operator in EXISTENCE_OPERATORS:
        return Requirement(key, operator)
    return Requirement(key, operator, tuple(values))


def _term_key(term: Term) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
    return tuple((r.key, r.operator, r.values) for r in term)


def _affinity_terms(spec: Mapping[str, Any], path: Path) -> tuple[Term, ...]:
    affinity = child_map(spec, "affinity", path)
    node_affinity = child_map(affinity, "nodeAffinity", (*path, "affinity"))
    required_path: Path = (*path, "affinity", "nodeAffinity")
    key = "requiredDuringSchedulingIgnoredDuringExecution"
    if node_affinity.get(key) is None:
        return ()
    required = child_map(node_affinity, key, required_path)
    terms_path: Path = (*required_path, key)
    raw_terms = child_list(required, "nodeSelectorTerms", terms_path)
    if not raw_terms:
        raise InvalidItem(
            f"{path_text((*terms_path, 'nodeSelectorTerms'))} is empty: list at least one term "
            "or drop requiredDuringSchedulingIgnoredDuringExecution"
        )
    terms: set[Term] = set()
    for i, raw in enumerate(raw_terms):
        tpath: Path = (*terms_path, "nodeSelectorTerms", i)
        term = as_map(raw, tpath)
        reqs = {
            _requirement(e, (*tpath, field, j), fields=field == "matchFields")
            for field in ("matchExpressions", "matchFields")
            for j, e in enumerate(child_list(term, field, tpath))
        }
        # An empty term stays: it selects no node, which the fit layer knows.
        terms.add(tuple(sorted(reqs, key=lambda r: (r.key, r.operator, r.values))))
    return tuple(sorted(terms, key=_term_key))


def _pin_to_node(terms: tuple[Term, ...], node_name: str) -> tuple[Term, ...]:
    """A pod with spec.nodeName skips the scheduler and lands on that node or nowhere."""
    pin = Requirement(NODE_NAME_FIELD, "In", (node_name,))
    pinned = {tuple(sorted({*t, pin}, key=lambda r: (r.key, r.operator, r.values)))
              for t in terms or ((),)}
    return tuple(sorted(pinned, key=_term_key))


def constraints_of(spec: Mapping[str, Any], path: str = "spec") -> PodConstraints:
    """The node rules of a PodSpec: nodeSelector, tolerations, required node affinity.

    matchFields on `metadata.name` and `spec.nodeName` both become Requirements with
    key `metadata.name`. Preferred affinity and pod (anti-)affinity are not filters of
    node choice alone and are left out. `path` locates the spec in error messages.
    """
    where = _split(path)
    selector = child_map(spec, "nodeSelector", where)
    terms = _affinity_terms(spec, where)
    node_name = spec.get("nodeName")
    if node_name:
        terms = _pin_to_node(terms, str(node_name))
    return PodConstraints(
        node_selector=tuple(sorted((str(k), str(v)) for k, v in selector.items())),
        tolerations=_tolerations(spec, where),
        affinity_terms=terms,
    )


def topology_request(annotations: Mapping[str, Any], where: str,
                     whole_gang: bool = False) -> TopologyRequest | None:
    """The topology request of Kueue's annotations, if any; `where` names the annotations
    in error messages. Whether the level is one the installation has is checked at
    admission, which knows the configured levels."""
    found = [(key, annotations[key]) for key in (REQUIRED_TOPOLOGY, PREFERRED_TOPOLOGY)
             if key in annotations]
    if not found:
        return None
    if len(found) > 1:
        raise InvalidItem(f"{where} has both {REQUIRED_TOPOLOGY} and {PREFERRED_TOPOLOGY}: "
                          "keep one")
    key, level = found[0]
    if not isinstance(level, str) or not level:
        raise InvalidItem(f"{where}[{key}] must name a topology level (a node label), "
                          "e.g. cloud.provider.com/topology-rack")
    return TopologyRequest(level, key == REQUIRED_TOPOLOGY, whole_gang)


def pod_set_from_spec(name: str, count: int, spec: object, path: str) -> PodSet:
    """`count` pods of PodSpec `spec`, which sits at `path` (for error messages)."""
    if count < 0:
        raise ValueError(f"a pod set cannot have {count} pods")
    if spec is None:
        spec = {}
    pod_spec = as_map(spec, _split(path))
    try:
        request = pod_request(pod_spec)
    except ResourceSpecError as e:
        raise InvalidItem(f"{path}.{e}") from None
    return PodSet(name, count, request, constraints_of(pod_spec, path))


# Wrappers of one shape carry the same pod template (a thousand jobs of one container of 8
# GPUs), and reading ten thousand of them at once (`plan --live`) would work out the same
# pod set for each: a template's pod set is remembered by the template as written -- its
# repr: every value with its type, in order -- for the few hundred shapes a cluster has.
# Only a template read from YAML or JSON (plain dicts, whose repr is faithful) and of a
# modest size is remembered; a template that is refused is worked out each time.
_REMEMBERED = 1024
_LONGEST = 16_384  # characters of repr
_pod_sets: dict[tuple[str, int, str, str], PodSet] = {}


def pod_set_from_template(
    name: str, count: int, template: Mapping[str, Any] | None, *, path: str = "template"
) -> PodSet:
    """`count` pods of a PodTemplateSpec ({metadata, spec}); a missing template or spec
    is an empty pod (it still takes one of the node's pod slots).

    `path` locates the template in the wrapped object ("" for a Pod, which is its own
    template) so that errors name the exact field.
    """
    if type(template) is not dict:
        return _pod_set_from_template(name, count, template, path)
    key = (name, count, path, repr(template))
    if len(key[3]) > _LONGEST:
        return _pod_set_from_template(name, count, template, path)
    found = _pod_sets.get(key)
    if found is None:
        found = _pod_set_from_template(name, count, template, path)
        if len(_pod_sets) >= _REMEMBERED:
            _pod_sets.clear()
        _pod_sets[key] = found
    return found


def _pod_set_from_template(name: str, count: int, template: Mapping[str, Any] | None,
                           path: str) -> PodSet:
    tmpl = {} if template is None else as_map(template, _split(path) or ("object",))
    pod_set = pod_set_from_spec(name, count, tmpl.get("spec"), f"{path}.spec" if path else "spec")
    metadata = child_map(tmpl, "metadata", _split(path))
    where = f"{path}.metadata" if path else "metadata"
    annotations = child_map(metadata, "annotations", _split(where))
    topology = topology_request(annotations, f"{where}.annotations")
    return pod_set if topology is None else dataclasses.replace(pod_set, topology=topology)
