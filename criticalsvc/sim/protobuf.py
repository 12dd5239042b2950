"""Request bodies in Kubernetes' protobuf encoding, decoded to the JSON the stand-in works on.

Why. kubectl's typed clients send `Content-Type: application/vnd.kubernetes.protobuf`: the
`create namespace|deployment|configmap|secret|serviceaccount|role|rolebinding|...` generators and
`auth can-i` / `auth whoami`. client-go falls back to JSON after a 415 for CBOR only (client-go
rest/client.go, `requestClientContentConfigProvider.UnsupportedMediaType`), so a stand-in that
answered 415 made those commands fail for good. Responses stay JSON: kubectl's Accept header
(`application/vnd.kubernetes.protobuf,application/json`) takes it.

The format (k8s.io/apimachinery runtime/serializer/protobuf): the magic `k8s\\x00`, then a
`runtime.Unknown` {1 typeMeta {1 apiVersion, 2 kind}, 2 raw, 3 contentEncoding, 4 contentType},
`raw` being the object's own message (k8s.io/api .../generated.proto). Protobuf is not
self-describing, so each kind decoded here has a field table below (the fields kubectl's generators
and the review APIs set, numbered as in generated.proto). A field outside the table is skipped when
it holds only zero values (gogo protobuf writes every non-pointer field, set or not); with a value
in it the body is refused (415) rather than silently losing what the user asked for.

JSON conventions (Go's encoding/json with omitempty): zero scalars and empty strings, lists, maps
and messages are dropped, except pointer fields (`replicas`, `immutable`, ...), kept when present
even if zero; `bytes` become base64; Time becomes RFC 3339; IntOrString an int or a string.
"""

from __future__ import annotations

import base64
from typing import Any

from ..timestamps import format_rfc3339

__all__ = ["MAGIC", "MEDIA_TYPE", "ProtobufError", "UnsupportedKind", "decode"]

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"


class ProtobufError(ValueError):
    """A body that is not a well-formed Kubernetes protobuf message (400)."""


class UnsupportedKind(ProtobufError):
    """A kind, or a field of one, this decoder has no table for (415: send JSON instead)."""


