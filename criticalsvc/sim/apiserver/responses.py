"""What the stand-in answers: JSON responses with `Warning` headers, and metav1.Status errors.

Errors are raised as the store's StatusError and turned into a metav1.Status body here, so kubectl
prints them the real way (`Error from server (Forbidden): ...`). Warning headers follow the API
server's warning recorder (k8s.io/apiserver pkg/endpoints/filters/warning.go).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from typing import Any

import orjson
from starlette.responses import Response

from ...api import GroupResource
from ..store import StatusError


def json_response(doc: Any, *, status_code: int = 200, media_type: str = "application/json",
                  warnings: Iterable[str] = ()) -> Response:
    """`doc` as JSON, with the webhooks' `warnings` as `Warning` headers."""
    response = Response(orjson.dumps(doc), status_code=status_code, media_type=media_type)
    # Raw UTF-8 bytes: Starlette's `headers.append` encodes latin-1 and fails on "…".
    response.raw_headers.extend((b"warning", value) for value in warning_headers(warnings))
    return response


def status_response(error: StatusError) -> Response:
    """The metav1.Status of `error`, with the warnings the failed write collected."""
    return json_response(error.status(), status_code=error.code, warnings=getattr(error, "warnings", ()))


# k8s.io/apiserver/pkg/endpoints/filters/warning.go: past 4 KiB of warning text (in runes) every
# warning is cut to 256 runes.
WARNING_TOTAL_RUNES = 4 * 1024
WARNING_ITEM_RUNES = 256


def _warning_header(text: str) -> bytes | None:
    """k8s.io/apimachinery util/net NewWarningHeader(299, "-", text): None if text has control characters."""
    if any(unicodedata.category(ch) == "Cc" for ch in text):
        return None
    quoted = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'299 - "{quoted}"'.encode()  # RFC 7234 warn-code 299; UTF-8 left as is, as Go writes it


def warning_headers(warnings: Iterable[str]) -> list[bytes]:
    """`Warning` header values as the API server's warning recorder writes them: empty and repeated
    texts dropped, texts with control characters dropped, everything cut to 256 runes once the
    total passes 4096 runes. Text is written as raw UTF-8 (kubectl prints it as such)."""
    headers: list[bytes] = []
    recorded: set[str] = set()
    ordered: list[str] = []
    written, truncating = 0, False
    for text in warnings:
        if not text or text in recorded:
            continue
        if written >= WARNING_TOTAL_RUNES and truncating:
            break
        recorded.add(text)
        ordered.append(text)
        if truncating:
            text = text[:WARNING_ITEM_RUNES]
        header = _warning_header(text)
        if header is None:
            continue
        if written + len(text) <= WARNING_TOTAL_RUNES or truncating:
            written += len(text)
            headers.append(header)
            continue
        truncating, written, headers = True, 0, []
        for earlier in ordered:
            cut = earlier[:WARNING_ITEM_RUNES]
            again = _warning_header(cut)
            if again is not None:
                written += len(cut)
                headers.append(again)
    return headers


def not_served() -> StatusError:
    """The 404 of a path this server does not serve."""
    return StatusError(404, "NotFound", "the server could not find the requested resource")


def method_not_allowed(method: str) -> StatusError:
    return StatusError(405, "MethodNotAllowed", f"the server does not allow this method on the requested resource "
                       f"({method})")


def conflict(gr: GroupResource, name: str) -> StatusError:
    """The 409 of a write whose resourceVersion is not the stored one."""
    return StatusError(409, "Conflict", f'Operation cannot be fulfilled on {gr} "{name}": the object has been '
                       "modified; please apply your changes to the latest version and try again",
                       details={"name": name, "group": gr.group, "kind": gr.resource})
