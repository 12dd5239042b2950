"""The create-only review APIs `kubectl auth can-i` (and `--list`) and `kubectl auth whoami` post:
SelfSubjectAccessReview, SelfSubjectRulesReview, SelfSubjectReview. There is no authorization here,
so every review allows, as for a cluster-admin (system:masters)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ...restmapper import ResourceType
from ...timestamps import format_rfc3339
from .bodies import object_body, request_body
from .context import APIServer
from .responses import json_response


async def review(standin: APIServer, request: Request, t: ResourceType) -> Response:
    """The review answered: 201 with its status filled in."""
    body = object_body(await request_body(request), t)
    user = request.headers.get("impersonate-user") or standin.default_user
    spec = body.get("spec") if isinstance(body.get("spec"), Mapping) else {}
    answer: dict[str, Any] = {"kind": t.kind, "apiVersion": t.api_version,
                              "metadata": {k: v for k, v in (body.get("metadata") or {}).items()
                                           if k in ("name", "generateName", "labels", "annotations")}}
    if t.kind == "SelfSubjectAccessReview":
        answer.update(spec=spec, status={"allowed": True})
    elif t.kind == "SelfSubjectRulesReview":
        answer.update(spec=spec, status={
            "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}],
            "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}], "incomplete": False})
    else:
        groups = [g.strip() for g in request.headers.getlist("impersonate-group") if g.strip()]
        answer["metadata"]["creationTimestamp"] = format_rfc3339(standin.store.clock())
        answer["status"] = {"userInfo": {"username": user,
                                         "groups": [*(groups or ["system:masters"]), "system:authenticated"]}}
    return json_response(answer, status_code=201)
