"""The HTTP edge of the caches and the live reads: JSON GETs and watch streams, nothing else.

Why `kubernetes.aio` and raw paths. The service is one asyncio process; a synchronous client call
blocks the event loop (and `asyncio.to_thread` has ~6 workers on 2 cores), so the watches, discovery
and the live reads all use the official client's asyncio flavour, `kubernetes.aio` (aiohttp
underneath). Only its plumbing is used — `Configuration` (kubeconfig / in-cluster auth, exec and
token refresh), `ApiClient.param_serialize` (URL, auth headers) and `ApiClient.call_api` (the raw
response, the `_preload_content=False` path) — never its generated model classes: the caches keep
slim projections of plain JSON, the generated models break on custom objects, and the generated
`Watch` retries a 410 with the same (expired) resourceVersion instead of re-listing. One code path
then serves every group/resource, built-in or custom, as kopf's watcher does.

Metadata only. Requests for lists and watches ask for `PartialObjectMetadata(List)` first
(`Accept: application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1, application/json`):
the gate reads nothing but metadata, and a Secret or ConfigMap cache would otherwise hold whole
payloads. A server that does not know the form answers plain JSON, which parses the same.

Errors. Everything that goes wrong becomes an `APIError`: `APIStatusError` when the server answered
with a metav1.Status (`code`, `reason`, `message`), `TransportError` when no answer came (connection
refused or dropped, timeout). Callers decide what is fatal; nothing here retries.

`Transport` is the small protocol the rest of the package depends on (the httpx transport idea), so
tests can swap the network for a fake without sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Protocol

import aiohttp
import orjson

from ..errors import CriticalsvcError, InvalidInput

JSON = dict[str, Any]
Params = Sequence[tuple[str, str]]

# As kubectl asks for tables: the metadata-only form first, plain JSON as the fallback.
ACCEPT_METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1, application/json"
ACCEPT_METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1, application/json"
ACCEPT_JSON = "application/json"


def list_items(page: Mapping[str, Any]) -> list[Any] | None:
    """A LIST answer's items; None when the answer is not a list.

    An empty list can come as `"items": null`: the API server encodes an empty PartialObjectMetadataList
    from a nil Go slice (measured on kube-apiserver 1.37.2 for Deployments and custom resources alike;
    plain JSON lists answer `[]`). Treating that as "no items" left a Resources criterion with nothing
    to wait for unverifiable, and a Finalizer criterion's type never synced (the gate stayed unready).
    """
    if "items" not in page:
        return None
    items = page["items"]
    if items is None:
        return []
    return items if isinstance(items, list) else None

# aiohttp's line iterator gives up on lines over 128 KiB; an annotated object in a watch stream can be
# larger (a last-applied-configuration annotation alone can reach the 256 KiB annotation limit), so
# lines are cut from 1 MiB chunks by hand, as kopf does (kopf issue #275).
_CHUNK = 1024 * 1024


class APIError(CriticalsvcError):
    """A request to the API server failed; `code` is the HTTP status (0 when no answer came)."""

    code: int = 0

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


class APIStatusError(APIError):
    """The API server answered with an error status (a metav1.Status)."""

    def __init__(self, code: int, reason: str, message: str, *, details: Mapping[str, Any] | None = None) -> None:
        self.code = code
        self.reason = reason
        self.details: Mapping[str, Any] = details or {}
        super().__init__(f"{code} {reason}: {message}" if reason else f"{code}: {message}")

    @property
    def gone(self) -> bool:
        """410 Gone / Expired: the resourceVersion (or continue token) is too old; list again."""
        return self.code == 410

    @property
    def not_found(self) -> bool:
        return self.code == 404


class TransportError(APIError):
    """No answer: the connection failed, was dropped, or the request timed out."""


def status_error(code: int, body: bytes | Mapping[str, Any], fallback: str = "") -> APIStatusError:
    """An APIStatusError from an error status code and a (possibly non-Status) body."""
    status: Any = body
    if isinstance(body, bytes):
        try:
            status = json.loads(body) if body else {}
        except ValueError:
            status = {"message": body[:200].decode("utf-8", "replace")}
    if not isinstance(status, Mapping):
        status = {}
    details = status.get("details") if isinstance(status.get("details"), Mapping) else {}
    return APIStatusError(int(status.get("code") or code), str(status.get("reason") or ""),
                          str(status.get("message") or fallback or "(no message)"), details=details)


class Transport(Protocol):
    """What the caches and the live reads need from an API server connection."""

    async def get(self, path: str, params: Params = (), *, timeout: float, accept: str = ACCEPT_JSON) -> JSON:
        """GET `path` and decode the JSON object; raises APIError."""
        ...

    def stream(self, path: str, params: Params = (), *, timeout: float,
               accept: str = ACCEPT_JSON) -> contextlib.AbstractAsyncContextManager[AsyncIterator[JSON]]:
        """GET a watch stream: an iterator of decoded event objects, one per line; raises APIError."""
        ...


class Sender(Protocol):
    """What the leader's writers (the replayer, the webhook router) need: a GET and a write."""

    async def get(self, path: str, params: Params = (), *, timeout: float, accept: str = ACCEPT_JSON) -> JSON:
        ...

    async def send(self, verb: str, path: str, payload: Mapping[str, Any] | None = None, *, timeout: float,
                   params: Params = (), content_type: str = ...) -> Any:
        ...


