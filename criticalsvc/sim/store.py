"""The simulated API server's storage and request semantics.

Objects are kept as whole JSON dicts (the HTTP face serves them back verbatim); every write also
updates `state`, the gate's slim, indexed view (a MemoryState), so the real decision function reads
this store exactly as the live service reads its watch caches.

Modelled (design/kubernetes-semantics.md §1-§5):
* DELETE of an object with finalizers only marks it (deletionTimestamp); it disappears when the last
  finalizer is removed, inside that update, without a second DELETE admission [S1]. No new finalizers
  after deletionTimestamp: 422 Invalid [V1].
* A namespace DELETE runs admission, then sets deletionTimestamp and phase Terminating; it is removed
  when the namespace controller empties spec.finalizers via `finalize_namespace` [N1]. A repeated
  DELETE of a Terminating namespace returns it without calling admission [N1]; a denied one changes
  nothing.
* A repeated DELETE of another terminating object runs admission again (§4); of a gone object: 404.
* A CRD DELETE adds the customresourcecleanup finalizer and the Terminating condition [C2]; while it
  is terminating, creating instances is 403 Forbidden [C3]; instances deleted by the CRD cleanup skip admission
  [C1] (`admission=False`).
* deletecollection: admission once per item with name "" [R1]; one worker, so it stops at the first
  denial, keeping what it already deleted, and returns that first error [S1][S2]; NotFound items are
  skipped.
* A webhook denial reaches the client as the webhook's status code (anything < 400 becomes 400),
  with the message `admission webhook "<name>" denied the request: <message>` [D3]; a failed webhook
  call follows failurePolicy: Fail -> 500 InternalError, Ignore -> proceed [D1].
* Creating in a Terminating namespace is Forbidden (NamespaceLifecycle); in a missing one, NotFound.
* An UPDATE (PUT or PATCH: the API server reviews a patch as the UPDATE it becomes) runs admission with
  the new object and the stored one as oldObject. A write through the `scale` subresource is reviewed as
  an UPDATE of `<resource>` with subResource `scale`, and its object and oldObject are autoscaling/v1
  Scales, not the workload [U1]; a webhook rule matches it only by naming `<resource>/scale` [D5].

[U1] https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/registry/apps/deployment/storage/storage.go
     (ScaleREST.Update: toScaleUpdateValidation converts both objects to Scales before validating admission)
"""

from __future__ import annotations

import builtins
import collections
import contextlib
import copy
import itertools
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any, Literal

import attrs

from ..admission import AdmissionRequest, parse_review, render_response, render_review
from ..api import (
    CRDS,
    CRITICAL_SERVICES,
    NAMESPACES,
    Criterion,
    GroupResource,
    ObjectRef,
    parse_critical_service,
)
from ..decision import Decision, decide
from ..errors import CriticalsvcError, InvalidInput
from ..projection import conditioned_criteria, project_for
from ..restmapper import ResourceType, RESTMapper, guess_resource, resource_type_from_crd
from ..state import MemoryState
from ..timestamps import format_rfc3339
from .tables import selector_string
from .webhooks import AdmissionHook, MatchConditionError, RegisteredWebhook

CRD_CLEANUP_FINALIZER = "customresourcecleanup.apiextensions.k8s.io"
NAMESPACE_FINALIZER = "kubernetes"


class StatusError(CriticalsvcError):
    """A Kubernetes API error, as apimachinery's errors.StatusError: rendered as a metav1.Status by the HTTP face."""

    def __init__(self, code: int, reason: str, message: str, *, details: Mapping[str, Any] | None = None) -> None:
        self.code, self.reason, self.message = code, reason, message
        self.details = dict(details or {})
        super().__init__(message)

    def status(self) -> dict[str, Any]:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "details": self.details, "code": self.code}


def not_found(gr: GroupResource, name: str) -> StatusError:
    return StatusError(404, "NotFound", f'{gr} "{name}" not found',
                       details={"name": name, "group": gr.group, "kind": gr.resource})


