"""Who created an AppWrapper, and whether they may create what it wraps.

The dispatcher creates wrapped objects with its own service account, so without a check
anyone allowed to create an AppWrapper could have it create anything the dispatcher may.
The admission webhook (webhook/server.py) records the creator in annotations the user cannot
forge, and asks the API server, as that user, whether they may ``create`` each wrapped
object's resource in the AppWrapper's namespace (a SubjectAccessReview). Kinds are mapped
to resources by API discovery, so any kind works, CRDs included, and the discovery answer
also says whether a kind is namespaced: cluster-scoped kinds are never wrapped.

:func:`creator_denials` asks the same questions again for the recorded creator, for the
controller to call just before it creates the objects: RBAC may have changed while the
AppWrapper waited in the queue.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from dispatcher.api.models import API_GROUP, AppWrapper
from dispatcher.controller.kube.client import ApiError, Kube, Resource

CREATOR = f"{API_GROUP}/creator"
CREATOR_UID = f"{API_GROUP}/creator-uid"
CREATOR_GROUPS = f"{API_GROUP}/creator-groups"
CREATOR_EXTRA = f"{API_GROUP}/creator-extra"
CREATOR_ANNOTATIONS = (CREATOR, CREATOR_UID, CREATOR_GROUPS, CREATOR_EXTRA)

SUBJECT_ACCESS_REVIEWS = Resource("authorization.k8s.io/v1", "SubjectAccessReview",
                                  "subjectaccessreviews", False)

NO_CREATOR = (
    "no creator is recorded on this AppWrapper (annotation {key}): it was created while the "
    "dispatcher's admission webhook was not installed, so nobody checked that its author may "
    "create what it wraps; apply it again"
)


@dataclass(frozen=True)
class UserInfo:
    """A user as the API server authenticated them (AdmissionReview ``userInfo``)."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @classmethod
    def from_request(cls, info: Mapping[str, Any]) -> UserInfo:
        extra = info.get("extra") or {}
        return cls(
            username=str(info.get("username") or ""),
            uid=str(info.get("uid") or ""),
            groups=tuple(str(g) for g in info.get("groups") or ()),
            extra=tuple(sorted((str(k), tuple(str(v) for v in values or ()))
                               for k, values in extra.items())),
        )

    def annotations(self) -> dict[str, str]:
        """The creator annotations that record this user."""
        out = {CREATOR: self.username, CREATOR_UID: self.uid,
               CREATOR_GROUPS: json.dumps(list(self.groups))}
        if self.extra:
            out[CREATOR_EXTRA] = json.dumps({k: list(v) for k, v in self.extra})
        return out

    @classmethod
    def from_annotations(cls, annotations: Mapping[str, str]) -> UserInfo | None:
        """The recorded creator; None if none is recorded. Raises ValueError if the
        annotations are not what the webhook writes."""
        username = annotations.get(CREATOR)
        if not username:
            return None
        try:
            groups = json.loads(annotations.get(CREATOR_GROUPS) or "[]")
            extra = json.loads(annotations.get(CREATOR_EXTRA) or "{}")
        except ValueError as e:
            raise ValueError(f"the creator annotations are not readable: {e}") from None
        if not (isinstance(groups, list) and isinstance(extra, dict)):
            raise ValueError(f"annotation {CREATOR_GROUPS} must be a JSON list and "
                             f"{CREATOR_EXTRA} a JSON object")
        return cls.from_request({"username": username, "uid": annotations.get(CREATOR_UID),
                                 "groups": groups, "extra": extra})

    def sar_subject(self) -> dict[str, Any]:
        subject: dict[str, Any] = {"user": self.username, "groups": list(self.groups)}
        if self.uid:
            subject["uid"] = self.uid
        if self.extra:
            subject["extra"] = {k: list(v) for k, v in self.extra}
        return subject


@dataclass(frozen=True)
class Item:
    """One wrapped object, as far as access is concerned."""

    index: int
    api_version: str
    kind: str
    name: str

    @property
    def group_kind(self) -> tuple[str, str]:
        return self.api_version.rpartition("/")[0], self.kind

    @property
    def where(self) -> str:
        name = f" {self.name!r}" if self.name else ""
        return f"spec.resources.GenericItems[{self.index}] ({self.kind}{name})"