class KubeTransport:
    """A Transport over a `kubernetes.aio` ApiClient (auth, TLS and host from its Configuration)."""

    def __init__(self, api_client: Any) -> None:
        self.api_client = api_client

    async def _open(self, path: str, params: Params, timeout: aiohttp.ClientTimeout, accept: str, *,
                    verb: str = "GET", payload: Mapping[str, Any] | None = None,
                    content_type: str = ACCEPT_JSON) -> Any:
        header_params = {"Accept": accept}
        if payload is not None:
            header_params["Content-Type"] = content_type
        method, url, headers, body, post = await self.api_client.param_serialize(
            method=verb, resource_path=path, query_params=list(params), header_params=header_params,
            body=payload, auth_settings=["BearerToken"])
        from kubernetes.aio.client.exceptions import ApiException

        try:
            # `_request_timeout` is handed to aiohttp as is: a ClientTimeout bounds the whole stream.
            response = await self.api_client.call_api(method, url, header_params=headers, body=body,
                                                      post_params=post, _request_timeout=timeout)
        except ApiException as exc:  # only with the client's retries configured (Retry-After exhausted)
            body = exc.body.encode() if isinstance(exc.body, str) else bytes(exc.body or b"")
            raise status_error(int(exc.status or 0), body, fallback=str(exc.reason or "")) from exc
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise TransportError(f"{verb} {path}: {_describe(exc)}") from exc
        if response.status >= 400:
            try:
                data = await response.read()
            except (aiohttp.ClientError, OSError, TimeoutError):
                data = b""
            finally:
                response.response.release()
            raise status_error(response.status, data, fallback=str(response.reason or ""))
        return response

    async def get(self, path: str, params: Params = (), *, timeout: float, accept: str = ACCEPT_JSON) -> JSON:
        response = await self._open(path, params, aiohttp.ClientTimeout(total=timeout), accept)
        return await _answer(response, f"GET {path}")

    async def send(self, verb: str, path: str, payload: Mapping[str, Any] | None = None, *, timeout: float,
                   params: Params = (), content_type: str = ACCEPT_JSON) -> JSON:
        """A write (POST, PATCH, DELETE) with a JSON body; the decoded answer. Raises APIError."""
        response = await self._open(path, params, aiohttp.ClientTimeout(total=timeout), ACCEPT_JSON, verb=verb,
                                    payload=payload, content_type=content_type)
        return await _answer(response, f"{verb} {path}")

    @contextlib.asynccontextmanager
    async def stream(self, path: str, params: Params = (), *, timeout: float,
                     accept: str = ACCEPT_JSON) -> AsyncIterator[AsyncIterator[JSON]]:
        response = await self._open(path, params, aiohttp.ClientTimeout(total=timeout), accept)
        try:
            yield _events(response.response.content, path)
        finally:
            response.response.close()  # never reuse a half-read stream's connection


