"""The AdmissionReview v1 wire format: decode a request and encode the response (the webhook's side),
encode a request (the API server's side: the simulator, the benchmarks and the tests post what
`render_review` builds, so every review body has this one shape).

Decoding is strict about what identifies the call (apiVersion, kind, request.uid, operation,
resource) and lenient about the rest, since the API server adds fields over releases. Every problem
is a MalformedReview naming the field path; a server answers it with HTTP 400, the CLI with exit 2.
The response must echo the request's uid and use the same apiVersion (design/kubernetes-semantics.md §1.4).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypedDict

from .api import GroupResource
from .errors import MalformedReview
from .request import AdmissionRequest as AdmissionRequest  # its home; importable from here as before

if TYPE_CHECKING:  # the wire format renders the rules' Decision; the rules never read the wire (.importlinter)
    from .decision import Decision

API_VERSION = "admission.k8s.io/v1"
OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")


class GroupVersionKindDict(TypedDict):
    group: str
    version: str
    kind: str


class GroupVersionResourceDict(TypedDict):
    group: str
    version: str
    resource: str


class UserInfoDict(TypedDict):
    username: str
    uid: NotRequired[str]
    groups: list[str]


class DeleteOptionsDict(TypedDict):
    apiVersion: str
    kind: Literal["DeleteOptions"]
    propagationPolicy: NotRequired[str]


class RequestDict(TypedDict):
    uid: str
    kind: GroupVersionKindDict
    resource: GroupVersionResourceDict
    subResource: NotRequired[str]
    requestKind: GroupVersionKindDict
    requestResource: GroupVersionResourceDict
    requestSubResource: NotRequired[str]
    name: str
    namespace: NotRequired[str]
    operation: str
    userInfo: UserInfoDict
    object: Mapping[str, Any] | None
    oldObject: Mapping[str, Any] | None
    dryRun: bool
    options: NotRequired[DeleteOptionsDict]


class ReviewRequestDict(TypedDict):
    apiVersion: str
    kind: Literal["AdmissionReview"]
    request: RequestDict


class StatusDict(TypedDict, total=False):
    code: int
    reason: str
    message: str
    status: Literal["Failure", "Success"]


class ResponseDict(TypedDict):
    uid: str
    allowed: bool
    status: NotRequired[StatusDict]
    warnings: NotRequired[list[str]]
    auditAnnotations: NotRequired[dict[str, str]]


class ReviewResponseDict(TypedDict):
    apiVersion: str
    kind: Literal["AdmissionReview"]
    response: ResponseDict


def parse_review(review: Any) -> AdmissionRequest:
    """An AdmissionReview (decoded JSON) -> AdmissionRequest; raises MalformedReview."""
    if not isinstance(review, Mapping):
        raise MalformedReview("", "an AdmissionReview must be a JSON object")
    if review.get("apiVersion") != API_VERSION:
        raise MalformedReview("apiVersion", f"expected {API_VERSION}, got {review.get('apiVersion')!r}")
    if review.get("kind") != "AdmissionReview":
        raise MalformedReview("kind", f"expected AdmissionReview, got {review.get('kind')!r}")
    request = review.get("request")
    if not isinstance(request, Mapping):
        raise MalformedReview("request", "required")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise MalformedReview("request.uid", "required")
    operation = request.get("operation")
    if operation not in OPERATIONS:
        raise MalformedReview("request.operation", f"must be one of {', '.join(OPERATIONS)}")
    resource = request.get("resource")
    if not isinstance(resource, Mapping):
        raise MalformedReview("request.resource", "required")
    group, plural = resource.get("group", ""), resource.get("resource")
    if not isinstance(group, str):
        raise MalformedReview("request.resource.group", "must be a string")
    if not isinstance(plural, str) or not plural:
        raise MalformedReview("request.resource.resource", "required")
    name = _str(request, "name")
    namespace = _str(request, "namespace")
    sub_resource = _str(request, "subResource")
    obj = _object(request, "object")
    old = _object(request, "oldObject")
    kind = request.get("kind")
    dry_run = request.get("dryRun", False)
    if not isinstance(dry_run, bool):
        raise MalformedReview("request.dryRun", "must be a boolean")
    user = request.get("userInfo")
    username = user.get("username", "") if isinstance(user, Mapping) else ""
    options = request.get("options")
    propagation = options.get("propagationPolicy") if isinstance(options, Mapping) else None
    return AdmissionRequest(
        uid=uid,
        group_resource=GroupResource(group, plural),
        operation=operation,
        name=name,
        namespace=namespace,
        object=obj,
        old_object=old,
        sub_resource=sub_resource,
        kind=str(kind.get("kind", "")) if isinstance(kind, Mapping) else "",
        dry_run=dry_run,
        username=str(username) if isinstance(username, str) else "",
        propagation_policy=propagation if isinstance(propagation, str) and propagation else None,
    )


def _str(request: Mapping[str, Any], key: str) -> str:
    value = request.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise MalformedReview(f"request.{key}", "must be a string")
    return value


def _object(request: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    value = request.get(key)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise MalformedReview(f"request.{key}", "must be an object or null")
    metadata = value.get("metadata")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise MalformedReview(f"request.{key}.metadata", "must be an object")
    return value


def render_review(request: AdmissionRequest, *, version: str = "v1",
                  groups: Sequence[str] = ("system:authenticated",), user_uid: str = "") -> ReviewRequestDict:
    """`request` as the AdmissionReview v1 the API server posts: parse_review(render_review(r)) == r.

    What parse_review does not read comes from the keywords: the resource's version, the user's uid and
    groups. requestKind/requestResource repeat
    kind/resource (they differ only when the API server converted the request to another version).
    `namespace` is left out when empty, as for a cluster-scoped object; for a Namespace the API server
    sends the namespace's own name there, so build such a request that way. The review holds copies of
    the objects, as a decoded body would.
    """
    gvk: GroupVersionKindDict = {"group": request.group_resource.group, "version": version, "kind": request.kind}
    gvr: GroupVersionResourceDict = {"group": request.group_resource.group, "version": version,
                                     "resource": request.group_resource.resource}
    user: UserInfoDict = {"username": request.username, "groups": list(groups)}
    if user_uid:
        user["uid"] = user_uid
    body: RequestDict = {
        "uid": request.uid, "kind": gvk, "resource": gvr, "requestKind": gvk.copy(), "requestResource": gvr.copy(),
        "name": request.name, "operation": request.operation, "userInfo": user,
        "object": copy.deepcopy(request.object), "oldObject": copy.deepcopy(request.old_object),
        "dryRun": request.dry_run,
    }
    if request.sub_resource:
        body["subResource"] = body["requestSubResource"] = request.sub_resource
    if request.namespace:
        body["namespace"] = request.namespace
    if request.operation == "DELETE":
        body["options"] = {"apiVersion": "meta.k8s.io/v1", "kind": "DeleteOptions"}
        if request.propagation_policy is not None:
            body["options"]["propagationPolicy"] = request.propagation_policy
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "request": body}


def render_response(uid: str, decision: Decision) -> ReviewResponseDict:
    """The AdmissionReview reply for `decision`."""
    response: ResponseDict = {"uid": uid, "allowed": decision.allowed}
    if not decision.allowed:
        response["status"] = {
            "code": decision.code,
            "reason": decision.reason,
            "message": decision.message,
            "status": "Failure",
        }
    if decision.waiting or decision.warnings:
        response["warnings"] = [*decision.waiting, *decision.warnings]
    audit = {"rule": decision.rule.value}
    if decision.break_glass:
        audit["break-glass"] = decision.break_glass
    if decision.recreated_provider:
        audit["recreated-provider"] = decision.recreated_provider
    if decision.blocking:
        audit["blocking"] = ",".join(decision.blocking)
    response["auditAnnotations"] = audit
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}