def wrapped_items(obj: AppWrapper | Mapping[str, Any]) -> list[Item]:
    """The items of an AppWrapper that say what they are (apiVersion and kind); the
    others are reported by the spec's validation."""
    if isinstance(obj, AppWrapper):
        templates: Iterable[Any] = (i.generictemplate for i in obj.spec.resources.GenericItems)
    else:
        generic = ((obj.get("spec") or {}).get("resources") or {}).get("GenericItems")
        generic = generic if isinstance(generic, list) else []
        templates = (i.get("generictemplate") if isinstance(i, Mapping) else None
                     for i in generic)
    items = []
    for index, template in enumerate(templates):
        if not isinstance(template, Mapping):
            continue
        api_version, kind = template.get("apiVersion"), template.get("kind")
        if not (isinstance(api_version, str) and api_version
                and isinstance(kind, str) and kind):
            continue
        meta = template.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        name = meta.get("name") or meta.get("generateName") or ""
        items.append(Item(index, api_version, kind, str(name)))
    return items


def resource_name(resource: Resource) -> str:
    """``jobs.batch``, ``pods``: how kubectl and RBAC messages name a resource."""
    group = resource.api_version.rpartition("/")[0]
    return f"{resource.plural}.{group}" if group else resource.plural


# Discovery lookups or SubjectAccessReviews one review has in flight at once, at most.
LOOKUPS_AT_ONCE = 4
# A review that has found this many kinds the cluster does not serve looks up no more
# group/versions: the answer is a refusal whatever the rest are, and the refusal's message
# (capped) would have room for few more lines.
MAX_UNSERVED = 8

T = TypeVar("T")
VersionKind = tuple[str, str]  # (apiVersion, kind)


async def _few_at_a_time(calls: Sequence[Callable[[], Awaitable[T]]],
                         enough: Callable[[list[T]], bool] = lambda _: False) -> list[T]:
    """The calls' answers, in order, with at most :data:`LOOKUPS_AT_ONCE` of them in
    flight; once the answers so far are ``enough``, the calls not made yet are not."""
    answers: list[T] = []
    for start in range(0, len(calls), LOOKUPS_AT_ONCE):
        if enough(answers):
            break
        batch = calls[start:start + LOOKUPS_AT_ONCE]
        answers += await asyncio.gather(*(call() for call in batch))
    return answers


