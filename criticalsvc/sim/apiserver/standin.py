"""The API-server stand-in: the simulator's Store served over the Kubernetes REST API.

What real clients need, and only that (measured with kubectl 1.32 and the `kubernetes` Python client
37; design/kubernetes-semantics.md §12): `/version` (minor "32", so the Cloud SDK's kubectl
dispatcher runs its 1.32 binary), discovery (aggregated v2 when asked with `v=v2`, legacy otherwise;
CRD groups appear as the CRD is created and go when it is gone), `/openapi/v2` as an empty protobuf
document (client-side validation finds no schema and passes), `/openapi/v3` for CRD-backed group
versions (so `kubectl explain criticalservices` works; each kind declares server-side
`fieldValidation`, so kubectl does not validate against a partial schema), and the resource verbs:
get, list (label and field selectors), watch (resourceVersion, 410 Gone as an ERROR event,
bookmarks, timeoutSeconds), create, update, patch (merge, a minimal strategic merge, JSON patch),
delete (DeleteOptions: propagationPolicy, preconditions, dryRun), deletecollection, the `status`
subresource, `namespaces/{name}/finalize` and the `scale` subresource of Deployments, ReplicaSets and
StatefulSets (`kubectl scale`). Errors are metav1.Status objects carrying the store's code, reason and
message, so kubectl prints them the real way (`Error from server (Forbidden): ...`).

What kubectl ≥ 1.32 needs beyond that, checked against kube-apiserver 1.37 (tests/test_clusters_api.py):
* server-side printing: `Accept: application/json;as=Table;v=v1;g=meta.k8s.io` on get, list and watch
  answers a meta.k8s.io Table (tables.py: CRD printer columns, the built-in printers), so `kubectl get`
  prints the server's columns; a Table watch sends the column definitions with its first event only;
* request bodies in JSON, YAML or Kubernetes protobuf (protobuf.py; client-go's typed clients send it:
  `kubectl create namespace|deployment|configmap|...`, `kubectl auth can-i`), a 415 naming what is not
  decoded otherwise (client-go falls back to JSON after a 415 for CBOR only);
* the create-only review APIs `kubectl auth can-i` (and `--list`) and `kubectl auth whoami` post: every
  review allows (there is no authorization here); discovery categories of built-ins (`kubectl get all`);
* custom resources get their structural schema's `default`s on every write, then are validated
  against it (schema.py: OpenAPI and CEL rules, ratcheting on update, the status subresource against
  the status schema): 422 Invalid with the real server's field errors, before any webhook is called;
* `Warning` headers as the API server's warning recorder writes them: raw UTF-8 (a webhook's "…"
  included), deduplicated, cut to 256 runes each once they pass 4096 in total.
Store semantics (finalizers, admission, terminating namespaces and CRDs) live in store.py; this
module translates HTTP to store calls and never re-implements them.

Threads, and why. The store's admission call is synchronous, and the webhook it calls may be served
by this very process on this very event loop (`serve --embedded`), or may read this API server back
(the gate's live confirmation read). So:

* every write (and every controller callback) runs on ONE writer thread: writes are serialized, as
  with one etcd writer, and the event loop never blocks on a webhook;
* reads run on a small reader pool;
* one lock guards the store's data. The writer holds it for the whole write except while a webhook
  call is out (`Store.around_webhook_call`), so readers - including the webhook's own read-back - get
  in, and see the state before the write. No other writer can interleave, so the write resumes on
  the state it admitted.

While a StandIn runs, touch the store only through `write()` / `read()` / `submit()`, or from
controllers scheduled on `standin.engine` (a RealTimeEngine whose callbacks run on the writer thread).

Use (what `criticalsvc serve --embedded` needs):

    store = Store(clock=time.time)
    store.create(crd_manifest)                                   # before serving: no lock needed yet
    store.webhooks.append(RegisteredWebhook(WebhookClient(url, ca_bundle=ca_pem)))  # or register_webhooks
    standin = StandIn(store, start_controllers=controllers.start_controllers)
    await serve(standin, host="127.0.0.1", port=0, on_ready=lambda url: write_kubeconfig(path, url))

`ServerThread(standin)` does the same on a thread of its own for synchronous callers and tests.

Webhook warnings reach the client as `Warning: 299 - "..."` headers (kubectl prints them).

Simplifications (documented, not hidden): one served version per resource; `limit` is ignored and no
`continue` token is returned (allowed by the API); answers are JSON only (no protobuf, YAML or
PartialObjectMetadata forms: clients that ask for them also accept JSON); protobuf bodies are decoded
for the kinds kubectl's generators and the reviews send (protobuf.py), others get 415; some built-in
printers are simplified or print NAME/AGE only (tables.py); the Scale subresource of custom resources
is not served; field selectors accept any dotted path; watch selector transitions are computed
against what this watch has seen; a write waiting on a slow webhook holds up other writes (never
reads) for up to its timeoutSeconds; no authentication or authorization (the user is the
`Impersonate-User` header, else `kubernetes-admin`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import functools
import hashlib
import re
import secrets
import socket
import threading
import time
import unicodedata
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import orjson
import structlog
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from ...api import CRDS, CRITICAL_SERVICES, NAMESPACES, GroupResource, ObjectRef
from ...labels import LabelSelector, Requirement
from ...restmapper import WELL_KNOWN, ResourceType, group_version_path
from ...timestamps import format_rfc3339
from .. import protobuf, tables
from .. import schema as crd_schema
from ..engine import Callback, Engine, RealTimeEngine
from ..store import DeleteResult, StatusError, Store, WatchEvent, not_found

__all__ = [
    "BUILTIN_NAMESPACES",
    "ServerThread",
    "StandIn",
    "json_patch",
    "merge_patch",
    "parse_field_selector",
    "parse_label_selector_text",
    "serve",
    "strategic_merge_patch",
]

log = structlog.get_logger("criticalsvc.sim.apiserver")
T = TypeVar("T")

# What a fresh cluster has; `default` is where Events about cluster-scoped objects go.
BUILTIN_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
SERVER_VERSION = {
    # minor "32": the Cloud SDK kubectl dispatcher runs the kubectl matching the server's minor, and
    # 1.32 is the one measured against this stand-in (design/kubernetes-semantics.md §12).
    "major": "1", "minor": "32", "gitVersion": "v1.32.0", "gitCommit": "", "gitTreeState": "clean",
    "buildDate": "2024-12-11T00:00:00Z", "goVersion": "go1.23.3", "compiler": "gc", "platform": "linux/amd64",
}
DEFAULT_USER = "kubernetes-admin"
# Types served on top of the store's mapper: events.k8s.io/v1 Events are a plain collection here
# (the real API server stores them with core Events).
EXTRA_TYPES = (ResourceType("events.k8s.io", "v1", "Event", "events", "event", True, ("ev",)),)
VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
# Built-in resources without a status subresource (kubectl api-resources, 1.32).
NO_STATUS = frozenset({
    GroupResource("", "events"), GroupResource("events.k8s.io", "events"), GroupResource("", "configmaps"),
    GroupResource("", "secrets"), GroupResource("", "serviceaccounts"), GroupResource("", "endpoints"),
    GroupResource("", "limitranges"), GroupResource("coordination.k8s.io", "leases"),
    *(GroupResource("rbac.authorization.k8s.io", r) for r in ("roles", "rolebindings", "clusterroles",
                                                              "clusterrolebindings")),
    GroupResource("admissionregistration.k8s.io", "validatingwebhookconfigurations"),
    GroupResource("admissionregistration.k8s.io", "mutatingwebhookconfigurations"),
})
# Discovery categories of built-in types (`kubectl get all` lists the `all` category).
BUILTIN_CATEGORIES: dict[GroupResource, tuple[str, ...]] = {
    **{GroupResource(g, r): ("all",) for g, r in (
        ("", "pods"), ("", "replicationcontrollers"), ("", "services"), ("apps", "daemonsets"),
        ("apps", "deployments"), ("apps", "replicasets"), ("apps", "statefulsets"),
        ("autoscaling", "horizontalpodautoscalers"), ("batch", "cronjobs"), ("batch", "jobs"))},
    **{GroupResource(g, r): ("api-extensions",) for g, r in (
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"),
        ("admissionregistration.k8s.io", "validatingwebhookconfigurations"),
        ("apiextensions.k8s.io", "customresourcedefinitions"))},
}
# Workloads with a `scale` subresource (autoscaling/v1 Scale; `kubectl scale`).
SCALABLE = frozenset({GroupResource("apps", "deployments"), GroupResource("apps", "replicasets"),
                      GroupResource("apps", "statefulsets")})
SCALE_KIND = {"group": "autoscaling", "version": "v1", "kind": "Scale"}
SCALE_TYPE = ResourceType("autoscaling", "v1", "Scale", "scale", "scale", True)
# Create-only review APIs without storage: `kubectl auth can-i` (and --list), `kubectl auth whoami`.
REVIEWS: dict[GroupResource, ResourceType] = {t.group_resource: t for t in (
    ResourceType("authorization.k8s.io", "v1", "SelfSubjectAccessReview", "selfsubjectaccessreviews",
                 "selfsubjectaccessreview", False),
    ResourceType("authorization.k8s.io", "v1", "SelfSubjectRulesReview", "selfsubjectrulesreviews",
                 "selfsubjectrulesreview", False),
    ResourceType("authentication.k8s.io", "v1", "SelfSubjectReview", "selfsubjectreviews", "selfsubjectreview",
                 False),
)}
# Kinds compiled into kubectl and the API server (strategic merge patch works on these only).
NOT_BUILTIN_GROUPS = frozenset({"criticalsvc.io", "work.open-cluster-management.io"})
BUILTIN = frozenset({t.group_resource for t in (*WELL_KNOWN, *EXTRA_TYPES) if t.group not in NOT_BUILTIN_GROUPS})
DISCOVERY_V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
OPENAPI_V2_PROTOBUF = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
DEFAULT_CRD_PATH = Path(__file__).resolve().parents[3] / "api" / "criticalservices.criticalsvc.io.yaml"
# The API server picks a watch timeout between 30 and 60 min (--min-request-timeout 1800 s).
DEFAULT_WATCH_TIMEOUT = 1800.0
# The watch cache sends a bookmark about once a minute.
DEFAULT_BOOKMARK_INTERVAL = 60.0


# --- selectors ---------------------------------------------------------------------------------------
_REQUIREMENT = re.compile(
    r"^\s*(?:(?P<not>!)\s*(?P<nkey>[^\s=!(),]+)"
    r"|(?P<key>[^\s=!(),]+)\s*(?:(?P<op>==|=|!=)\s*(?P<value>[^\s,()]*)"
    r"|\s+(?P<setop>in|notin)\s*\((?P<values>[^()]*)\))?)\s*$")


def _split_top(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]


def parse_label_selector_text(text: str) -> LabelSelector:
    """A `labelSelector` query value (`app=web,tier!=db,env in (a,b),!legacy`); 400 if malformed."""
    requirements: list[Requirement] = []
    for part in _split_top(text):
        m = _REQUIREMENT.match(part)
        if m is None:
            raise StatusError(400, "BadRequest", f'unable to parse requirement: found "{part.strip()}", '
                              "expected: key, key=value, key!=value, key in (...), key notin (...) or !key")
        if m["not"]:
            requirements.append(Requirement(m["nkey"], "DoesNotExist"))
        elif m["op"]:
            requirements.append(Requirement(m["key"], "NotIn" if m["op"] == "!=" else "In",
                                            frozenset([m["value"]])))
        elif m["setop"]:
            values = frozenset(v.strip() for v in m["values"].split(",") if v.strip())
            requirements.append(Requirement(m["key"], "In" if m["setop"] == "in" else "NotIn", values))
        else:
            requirements.append(Requirement(m["key"], "Exists"))
    return LabelSelector(tuple(requirements))


FieldRequirement = tuple[tuple[str, ...], bool, str]  # (path, equal?, value)


def parse_field_selector(text: str) -> list[FieldRequirement]:
    """A `fieldSelector` (`metadata.name=x,metadata.namespace!=y`); any dotted path is accepted."""
    result: list[FieldRequirement] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        m = re.match(r"^([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*)$", part)
        if m is None:
            raise StatusError(400, "BadRequest", f'invalid field selector: "{part}": expected field=value or '
                              "field!=value")
        result.append((tuple(m[1].split(".")), m[2] != "!=", m[3]))
    return result


def _field(obj: Any, path: tuple[str, ...]) -> str:
    for key in path:
        obj = obj.get(key) if isinstance(obj, Mapping) else None
    if obj is None:
        return ""
    if isinstance(obj, bool):
        return str(obj).lower()
    return str(obj)


def _matcher(params: Mapping[str, str]) -> Callable[[Mapping[str, Any]], bool]:
    labels = parse_label_selector_text(params.get("labelSelector", ""))
    fields = parse_field_selector(params.get("fieldSelector", ""))

    def match(obj: Mapping[str, Any]) -> bool:
        md = obj.get("metadata") or {}
        if not labels.matches(md.get("labels") or {}):
            return False
        return all((_field(obj, path) == value) == equal for path, equal, value in fields)

    return match


# --- patches -----------------------------------------------------------------------------------------
def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# patchMergeKey of the object lists kubectl patches (k8s.io/api struct tags); other lists are replaced.
MERGE_KEYS = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name", "env": "name",
    "volumes": "name", "imagePullSecrets": "name", "volumeMounts": "mountPath", "volumeDevices": "devicePath",
    "conditions": "type", "ownerReferences": "uid", "hostAliases": "ip", "resourceClaims": "name",
}
# Primitive lists with patchStrategy=merge (ObjectMeta.finalizers): the patch's values are added.
MERGED_PRIMITIVE_LISTS = frozenset({"finalizers"})
_DELETE = object()


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """The part of strategic merge patch kubectl's client-side apply and `kubectl patch` use.

    Directives: `$patch: replace|delete` (maps and list items), `$deleteFromPrimitiveList/<f>`;
    `$setElementOrder/<f>` and `$retainKeys` are dropped. Object lists in MERGE_KEYS merge by key
    (`ports` by containerPort, else port); `finalizers` is a merged set; other lists are replaced.
    """
    result = _smp(target, patch)
    return {} if result is _DELETE else result


def _smp(target: Any, patch: Any) -> Any:
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "delete":
        return _DELETE
    base: dict[str, Any] = {} if directive == "replace" or not isinstance(target, Mapping) else dict(target)
    deletions: list[tuple[str, list[Any]]] = []
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys") or key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            deletions.append((key.partition("/")[2], list(value or [])))
        elif value is None:
            base.pop(key, None)
        elif isinstance(value, Mapping):
            merged = _smp(base.get(key), value)
            if merged is _DELETE:
                base.pop(key, None)
            else:
                base[key] = merged
        elif isinstance(value, list):
            base[key] = _smp_list(key, base.get(key), value)
        else:
            base[key] = value
    for key, values in deletions:
        if isinstance(base.get(key), list):
            base[key] = [v for v in base[key] if v not in values]
    return base


def _smp_list(key: str, current: Any, patch: list[Any]) -> list[Any]:
    if any(isinstance(x, Mapping) and x.get("$patch") == "replace" for x in patch):
        return [_smp(None, x) for x in patch if not (isinstance(x, Mapping) and x.get("$patch") == "replace")]
    existing = list(current) if isinstance(current, list) else []
    merge_key = MERGE_KEYS.get(key)
    if key == "ports":
        merge_key = "containerPort" if any(isinstance(x, Mapping) and "containerPort" in x for x in patch) else "port"
    if merge_key and all(isinstance(x, Mapping) for x in patch) and all(isinstance(x, Mapping) for x in existing):
        for item in patch:
            at = next((i for i, x in enumerate(existing) if x.get(merge_key) == item.get(merge_key)), None)
            if item.get("$patch") == "delete":
                if at is not None:
                    del existing[at]
            elif at is None:
                existing.append(_smp(None, item))
            else:
                existing[at] = _smp(existing[at], item)
        return existing
    if key in MERGED_PRIMITIVE_LISTS:
        return existing + [x for x in patch if x not in existing]
    return [_smp(None, x) for x in patch]


class PatchError(ValueError):
    """A JSON patch that cannot be applied (bad pointer, failed test)."""


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f'invalid JSON pointer "{path}"')
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _container(doc: Any, parts: list[str], path: str) -> tuple[Any, str]:
    node = doc
    for part in parts[:-1]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise PatchError(f'path "{path}" does not exist')
    return node, parts[-1]


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test)."""
    if not isinstance(operations, list):
        raise PatchError("a JSON patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, Mapping) or not isinstance(op.get("path"), str):
            raise PatchError(f"invalid operation {op!r}")
        kind, path = op.get("op"), op["path"]
        if kind in ("move", "copy"):
            source = _get_pointer(doc, str(op.get("from", "")))
            if kind == "move":
                doc = _remove_pointer(doc, str(op.get("from", "")))
            doc = _add_pointer(doc, path, copy.deepcopy(source))
        elif kind == "add":
            doc = _add_pointer(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            doc = _remove_pointer(doc, path)
        elif kind == "replace":
            _get_pointer(doc, path)
            doc = _add_pointer(_remove_pointer(doc, path), path, copy.deepcopy(op.get("value")))
        elif kind == "test":
            if _get_pointer(doc, path) != op.get("value"):
                raise PatchError(f'testing value "{path}" failed')
        else:
            raise PatchError(f'unexpected operation "{kind}"')
    return doc


def _get_pointer(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        return doc
    node, last = _container(doc, parts, path)
    if isinstance(node, dict) and last in node:
        return node[last]
    if isinstance(node, list) and last.isdigit() and int(last) < len(node):
        return node[int(last)]
    raise PatchError(f'path "{path}" does not exist')


def _add_pointer(doc: Any, path: str, value: Any) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    node, last = _container(doc, parts, path)
    if isinstance(node, dict):
        node[last] = value
    elif isinstance(node, list) and last == "-":
        node.append(value)
    elif isinstance(node, list) and last.isdigit() and int(last) <= len(node):
        node.insert(int(last), value)
    else:
        raise PatchError(f'path "{path}" does not exist')
    return doc


def _remove_pointer(doc: Any, path: str) -> Any:
    _get_pointer(doc, path)
    parts = _pointer(path)
    if not parts:
        return None
    node, last = _container(doc, parts, path)
    if isinstance(node, dict):
        del node[last]
    else:
        del node[int(last)]
    return doc


# --- concurrency -------------------------------------------------------------------------------------
class _StoreGuard:
    """One data lock; the writer thread lends it to readers while a webhook call is out."""

    def __init__(self) -> None:
        self.data = threading.Lock()
        self._writer: int | None = None

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        with self.data:
            self._writer = threading.get_ident()
            try:
                yield
            finally:
                self._writer = None

    @contextlib.contextmanager
    def outside(self) -> Iterator[None]:
        """Store.around_webhook_call: release the data lock for the call, if this thread holds it."""
        if self._writer != threading.get_ident():
            yield
            return
        self._writer = None
        self.data.release()
        try:
            yield
        finally:
            self.data.acquire()
            self._writer = threading.get_ident()


class StandInEngine(RealTimeEngine):
    """Wall-clock time whose callbacks run on the stand-in's writer thread, holding the store.

    It exists before the stand-in starts (so a `Cluster(engine=...)` can be built on it); callbacks
    scheduled before then wait, and run when the stand-in starts, at their due time.
    """

    def __init__(self) -> None:
        super().__init__(None)
        self._run: Callable[[Callback], None] | None = None
        self._pending: list[tuple[float, Callback]] = []
        self._attach = threading.Lock()

    def attach(self, loop: asyncio.AbstractEventLoop, run: Callable[[Callback], None]) -> None:
        with self._attach:
            self._loop, self._run = loop, run
            pending, self._pending = self._pending, []
        for due, callback in pending:
            self.schedule(due - self.now(), callback)

    def schedule(self, delay: float, callback: Callback) -> None:
        with self._attach:
            run = self._run
            if run is None:
                self._pending.append((self.now() + delay, callback))
                return
        super().schedule(delay, lambda: run(callback))


# --- the stand-in ------------------------------------------------------------------------------------
class _Served(NamedTuple):
    """A resource type as discovery shows it."""

    type: ResourceType
    status: bool
    categories: tuple[str, ...]
    verbs: tuple[str, ...] = tuple(VERBS)


class _Closing:
    """Sentinel put on watch queues when the stand-in stops."""


class StandIn:
    """The Store behind the Kubernetes REST API; `app` is the ASGI application.

    Controllers run on `engine` (a StandInEngine: real time, callbacks on the writer thread). Either
    pass `start_controllers(store, engine)`, called once on the writer thread when the stand-in starts,
    or build them beforehand on an engine you pass in (`engine = StandInEngine(); cluster =
    Cluster(engine=engine); StandIn(cluster.store, engine=engine)`). `bootstrap_namespaces` are
    created at start if missing.
    """

    def __init__(self, store: Store, *, engine: StandInEngine | None = None,
                 start_controllers: Callable[[Store, Engine], object] | None = None,
                 bootstrap_namespaces: Iterable[str] = BUILTIN_NAMESPACES,
                 bookmark_interval: float = DEFAULT_BOOKMARK_INTERVAL,
                 watch_timeout: float = DEFAULT_WATCH_TIMEOUT, crd_path: Path | None = DEFAULT_CRD_PATH,
                 default_user: str = DEFAULT_USER, readers: int = 4) -> None:
        self.store = store
        self.start_controllers = start_controllers
        self.bootstrap_namespaces = tuple(bootstrap_namespaces)
        self.bookmark_interval = bookmark_interval
        self.watch_timeout = watch_timeout
        self.crd_path = crd_path
        self.default_user = default_user
        # What a real server's discovery can also say: served without the aggregated form (before 1.26,
        # or behind a proxy), or an aggregated API whose backend does not answer marked `Stale`.
        self.aggregated_discovery = True
        self.stale_groups: set[str] = set()
        for t in EXTRA_TYPES:
            if store.mapper.lookup(t.group_resource) is None:
                store.mapper.add(t)
        self._guard = _StoreGuard()
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="standin-writer")
        self._readers = concurrent.futures.ThreadPoolExecutor(readers, thread_name_prefix="standin-reader")
        self._watches: set[asyncio.Queue[WatchEvent | _Closing]] = set()
        self._started: asyncio.Future[None] | None = None
        self._engine = engine or StandInEngine()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self.app = Starlette(routes=[Route("/{path:path}", self._endpoint,
                                           methods=["GET", "POST", "PUT", "PATCH", "DELETE"])],
                             lifespan=self._lifespan)

    # --- lifecycle ------------------------------------------------------------------------------------
    @property
    def engine(self) -> StandInEngine:
        """The controllers' engine: real time, callbacks on the writer thread (held until start)."""
        return self._engine

    async def start(self) -> None:
        """Bootstrap namespaces and start the controllers (idempotent; the first request calls it)."""
        if self._started is None:
            self._started = asyncio.ensure_future(self._start())
        await self._started

    async def _start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._engine.attach(self._loop, self._run_callback)
        self.store.around_webhook_call = self._guard.outside

        def boot() -> None:
            for name in self.bootstrap_namespaces:
                if not self.store.exists(NAMESPACES, "", name):
                    self.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
            if self.start_controllers is not None:
                self.start_controllers(self.store, self._engine)

        await self.write(boot)

    async def stop(self) -> None:
        """End every watch, stop running controller callbacks and release the threads."""
        self._closed = True
        self.close_watches()
        self._writer.shutdown(wait=False, cancel_futures=True)
        self._readers.shutdown(wait=False, cancel_futures=True)

    @property
    def open_watches(self) -> int:
        """How many watch streams are open (subscribed to the store)."""
        return len(self._watches)

    def close_watches(self) -> None:
        """End all open watch streams now (before a graceful server shutdown); callable from any thread."""
        loop = self._loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is not None and running is not loop:
            with contextlib.suppress(RuntimeError):  # the loop is closed: no stream is left to end
                loop.call_soon_threadsafe(self.close_watches)
            return
        for queue in list(self._watches):
            queue.put_nowait(_Closing())

    @contextlib.asynccontextmanager
    async def _lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        await self.start()
        try:
            yield
        finally:
            await self.stop()

    # --- store access ---------------------------------------------------------------------------------
    def _locked_write(self, fn: Callable[[], T]) -> T:
        with self._guard.writing():
            return fn()

    def _locked_read(self, fn: Callable[[], T]) -> T:
        with self._guard.data:
            return fn()

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run `fn` on the writer thread holding the store. Call it from any thread but that one: a
        controller callback already runs there and holds the store, and waiting on it would deadlock."""
        return self._writer.submit(self._locked_write, fn)

    async def write(self, fn: Callable[[], T]) -> T:
        return await asyncio.wrap_future(self.submit(fn))

    async def read(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._readers, self._locked_read, fn)

    def _run_callback(self, callback: Callback) -> None:
        if self._closed:
            return

        def run() -> None:
            try:
                callback()
            except Exception:  # a failing controller must not take the API server down
                log.exception("controller callback failed")

        with contextlib.suppress(RuntimeError):  # shutting down
            self.submit(run)

    # --- HTTP -----------------------------------------------------------------------------------------
    async def _endpoint(self, request: Request) -> Response:
        try:
            await self.start()
            return await self._route(request)
        except StatusError as exc:
            return _status(exc)
        except Exception as exc:
            log.exception("stand-in request failed", method=request.method, path=request.url.path)
            return _status(StatusError(500, "InternalError", f"Internal error occurred: {exc}"))

    async def _route(self, request: Request) -> Response:
        parts = [p for p in request.url.path.split("/") if p]
        if not parts:
            return _json({"paths": ["/api", "/api/v1", "/apis", "/healthz", "/livez", "/openapi/v2",
                                    "/openapi/v3", "/readyz", "/version"]})
        head = parts[0]
        if len(parts) == 1 and head in ("healthz", "livez", "readyz"):
            return Response(b"ok", media_type="text/plain")
        if parts == ["version"]:
            return _json(SERVER_VERSION)
        if head == "openapi":
            return await self._openapi(parts[1:])
        if head == "api":
            if len(parts) == 1:
                return await self._discovery_core(request)
            if parts[1] != "v1":
                raise _not_served()
            return await self._resource(request, "", "v1", parts[2:])
        if head == "apis":
            if len(parts) == 1:
                return await self._discovery_groups(request)
            if len(parts) == 2:
                return await self._api_group(parts[1])
            return await self._resource(request, parts[1], parts[2], parts[3:])
        raise _not_served()

    # --- discovery ------------------------------------------------------------------------------------
    def _types(self) -> list[ResourceType]:
        return sorted(self.store.mapper.types(), key=lambda t: (t.group, t.plural))

    def _has_status(self, t: ResourceType) -> bool:
        crd = self.store.get(CRDS, "", f"{t.plural}.{t.group}") if t.group else None
        if crd is None:
            return t.group_resource not in NO_STATUS
        for v in (crd.get("spec") or {}).get("versions") or []:
            if isinstance(v, Mapping) and v.get("name") == t.version:
                return isinstance((v.get("subresources") or {}).get("status"), Mapping)
        return False

    def _categories(self, t: ResourceType) -> list[str]:
        crd = self.store.get(CRDS, "", f"{t.plural}.{t.group}") if t.group else None
        if crd is None and t.group_resource == CRITICAL_SERVICES:
            crd = _load_crd(self.crd_path)
        if crd is None:
            return list(BUILTIN_CATEGORIES.get(t.group_resource, ()))
        names = (crd.get("spec") or {}).get("names") or {}
        categories = names.get("categories") if isinstance(names, Mapping) else None
        return [str(c) for c in categories] if isinstance(categories, list) else []

    def _groups(self) -> dict[str, dict[str, list[_Served]]]:
        groups: dict[str, dict[str, list[_Served]]] = {}
        for t in self._types():
            served = _Served(t, self._has_status(t), tuple(self._categories(t)))
            groups.setdefault(t.group, {}).setdefault(t.version, []).append(served)
        for t in REVIEWS.values():  # create-only APIs with no storage (kubectl auth can-i / whoami)
            groups.setdefault(t.group, {}).setdefault(t.version, []).append(_Served(t, False, (), ("create",)))
        for versions in groups.values():
            for entries in versions.values():
                entries.sort(key=lambda served: served.type.plural)
        return groups

    async def _discovery_core(self, request: Request) -> Response:
        groups = await self.read(self._groups)
        if self.aggregated_discovery and _wants_aggregated(request):
            return _json(_aggregated({"": groups.get("", {})}, self.stale_groups), media_type=DISCOVERY_V2)
        return _json({"kind": "APIVersions", "apiVersion": "v1", "versions": ["v1"],
                      "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0",
                                                      "serverAddress": request.url.netloc}]})

    async def _discovery_groups(self, request: Request) -> Response:
        groups = await self.read(self._groups)
        named = {g: vs for g, vs in sorted(groups.items(), key=lambda kv: _group_order(kv[0])) if g}
        if self.aggregated_discovery and _wants_aggregated(request):
            return _json(_aggregated(named, self.stale_groups), media_type=DISCOVERY_V2)
        return _json({"kind": "APIGroupList", "apiVersion": "v1",
                      "groups": [_api_group_doc(g, list(vs)) for g, vs in named.items()]})

    async def _api_group(self, group: str) -> Response:
        groups = await self.read(self._groups)
        if not group or group not in groups:
            raise _not_served()
        return _json(_api_group_doc(group, list(groups[group])))

    async def _resource_list(self, group: str, version: str) -> Response:
        groups = await self.read(self._groups)
        entries = groups.get(group, {}).get(version)
        if entries is None:
            raise _not_served()
        gv = f"{group}/{version}" if group else version
        resources: list[dict[str, Any]] = []
        for t, status, categories, verbs in entries:
            resource: dict[str, Any] = {"name": t.plural, "singularName": t.singular, "namespaced": t.namespaced,
                                        "kind": t.kind, "verbs": list(verbs)}
            if t.short_names:
                resource["shortNames"] = list(t.short_names)
            if categories:
                resource["categories"] = list(categories)
            resources.append(resource)
            for sub in _subresources(t, status):
                entry: dict[str, Any] = {"name": f"{t.plural}/{sub}", "singularName": "", "namespaced": t.namespaced,
                                         "kind": t.kind, "verbs": _SUBRESOURCE_VERBS[sub]}
                if sub == "scale":
                    entry.update(SCALE_KIND)
                resources.append(entry)
        return _json({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})

    # --- openapi --------------------------------------------------------------------------------------
    async def _openapi(self, rest: list[str]) -> Response:
        if rest == ["v2"]:
            # An empty protobuf document: kubectl finds no schema and skips client-side validation.
            return Response(b"", media_type=OPENAPI_V2_PROTOBUF)
        if not rest or rest[0] != "v3":
            raise _not_served()
        documents = await self.read(self._openapi_documents)
        if len(rest) == 1:
            return _json({"paths": {path: {"serverRelativeURL": f"/openapi/v3/{path}?hash={_hash(doc)}"}
                                    for path, doc in documents.items()}})
        doc = documents.get("/".join(rest[1:]))
        if doc is None:
            raise _not_served()
        return _json(doc)

    def _openapi_documents(self) -> dict[str, dict[str, Any]]:
        """One OpenAPI v3 document per group/version that has a schema (CRD-backed types)."""
        documents: dict[str, dict[str, Any]] = {}
        for t in self._types():
            schema = self._schema(t)
            if schema is None:
                continue
            path = group_version_path(t.group, t.version).removeprefix("/")  # served as /openapi/v3/<path>
            doc = documents.setdefault(path, {"openapi": "3.0.0", "info": {"title": "Kubernetes",
                                                                              "version": "v1.32.0"},
                                              "paths": {}, "components": {"schemas": {}}})
            gvk = {"group": t.group, "version": t.version, "kind": t.kind}
            name = ".".join([*reversed(t.group.split(".")), t.version, t.kind])
            doc["components"]["schemas"][name] = {**schema, "x-kubernetes-group-version-kind": [gvk]}
            # Declaring fieldValidation makes kubectl leave validation to the server (it sends
            # fieldValidation=Strict), rather than validate against this partial document.
            doc["paths"][t.path(namespace="{namespace}", name="{name}")] = {"patch": {
                "operationId": f"patch{t.kind}", "x-kubernetes-group-version-kind": gvk,
                "x-kubernetes-action": "patch",
                "parameters": [{"name": "fieldValidation", "in": "query", "schema": {"type": "string"}}],
                "responses": {"200": {"description": "OK"}}}}
        return documents

    def _schema(self, t: ResourceType) -> dict[str, Any] | None:
        crd = self.store.get(CRDS, "", f"{t.plural}.{t.group}") if t.group else None
        if crd is None and t.group_resource == CRITICAL_SERVICES:
            crd = _load_crd(self.crd_path) or _FALLBACK_CRD
        if crd is None:
            return None
        schema: dict[str, Any] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        for v in (crd.get("spec") or {}).get("versions") or []:
            if isinstance(v, Mapping) and v.get("name") == t.version:
                found = ((v.get("schema") or {}).get("openAPIV3Schema"))
                if isinstance(found, Mapping):
                    schema = copy.deepcopy(dict(found))
        properties = schema.setdefault("properties", {})
        properties.setdefault("apiVersion", {"type": "string", "description": (
            "APIVersion defines the versioned schema of this representation of an object.")})
        properties.setdefault("kind", {"type": "string", "description": (
            "Kind is a string value representing the REST resource this object represents.")})
        properties.setdefault("metadata", {"type": "object", "description": (
            "Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/"
            "sig-architecture/api-conventions.md#metadata")})
        return schema

    # --- resources ------------------------------------------------------------------------------------
    async def _resource(self, request: Request, group: str, version: str, rest: list[str]) -> Response:
        params = {k: v for k, v in request.query_params.items()}
        watch = False
        if rest and rest[0] == "watch":  # the deprecated /watch/ prefix
            watch, rest = True, rest[1:]
        if not rest:
            if request.method != "GET":
                raise _method_not_allowed(request.method)
            return await self._resource_list(group, version)
        namespace: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3 and not (len(rest) == 3 and rest[2] in ("status", "finalize")):
            namespace, rest = rest[1], rest[2:]
        if len(rest) > 3:
            raise _not_served()
        review = REVIEWS.get(GroupResource(group, rest[0]))
        if review is not None and review.version == version and len(rest) == 1 and namespace is None:
            if request.method != "POST":
                raise _method_not_allowed(request.method)
            return await self._review(request, review)
        t = await self.read(lambda: self.store.mapper.lookup(GroupResource(group, rest[0])))
        if t is None or t.plural != rest[0] or t.version != version:
            raise _not_served()
        if namespace is not None and not t.namespaced:
            raise _not_served()
        if len(rest) > 1 and t.namespaced and namespace is None:
            raise _not_served()
        if not t.namespaced:
            namespace = ""
        user = request.headers.get("impersonate-user") or self.default_user
        if len(rest) == 1:
            watch = watch or params.get("watch") in ("true", "1")
            if request.method == "GET":
                form = _output_form(request, params)
                return await (self._watch(t, namespace, params, form) if watch
                              else self._list(t, namespace, params, form))
            if request.method == "POST":
                if namespace is None:
                    raise _method_not_allowed("POST")
                return await self._create(request, t, namespace, params, user)
            if request.method == "DELETE":
                return await self._delete_collection(request, t, namespace, params, user)
            raise _method_not_allowed(request.method)
        assert namespace is not None
        ref = ObjectRef(t.group_resource, namespace, rest[1])
        if len(rest) == 3:
            return await self._subresource(request, t, ref, rest[2], params, user)
        if request.method == "GET":
            form = _output_form(request, params)

            def get() -> tuple[dict[str, Any] | None, tables.Printer | None]:
                found = self.store.get(ref.group_resource, ref.namespace, ref.name)
                return found, (self._printer(t) if form.table and found is not None else None)

            obj, printer = await self.read(get)
            if obj is None:
                raise not_found(t.group_resource, ref.name)
            if printer is not None:
                return _json(self._table(printer, [obj], str(obj["metadata"].get("resourceVersion", "")), form,
                                         is_list=False))
            return _json(obj)
        if request.method == "PUT":
            return await self._update(request, t, ref, params, user)
        if request.method == "PATCH":
            return await self._patch(request, t, ref, params, user)
        if request.method == "DELETE":
            return await self._delete(request, t, ref, params, user)
        raise _method_not_allowed(request.method)

    async def _mutate(self, fn: Callable[[], T]) -> tuple[T, list[str]]:
        """Run a write; return its result and the webhooks' warnings (raised errors carry them too)."""
        def op() -> tuple[T, list[str]]:
            self.store.admission_warnings.clear()
            try:
                result = fn()
            except StatusError as exc:
                exc.warnings = list(self.store.admission_warnings)  # type: ignore[attr-defined]
                raise
            return result, list(self.store.admission_warnings)

        return await self.write(op)

    async def _list(self, t: ResourceType, namespace: str | None, params: Mapping[str, str],
                    form: _OutputForm) -> Response:
        match = _matcher(params)

        def op() -> tuple[int, list[dict[str, Any]], tables.Printer | None]:
            items = self.store.list(t.group_resource, namespace or None)
            return (self.store.resource_version, [o for o in items if match(o)],
                    self._printer(t) if form.table else None)

        rv, items, printer = await self.read(op)
        if printer is not None:
            return _json(self._table(printer, items, str(rv), form))
        if form.metadata_list:
            # As the real API server encodes it: an empty list's items are `null` (a nil Go slice).
            partial = [{"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]}
                       for o in items]
            return _json({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                          "metadata": {"resourceVersion": str(rv)}, "items": partial or None})
        return _json({"kind": f"{t.kind}List", "apiVersion": t.api_version,
                      "metadata": {"resourceVersion": str(rv)}, "items": items})

    # --- server-side printing (kubectl get) -----------------------------------------------------------
    def _printer(self, t: ResourceType) -> tables.Printer:
        """How the real API server prints `t`: the CRD's printer columns, else the built-in printer.
        Call holding the store (it reads the CRD)."""
        crd = self.store.get(CRDS, "", f"{t.plural}.{t.group}") if t.group else None
        if crd is None and t.group_resource == CRITICAL_SERVICES:
            crd = _load_crd(self.crd_path)
        if crd is not None:
            try:
                return tables.crd_table_columns(crd, t.version)
            except tables.TableError:  # the API server falls back to its default convertor
                return tables.DEFAULT
        return tables.printer_for(t.group_resource)

    def _table(self, printer: tables.Printer, objects: list[dict[str, Any]], resource_version: str,
               form: _OutputForm, *, headers: bool = True, is_list: bool = True) -> dict[str, Any]:
        try:
            return tables.make_table(printer, objects, now=self.store.clock(), resource_version=resource_version,
                                     include_object=form.include_object, headers=headers,
                                     group_version=form.group_version, is_list=is_list)
        except tables.TableError as exc:
            raise StatusError(400, "BadRequest", str(exc)) from exc

    async def _create(self, request: Request, t: ResourceType, namespace: str, params: Mapping[str, str],
                      user: str) -> Response:
        body = _object_body(await _request_body(request), t)
        md = body.setdefault("metadata", {})
        if t.namespaced:
            if md.get("namespace") and md["namespace"] != namespace:
                raise StatusError(400, "BadRequest", "the namespace of the provided object does not match the "
                                  "namespace sent on the request")
            md["namespace"] = namespace
        if not md.get("name") and md.get("generateName"):
            # apiserver's SimpleNameGenerator: 5 characters from an alphabet without vowels.
            md["name"] = md["generateName"] + "".join(secrets.choice("bcdfghjklmnpqrstvwxz2456789")
                                                      for _ in range(5))

        def op() -> dict[str, Any]:
            self._default(t, body)
            self._validate(t, body)
            return self.store.create(body, user=user, dry_run=_dry_run(params))

        obj, warnings = await self._mutate(op)
        return _json(obj, status_code=201, warnings=warnings)

    def _default(self, t: ResourceType, obj: dict[str, Any]) -> None:
        """The `default`s of a custom resource's structural schema, as the API server applies them to
        every write (apiextensions-apiserver structural/defaulting)."""
        crd = self.store.get(CRDS, "", f"{t.plural}.{t.group}") if t.group else None
        for v in ((crd or {}).get("spec") or {}).get("versions") or []:
            if isinstance(v, Mapping) and v.get("name") == t.version:
                schema = (v.get("schema") or {}).get("openAPIV3Schema")
                if isinstance(schema, Mapping):
                    _apply_defaults(obj, schema)

    def _validate(self, t: ResourceType, obj: Mapping[str, Any], current: Mapping[str, Any] | None = None, *,
                  status: bool = False) -> None:
        """A custom resource write checked against its CRD's schema (schema.py: OpenAPI, then CEL rules;
        an update ratchets what it leaves unchanged), as the registry checks it after defaulting and
        before the validating webhooks: 422 Invalid, one cause per field error. Built-in types are not
        checked here, nor writes the real server refuses before validating (a stale resourceVersion:
        409; a create while the CRD terminates: 403), which the store then refuses."""
        if not t.group or t.group_resource in BUILTIN:
            return
        crd = self.store.get(CRDS, "", f"{t.plural}.{t.group}")
        if crd is None:
            return
        if current is None and (crd.get("metadata") or {}).get("deletionTimestamp"):
            return
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if current is not None and rv and rv != (current.get("metadata") or {}).get("resourceVersion"):
            return
        found = crd_schema.served_schema(crd, t.version)
        if found is None:
            return
        errors = crd_schema.validate(obj, found, current, status_only=status)
        if errors:
            name = str((obj.get("metadata") or {}).get("name") or "")
            status_body = crd_schema.invalid_status(t.group, t.kind, name, errors)
            raise StatusError(422, "Invalid", status_body["message"], details=status_body["details"])

    def _preserve(self, t: ResourceType, new: dict[str, Any], current: Mapping[str, Any]) -> None:
        """What the registry strategies keep on a main-resource update: status, a namespace's finalizers."""
        if self._has_status(t):
            if "status" in current:
                new["status"] = copy.deepcopy(current["status"])
            else:
                new.pop("status", None)
        if t.group_resource == NAMESPACES:
            new.setdefault("spec", {})["finalizers"] = list((current.get("spec") or {}).get("finalizers") or [])

    def _existing(self, t: ResourceType, ref: ObjectRef) -> dict[str, Any]:
        """The stored object `ref`, or a 404 NotFound as the API server answers a write to a missing one."""
        current = self.store.get(ref.group_resource, ref.namespace, ref.name)
        if current is None:
            raise not_found(t.group_resource, ref.name)
        return current

    async def _update(self, request: Request, t: ResourceType, ref: ObjectRef, params: Mapping[str, str],
                      user: str) -> Response:
        body = _object_body(await _request_body(request), t)
        _check_identity(body, t, ref)

        def op() -> dict[str, Any]:
            current = self._existing(t, ref)
            self._preserve(t, body, current)
            self._default(t, body)
            self._validate(t, body, current)
            return self.store.update(body, user=user, dry_run=_dry_run(params))

        obj, warnings = await self._mutate(op)
        return _json(obj, warnings=warnings)

    async def _patch(self, request: Request, t: ResourceType, ref: ObjectRef, params: Mapping[str, str],
                     user: str, *, status_only: bool = False) -> Response:
        content_type = request.headers.get("content-type", "").split(";")[0].strip()
        apply = self._patcher(t, content_type)
        patch = _json_body(await request.body())

        def op() -> dict[str, Any]:
            current = self._existing(t, ref)
            try:
                new = apply(current, patch)
            except PatchError as exc:
                raise StatusError(422, "Invalid", f"the server rejected our request due to an error in our "
                                  f"request: {exc}") from exc
            if not isinstance(new, dict):
                raise StatusError(422, "Invalid", "the patched object is not a JSON object")
            new["apiVersion"], new["kind"] = current["apiVersion"], current["kind"]
            _check_identity(new, t, ref)
            if status_only:
                return self._write_status(t, ref, new, current, params)
            self._preserve(t, new, current)
            self._default(t, new)
            self._validate(t, new, current)
            return self.store.update(new, user=user, dry_run=_dry_run(params))

        obj, warnings = await self._mutate(op)
        return _json(obj, warnings=warnings)

    def _patcher(self, t: ResourceType, content_type: str) -> Callable[[Any, Any], Any]:
        if content_type == "application/merge-patch+json":
            return merge_patch
        if content_type == "application/json-patch+json":
            return json_patch
        if content_type == "application/strategic-merge-patch+json":
            if t.group_resource not in BUILTIN:
                # Custom resources have no Go struct tags to drive a strategic merge.
                raise StatusError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                                  "accepted media types include: application/json-patch+json, "
                                  "application/merge-patch+json, application/apply-patch+yaml")
            return strategic_merge_patch
        raise StatusError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - "
                          f'"{content_type}" is not supported by the API-server stand-in; accepted media types '
                          "include: application/json-patch+json, application/merge-patch+json, "
                          "application/strategic-merge-patch+json")

    def _write_status(self, t: ResourceType, ref: ObjectRef, new: Mapping[str, Any], current: Mapping[str, Any],
                      params: Mapping[str, str]) -> dict[str, Any]:
        rv = (new.get("metadata") or {}).get("resourceVersion")
        if rv and rv != current["metadata"]["resourceVersion"]:
            raise _conflict(t.group_resource, ref.name)
        # statusStrategy.PrepareForUpdate: the stored object with the new status (or none), then validated.
        candidate = {k: v for k, v in current.items() if k != "status"}
        if "status" in new:
            candidate["status"] = new["status"]
        self._validate(t, candidate, current, status=True)
        status = new.get("status")
        status = dict(status) if isinstance(status, Mapping) else {}
        if _dry_run(params):
            return {**copy.deepcopy(dict(current)), "status": status}
        obj = self.store.set_status(ref, status)
        if obj is None:
            raise not_found(t.group_resource, ref.name)
        return obj

    async def _subresource(self, request: Request, t: ResourceType, ref: ObjectRef, sub: str,
                           params: Mapping[str, str], user: str) -> Response:
        if sub == "scale" and t.group_resource in SCALABLE:
            return await self._scale(request, t, ref, params, user)
        if sub == "finalize" and t.group_resource == NAMESPACES:
            if request.method != "PUT":
                raise _method_not_allowed(request.method)
            return await self._finalize(request, ref)
        if sub != "status" or not await self.read(lambda: self._has_status(t)):
            raise _not_served()
        if request.method == "GET":
            obj = await self.read(lambda: self.store.get(ref.group_resource, ref.namespace, ref.name))
            if obj is None:
                raise not_found(t.group_resource, ref.name)
            return _json(obj)
        if request.method == "PATCH":
            return await self._patch(request, t, ref, params, user, status_only=True)
        if request.method != "PUT":
            raise _method_not_allowed(request.method)
        body = _object_body(await _request_body(request), t)
        _check_identity(body, t, ref)

        def op() -> dict[str, Any]:
            current = self._existing(t, ref)
            return self._write_status(t, ref, body, current, params)

        obj, _ = await self._mutate(op)
        return _json(obj)

    async def _scale(self, request: Request, t: ResourceType, ref: ObjectRef, params: Mapping[str, str],
                     user: str) -> Response:
        """The autoscaling/v1 Scale of a Deployment, ReplicaSet or StatefulSet (`kubectl scale`): a
        write sets the workload's spec.replicas (an UPDATE of the workload through admission)."""
        if request.method == "GET":
            obj = await self.read(lambda: self._existing(t, ref))
            return _json(_scale_of(obj))
        if request.method == "PUT":
            body: Any = _object_body(await _request_body(request), SCALE_TYPE)
            _check_identity(body, SCALE_TYPE, ref)
            apply: Callable[[Any, Any], Any] = lambda _current, replacement: replacement  # noqa: E731
        elif request.method == "PATCH":
            apply = self._patcher(t, request.headers.get("content-type", "").split(";")[0].strip())
            body = _json_body(await request.body())
        else:
            raise _method_not_allowed(request.method)

        def new_scale(current: dict[str, Any]) -> dict[str, Any]:
            try:
                scale = apply(current, body)
            except PatchError as exc:
                raise StatusError(422, "Invalid", f"the server rejected our request due to an error in our "
                                  f"request: {exc}") from exc
            if not isinstance(scale, dict):
                raise StatusError(422, "Invalid", "the patched object is not a JSON object")
            return scale

        def op() -> dict[str, Any]:
            current = self._existing(t, ref)
            scale = new_scale(_scale_of(current))
            rv = (scale.get("metadata") or {}).get("resourceVersion")
            if rv and rv != current["metadata"].get("resourceVersion"):
                raise _conflict(t.group_resource, ref.name)
            replicas = (scale.get("spec") or {}).get("replicas", 0)
            if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
                message = f"Invalid value: {orjson.dumps(replicas).decode()}: must be greater than or equal to 0"
                raise StatusError(422, "Invalid", f'Scale.autoscaling "{ref.name}" is invalid: spec.replicas: '
                                  f"{message}", details={"name": ref.name, "group": "autoscaling", "kind": "Scale",
                                                         "causes": [{"reason": "FieldValueInvalid", "message": message,
                                                                     "field": "spec.replicas"}]})
            updated = copy.deepcopy(current)
            updated.setdefault("spec", {})["replicas"] = replicas
            updated["metadata"].pop("resourceVersion", None)
            return _scale_of(self.store.update(updated, user=user, dry_run=_dry_run(params)))

        scale, warnings = await self._mutate(op)
        return _json(scale, warnings=warnings)

    async def _review(self, request: Request, t: ResourceType) -> Response:
        """SelfSubjectAccessReview, SelfSubjectRulesReview, SelfSubjectReview. The stand-in authorizes
        everything (no RBAC), so every review allows, as for a cluster-admin."""
        body = _object_body(await _request_body(request), t)
        user = request.headers.get("impersonate-user") or self.default_user
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
            answer["metadata"]["creationTimestamp"] = format_rfc3339(self.store.clock())
            answer["status"] = {"userInfo": {"username": user,
                                             "groups": [*(groups or ["system:masters"]), "system:authenticated"]}}
        return _json(answer, status_code=201)

    async def _finalize(self, request: Request, ref: ObjectRef) -> Response:
        body = await _request_body(request)
        finalizers = ((body.get("spec") or {}) if isinstance(body, Mapping) else {}).get("finalizers") or []

        def op() -> dict[str, Any]:
            current = self.store.get(NAMESPACES, "", ref.name)
            if current is None:
                raise not_found(NAMESPACES, ref.name)
            if list(finalizers) == list((current.get("spec") or {}).get("finalizers") or []):
                return current
            if finalizers:
                raise StatusError(422, "Invalid", f'namespaces "{ref.name}" is invalid: spec.finalizers: the '
                                  "API-server stand-in only supports removing all of them")
            obj = self.store.finalize_namespace(ref.name)
            if obj is None:
                raise not_found(NAMESPACES, ref.name)
            return obj

        obj, _ = await self._mutate(op)
        return _json(obj)

    async def _delete(self, request: Request, t: ResourceType, ref: ObjectRef, params: Mapping[str, str],
                      user: str) -> Response:
        options = _delete_options(await _request_body(request), params)

        def op() -> DeleteResult:
            current = self._existing(t, ref)
            rv = options["resource_version"]
            if rv is not None and rv != current["metadata"].get("resourceVersion"):
                raise StatusError(409, "Conflict", f"Operation cannot be fulfilled on {t.group_resource} "
                                  f'"{ref.name}": Precondition failed: ResourceVersion in precondition: {rv}, '
                                  f"ResourceVersion in object meta: {current['metadata'].get('resourceVersion')}")
            return self.store.delete(ref, user=user, dry_run=options["dry_run"],
                                     propagation=options["propagation"], uid=options["uid"])

        result, warnings = await self._mutate(op)
        if result.outcome == "deleted":
            md = result.object["metadata"]
            return _json({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                          "details": {"name": ref.name, "group": t.group, "kind": t.plural,
                                      "uid": md.get("uid", "")}}, warnings=warnings)
        return _json(result.object, warnings=warnings)

    async def _delete_collection(self, request: Request, t: ResourceType, namespace: str | None,
                                 params: Mapping[str, str], user: str) -> Response:
        options = _delete_options(await _request_body(request), params)
        match = _matcher(params)
        results, warnings = await self._mutate(lambda: self.store.delete_collection(
            t.group_resource, namespace or None if t.namespaced else "", user=user,
            dry_run=options["dry_run"], where=match))
        return _json({"kind": f"{t.kind}List", "apiVersion": t.api_version,
                      "metadata": {"resourceVersion": str(self.store.resource_version)},
                      "items": [r.object for r in results]}, warnings=warnings)

    # --- watch ----------------------------------------------------------------------------------------
    async def _watch(self, t: ResourceType, namespace: str | None, params: Mapping[str, str],
                     form: _OutputForm) -> Response:
        match = _matcher(params)
        printer = await self.read(lambda: self._printer(t)) if form.table else None
        if printer is not None:
            self._table(printer, [], "", form)  # a bad includeObject is a 400 before the stream starts
        selective = bool(params.get("labelSelector") or params.get("fieldSelector"))
        gr = t.group_resource
        raw_rv = params.get("resourceVersion", "")
        send_initial = params.get("sendInitialEvents") == "true" or raw_rv in ("", "0")
        if not send_initial and not raw_rv.isdigit():
            raise StatusError(400, "BadRequest", f'resourceVersion: Invalid value: "{raw_rv}": must be an integer')
        floor = int(raw_rv) if raw_rv.isdigit() else 0
        bookmarks = params.get("allowWatchBookmarks") in ("true", "1")
        try:
            timeout = float(params.get("timeoutSeconds") or self.watch_timeout)
        except ValueError:
            raise StatusError(400, "BadRequest", "timeoutSeconds: must be a number") from None
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[WatchEvent | _Closing] = asyncio.Queue()

        def in_scope(obj: Mapping[str, Any]) -> bool:
            return namespace is None or namespace == "" or (obj.get("metadata") or {}).get("namespace") == namespace

        def listener(event: WatchEvent) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is gone: the stream is over anyway
                loop.call_soon_threadsafe(queue.put_nowait, event)

        # With a selector, an object that stops (starts) matching is DELETED (ADDED) to this watch, as
        # in the watch cache. `seen` holds the keys this watch shows; for a watch from a resourceVersion
        # it starts as what matches at subscription (the state at that version is not kept).
        seen: set[tuple[str, str]] = set()

        def translate(kind: str, obj: Mapping[str, Any]) -> str | None:
            if not selective:
                return kind
            key = _key(obj)
            if kind == "DELETED":
                visible = key in seen or match(obj)
                seen.discard(key)
                return "DELETED" if visible else None
            if match(obj):
                shown = "ADDED" if kind == "ADDED" or key not in seen else kind
                seen.add(key)
                return shown
            if key in seen:
                seen.discard(key)
                return "DELETED"
            return None

        def subscribe() -> tuple[Callable[[], None], int, list[tuple[str, Mapping[str, Any]]]] | int:
            # Atomic under the data lock: nothing is missed or repeated between backlog and live events.
            current = self.store.resource_version
            objects = [o for o in self.store.list(gr, namespace or None) if match(o)]
            initial: list[tuple[str, Mapping[str, Any]]] = []
            if send_initial:
                initial = [("ADDED", o) for o in objects]
                seen.update(_key(o) for o in objects)
            else:
                backlog = self.store.events_since(floor)
                if backlog is None:  # too old: answer with the oldest version still known
                    return self.store.events[0].resource_version - 1 if self.store.events else current
                seen.update(_key(o) for o in objects)
                for e in backlog:
                    kind = translate(e.type, e.object) if e.group_resource == gr and in_scope(e.object) else None
                    if kind is not None:
                        initial.append((kind, e.object))
            return self.store.subscribe(listener), current, initial

        subscribed = await self.read(subscribe)
        if isinstance(subscribed, int):
            # The watch cache's answer to an expired version: HTTP 200, one ERROR event, 410 Expired.
            gone = StatusError(410, "Expired", f"too old resource version: {floor} ({subscribed})").status()
            return Response(orjson.dumps({"type": "ERROR", "object": gone}) + b"\n", media_type="application/json")
        unsubscribe, start_rv, initial = subscribed
        self._watches.add(queue)

        headers = [True]  # a Table watch sends the column definitions with the first event only

        def line(kind: str, obj: Mapping[str, Any]) -> bytes:
            if printer is not None:
                md = obj.get("metadata") or {}
                obj = self._table(printer, [dict(obj)], str(md.get("resourceVersion", "")), form,
                                  headers=headers[0], is_list=False)
                headers[0] = False
            return orjson.dumps({"type": kind, "object": obj}) + b"\n"

        def bookmark(rv: int, *, initial_end: bool = False) -> bytes:
            md: dict[str, Any] = {"resourceVersion": str(rv)}
            if initial_end:
                md["annotations"] = {"k8s.io/initial-events-end": "true"}
            return line("BOOKMARK", {"kind": t.kind, "apiVersion": t.api_version, "metadata": md})

        async def stream() -> AsyncIterator[bytes]:
            try:
                deadline = loop.time() + timeout
                for initial_kind, obj in initial:
                    yield line(initial_kind, obj)
                last_rv = start_rv
                if bookmarks:
                    yield bookmark(last_rv, initial_end=send_initial)
                next_bookmark = loop.time() + self.bookmark_interval
                while True:
                    now = loop.time()
                    if now >= deadline:
                        return
                    if bookmarks and now >= next_bookmark:
                        yield bookmark(last_rv)
                        next_bookmark = now + self.bookmark_interval
                    wait = min(deadline, next_bookmark) - now if bookmarks else deadline - now
                    try:
                        event = await asyncio.wait_for(queue.get(), max(wait, 0.0))
                    except TimeoutError:
                        continue
                    if isinstance(event, _Closing):
                        return
                    last_rv = event.resource_version
                    if event.group_resource != gr or event.resource_version <= floor or not in_scope(event.object):
                        continue
                    shown = translate(event.type, event.object)
                    if shown is not None:
                        yield line(shown, event.object)
            finally:
                self._watches.discard(queue)
                unsubscribe()

        return StreamingResponse(stream(), media_type="application/json")


# --- helpers -----------------------------------------------------------------------------------------
_SUBRESOURCE_VERBS = {"status": ["get", "patch", "update"], "finalize": ["update"], "scale": ["get", "patch", "update"]}


def _subresources(t: ResourceType, status: bool) -> list[str]:
    subs = ["status"] if status else []
    if t.group_resource == NAMESPACES:
        subs.append("finalize")
    if t.group_resource in SCALABLE:
        subs.append("scale")
    return subs


def _version_order(version: str) -> tuple[int, int, int]:
    """Kubernetes version priority: GA > beta > alpha, then by number (v1 > v1beta2 > v1alpha1)."""
    m = re.match(r"^v(\d+)(?:(alpha|beta)(\d+))?$", version)
    if m is None:
        return (3, 0, 0)
    stability = {"alpha": 2, "beta": 1, None: 0}[m[2]]
    return (stability, -int(m[1]), -int(m[3] or 0))


def _group_order(group: str) -> tuple[int, str]:
    builtin = {t.group for t in (*WELL_KNOWN, *REVIEWS.values()) if t.group not in NOT_BUILTIN_GROUPS}
    return (0 if group in builtin else 1, group)


def _api_group_doc(group: str, versions: list[str]) -> dict[str, Any]:
    ordered = sorted(versions, key=_version_order)
    entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in ordered]
    return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": entries,
            "preferredVersion": entries[0]}


