"""Request bodies: decoded from JSON, YAML or Kubernetes protobuf, and checked against the URL.

The API server defaults a body's apiVersion and kind from the URL and refuses one of another type, or
whose name or namespace differ from the URL's (k8s.io/apiserver pkg/endpoints/handlers/create.go,
update.go). Protobuf is what client-go's typed clients send (`kubectl create namespace|deployment|...`,
`kubectl auth can-i`); protobuf.py decodes the kinds they send, others get 415.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
import yaml
from starlette.requests import Request

from ...api import ObjectRef
from ...restmapper import ResourceType
from .. import protobuf
from ..store import StatusError


def json_body(raw: bytes) -> Any:
    """A JSON body (a PATCH is always JSON); an empty one is `{}`."""
    try:
        return orjson.loads(raw) if raw.strip() else {}
    except orjson.JSONDecodeError as exc:
        raise StatusError(400, "BadRequest", f"the body of the request could not be decoded as JSON: {exc}") from exc


def media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def decode_body(raw: bytes, media: str) -> Any:
    """A request body as JSON data, from JSON, YAML or Kubernetes protobuf (what client-go sends)."""
    if media == protobuf.MEDIA_TYPE:
        try:
            return protobuf.decode(raw)
        except protobuf.UnsupportedKind as exc:
            raise StatusError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - "
                              f"{exc}; send it as application/json (kubectl create -f / kubectl apply -f)") from exc
        except protobuf.ProtobufError as exc:
            raise StatusError(400, "BadRequest", f"the body of the request could not be decoded: {exc}") from exc
    if media in ("application/yaml", "application/x-yaml", "text/yaml"):
        try:
            return yaml.safe_load(raw) if raw.strip() else {}
        except yaml.YAMLError as exc:
            raise StatusError(400, "BadRequest",
                              f"the body of the request could not be decoded as YAML: {exc}") from exc
    if media not in ("", "application/json", "*/*"):
        raise StatusError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                          f'"{media}"; accepted media types include: application/json, application/yaml, '
                          "application/vnd.kubernetes.protobuf")
    return json_body(raw)


async def request_body(request: Request) -> Any:
    """The body of a create, update or delete, decoded by its Content-Type."""
    return decode_body(await request.body(), media_type(request))


def object_body(body: Any, t: ResourceType) -> dict[str, Any]:
    """`body` as an object of type `t`: apiVersion and kind defaulted from the URL, or a 400."""
    if not isinstance(body, dict):
        raise StatusError(400, "BadRequest", "the body of the request must be a JSON object")
    # The API server defaults apiVersion/kind from the URL and rejects a body of another type.
    body.setdefault("apiVersion", t.api_version)
    body.setdefault("kind", t.kind)
    if body["apiVersion"] != t.api_version or body["kind"] != t.kind:
        raise StatusError(400, "BadRequest", f"the API version in the data ({body['apiVersion']}) and kind "
                          f"({body['kind']}) do not match the expected {t.api_version}, Kind={t.kind}")
    if not isinstance(body.get("metadata", {}), dict):
        raise StatusError(400, "BadRequest", "metadata must be a JSON object")
    return body


def check_identity(body: dict[str, Any], t: ResourceType, ref: ObjectRef) -> None:
    """The body names the object of the URL (defaulted from it when it names none), or a 400."""
    md = body.setdefault("metadata", {})
    if md.get("name", ref.name) != ref.name:
        raise StatusError(400, "BadRequest", f"the name of the object ({md['name']}) does not match the name on "
                          f"the URL ({ref.name})")
    md["name"] = ref.name
    if t.namespaced:
        if md.get("namespace", ref.namespace) != ref.namespace:
            raise StatusError(400, "BadRequest", "the namespace of the provided object does not match the namespace "
                              "sent on the request")
        md["namespace"] = ref.namespace


def dry_run(params: Mapping[str, str]) -> bool:
    """`?dryRun=All`: admission runs, nothing is stored."""
    return params.get("dryRun") == "All"