async def _answer(response: Any, what: str) -> JSON:
    """Read a whole answer and decode it as a JSON object; the connection goes back to the pool."""
    try:
        data = await response.read()
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise TransportError(f"{what}: {_describe(exc)}") from exc
    finally:
        response.response.release()
    return _json_object(data, f"{what}: the answer")


async def _events(content: aiohttp.StreamReader, path: str) -> AsyncIterator[JSON]:
    buffer = b""
    try:
        async for chunk in content.iter_chunked(_CHUNK):
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if line.strip():
                    yield _decode_event(line, path)
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise TransportError(f"watch {path}: {_describe(exc)}") from exc
    if buffer.strip():
        yield _decode_event(buffer, path)


def _decode_event(line: bytes, path: str) -> JSON:
    return _json_object(line, f"watch {path}: an event")


def _json_object(data: bytes, what: str) -> JSON:
    """`data` decoded as a JSON object; a TransportError saying `what` was not one otherwise.

    orjson first: every watch event, LIST page, discovery document and fresh read is decoded here, on the
    event loop, and orjson takes a fraction of the json module's time. What orjson refuses and json takes
    (an integer beyond 64 bits, which kube-apiserver does not send) is decoded by json as before."""
    try:
        decoded = orjson.loads(data)
    except orjson.JSONDecodeError:
        try:
            decoded = json.loads(data)
        except ValueError as exc:
            raise TransportError(f"{what} is not JSON") from exc
    if not isinstance(decoded, dict):
        raise TransportError(f"{what} is not a JSON object")
    return decoded


def _describe(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__


async def connect(*, kubeconfig: str | None = None, context: str | None = None) -> Any:
    """A `kubernetes.aio` ApiClient from a kubeconfig (or $KUBECONFIG / ~/.kube/config), else in-cluster.

    The caller closes it with `disconnect`. Passing `kubeconfig` forces that file; without
    it the in-cluster service account is used when the process runs in a pod, as `kubectl` would.
    """
    import os

    from kubernetes.aio import client, config

    configuration = client.Configuration()
    in_cluster = "KUBERNETES_SERVICE_HOST" in os.environ
    if kubeconfig is not None and not os.path.isfile(kubeconfig):
        # kubernetes' loader only logs "Config not found" and then fails with a less useful message.
        raise InvalidInput("", "no such kubeconfig file", where=kubeconfig)
    if kubeconfig is None and not in_cluster and not os.environ.get("KUBECONFIG") and \
            not os.path.isfile(os.path.expanduser("~/.kube/config")):
        raise InvalidInput("--kubeconfig", "no cluster configuration: not in a pod, no $KUBECONFIG and no "
                           "~/.kube/config (try --embedded for a simulated cluster)")
    try:
        if kubeconfig is None and in_cluster and not os.environ.get("KUBECONFIG"):
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            await config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, context=context, client_configuration=configuration, persist_config=False)
    except (config.ConfigException, OSError, ValueError) as exc:
        where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise InvalidInput("", f"cannot use the cluster configuration: {exc}", where=where) from exc
    return client.ApiClient(configuration)


# aiohttp closes a TLS connection asynchronously; its documented wait before the loop ends
# (https://docs.aiohttp.org/en/stable/client_advanced.html#graceful-shutdown).
TLS_CLOSE_WAIT = 0.25


async def disconnect(api_client: Any) -> None:
    """Close a client from `connect`, then wait the moment its TLS connections take to close: a command that ends
    its event loop at once leaves their sockets open, and they warn (ResourceWarning) wherever the garbage
    collector finds them - in the tests that run commands in-process, another test."""
    await api_client.close()
    await asyncio.sleep(TLS_CLOSE_WAIT)


__all__ = [
    "ACCEPT_JSON",
    "ACCEPT_METADATA",
    "ACCEPT_METADATA_LIST",
    "TLS_CLOSE_WAIT",
    "APIError",
    "APIStatusError",
    "KubeTransport",
    "Transport",
    "TransportError",
    "connect",
    "disconnect",
    "status_error",
]