@attrs.frozen
class WatchEvent:
    resource_version: int
    type: Literal["ADDED", "MODIFIED", "DELETED"]
    group_resource: GroupResource
    object: Mapping[str, Any]


@attrs.frozen
class DeleteResult:
    outcome: Literal["deleted", "marked", "unchanged"]
    object: Mapping[str, Any]


Key = tuple[GroupResource, str, str]


class Store:
    """The simulated API server. `clock()` returns seconds (virtual or real)."""

    def __init__(self, *, clock: Callable[[], float], mapper: RESTMapper | None = None,
                 webhooks: Iterable[RegisteredWebhook] = (), history: int = 10_000) -> None:
        self.clock = clock
        self.state = MemoryState(mapper)
        self.webhooks = list(webhooks)
        self._objects: dict[Key, dict[str, Any]] = {}
        # Names per (resource, namespace): a namespace controller or CRD cleanup lists one resource in
        # one namespace per call, which must cost O(matching), not O(cluster), at 10,000 objects.
        self._names: dict[tuple[GroupResource, str], set[str]] = {}
        self._rv = itertools.count(1)
        self.resource_version = 0
        self.events: list[WatchEvent] = []
        self._history = history
        self._listeners: list[Callable[[WatchEvent], None]] = []
        self._uids = (f"00000000-0000-4000-8000-{i:012d}" for i in itertools.count(1))
        self._review_ids = itertools.count(1)
        # Entered around every webhook call. The HTTP stand-in (sim/apiserver/standin.py) lets readers in
        # while a write waits on a webhook, so a webhook that reads the API server back does not deadlock.
        self.around_webhook_call: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext
        # Warnings of webhook replies, recorded even on denial [D1]; the HTTP face clears this before a
        # request and returns what it holds afterwards as `Warning` headers (kubectl prints them).
        self.admission_warnings: collections.deque[str] = collections.deque(maxlen=64)
        # The criteria with conditions (criticalsvc/condition.py) on each type, evaluated as objects are
        # stored; recomputed after a CriticalService or CRD changes (None: to be recomputed).
        self._conditions: dict[GroupResource, frozenset[Criterion]] | None = None
        self._conditioned: set[str] = set()  # CriticalServices with a condition, by name

    @property
    def mapper(self) -> RESTMapper:
        return self.state.mapper

    # --- reads ------------------------------------------------------------------------------------
    def get(self, gr: GroupResource, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self._objects.get((gr, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def exists(self, gr: GroupResource, namespace: str, name: str) -> bool:
        return (gr, namespace, name) in self._objects

    def _keys(self, gr: GroupResource, namespace: str | None) -> builtins.list[Key]:
        """Keys of gr (in namespace), sorted by (namespace, name): storage key order."""
        if namespace is not None:
            return [(gr, namespace, n) for n in sorted(self._names.get((gr, namespace), ()))]
        return sorted(((g, ns, n) for (g, ns), names in self._names.items() if g == gr for n in names),
                      key=lambda k: k[1:])

    def list(self, gr: GroupResource, namespace: str | None = None) -> list[dict[str, Any]]:
        return [copy.deepcopy(self._objects[k]) for k in self._keys(gr, namespace)]

    def refs(self, gr: GroupResource | None = None, namespace: str | None = None) -> Iterator[ObjectRef]:
        if gr is not None:
            for g, ns, n in self._keys(gr, namespace):
                yield ObjectRef(g, ns, n)
            return
        for g, ns, n in sorted(self._objects, key=lambda k: (str(k[0]), k[1], k[2])):
            if namespace is None or ns == namespace:
                yield ObjectRef(g, ns, n)

    def count(self) -> int:
        return len(self._objects)

    def resource_type(self, gr: GroupResource) -> ResourceType:
        t = self.mapper.lookup(gr)
        if t is None:
            raise StatusError(404, "NotFound", "the server could not find the requested resource")
        return t

    # --- watch ------------------------------------------------------------------------------------
    def subscribe(self, listener: Callable[[WatchEvent], None]) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def events_since(self, resource_version: int) -> builtins.list[WatchEvent] | None:
        """Events after `resource_version`, or None when that version is too old (410 Gone)."""
        if self.events and resource_version < self.events[0].resource_version - 1:
            return None
        return [e for e in self.events if e.resource_version > resource_version]

    def _emit(self, kind: Literal["ADDED", "MODIFIED", "DELETED"], gr: GroupResource, obj: dict[str, Any]) -> None:
        event = WatchEvent(int(obj["metadata"]["resourceVersion"]), kind, gr, copy.deepcopy(obj))
        self.events.append(event)
        if len(self.events) > self._history:
            del self.events[: len(self.events) - self._history]
        for listener in list(self._listeners):
            listener(event)

    # --- writes -----------------------------------------------------------------------------------
    def _bump(self, obj: dict[str, Any]) -> None:
        self.resource_version = next(self._rv)
        obj["metadata"]["resourceVersion"] = str(self.resource_version)

    def _conditions_on(self, gr: GroupResource) -> frozenset[Criterion]:
        if self._conditions is None:
            self._conditions = conditioned_criteria(self.state.critical_services(), self.state)
        return self._conditions.get(gr, frozenset())

    def _index(self, gr: GroupResource, obj: dict[str, Any]) -> None:
        self.state.upsert(project_for(obj, gr, self._conditions_on(gr)))
        if gr == CRITICAL_SERVICES:
            name = obj["metadata"]["name"]
            try:
                cs = parse_critical_service(obj, lenient_conditions=True)
            except InvalidInput:
                self.state.remove_critical_service(name)
                conditioned = False
            else:
                self.state.upsert_critical_service(cs)
                conditioned = any(c.condition is not None for c in cs.criteria)
            # Status writes are most CriticalService writes: they re-evaluate nothing unless conditions
            # are (or were) involved.
            if conditioned or name in self._conditioned:
                if conditioned:
                    self._conditioned.add(name)
                else:
                    self._conditioned.discard(name)
                self._reevaluate()
        elif gr == CRDS:
            self._conditions = None  # a criterion naming the CRD's Kind may resolve now

    def _reevaluate(self) -> None:
        """Project again the objects of every type whose conditions changed: the gate's caches re-list
        such a type (criticalsvc/cache/watchset.py), and the simulated state must not lag them."""
        before = self._conditions
        self._conditions = None
        for gr in {*(before or {}), *self._conditions_by_type()}:
            conditions = self._conditions_on(gr)
            if (before or {}).get(gr, frozenset()) != conditions:
                for key in self._keys(gr, None):
                    self.state.upsert(project_for(self._objects[key], gr, conditions))

    def _conditions_by_type(self) -> dict[GroupResource, frozenset[Criterion]]:
        self._conditions_on(CRITICAL_SERVICES)
        return self._conditions or {}

    def _unindex(self, gr: GroupResource, obj: Mapping[str, Any]) -> None:
        md = obj["metadata"]
        self.state.remove(ObjectRef(gr, md.get("namespace", ""), md["name"]))
        if gr == CRITICAL_SERVICES:
            self.state.remove_critical_service(md["name"])
            self._conditioned.discard(md["name"])
            self._conditions = None
        if gr == CRDS:
            self._conditions = None
            t = resource_type_from_crd(obj)
            if t is not None:
                self.mapper.remove(t.group_resource)

    def _store(self, gr: GroupResource, obj: dict[str, Any], event: Literal["ADDED", "MODIFIED"]) -> dict[str, Any]:
        self._bump(obj)
        md = obj["metadata"]
        self._objects[(gr, md.get("namespace", ""), md["name"])] = obj
        self._names.setdefault((gr, md.get("namespace", "")), set()).add(md["name"])
        self._index(gr, obj)
        self._emit(event, gr, obj)
        return copy.deepcopy(obj)

    def _remove(self, gr: GroupResource, obj: dict[str, Any]) -> dict[str, Any]:
        md = obj["metadata"]
        del self._objects[(gr, md.get("namespace", ""), md["name"])]
        names = self._names.get((gr, md.get("namespace", "")))
        if names is not None:
            names.discard(md["name"])
            if not names:
                del self._names[(gr, md.get("namespace", ""))]
        self._bump(obj)
        self._unindex(gr, obj)
        self._emit("DELETED", gr, obj)
        return copy.deepcopy(obj)

    def gr_for(self, obj: Mapping[str, Any]) -> GroupResource:
        return self.mapper.resource_for_kind(str(obj.get("apiVersion", "")), str(obj.get("kind", "")))

    def create(self, manifest: Mapping[str, Any], *, user: str = "admin", dry_run: bool = False,
               allow_unknown_kinds: bool = False) -> dict[str, Any]:
        obj: dict[str, Any] = copy.deepcopy(dict(manifest))
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        if not isinstance(api_version, str) or not isinstance(kind, str):
            raise StatusError(400, "BadRequest", "Object 'Kind' is missing")
        gr = self.gr_for(obj)
        t = self.mapper.lookup(gr)
        if t is None:
            if not allow_unknown_kinds:
                raise StatusError(404, "NotFound", f'no matches for kind "{kind}" in version "{api_version}"')
            group = api_version.rpartition("/")[0]
            version = api_version.rpartition("/")[2]
            namespaced = bool((obj.get("metadata") or {}).get("namespace"))
            t = ResourceType(group, version, kind, guess_resource(kind), kind.lower(), namespaced)
            self.mapper.add(t)
        md = obj.setdefault("metadata", {})
        name = md.get("name")
        if not isinstance(name, str) or not name:
            raise StatusError(422, "Invalid", f"{kind}: metadata.name: Required value")
        namespace = md.get("namespace", "") if t.namespaced else ""
        if t.namespaced:
            if not namespace:
                md["namespace"] = namespace = "default"
            ns = self._objects.get((NAMESPACES, "", namespace))
            if ns is None:
                raise not_found(NAMESPACES, namespace)
            if ns["metadata"].get("deletionTimestamp"):
                raise StatusError(403, "Forbidden", f'{kind.lower()} "{name}" is forbidden: unable to create new '
                                  f"content in namespace {namespace} because it is being terminated")
        else:
            md.pop("namespace", None)
        if (gr, namespace, name) in self._objects:
            raise StatusError(409, "AlreadyExists", f'{gr} "{name}" already exists',
                              details={"name": name, "group": gr.group, "kind": gr.resource})
        crd = self._crd_for(gr)
        if crd is not None and crd["metadata"].get("deletionTimestamp"):
            # apiextensions-apiserver's forbidCreateAdmission (customresource_handler.go, v1.37.2): 403.
            raise StatusError(403, "Forbidden", f'{gr} "{name}" is forbidden: create not allowed while custom '
                              "resource definition is terminating")
        if gr == CRDS and resource_type_from_crd(obj) is None:
            raise StatusError(422, "Invalid", f'{gr} "{name}" is invalid: spec: group, names.plural and names.kind '
                              "are required")
        if gr == CORE_EVENTS:
            _check_event_namespace(obj, name, namespace)
        md.pop("deletionTimestamp", None)
        md["uid"] = next(self._uids)
        md["creationTimestamp"] = format_rfc3339(self.clock())
        md.setdefault("generation", 1)
        if gr == NAMESPACES:
            obj.setdefault("spec", {}).setdefault("finalizers", [NAMESPACE_FINALIZER])
            obj["status"] = {"phase": "Active"}
            md.setdefault("labels", {})["kubernetes.io/metadata.name"] = name
        self._admit("CREATE", gr, obj, None, name=name, namespace=namespace, user=user, dry_run=dry_run)
        if dry_run:
            return obj
        if gr == CRDS:
            t_new = resource_type_from_crd(obj)
            if t_new is not None:
                self.mapper.add(t_new)
            established = {"type": "Established", "status": "True", "reason": "InitialNamesAccepted"}
            obj["status"] = {"conditions": [established],
                             "acceptedNames": obj["spec"]["names"]}
        return self._store(gr, obj, "ADDED")

    def _crd_for(self, gr: GroupResource) -> dict[str, Any] | None:
        return self._objects.get((CRDS, "", f"{gr.resource}.{gr.group}")) if gr.group else None

    def update(self, manifest: Mapping[str, Any], *, user: str = "admin", dry_run: bool = False,
               subresource: str = "") -> dict[str, Any]:
        """Replace an object (optimistic concurrency on resourceVersion when given). With `subresource`
        "scale" the write came through the scale subresource: admission sees Scales [U1]."""
        obj: dict[str, Any] = copy.deepcopy(dict(manifest))
        gr = self.gr_for(obj)
        md = obj.get("metadata") or {}
        key = (gr, md.get("namespace", "") if self.resource_type(gr).namespaced else "", md.get("name", ""))
        current = self._objects.get(key)
        if current is None:
            raise not_found(gr, key[2])
        rv = md.get("resourceVersion")
        if rv and rv != current["metadata"]["resourceVersion"]:
            raise StatusError(409, "Conflict", f'Operation cannot be fulfilled on {gr} "{key[2]}": the object has '
                              "been modified; please apply your changes to the latest version and try again")
        old_md = current["metadata"]
        for immutable in ("uid", "creationTimestamp", "deletionTimestamp", "namespace"):
            if immutable in old_md:
                md[immutable] = old_md[immutable]
            else:
                md.pop(immutable, None)
        md["name"] = old_md["name"]
        if old_md.get("deletionTimestamp"):
            added = set(md.get("finalizers") or []) - set(old_md.get("finalizers") or [])
            if added:
                # NewInvalid names the group-qualified kind: `ConfigMap`, `Deployment.apps`.
                kind = f"{current.get('kind')}.{gr.group}" if gr.group else str(current.get("kind"))
                raise StatusError(422, "Invalid", f'{kind} "{key[2]}" is invalid: metadata.finalizers: Forbidden: '
                                  "no new finalizers can be added if the object is being deleted, found new "
                                  f"finalizers {_go_strings(sorted(added))}")
        if obj.get("spec") != current.get("spec"):
            md["generation"] = int(old_md.get("generation", 1)) + 1
        if subresource == "scale":
            self._admit("UPDATE", gr, scale_of(obj), scale_of(current), name=key[2], namespace=key[1], user=user,
                        dry_run=dry_run, subresource=subresource)
        else:
            self._admit("UPDATE", gr, obj, current, name=key[2], namespace=key[1], user=user, dry_run=dry_run)
        if dry_run:
            return obj
        obj["metadata"] = md
        if md.get("deletionTimestamp") and not md.get("finalizers") and not self._spec_finalizers(gr, obj):
            # Last finalizer gone: the object is removed within this update, no DELETE admission [S1].
            self._objects[key] = obj
            return self._remove(gr, obj)
        return self._store(gr, obj, "MODIFIED")

    def _spec_finalizers(self, gr: GroupResource, obj: Mapping[str, Any]) -> builtins.list[str]:
        return list((obj.get("spec") or {}).get("finalizers") or []) if gr == NAMESPACES else []

    def remove_finalizer(self, ref: ObjectRef, finalizer: str, *, user: str = "controller") -> dict[str, Any] | None:
        """What a controller's PATCH of metadata.finalizers does; None if the object is gone."""
        current = self._objects.get((ref.group_resource, ref.namespace, ref.name))
        if current is None:
            return None
        finalizers = list(current["metadata"].get("finalizers") or [])
        if finalizer not in finalizers:
            return copy.deepcopy(current)
        obj = copy.deepcopy(current)
        obj["metadata"]["finalizers"] = [f for f in finalizers if f != finalizer]
        obj["metadata"].pop("resourceVersion", None)
        return self.update(obj, user=user)

    def finalize_namespace(self, name: str) -> dict[str, Any] | None:
        """The namespace controller's `namespaces/finalize` call: drop spec.finalizers [N1]."""
        current = self._objects.get((NAMESPACES, "", name))
        if current is None:
            return None
        obj = copy.deepcopy(current)
        obj["spec"]["finalizers"] = []
        if obj["metadata"].get("deletionTimestamp") and not obj["metadata"].get("finalizers"):
            return self._remove(NAMESPACES, obj)
        return self._store(NAMESPACES, obj, "MODIFIED")

    def set_status(self, ref: ObjectRef, status: Mapping[str, Any]) -> dict[str, Any] | None:
        """The status subresource: replaces .status, no admission for the gate's rules."""
        current = self._objects.get((ref.group_resource, ref.namespace, ref.name))
        if current is None:
            return None
        obj = copy.deepcopy(current)
        obj["status"] = copy.deepcopy(dict(status))
        return self._store(ref.group_resource, obj, "MODIFIED")

    # --- delete -----------------------------------------------------------------------------------
    def delete(self, ref: ObjectRef, *, user: str = "admin", dry_run: bool = False, admission: bool = True,
               propagation: str = "Background", uid: str | None = None, _collection: bool = False) -> DeleteResult:
        gr = ref.group_resource
        current = self._objects.get((gr, ref.namespace, ref.name))
        if current is None:
            raise not_found(gr, ref.name)
        md = current["metadata"]
        if uid is not None and md.get("uid") != uid:
            raise StatusError(409, "Conflict", f"Precondition failed: UID in precondition: {uid}, UID in object "
                              f"meta: {md.get('uid')}")
        if gr == NAMESPACES and md.get("deletionTimestamp"):
            return DeleteResult("unchanged", copy.deepcopy(current))  # no admission on a Terminating ns [N1]
        if admission:
            self._admit("DELETE", gr, None, current, name="" if _collection else ref.name,
                        namespace=ref.name if gr == NAMESPACES else ref.namespace, user=user, dry_run=dry_run,
                        propagation=propagation)
        if dry_run:
            return DeleteResult("unchanged", copy.deepcopy(current))
        if md.get("deletionTimestamp"):
            return DeleteResult("unchanged", copy.deepcopy(current))  # already terminating: keeps its timestamp
        obj = copy.deepcopy(current)
        finalizers = list(obj["metadata"].get("finalizers") or [])
        if gr == CRDS:
            finalizers = [*finalizers, CRD_CLEANUP_FINALIZER] if CRD_CLEANUP_FINALIZER not in finalizers else finalizers
            obj["metadata"]["finalizers"] = finalizers
            obj.setdefault("status", {})["conditions"] = [
                *[c for c in obj.get("status", {}).get("conditions", []) if c.get("type") != "Terminating"],
                {"type": "Terminating", "status": "True", "reason": "InstanceDeletionPending",
                 "message": "CustomResourceDefinition marked for deletion; CustomResource deletion will begin soon"}]
        if propagation == "Foreground" and "foregroundDeletion" not in finalizers:
            finalizers.append("foregroundDeletion")
            obj["metadata"]["finalizers"] = finalizers
        if propagation == "Orphan" and "orphan" not in finalizers:
            finalizers.append("orphan")
            obj["metadata"]["finalizers"] = finalizers
        if finalizers or self._spec_finalizers(gr, obj):
            obj["metadata"]["deletionTimestamp"] = format_rfc3339(self.clock())
            obj["metadata"]["deletionGracePeriodSeconds"] = 0
            if gr == NAMESPACES:
                obj["status"] = {**obj.get("status", {}), "phase": "Terminating"}
            return DeleteResult("marked", self._store(gr, obj, "MODIFIED"))
        return DeleteResult("deleted", self._remove(gr, obj))

    def delete_collection(self, gr: GroupResource, namespace: str | None, *, user: str = "admin",
                          admission: bool = True, dry_run: bool = False,
                          where: Callable[[Mapping[str, Any]], bool] | None = None) -> builtins.list[DeleteResult]:
        """deletecollection with one worker: stop at the first error, keep what was done [S1][S2].

        `namespace=None` spans all namespaces; `where` filters items (label/field selectors).
        """
        results: builtins.list[DeleteResult] = []
        for ref in list(self.refs(gr, namespace)):
            if where is not None and not where(self._objects.get((gr, ref.namespace, ref.name)) or {}):
                continue
            try:
                results.append(self.delete(ref, user=user, admission=admission, dry_run=dry_run, _collection=True))
            except StatusError as exc:
                if exc.code == 404:
                    continue
                raise
        return results

    # --- admission --------------------------------------------------------------------------------
    def _admit(self, operation: str, gr: GroupResource, obj: Mapping[str, Any] | None,
               old: Mapping[str, Any] | None, *, name: str, namespace: str, user: str, dry_run: bool,
               propagation: str = "Background", subresource: str = "") -> None:
        # A rule names a subresource as `<resource>/<subresource>` [D5]; webhooks.py matches it so spelt.
        matched = GroupResource(gr.group, f"{gr.resource}/{subresource}") if subresource else gr
        built: builtins.list[dict[str, Any]] = []

        def request() -> Mapping[str, Any]:
            # What matchConditions read: the request as it will be sent (its uid aside), built once per write.
            if not built:
                built.append(self.admission_review(operation, gr, obj, old, name=name, namespace=namespace,
                                                   user=user, dry_run=dry_run, propagation=propagation,
                                                   subresource=subresource, uid="")["request"])
            return built[0]

        for webhook in self.webhooks:
            try:
                hit = webhook.matches(operation, matched, namespace if gr != NAMESPACES else name or namespace, obj,
                                      old, name=name, request=request)
            except MatchConditionError as exc:  # failurePolicy Fail: refused without calling the webhook
                raise StatusError(500, "InternalError", f'Internal error occurred: failed calling webhook '
                                  f'"{webhook.name}": failed to evaluate match conditions: {exc}') from exc
            if not hit:
                continue
            review = self.admission_review(operation, gr, obj, old, name=name, namespace=namespace, user=user,
                                           dry_run=dry_run, propagation=propagation, subresource=subresource)
            try:
                with self.around_webhook_call():
                    reply = webhook.hook(review)
                response = reply["response"]
                wrong_uid = response.get("uid") != review["request"]["uid"]
                if reply.get("apiVersion") != "admission.k8s.io/v1" or wrong_uid:
                    raise ValueError("webhook response uid or apiVersion mismatch")
                allowed = bool(response["allowed"])
            except Exception as exc:  # any failed call is subject to failurePolicy [D1][D2]
                if webhook.failure_policy == "Ignore":
                    continue
                raise StatusError(500, "InternalError", f'Internal error occurred: failed calling webhook '
                                  f'"{webhook.name}": {exc}') from exc
            warnings = response.get("warnings")
            if isinstance(warnings, list):
                self.admission_warnings.extend(str(w) for w in warnings)
            if not allowed:
                status = response.get("status") or {}
                code = int(status.get("code") or 0)
                code = code if code >= 400 else 400  # [D3]
                message = status.get("message") or status.get("reason")
                text = (f'admission webhook "{webhook.name}" denied the request: {message}' if message
                        else f'admission webhook "{webhook.name}" denied the request without explanation')
                raise StatusError(code, str(status.get("reason") or "BadRequest"), text)

    def admission_review(self, operation: str, gr: GroupResource, obj: Mapping[str, Any] | None,
                         old: Mapping[str, Any] | None, *, name: str, namespace: str, user: str,
                         dry_run: bool, propagation: str = "Background", subresource: str = "",
                         uid: str | None = None) -> dict[str, Any]:
        """An AdmissionReview v1 request exactly as the API server builds it (§1)."""
        t = self.mapper.lookup(gr)
        scale = subresource == "scale"
        request = AdmissionRequest(
            # Fresh per call (§1.1); deterministic so a seeded simulation replays identically.
            uid=uid if uid is not None else str(uuid.UUID(int=next(self._review_ids), version=4)),
            group_resource=gr, operation=operation,
            name=name, namespace=namespace, object=obj, old_object=old,
            kind="Scale" if scale else t.kind if t else gr.resource, dry_run=dry_run, username=user,
            propagation_policy=propagation, sub_resource=subresource)
        review: dict[str, Any] = dict(render_review(request, version=t.version if t else "v1"))
        if scale:  # the kind is autoscaling/v1's, the resource the workload's [U1]
            review["request"] = {**review["request"], "kind": dict(SCALE_KIND), "requestKind": dict(SCALE_KIND)}
        return review


SCALE_KIND = {"group": "autoscaling", "version": "v1", "kind": "Scale"}


def scale_of(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The autoscaling/v1 Scale of a workload (scaleFromDeployment in pkg/registry/apps/deployment/storage/
    storage.go [U1]): metadata reduced to name, namespace, uid, resourceVersion and creationTimestamp, and
    spec.replicas left out when 0, as the `omitempty` of autoscaling/v1 ScaleSpec.Replicas writes it."""
    md = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    selector = selector_string(spec.get("selector"))
    replicas = spec.get("replicas", 1)  # the API server defaults a workload's replicas to 1
    return {"kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {k: md[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                         if k in md},
            "spec": {"replicas": replicas} if replicas else {},
            "status": {"replicas": (obj.get("status") or {}).get("replicas", 0),
                       **({"selector": selector} if selector else {})}}


def gate_hook(store: Store, *, on_decision: Callable[[AdmissionRequest, Decision], None] | None = None,
              manages_routes: bool = False) -> AdmissionHook:
    """The real decision function as an in-process webhook reading this store's state; `on_decision`
    sees every decision, as the live server's hook does (the replayer records intents from it).
    `manages_routes`: the webhook also has the provider routes (webhooks.ProviderRoutesRule)."""

    def hook(review: dict[str, Any]) -> dict[str, Any]:
        request = parse_review(review)
        decision = decide(request, store.state, manages_routes=manages_routes)
        if on_decision is not None:
            on_decision(request, decision)
        return dict(render_response(request.uid, decision))

    return hook


def _go_strings(values: list[str]) -> str:
    """A []string as Go's %#v prints it, as the API server's finalizer error does: []string{"a", "b"}."""
    return "[]string{" + ", ".join(f'"{v}"' for v in values) + "}"


CORE_EVENTS = GroupResource("", "events")


def _check_event_namespace(event: Mapping[str, Any], name: str, namespace: str) -> None:
    """A core/v1 Event without eventTime lives in its involved object's namespace, or - for a
    cluster-scoped object - in "default" (legacyValidateEvent, pkg/apis/core/validation/events.go,
    v1.37.2); the status writer relies on that for CriticalServices' Events."""
    if event.get("eventTime"):
        return
    found = event.get("involvedObject")
    involved: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    involved_ns = str(involved.get("namespace") or "")
    if (namespace not in ("", "default")) if not involved_ns else (namespace != involved_ns):
        raise StatusError(422, "Invalid", f'Event "{name}" is invalid: involvedObject.namespace: Invalid value: '
                          f'"{involved_ns}": does not match event.namespace')
