"""The ConversionReview the API server posts to the conversion webhook: every object of a
request converted (dispatcher.api.conversion), and what a v1beta2 reader is shown of an
object that cannot be converted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dispatcher.api.conversion import (
    UNCONVERTED_ANNOTATION,
    ConversionError,
    convert,
    v1beta2_status,
)
from dispatcher.api.models import APPWRAPPER_API_VERSION
from dispatcher.api.v1beta2 import APPWRAPPER_API_VERSION_V1BETA2


def conversion_response(request: Mapping[str, Any]) -> dict[str, Any]:
    """The ``response`` of a ConversionReview (apiextensions.k8s.io/v1) whose ``request``
    is given: every object in ``desiredAPIVersion``. The API server converts a whole list
    in one review, so one object's content never fails a read: an object that cannot be
    shown as v1beta2 is shown as far as it can be (:func:`unconverted`). A conversion to
    v1beta1 is a write of that one object: it fails, saying which object and why (the API
    server then refuses the write)."""
    uid = str(request.get("uid") or "")
    desired = str(request.get("desiredAPIVersion") or "")
    converted: list[dict[str, Any]] = []
    for index, obj in enumerate(request.get("objects") or []):
        try:
            if not isinstance(obj, Mapping):
                raise ConversionError("must be a mapping")
            converted.append(convert(obj, desired))
        except Exception as e:  # a RecursionError or a ValueError deep inside included
            if desired == APPWRAPPER_API_VERSION_V1BETA2 and isinstance(obj, Mapping) \
                    and obj.get("apiVersion") == APPWRAPPER_API_VERSION:
                converted.append(unconverted(obj, _why(e)))
                continue
            meta = obj.get("metadata") if isinstance(obj, Mapping) else None
            name = f"{meta.get('namespace')}/{meta.get('name')}" \
                if isinstance(meta, Mapping) else f"object {index}"
            return {"uid": uid, "convertedObjects": [],
                    "result": {"status": "Failure", "message": f"AppWrapper {name}: {_why(e)}"}}
    return {"uid": uid, "convertedObjects": converted, "result": {"status": "Success"}}


def _why(e: Exception) -> str:
    if isinstance(e, ConversionError):
        return str(e)
    if isinstance(e, RecursionError):
        return "it nests too deep to be converted; flatten it"
    return f"it cannot be converted ({type(e).__name__}: {str(e)[:200]})"


def unconverted(obj: Mapping[str, Any], why: str) -> dict[str, Any]:
    """A v1beta1 AppWrapper that cannot be converted, for a v1beta2 reader: its metadata (a
    list shows it, a watch follows it, kubectl delete works), no components, the status
    as far as it can be worked out, and the annotation :data:`UNCONVERTED_ANNOTATION`
    saying why. That form is never written back: :func:`to_v1beta1` refuses it, so an
    edit through v1beta2 cannot replace the stored spec with an empty one."""
    metadata = dict(obj["metadata"]) if isinstance(obj.get("metadata"), Mapping) else {}
    annotations = metadata.get("annotations")
    metadata["annotations"] = {**(annotations if isinstance(annotations, Mapping) else {}),
                               UNCONVERTED_ANNOTATION: why}
    result: dict[str, Any] = {"apiVersion": APPWRAPPER_API_VERSION_V1BETA2,
                              "kind": obj.get("kind") or "AppWrapper", "metadata": metadata,
                              "spec": {"components": []}}
    if "status" in obj:
        try:
            result["status"] = v1beta2_status(obj["status"], metadata, {})
        except Exception:  # the status is the dispatcher's; shown empty rather than failing
            result["status"] = {}
    return result