def _aggregated(groups: Mapping[str, Mapping[str, list[_Served]]], stale: Iterable[str] = ()) -> dict[str, Any]:
    """An apidiscovery.k8s.io/v2 APIGroupDiscoveryList (design/kubernetes-semantics.md §12)."""
    items = []
    for group, versions in groups.items():
        entries = []
        for version in sorted(versions, key=_version_order):  # the preferred version first
            resources = []
            for t, status, categories, verbs in versions[version]:
                kind = {"group": t.group, "version": t.version, "kind": t.kind}
                resource: dict[str, Any] = {
                    "resource": t.plural, "responseKind": kind, "scope": "Namespaced" if t.namespaced else "Cluster",
                    "singularResource": t.singular, "verbs": list(verbs)}
                if t.short_names:
                    resource["shortNames"] = list(t.short_names)
                if categories:
                    resource["categories"] = list(categories)
                subs = _subresources(t, status)
                if subs:
                    resource["subresources"] = [{"subresource": s, "responseKind": SCALE_KIND if s == "scale" else kind,
                                                 "verbs": _SUBRESOURCE_VERBS[s]} for s in subs]
                resources.append(resource)
            entries.append({"version": version, "resources": resources,
                            "freshness": "Stale" if group in stale else "Current"})
        items.append({"metadata": {"name": group}, "versions": entries})
    return {"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items}


class _OutputForm(NamedTuple):
    """What a GET answers: the object(s) as stored, a meta.k8s.io Table of them (kubectl get), or, for a
    list, a PartialObjectMetadataList (metadata-only informers, the gate's caches)."""

    table: bool = False
    group_version: str = "meta.k8s.io/v1"
    include_object: str = ""
    metadata_list: bool = False


TABLE_VERSIONS = ("v1", "v1beta1")


def _output_form(request: Request, params: Mapping[str, str]) -> _OutputForm:
    """The first form of the Accept header this stand-in serves: `application/json;as=Table;v=v1;g=meta.k8s.io`
    (or v1beta1) for a Table, `as=PartialObjectMetadataList;g=meta.k8s.io;v=v1` for a metadata-only list,
    plain JSON otherwise (protobuf and YAML answers are not served, so those entries are passed over; so
    is the single-object PartialObjectMetadata form, whose clients also accept JSON)."""
    for media in request.headers.get("accept", "").split(","):
        kind, *options = (p.strip() for p in media.split(";"))
        opts = {k.strip().lower(): v.strip() for k, _, v in (o.partition("=") for o in options)}
        if kind.lower() not in ("application/json", "application/*", "*/*"):
            continue
        if "as" not in opts:
            return _OutputForm()
        if opts["as"] == "Table" and opts.get("g") == "meta.k8s.io" and opts.get("v") in TABLE_VERSIONS:
            return _OutputForm(True, f"meta.k8s.io/{opts['v']}", params.get("includeObject", ""))
        if opts["as"] == "PartialObjectMetadataList" and opts.get("g") == "meta.k8s.io" and opts.get("v") == "v1":
            return _OutputForm(metadata_list=True)
    return _OutputForm()


def _wants_aggregated(request: Request) -> bool:
    """True when Accept offers apidiscovery v2 (kubectl 1.28 offers only v2beta1: it gets the legacy form)."""
    for media in request.headers.get("accept", "").split(","):
        params = dict(p.strip().partition("=")[::2] for p in media.split(";")[1:])
        if params.get("g") == "apidiscovery.k8s.io" and params.get("v") == "v2" \
                and params.get("as") == "APIGroupDiscoveryList":
            return True
    return False


def _hash(doc: Mapping[str, Any]) -> str:
    return hashlib.sha512(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32].upper()


def _load_crd(path: Path | None) -> dict[str, Any] | None:
    """The CriticalService CRD manifest (for its schema), if the file is there and readable."""
    if path is None:
        return None
    try:
        stat = path.stat()
    except OSError:
        return None
    return _parse_crd(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)
def _parse_crd(path: str, _mtime_ns: int, _size: int) -> dict[str, Any] | None:
    # Discovery asks for this on every request; parsing the YAML costs ~45 ms, so it is parsed once per
    # version of the file (the mtime/size key re-reads it after an edit).
    try:
        docs = list(yaml.safe_load_all(Path(path).read_text()))
    except (OSError, yaml.YAMLError):
        return None
    return next((d for d in docs if isinstance(d, dict) and d.get("kind") == "CustomResourceDefinition"), None)


_FALLBACK_CRD: dict[str, Any] = {"spec": {"versions": [{"name": "v1alpha1", "schema": {"openAPIV3Schema": {
    "type": "object",
    "description": "CriticalService names a provider workload and the criteria under which it may be deleted; "
                   "the criticalsvc deletion gate denies deleting it (or its namespace) until they are met.",
    "properties": {
        "spec": {"type": "object", "description": "The provider and the deletion criteria.",
                 "x-kubernetes-preserve-unknown-fields": True},
        "status": {"type": "object", "description": "Conditions, providerUID and blockers, written by the gate.",
                   "x-kubernetes-preserve-unknown-fields": True}}}}}]}}


def _json(doc: Any, *, status_code: int = 200, media_type: str = "application/json",
          warnings: Iterable[str] = ()) -> Response:
    response = Response(orjson.dumps(doc), status_code=status_code, media_type=media_type)
    # Raw UTF-8 bytes: Starlette's `headers.append` encodes latin-1 and fails on "…".
    response.raw_headers.extend((b"warning", value) for value in warning_headers(warnings))
    return response


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


def _status(error: StatusError) -> Response:
    return _json(error.status(), status_code=error.code, warnings=getattr(error, "warnings", ()))


def _apply_defaults(value: Any, schema: Mapping[str, Any]) -> None:
    """structuraldefaulting.Default: fill missing (or null, unless nullable) properties with their
    schema `default`, then recurse into properties, additionalProperties and array items."""
    if isinstance(value, dict):
        found = schema.get("properties")
        properties: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        for key, prop in properties.items():
            if isinstance(prop, Mapping) and "default" in prop and (
                    key not in value or (value[key] is None and not prop.get("nullable"))):
                value[key] = copy.deepcopy(prop["default"])
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            prop = properties.get(key)
            if isinstance(prop, Mapping):
                _apply_defaults(item, prop)
            elif isinstance(extra, Mapping):
                _apply_defaults(item, extra)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for item in value:
            _apply_defaults(item, schema["items"])


def _scale_of(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The autoscaling/v1 Scale of a workload (k8s registry apps/deployment scaleFromDeployment)."""
    md = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    selector = tables.selector_string(spec.get("selector"))
    return {"kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {k: md[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                         if k in md},
            "spec": {"replicas": spec.get("replicas", 1)},  # the API server defaults replicas to 1
            "status": {"replicas": (obj.get("status") or {}).get("replicas", 0),
                       **({"selector": selector} if selector else {})}}


def _not_served() -> StatusError:
    return StatusError(404, "NotFound", "the server could not find the requested resource")


def _method_not_allowed(method: str) -> StatusError:
    return StatusError(405, "MethodNotAllowed", f"the server does not allow this method on the requested resource "
                       f"({method})")


def _conflict(gr: GroupResource, name: str) -> StatusError:
    return StatusError(409, "Conflict", f'Operation cannot be fulfilled on {gr} "{name}": the object has been '
                       "modified; please apply your changes to the latest version and try again",
                       details={"name": name, "group": gr.group, "kind": gr.resource})


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    md = obj.get("metadata") or {}
    return str(md.get("namespace", "")), str(md.get("name", ""))


def _json_body(raw: bytes) -> Any:
    try:
        return orjson.loads(raw) if raw.strip() else {}
    except orjson.JSONDecodeError as exc:
        raise StatusError(400, "BadRequest", f"the body of the request could not be decoded as JSON: {exc}") from exc


def _media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def _decode_body(raw: bytes, media: str) -> Any:
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
    return _json_body(raw)


async def _request_body(request: Request) -> Any:
    return _decode_body(await request.body(), _media_type(request))


def _object_body(body: Any, t: ResourceType) -> dict[str, Any]:
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


def _check_identity(body: dict[str, Any], t: ResourceType, ref: ObjectRef) -> None:
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


def _dry_run(params: Mapping[str, str]) -> bool:
    return params.get("dryRun") == "All"


def _delete_options(body: Any, params: Mapping[str, str]) -> dict[str, Any]:
    """metav1.DeleteOptions from the body and the query (the query wins, as in the API server)."""
    body = body if isinstance(body, Mapping) else {}
    preconditions = body.get("preconditions") or {}
    propagation = params.get("propagationPolicy") or body.get("propagationPolicy")
    orphan = params.get("orphanDependents", body.get("orphanDependents"))
    if propagation is None and orphan is not None:
        propagation = "Orphan" if str(orphan).lower() == "true" else "Background"
    if propagation not in (None, "Background", "Foreground", "Orphan"):
        raise StatusError(422, "Invalid", f'DeleteOptions.propagationPolicy: Unsupported value: "{propagation}": '
                          'supported values: "Foreground", "Background", "Orphan"')
    dry = body.get("dryRun") or []
    return {"propagation": propagation or "Background", "uid": preconditions.get("uid"),
            "resource_version": preconditions.get("resourceVersion"),
            "dry_run": params.get("dryRun") == "All" or "All" in dry}


# --- serving -----------------------------------------------------------------------------------------
def _listening_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)  # connections queue from here on, before hypercorn accepts
    return sock


async def serve(standin: StandIn, *, host: str = "127.0.0.1", port: int = 0, certfile: str | None = None,
                keyfile: str | None = None, shutdown_trigger: Callable[[], Awaitable[object]] | None = None,
                on_ready: Callable[[str], None] | None = None) -> None:
    """Serve the stand-in with hypercorn until `shutdown_trigger` returns (default: SIGINT/SIGTERM).

    `port=0` picks a free port; `on_ready(url)` gets the URL (http, or https with cert and key) once
    the socket listens. Open watches are ended first, so shutdown does not wait for them.
    """
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config

    sock = _listening_socket(host, port)
    bound = sock.getsockname()[1]
    config = Config()
    config.bind = [f"fd://{sock.detach()}"]
    config.certfile, config.keyfile = certfile, keyfile
    config.accesslog = None
    config.graceful_timeout = 2.0
    config.keep_alive_timeout = 120.0  # longer than client-go's idle connection timeout (90 s)
    stop = asyncio.Event()

    async def trigger() -> None:
        if shutdown_trigger is None:
            await stop.wait()
        else:
            await shutdown_trigger()
        standin.close_watches()

    if shutdown_trigger is None:
        import signal

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
    shown = f"[{host}]" if ":" in host else host
    if on_ready is not None:
        on_ready(f"{'https' if certfile else 'http'}://{shown}:{bound}")
    await hypercorn_serve(standin.app, config, shutdown_trigger=trigger)  # type: ignore[arg-type]


class ServerThread:
    """The stand-in served on its own thread and event loop, for synchronous callers (tests, kubectl).

        with ServerThread(StandIn(store)) as url:
            subprocess.run(["kubectl", "--server", url, "get", "ns"])
    """

    def __init__(self, standin: StandIn, *, host: str = "127.0.0.1", port: int = 0,
                 certfile: str | None = None, keyfile: str | None = None) -> None:
        self.standin = standin
        self._kwargs = {"host": host, "port": port, "certfile": certfile, "keyfile": keyfile}
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.url = ""

    def start(self, timeout: float = 10.0) -> str:
        self._thread = threading.Thread(target=self._main, name="standin-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout) or self._error is not None:
            raise RuntimeError(f"the API-server stand-in did not start: {self._error}")
        self._wait_until_serving(timeout)
        return self.url

    def _wait_until_serving(self, timeout: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while True:  # readiness is polled: hypercorn runs the lifespan before it accepts
            try:
                if httpx.get(f"{self.url}/readyz", verify=False, timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or self._error is not None:
                raise RuntimeError(f"the API-server stand-in at {self.url} did not become ready: {self._error}")
            time.sleep(0.02)

    def _main(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()

            def ready(url: str) -> None:
                self.url = url
                self._ready.set()

            await serve(self.standin, shutdown_trigger=self._stop.wait, on_ready=ready,
                        **self._kwargs)  # type: ignore[arg-type]

        try:
            asyncio.run(main())
        except BaseException as exc:  # reported to start(); the thread ends either way
            self._error = exc
            self._ready.set()

    def stop(self, timeout: float = 10.0) -> None:
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