# --- wire format -------------------------------------------------------------------------------------
def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ProtobufError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes) -> list[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of each field: varints as int, length-delimited as bytes."""
    out: list[tuple[int, int, int | bytes]] = []
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ProtobufError("field number 0")
        value: int | bytes
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 1:
            value, pos = int.from_bytes(data[pos:pos + 8], "little"), pos + 8
        elif wire == 5:
            value, pos = int.from_bytes(data[pos:pos + 4], "little"), pos + 4
        elif wire == 2:
            length, pos = _varint(data, pos)
            value, pos = data[pos:pos + length], pos + length
        else:
            raise ProtobufError(f"unsupported wire type {wire}")
        if pos > len(data):
            raise ProtobufError("truncated field")
        out.append((number, wire, value))
    return out


def _all_zero(data: bytes, depth: int = 0) -> bool:
    """True when `data`, read as a message, holds nothing but zero values (an unset non-pointer field)."""
    if depth > 32:
        return False
    try:
        fields = _fields(data)
    except ProtobufError:
        return False
    return all(value == 0 if isinstance(value, int) else (not value or _all_zero(value, depth + 1))
               for _, _, value in fields)


def _signed(value: int, bits: int = 64) -> int:
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


# --- field tables ------------------------------------------------------------------------------------
# A field: (json name, type, flags). Types: "string", "bytes", "int", "bool", "time", "intorstr",
# ("map", value type), or a message name. Flags: "r" repeated, "p" pointer (kept when zero).
Field = tuple[str, Any, str]
S, B, INT, BOOL, T = "string", "bytes", "int", "bool", "time"
MAP_SS, MAP_SB = ("map", S), ("map", B)

MESSAGES: dict[str, dict[int, Field]] = {
    # k8s.io/apimachinery/pkg/apis/meta/v1
    "ObjectMeta": {1: ("name", S, ""), 2: ("generateName", S, ""), 3: ("namespace", S, ""), 4: ("selfLink", S, ""),
                   5: ("uid", S, ""), 6: ("resourceVersion", S, ""), 7: ("generation", INT, ""),
                   8: ("creationTimestamp", T, ""), 9: ("deletionTimestamp", T, ""),
                   10: ("deletionGracePeriodSeconds", INT, "p"), 11: ("labels", MAP_SS, ""),
                   12: ("annotations", MAP_SS, ""), 13: ("ownerReferences", "OwnerReference", "r"),
                   14: ("finalizers", S, "r")},
    "OwnerReference": {5: ("apiVersion", S, ""), 1: ("kind", S, ""), 3: ("name", S, ""), 4: ("uid", S, ""),
                       6: ("controller", BOOL, "p"), 7: ("blockOwnerDeletion", BOOL, "p")},
    "LabelSelector": {1: ("matchLabels", MAP_SS, ""), 2: ("matchExpressions", "LabelSelectorRequirement", "r")},
    "LabelSelectorRequirement": {1: ("key", S, ""), 2: ("operator", S, ""), 3: ("values", S, "r")},
    "Preconditions": {1: ("uid", S, "p"), 2: ("resourceVersion", S, "p")},
    "DeleteOptions": {1: ("gracePeriodSeconds", INT, "p"), 2: ("preconditions", "Preconditions", ""),
                      3: ("orphanDependents", BOOL, "p"), 4: ("propagationPolicy", S, "p"), 5: ("dryRun", S, "r")},
    # k8s.io/api/core/v1
    "Namespace": {1: ("metadata", "ObjectMeta", ""), 2: ("spec", "NamespaceSpec", ""),
                  3: ("status", "NamespaceStatus", "")},
    "NamespaceSpec": {1: ("finalizers", S, "r")},
    "NamespaceStatus": {1: ("phase", S, "")},
    "ConfigMap": {1: ("metadata", "ObjectMeta", ""), 2: ("data", MAP_SS, ""), 3: ("binaryData", MAP_SB, ""),
                  4: ("immutable", BOOL, "p")},
    "Secret": {1: ("metadata", "ObjectMeta", ""), 2: ("data", MAP_SB, ""), 3: ("type", S, ""),
               4: ("stringData", MAP_SS, ""), 5: ("immutable", BOOL, "p")},
    "ServiceAccount": {1: ("metadata", "ObjectMeta", ""), 2: ("secrets", "ObjectReference", "r"),
                       3: ("imagePullSecrets", "LocalObjectReference", "r"),
                       4: ("automountServiceAccountToken", BOOL, "p")},
    "ObjectReference": {1: ("kind", S, ""), 2: ("namespace", S, ""), 3: ("name", S, ""), 4: ("uid", S, ""),
                        5: ("apiVersion", S, ""), 6: ("resourceVersion", S, ""), 7: ("fieldPath", S, "")},
    "LocalObjectReference": {1: ("name", S, "")},
    "PodTemplateSpec": {1: ("metadata", "ObjectMeta", ""), 2: ("spec", "PodSpec", "")},
    "PodSpec": {2: ("containers", "Container", "r"), 20: ("initContainers", "Container", "r"),
                3: ("restartPolicy", S, ""), 4: ("terminationGracePeriodSeconds", INT, "p"), 6: ("dnsPolicy", S, ""),
                7: ("nodeSelector", MAP_SS, ""), 8: ("serviceAccountName", S, ""), 9: ("serviceAccount", S, ""),
                10: ("nodeName", S, ""), 15: ("imagePullSecrets", "LocalObjectReference", "r"),
                19: ("schedulerName", S, ""), 24: ("priorityClassName", S, "")},
    "Container": {1: ("name", S, ""), 2: ("image", S, ""), 3: ("command", S, "r"), 4: ("args", S, "r"),
                  5: ("workingDir", S, ""), 6: ("ports", "ContainerPort", "r"), 7: ("env", "EnvVar", "r"),
                  13: ("terminationMessagePath", S, ""), 14: ("imagePullPolicy", S, ""),
                  16: ("stdin", BOOL, ""), 17: ("stdinOnce", BOOL, ""), 18: ("tty", BOOL, ""),
                  20: ("terminationMessagePolicy", S, "")},
    "ContainerPort": {1: ("name", S, ""), 2: ("hostPort", INT, ""), 3: ("containerPort", INT, ""),
                      4: ("protocol", S, ""), 5: ("hostIP", S, "")},
    "EnvVar": {1: ("name", S, ""), 2: ("value", S, "")},
    "Service": {1: ("metadata", "ObjectMeta", ""), 2: ("spec", "ServiceSpec", "")},
    "ServiceSpec": {1: ("ports", "ServicePort", "r"), 2: ("selector", MAP_SS, ""), 3: ("clusterIP", S, ""),
                    18: ("clusterIPs", S, "r"), 4: ("type", S, ""), 5: ("externalIPs", S, "r"),
                    10: ("externalName", S, "")},
    "ServicePort": {1: ("name", S, ""), 2: ("protocol", S, ""), 6: ("appProtocol", S, "p"), 3: ("port", INT, ""),
                    4: ("targetPort", "intorstr", ""), 5: ("nodePort", INT, "")},
    # k8s.io/api/apps/v1, batch/v1
    "Deployment": {1: ("metadata", "ObjectMeta", ""), 2: ("spec", "DeploymentSpec", "")},
    "DeploymentSpec": {1: ("replicas", INT, "p"), 2: ("selector", "LabelSelector", ""),
                       3: ("template", "PodTemplateSpec", ""), 5: ("minReadySeconds", INT, ""),
                       6: ("revisionHistoryLimit", INT, "p"), 7: ("paused", BOOL, ""),
                       9: ("progressDeadlineSeconds", INT, "p")},
    "Job": {1: ("metadata", "ObjectMeta", ""), 2: ("spec", "JobSpec", "")},
    "JobSpec": {1: ("parallelism", INT, "p"), 2: ("completions", INT, "p"), 3: ("activeDeadlineSeconds", INT, "p"),
                4: ("selector", "LabelSelector", ""), 5: ("manualSelector", BOOL, "p"),
                6: ("template", "PodTemplateSpec", ""), 7: ("backoffLimit", INT, "p"),
                8: ("ttlSecondsAfterFinished", INT, "p"), 10: ("suspend", BOOL, "p")},
    # k8s.io/api/rbac/v1
    "Role": {1: ("metadata", "ObjectMeta", ""), 2: ("rules", "PolicyRule", "r")},
    "ClusterRole": {1: ("metadata", "ObjectMeta", ""), 2: ("rules", "PolicyRule", "r"),
                    3: ("aggregationRule", "AggregationRule", "")},
    "PolicyRule": {1: ("verbs", S, "r"), 2: ("apiGroups", S, "r"), 3: ("resources", S, "r"),
                   4: ("resourceNames", S, "r"), 5: ("nonResourceURLs", S, "r")},
    "AggregationRule": {1: ("clusterRoleSelectors", "LabelSelector", "r")},
    "RoleBinding": {1: ("metadata", "ObjectMeta", ""), 2: ("subjects", "Subject", "r"), 3: ("roleRef", "RoleRef", "")},
    "Subject": {1: ("kind", S, ""), 2: ("apiGroup", S, ""), 3: ("name", S, ""), 4: ("namespace", S, "")},
    "RoleRef": {1: ("apiGroup", S, ""), 2: ("kind", S, ""), 3: ("name", S, "")},
    # k8s.io/api/authorization/v1, authentication/v1, autoscaling/v1
    "SelfSubjectAccessReview": {1: ("metadata", "ObjectMeta", ""), 2: ("spec", "SelfSubjectAccessReviewSpec", "")},
    "SelfSubjectAccessReviewSpec": {1: ("resourceAttributes", "ResourceAttributes", ""),
                                    2: ("nonResourceAttributes", "NonResourceAttributes", "")},
    "ResourceAttributes": {1: ("namespace", S, ""), 2: ("verb", S, ""), 3: ("group", S, ""), 4: ("version", S, ""),
                           5: ("resource", S, ""), 6: ("subresource", S, ""), 7: ("name", S, ""),
                           8: ("fieldSelector", "SelectorAttributes", ""),
                           9: ("labelSelector", "SelectorAttributes", "")},
    "SelectorAttributes": {1: ("rawSelector", S, "")},
    "NonResourceAttributes": {1: ("path", S, ""), 2: ("verb", S, "")},
    "SelfSubjectRulesReview": {1: ("metadata", "ObjectMeta", ""), 2: ("spec", "SelfSubjectRulesReviewSpec", "")},
    "SelfSubjectRulesReviewSpec": {1: ("namespace", S, "")},
    "SelfSubjectReview": {1: ("metadata", "ObjectMeta", "")},
    "Scale": {1: ("metadata", "ObjectMeta", ""), 2: ("spec", "ScaleSpec", "")},
    "ScaleSpec": {1: ("replicas", INT, "")},
}
# Top-level kinds by (API group, kind); the message of each is named as the kind.
KINDS = frozenset({
    ("", "Namespace"), ("", "ConfigMap"), ("", "Secret"), ("", "ServiceAccount"), ("", "Service"),
    ("apps", "Deployment"), ("batch", "Job"),
    ("rbac.authorization.k8s.io", "Role"), ("rbac.authorization.k8s.io", "ClusterRole"),
    ("rbac.authorization.k8s.io", "RoleBinding"), ("rbac.authorization.k8s.io", "ClusterRoleBinding"),
    ("authorization.k8s.io", "SelfSubjectAccessReview"), ("authorization.k8s.io", "SelfSubjectRulesReview"),
    ("authentication.k8s.io", "SelfSubjectReview"), ("autoscaling", "Scale"),
    ("meta.k8s.io", "DeleteOptions"), ("", "DeleteOptions"),
})
_ALIASES = {"ClusterRoleBinding": "RoleBinding"}


def _scalar(kind: Any, wire: int, value: int | bytes, where: str) -> Any:
    if kind in (S, B, T, "intorstr") or (isinstance(kind, str) and kind in MESSAGES):
        if not isinstance(value, bytes):
            raise ProtobufError(f"{where}: expected a length-delimited value")
        if kind == S:
            try:
                return value.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ProtobufError(f"{where}: invalid UTF-8") from exc
        if kind == B:
            return base64.b64encode(value).decode("ascii")
        if kind == T:
            fields = {n: v for n, _, v in _fields(value)}
            seconds = fields.get(1, 0)
            if not isinstance(seconds, int) or seconds == 0:
                return None
            return format_rfc3339(_signed(seconds))
        if kind == "intorstr":
            fields = {n: v for n, _, v in _fields(value)}
            if fields.get(1, 0) == 1:
                text = fields.get(3, b"")
                return text.decode("utf-8") if isinstance(text, bytes) else ""
            number = fields.get(2, 0)
            return _signed(number) if isinstance(number, int) else 0
        return _message(kind, value, where)
    if not isinstance(value, int):
        raise ProtobufError(f"{where}: expected a varint")
    if kind == BOOL:
        return bool(value)
    if kind == INT:
        return _signed(value)
    raise ProtobufError(f"{where}: unknown field type {kind!r}")  # pragma: no cover - tables are static


def _empty(value: Any) -> bool:
    return value is None or value == "" or value == 0 or value is False or value == [] or value == {}


def _message(name: str, data: bytes, where: str = "") -> dict[str, Any]:
    table = MESSAGES[name]
    where = where or name
    out: dict[str, Any] = {}
    for number, wire, value in _fields(data):
        field = table.get(number)
        if field is None:
            empty = value == 0 if isinstance(value, int) else (not value or _all_zero(value))
            if not empty:
                raise UnsupportedKind(f"field {number} of {name} ({where}) is set, and the API-server stand-in "
                                      "does not decode it from protobuf")
            continue
        json_name, kind, flags = field
        path = f"{where}.{json_name}"
        if isinstance(kind, tuple):  # map entry {1 key, 2 value}
            if not isinstance(value, bytes):
                raise ProtobufError(f"{path}: expected a map entry")
            entry = {n: v for n, _, v in _fields(value)}
            key = _scalar(S, 2, entry.get(1, b""), path)
            item = _scalar(kind[1], 2, entry.get(2, b""), path)
            out.setdefault(json_name, {})[key] = item
            continue
        decoded = _scalar(kind, wire, value, path)
        if "r" in flags:
            out.setdefault(json_name, []).append(decoded)
        elif ("p" in flags and decoded is not None) or not _empty(decoded):
            out[json_name] = decoded
    return out


def _text(value: int | bytes | None) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else ""


def decode(body: bytes) -> dict[str, Any]:
    """The JSON form of a `k8s\\x00`-prefixed protobuf body; ProtobufError (400) or UnsupportedKind (415)."""
    if not body.startswith(MAGIC):
        raise ProtobufError("the body does not start with the Kubernetes protobuf magic number")
    envelope = {n: v for n, _, v in _fields(body[len(MAGIC):])}
    type_meta = envelope.get(1, b"")
    raw = envelope.get(2, b"")
    if not isinstance(type_meta, bytes) or not isinstance(raw, bytes):
        raise ProtobufError("malformed runtime.Unknown envelope")
    tm = {n: v for n, _, v in _fields(type_meta)}
    api_version, kind = _text(tm.get(1)), _text(tm.get(2))
    if envelope.get(3):
        raise UnsupportedKind("protobuf bodies with a contentEncoding are not decoded by the API-server stand-in")
    group = api_version.rpartition("/")[0]
    if (group, kind) not in KINDS:
        raise UnsupportedKind(f"the API-server stand-in does not decode {kind or 'this kind'} ({api_version}) "
                              "from protobuf")
    obj = _message(_ALIASES.get(kind, kind), raw, kind)
    return {"apiVersion": api_version, "kind": kind, **obj}
