"""A failed API call in one line a user can act on: what was asked of which server, what
went wrong, and what to do — "0 ClientConnectorError" and a bare 403 say none of that."""

from __future__ import annotations

from dataclasses import dataclass

from .client import NO_ANSWER, ApiError, Request

# Who needs a grant the API server refused, for `dispatcher run` and `dispatcher webhook`.
DISPATCHER = "the dispatcher's ServiceAccount"
DISPATCHER_HINT = "deploy/'s roles grant all it needs"


@dataclass(frozen=True)
class Permission:
    """What RBAC must allow for one request."""

    verb: str
    resource: str  # "pods", "pods/status"
    group: str  # "" for the core group
    namespace: str | None  # None: cluster-wide

    def __str__(self) -> str:
        where = f"in namespace {self.namespace}" if self.namespace else "cluster-wide"
        return (f"verb {self.verb!r} on {self.resource!r} (apiGroup {self.group!r}) "
                f"{where}")


def permission(request: Request) -> Permission | None:
    """The RBAC rule a request needs; None for a path that is not a resource's."""
    parts = [p for p in request.path.split("?")[0].split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest:
        return None
    resource = rest[0] + (f"/{rest[2]}" if len(rest) >= 3 else "")
    named = len(rest) >= 2
    verbs = {"WATCH": "watch", "POST": "create", "PUT": "update", "PATCH": "patch",
             "DELETE": "delete" if named else "deletecollection",
             "GET": "get" if named else "list"}
    verb = verbs.get(request.method.upper())
    return None if verb is None else Permission(verb, resource, group, namespace)


def untrusted_certificate(error: ApiError) -> bool:
    """The connection failed because the server's certificate was not verified (a
    self-signed one, or another CA's): its cause is the CA, not a server that is down."""
    text = f"{error.reason} {error.message}".lower()
    return "certificate" in text and ("verif" in text or "self-signed" in text
                                      or "self signed" in text)


def explain(error: ApiError, grantee: str = DISPATCHER, hint: str = DISPATCHER_HINT) -> str:
    """One line for `error`; `grantee`: who needs a grant the API server refused, and
    `hint`: where to find it."""
    request = error.request
    server = request.server if request is not None else "the API server"
    asked = f"{request.method} {request.path}" if request is not None else "a request"
    if error.status == NO_ANSWER and untrusted_certificate(error):
        return (f"cannot reach the API server at {server}: its certificate is not trusted "
                f"({error.message}): give the kubeconfig's cluster the CA that signed it "
                "(kubectl config set-cluster NAME --certificate-authority=CA.crt "
                "--embed-certs), or check that the server address is one the certificate "
                "names")
    if error.status == NO_ANSWER:
        return (f"cannot reach the API server at {server} ({error.reason}: {error.message}): "
                "is it running, and is the kubeconfig's server address right?")
    if error.status == 401:
        return (f"the API server at {server} refused the credentials (401 Unauthorized) "
                f"for {asked}: the token or certificate is expired, revoked or wrong")
    if error.status == 403:
        needed = permission(request) if request is not None else None
        grant = f"; {grantee} needs RBAC {needed}" if needed is not None else ""
        return f"forbidden (403): {asked}: {error.message}{grant} ({hint})"
    return f"{asked}: the API server at {server} answered {error}"