@dataclass
class Access:
    """Discovery and SubjectAccessReviews through one API client."""

    kube: Kube

    async def _kinds_of(self, api_version: str, kinds: Sequence[str]
                       ) -> dict[str, Resource | None]:
        """The REST resource of each of ``kinds`` of one group/version (None: not served),
        in one lookup; a kept answer that misses one is looked up afresh once (its CRD
        may have been installed since). A miss is not kept: anyone may make up
        group/versions."""
        kept = self.kube.knows(api_version)
        found = {kind: await self.kube.resource(api_version, kind) for kind in kinds}
        if None in found.values():
            self.kube.forget(api_version)
            if kept:
                found = {kind: await self.kube.resource(api_version, kind) for kind in kinds}
                if None in found.values():
                    self.kube.forget(api_version)
        return found

    async def may(self, user: UserInfo, verb: str, resource: Resource, namespace: str,
                  name: str = "", subresource: str = "") -> bool:
        """Whether ``user`` may ``verb`` ``resource`` (the one called ``name``, its
        ``subresource``, if given) in ``namespace``, by the API server's authorizers
        (RBAC and any other)."""
        group, _, version = resource.api_version.rpartition("/")
        attributes = {"namespace": namespace, "verb": verb, "group": group,
                      "version": version, "resource": resource.plural}
        if name:
            attributes["name"] = name
        if subresource:
            attributes["subresource"] = subresource
        body = {
            "apiVersion": SUBJECT_ACCESS_REVIEWS.api_version, "kind": "SubjectAccessReview",
            "spec": {**user.sar_subject(), "resourceAttributes": attributes},
        }
        review = await self.kube.request("POST", SUBJECT_ACCESS_REVIEWS.path(), body)
        return bool((review.get("status") or {}).get("allowed"))

    async def _resources(self, items: Sequence[Item], stop_after: int | None
                         ) -> dict[VersionKind, Resource | None]:
        """The resource of each item's kind (None: not served), each group/version looked
        up once, in the items' order; with ``stop_after``, no more lookups once that many
        kinds are found not served (the items not looked up are not in the answer)."""
        versions: dict[str, dict[str, None]] = {}
        for item in items:
            versions.setdefault(item.api_version, {})[item.kind] = None

        def enough(answers: list[dict[str, Resource | None]]) -> bool:
            return stop_after is not None and stop_after <= sum(
                r is None for answer in answers for r in answer.values())

        answers = await _few_at_a_time(
            [functools.partial(self._kinds_of, v, list(kinds)) for v, kinds in versions.items()],
            enough)
        # Fewer answers than versions when it stopped early.
        return {(version, kind): resource
                for version, answer in zip(versions, answers, strict=False)
                for kind, resource in answer.items()}

    async def denials(self, user: UserInfo, namespace: str, items: Sequence[Item],
                      unserved: bool = True) -> list[str]:
        """One line per item ``user`` may not create in ``namespace`` (or that is
        cluster-scoped; or, with ``unserved``, whose kind the cluster does not serve).
        Each distinct group/version is looked up once, each distinct resource reviewed
        once, a few at a time. With ``unserved``, once :data:`MAX_UNSERVED` kinds are
        found not served the rest is not looked up, and a first line says so.

        Raises :class:`ApiError` when the API server cannot answer."""
        resolved = await self._resources(items, MAX_UNSERVED if unserved else None)
        problems: dict[int, str] = {}
        unchecked: list[Item] = []
        to_review: dict[Resource, list[Item]] = {}
        for item in items:
            if (item.api_version, item.kind) not in resolved:
                unchecked.append(item)
                continue
            resource = resolved[item.api_version, item.kind]
            if resource is None:
                if unserved:
                    problems[item.index] = (
                        f"{item.where}: kind {item.kind} ({item.api_version}) is not served "
                        "by this cluster; install its CRD or operator, then apply the "
                        "AppWrapper again")
            elif not resource.namespaced:
                problems[item.index] = (
                    f"{item.where}: {item.kind} is cluster-scoped; an AppWrapper wraps only "
                    "objects of its own namespace")
            else:
                to_review.setdefault(resource, []).append(item)
        resources = list(to_review)
        answers = await _few_at_a_time(
            [functools.partial(self.may, user, "create", r, namespace) for r in resources])
        for resource, allowed in zip(resources, answers, strict=True):
            if allowed:
                continue
            for item in to_review[resource]:
                problems[item.index] = (
                    f"{item.where}: {user.username} may not create {resource_name(resource)} "
                    f"in namespace {namespace}")
        lines = [problems[i] for i in sorted(problems)]
        if unchecked:  # first: a capped message may not show the last line
            lines.insert(0, (
                f"spec.resources.GenericItems: {len(unchecked)} wrapped objects were not "
                f"checked (from {unchecked[0].where} on): those before them already name "
                f"{MAX_UNSERVED} kinds this cluster does not serve; correct those first"))
        return lines


async def creator_denials(kube: Kube, aw: AppWrapper | Mapping[str, Any], *,
                          require_creator: bool = True) -> list[str]:
    """Why the recorded creator of ``aw`` may not have its items created now: one line
    per item they may not create in its namespace, or that is cluster-scoped. Empty when
    every item is allowed. Kinds the cluster does not serve are left to the caller (its
    create fails with a message of its own).

    Without a recorded creator (an AppWrapper from before the webhook was installed) the
    answer is a denial saying so, unless ``require_creator`` is False.

    Raises :class:`~dispatcher.controller.kube.client.ApiError` when the API server cannot
    answer (try again later; it says nothing about the user).
    """
    if isinstance(aw, AppWrapper):
        annotations: Mapping[str, str] = aw.metadata.annotations
        namespace = aw.metadata.namespace
    else:
        meta = aw.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        namespace = str(meta.get("namespace") or "default")
    try:
        creator = UserInfo.from_annotations(annotations)
    except ValueError as e:
        return [str(e)]
    if creator is None:
        return [NO_CREATOR.format(key=CREATOR)] if require_creator else []
    return await Access(kube).denials(creator, namespace, wrapped_items(aw), unserved=False)


__all__ = [
    "CREATOR_ANNOTATIONS",
    "LOOKUPS_AT_ONCE",
    "MAX_UNSERVED",
    "Access",
    "ApiError",
    "Item",
    "UserInfo",
    "creator_denials",
    "wrapped_items",
]
