"""The Open Cluster Management work agent's apply and deletion paths, in Python, on the real CRDs.

What the agent of open-cluster-management-io/ocm does, read from its source at v1.3.1
(commit 805fa6103d8bc1761dbc9cb4e420def42703ec53; these files are the same at v1.3.0 and at the
newest commit read, 00f84c32b), step by step, each step linked to the lines it follows (the agent
itself cannot be built here, so this is a faithful copy of its deletion path, not the binary). The
hub and the managed cluster are the same test control plane; the CRDs are those of the
`open-cluster-management.io/api` module (ocmcrds.py).

Apply (`ManifestWorkAgent.apply`): the hub's ManifestWork in the cluster namespace; the agent adds its
finalizer, creates the AppliedManifestWork (with its own finalizer), creates each manifest with an
ownerReference to the AppliedManifestWork (none for what a deleteOption orphans), and records the
objects, sorted, in the AppliedManifestWork's status.appliedResources.

Delete (`Teardown`): the user deletes the ManifestWork. The ManifestWork finalize controller deletes
the AppliedManifestWork; the AppliedManifestWork finalize controller then makes ONE pass of DELETEs
over status.appliedResources (sorted by group, version, resource, namespace, name — not in manifest
order), each Background with a UID precondition. A refused DELETE is an error for that sync but the
object is dropped from appliedResources and never sent again; a 404 or 409 is forgotten. The agent
requeues (50 ms doubling to 60 s) only to wait for the deletions that went through, removes the
AppliedManifestWork's finalizer, and then the ManifestWork's. What was refused is left, owned by an
AppliedManifestWork that no longer exists, to kube-controller-manager's garbage collector, which
deletes it (Background) and retries each refusal with its own backoff (5 ms doubling to 1000 s,
https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/controller/garbagecollector/graph_builder.go#L151-L152,
https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/client-go/util/workqueue/default_rate_limiters.go#L50-L56).
"""

from __future__ import annotations

import copy
import hashlib
import heapq
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs
import httpx

from criticalsvc.backoff import Backoff

from .client import Client

OCM = "https://github.com/open-cluster-management-io/ocm/blob/v1.3.1/"
SDK = "https://github.com/open-cluster-management-io/sdk-go/blob/v1.3.0/"
GROUP = "work.open-cluster-management.io"
WORK_API = f"/apis/{GROUP}/v1"
# https://github.com/open-cluster-management-io/api/blob/v1.3.0/work/v1/types.go#L680-L684
MANIFESTWORK_FINALIZER = "cluster.open-cluster-management.io/manifest-work-cleanup"
APPLIED_FINALIZER = "cluster.open-cluster-management.io/applied-manifest-work-cleanup"
# The hub's hash names the AppliedManifestWork "<hubHash>-<work>" (helper.HubHash, sha256 of the hub's
# URL): OCM helpers.go#L339-L343.
HUB_HASH = hashlib.sha256(b"https://hub.criticalsvc.test:6443").hexdigest()
AGENT_ID = "criticalsvc-tests"

JSON = dict[str, Any]


def manifestwork_path(namespace: str, name: str) -> str:
    return f"{WORK_API}/namespaces/{namespace}/manifestworks/{name}"


def applied_path(name: str) -> str:
    return f"{WORK_API}/appliedmanifestworks/{name}"


@attrs.frozen
class AppliedResource:
    """One entry of AppliedManifestWork status.appliedResources (AppliedManifestResourceMeta)."""

    group: str
    version: str
    resource: str
    namespace: str
    name: str
    uid: str

    @property
    def path(self) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        middle = f"/namespaces/{self.namespace}" if self.namespace else ""
        return f"{base}{middle}/{self.resource}/{self.name}"

    @property
    def sort_key(self) -> tuple[str, str, str, str, str]:
        return (self.group, self.version, self.resource, self.namespace, self.name)

    def to_json(self) -> JSON:
        return {"group": self.group, "version": self.version, "resource": self.resource,
                "namespace": self.namespace, "name": self.name, "uid": self.uid}

    @classmethod
    def from_json(cls, data: JSON) -> AppliedResource:
        return cls(data.get("group", ""), data["version"], data["resource"], data.get("namespace", ""),
                   data["name"], data["uid"])


@attrs.frozen
class DeleteAttempt:
    """A DELETE the agent sent: the object, the answer's code and message, when (monotonic)."""

    path: str
    status: int
    message: str
    at: float


def owned_by_the_work(group: str, resource: str, namespace: str, name: str, delete_option: JSON | None) -> bool:
    """Whether the AppliedManifestWork owns this manifest's object, from the deleteOption: Foreground (and
    no option) own everything, Orphan nothing, SelectivelyOrphan all but the rules' objects.
    OCM pkg/work/helper/helpers.go#L459-L501."""
    if delete_option is None:
        return True
    policy = delete_option.get("propagationPolicy")
    if policy == "Foreground":
        return True
    if policy == "Orphan":
        return False
    rules = (delete_option.get("selectivelyOrphans") or {}).get("orphaningRules")
    if not rules:
        return True
    return not any(r.get("group", "") == group and r.get("resource") == resource and r.get("name") == name
                   and r.get("namespace", "") == namespace for r in rules)


class Discovery:
    """Kind -> (resource, namespaced) per group/version, from the API server's discovery, as the agent's
    REST mapper; looked up again on a miss (a CRD applied a moment ago)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.known: dict[str, dict[str, tuple[str, bool]]] = {}

    def resource(self, api_version: str, kind: str) -> tuple[str, bool] | None:
        found = self.known.get(api_version, {}).get(kind)
        if found is None:
            path = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
            listing = self.client.get(path) or {}
            self.known[api_version] = {r["kind"]: (r["name"], bool(r["namespaced"]))
                                       for r in listing.get("resources", []) if "/" not in r["name"]}
            found = self.known[api_version].get(kind)
        return found


@attrs.frozen
class AppliedWork:
    """A ManifestWork applied by the agent: its names, and the objects it recorded (sorted, as upstream)."""

    namespace: str
    name: str
    applied_name: str
    applied_uid: str
    resources: tuple[AppliedResource, ...]
    orphaned: tuple[AppliedResource, ...]

    @property
    def path(self) -> str:
        return manifestwork_path(self.namespace, self.name)

    @property
    def applied_path(self) -> str:
        return applied_path(self.applied_name)


class ManifestWorkAgent:
    """The hub's ManifestWork and the work agent's apply path, on one control plane."""

    def __init__(self, client: Client, *, cluster_namespace: str = "cluster1") -> None:
        self.client = client
        self.cluster_namespace = cluster_namespace
        self.discovery = Discovery(client)

    def install_crds(self, kubectl: Callable[..., Any], crd_texts: Iterable[str]) -> None:
        """Apply the ManifestWork CRDs (ocmcrds.ensure_crds()) and the cluster namespace; wait until served."""
        for text in crd_texts:
            done = kubectl("apply", "--server-side", "-f", "-", input=text)
            assert done.returncode == 0, done.stderr
        for plural in ("manifestworks", "appliedmanifestworks"):
            done = kubectl("wait", "--for=condition=Established", f"crd/{plural}.{GROUP}", "--timeout=60s")
            assert done.returncode == 0, done.stderr
        self.client.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                  "metadata": {"name": self.cluster_namespace}})
        self.wait_for_garbage_collector()

    def wait_for_garbage_collector(self, *, timeout: float = 120) -> None:
        """Wait until kube-controller-manager's garbage collector watches AppliedManifestWorks, as on a managed
        cluster where the CRD has long been installed. It starts watching a new type only at its next
        discovery sync (every 30 s,
        https://github.com/kubernetes/kubernetes/blob/v1.37.2/cmd/kube-controller-manager/app/core.go#L694-L705);
        before that it would not see an AppliedManifestWork go, and the refused objects would wait for that
        sync instead. The probe: a throwaway AppliedManifestWork owning a ConfigMap is deleted; the garbage
        collector deleting the ConfigMap says it watches the type."""
        name = f"gc-probe-{uuid.uuid4().hex[:8]}"
        owner = _ok(self.client.create(f"{WORK_API}/appliedmanifestworks", {
            "apiVersion": f"{GROUP}/v1", "kind": "AppliedManifestWork", "metadata": {"name": name},
            "spec": {"hubHash": "probe", "manifestWorkName": name, "agentID": "probe"}}))
        configmap = f"/api/v1/namespaces/{self.cluster_namespace}/configmaps/{name}"
        _ok(self.client.create(f"/api/v1/namespaces/{self.cluster_namespace}/configmaps", {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "ownerReferences": [{
                "apiVersion": f"{GROUP}/v1", "kind": "AppliedManifestWork", "name": name,
                "uid": owner["metadata"]["uid"]}]}}))
        _ok(self.client.delete(applied_path(name)))
        deadline = time.monotonic() + timeout
        while self.client.exists(configmap):
            if time.monotonic() > deadline:
                raise AssertionError(f"the garbage collector did not delete {configmap} within {timeout:.0f} s "
                                     "of its owner AppliedManifestWork's deletion")
            time.sleep(0.5)

    def apply(self, name: str, manifests: Sequence[JSON], *, delete_option: JSON | None = None,
              timeout: float = 90) -> AppliedWork:
        """Create the ManifestWork and do what the agent does until every manifest is applied."""
        # The hub: a ManifestWork in the cluster's namespace (ManifestWorkSpec: workload.manifests,
        # deleteOption).
        spec: JSON = {"workload": {"manifests": [copy.deepcopy(m) for m in manifests]}}
        if delete_option is not None:
            spec["deleteOption"] = delete_option
        work = _ok(self.client.create(f"{WORK_API}/namespaces/{self.cluster_namespace}/manifestworks", {
            "apiVersion": f"{GROUP}/v1", "kind": "ManifestWork",
            "metadata": {"name": name, "namespace": self.cluster_namespace}, "spec": spec}))
        path = manifestwork_path(self.cluster_namespace, name)
        # The agent adds its finalizer to the ManifestWork first:
        # OCM pkg/work/spoke/controllers/finalizercontroller/add_finalizer_controller.go#L67-L79.
        _ok(self.client.merge_patch(path, {"metadata": {
            "uid": work["metadata"]["uid"], "resourceVersion": work["metadata"]["resourceVersion"],
            "finalizers": [*work["metadata"].get("finalizers", []), MANIFESTWORK_FINALIZER]}}))
        # It creates the AppliedManifestWork "<hubHash>-<work>" with its finalizer:
        # OCM pkg/work/spoke/controllers/manifestcontroller/manifestwork_controller.go#L207-L226.
        applied_name = f"{HUB_HASH}-{name}"
        applied = _ok(self.client.create(f"{WORK_API}/appliedmanifestworks", {
            "apiVersion": f"{GROUP}/v1", "kind": "AppliedManifestWork",
            "metadata": {"name": applied_name, "finalizers": [APPLIED_FINALIZER]},
            "spec": {"hubHash": HUB_HASH, "manifestWorkName": name, "agentID": AGENT_ID}}))
        # The owner every applied object gets: APIVersion, Kind, Name, UID, no controller and no
        # blockOwnerDeletion (NewAppliedManifestWorkOwner, OCM pkg/work/helper/helpers.go#L355-L367; used by
        # the reconciler, pkg/work/spoke/controllers/manifestcontroller/manifestwork_reconciler.go#L112-L113).
        owner = {"apiVersion": f"{GROUP}/v1", "kind": "AppliedManifestWork", "name": applied_name,
                 "uid": applied["metadata"]["uid"]}
        recorded: dict[int, tuple[AppliedResource, bool]] = {}
        deadline = time.monotonic() + timeout
        while len(recorded) < len(manifests):
            # The reconciler applies every manifest each sync and requeues on errors (a CR whose CRD is not
            # served yet): manifestwork_reconciler.go#L116-L129.
            for index, manifest in enumerate(manifests):
                if index not in recorded:
                    done = self._apply_one(manifest, owner, delete_option)
                    if done is not None:
                        recorded[index] = done
            if len(recorded) < len(manifests):
                if time.monotonic() > deadline:
                    missing = [manifests[i]["metadata"]["name"] for i in range(len(manifests)) if i not in recorded]
                    raise AssertionError(f"ManifestWork {name}: not applied within {timeout:.0f} s: {missing}")
                time.sleep(0.2)
        # The ManifestWork's Applied condition (the AppliedManifestWork reconciler records nothing before it,
        # appliedmanifestwork_reconciler.go#L47-L50).
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        _ok(self.client.merge_patch(f"{path}/status", {"status": {"conditions": [
            {"type": "Applied", "status": "True", "reason": "AppliedManifestWorkComplete",
             "message": "Apply manifest work complete", "lastTransitionTime": now}]}}))
        # status.appliedResources: every applied object with its UID (orphaned ones too), SORTED by group,
        # version, resource, namespace and name: appliedmanifestwork_reconciler.go#L55-L82, #L106-L124.
        resources = sorted((r for r, _ in recorded.values()), key=lambda r: r.sort_key)
        _ok(self.client.merge_patch(f"{applied_path(applied_name)}/status", {"status": {
            "appliedResources": [r.to_json() for r in resources]}}))
        orphaned = tuple(r for r, owned in recorded.values() if not owned)
        return AppliedWork(self.cluster_namespace, name, applied_name, applied["metadata"]["uid"],
                           tuple(resources), orphaned)

    def _apply_one(self, manifest: JSON, owner: JSON,
                   delete_option: JSON | None) -> tuple[AppliedResource, bool] | None:
        api_version, kind = manifest["apiVersion"], manifest["kind"]
        found = self.discovery.resource(api_version, kind)
        if found is None:
            return None  # not served yet (its CRD is being established): the next sync tries again
        resource, namespaced = found
        group, _, version = api_version.rpartition("/")
        meta = manifest["metadata"]
        namespace = meta.get("namespace", "") if namespaced else ""
        owned = owned_by_the_work(group, resource, namespace, meta["name"], delete_option)
        body = copy.deepcopy(manifest)
        # manageOwnerRef: the owner when the work owns the object; else the owner with UID "<uid>-", which
        # MergeOwnerRefs reads as "remove it", so a new orphaned object has no ownerReference at all
        # (manifestwork_reconciler.go#L301-L313, #L367-L379; update_apply.go#L60).
        if owned:
            body["metadata"]["ownerReferences"] = [owner]
        else:
            body["metadata"].pop("ownerReferences", None)
        applied = AppliedResource(group, version, resource, namespace, meta["name"], "")
        collection = applied.path.rsplit("/", 1)[0]
        response = self.client.create(collection, body)
        if response.status_code == 409:  # exists: the update applier merges the owner in
            current = self.client.get(applied.path) or {}
            refs = [r for r in current["metadata"].get("ownerReferences", []) if r.get("uid") != owner["uid"]]
            patch = {"metadata": {"ownerReferences": [*refs, owner] if owned else refs}}
            response = self.client.merge_patch(applied.path, patch)
        if response.status_code in (404, 403, 422) or response.status_code >= 500:
            return None
        _ok(response)
        return attrs.evolve(applied, uid=response.json()["metadata"]["uid"]), owned


class Teardown(threading.Thread):
    """The user's DELETE of a ManifestWork, then the agent's two finalize controllers until it is gone.

    One thread runs both controllers' work queues, keyed by "manifestwork" and "applied"; a write of
    ours that changes an object queues the controllers its informer events would (an update event is
    seen at once). `deletes` lists every DELETE the agent sent; `errors` the syncs that failed;
    `manifestwork_gone_at` and `applied_gone_at` when those were removed (monotonic).
    """

    def __init__(self, client: Client, work: AppliedWork) -> None:
        super().__init__(daemon=True, name=f"manifestwork-agent-{work.name}")
        self.client, self.work = client, work
        self.deletes: list[DeleteAttempt] = []
        self.errors: list[str] = []
        self.started_at = 0.0
        self.manifestwork_gone_at: float | None = None
        self.applied_gone_at: float | None = None
        self.stopping = threading.Event()
        self._due: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []
        # The ManifestWork finalize controller's own limiter, 5 ms doubling to 1000 s: OCM
        # pkg/work/spoke/controllers/finalizercontroller/manifestwork_finalize_controller.go#L55.
        self._manifestwork_limiter = _Limiter(Backoff(initial=0.005, maximum=1000.0))
        # The AppliedManifestWork finalize controller's, 50 ms doubling to 60 s:
        # appliedmanifestwork_finalize_controller.go#L54-L55.
        self._applied_limiter = _Limiter(Backoff(initial=0.05, maximum=60.0))
        # A sync that returns an error is re-queued by the controller framework's queue with client-go's
        # default controller limiter, 5 ms doubling to 1000 s, per key (sdk-go
        # pkg/basecontroller/factory/base_controller.go#L158-L169, controller_context.go#L26-L28).
        self._queue_limiter = {"manifestwork": _Limiter(Backoff(initial=0.005, maximum=1000.0)),
                               "applied": _Limiter(Backoff(initial=0.005, maximum=1000.0))}

    # --- the queue ----------------------------------------------------------------------------------------
    def _add_after(self, key: str, delay: float) -> None:
        due = time.monotonic() + max(0.0, delay)
        if key in self._due and self._due[key] <= due:
            return  # one pending run per key, the earliest (client-go's delaying queue)
        self._due[key] = due
        heapq.heappush(self._heap, (due, key))

    def run(self) -> None:
        self.started_at = time.monotonic()
        # The user (or the hub's placement) deletes the ManifestWork; its finalizer keeps it.
        _ok(self.client.delete(self.work.path))
        self._add_after("manifestwork", 0)
        while not self.stopping.is_set() and self.manifestwork_gone_at is None:
            if not self._heap:
                self.stopping.wait(0.05)
                continue
            due, key = heapq.heappop(self._heap)
            if self._due.get(key) != due:
                continue  # superseded by an earlier run
            if self.stopping.wait(max(0.0, due - time.monotonic())):
                return
            del self._due[key]
            sync = self._sync_manifestwork if key == "manifestwork" else self._sync_applied
            try:
                sync()
            except Exception as exc:  # the framework logs it and re-queues the key rate-limited
                self.errors.append(f"{key}: {exc}"[:500])
                self._add_after(key, self._queue_limiter[key].when())
            else:
                self._queue_limiter[key].forget()

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)

    # --- ManifestWorkFinalizeController.sync: manifestwork_finalize_controller.go#L67-L122 ----------------
    def _sync_manifestwork(self) -> None:
        work = self.client.get(self.work.path)
        if work is None:
            self.manifestwork_gone_at = self.manifestwork_gone_at or time.monotonic()
            return
        if not work["metadata"].get("deletionTimestamp"):
            return
        # deleteAppliedManifestWork (#L124-L149): unless it is gone or already deleting, set the WorkDeleting
        # condition and DELETE the AppliedManifestWork with default options.
        applied = self.client.get(self.work.applied_path)
        if applied is not None and not applied["metadata"].get("deletionTimestamp"):
            conditions = [c for c in work.get("status", {}).get("conditions", []) if c["type"] != "Deleting"]
            conditions.append({"type": "Deleting", "status": "True", "reason": "WorkDeleting",
                               "message": "ManifestWork is being deleted",
                               "observedGeneration": work["metadata"].get("generation", 0),
                               "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
            _ok(self.client.merge_patch(f"{self.work.path}/status", {"status": {"conditions": conditions}}))
            _ok(self.client.delete(self.work.applied_path))
            self._add_after("applied", 0)  # the AppliedManifestWork's update event
        # #L96-L107: while the AppliedManifestWork exists, requeue with the controller's own limiter.
        if self.client.exists(self.work.applied_path):
            self._add_after("manifestwork", self._manifestwork_limiter.when())
            return
        # #L115-L119: forget the limiter and remove the ManifestWork's finalizer.
        self._manifestwork_limiter.forget()
        _remove_finalizer(self.client, self.work.path, work, MANIFESTWORK_FINALIZER)
        if self.client.get(self.work.path) is None:
            self.manifestwork_gone_at = time.monotonic()

    # --- AppliedManifestWorkFinalizeController: appliedmanifestwork_finalize_controller.go#L64-L135 -------
    def _sync_applied(self) -> None:
        applied = self.client.get(self.work.applied_path)
        if applied is None:
            return
        meta = applied["metadata"]
        if not meta.get("deletionTimestamp") or APPLIED_FINALIZER not in meta.get("finalizers", []):
            return  # #L88-L96: nothing to do until deleted, or once the finalizer is gone
        owner_uid = meta["uid"]
        original = [AppliedResource.from_json(r) for r in applied.get("status", {}).get("appliedResources") or []]
        pending, errors = self.delete_applied_resources(original, owner_uid)
        # #L110-L115: status.appliedResources becomes what is pending finalization (a refused object is gone
        # from it, so no later sync sends its DELETE again).
        updated = pending != original
        if updated:
            _ok(self.client.merge_patch(f"{self.work.applied_path}/status", {
                "metadata": {"uid": owner_uid, "resourceVersion": meta["resourceVersion"]},
                "status": {"appliedResources": [r.to_json() for r in pending] or None}}))
            self._add_after("applied", 0)  # its update event
            self._add_after("manifestwork", 0)
        # #L117-L120: return at once on an update or an error (an error: the framework's rate-limited requeue).
        if errors:
            raise RuntimeError("; ".join(errors))
        if updated:
            return
        # #L122-L127: wait for the deletions that went through, 50 ms doubling to 60 s.
        if pending:
            self._add_after("applied", self._applied_limiter.when())
            return
        # #L129-L135: forget the limiter and remove the finalizer; the AppliedManifestWork is gone.
        self._applied_limiter.forget()
        _remove_finalizer(self.client, self.work.applied_path, applied, APPLIED_FINALIZER)
        if self.client.get(self.work.applied_path) is None:
            self.applied_gone_at = time.monotonic()
        self._add_after("manifestwork", 0)  # its delete event

    # --- helper.DeleteAppliedResources: OCM pkg/work/helper/helpers.go#L172-L273 ---------------------------
    def delete_applied_resources(self, resources: Sequence[AppliedResource],
                                 owner_uid: str) -> tuple[list[AppliedResource], list[str]]:
        pending: list[AppliedResource] = []
        errors: list[str] = []
        for resource in resources:  # in status order: sorted, not the manifests' order
            try:
                current = self.client.get(resource.path)
            except httpx.HTTPError as exc:  # #L206-L211: kept as an error, dropped from the list
                errors.append(f"failed to get {resource.path}: {exc}")
                continue
            if current is None:
                continue  # #L200-L204: removed
            meta = current["metadata"]
            owners = meta.get("ownerReferences") or []
            if not any(o.get("uid") == owner_uid for o in owners):
                continue  # #L215-L218: not owned by us (an orphaned object): left alone
            if any(o.get("apiVersion") == f"{GROUP}/v1" and o.get("kind") == "AppliedManifestWork"
                   and o.get("uid") != owner_uid for o in owners):
                # #L220-L230: another AppliedManifestWork owns it too: only our ownerReference is removed.
                kept = [o for o in owners if o.get("uid") != owner_uid]
                response = self.client.merge_patch(resource.path, {"metadata": {
                    "uid": meta["uid"], "resourceVersion": meta["resourceVersion"], "ownerReferences": kept}})
                if response.status_code >= 400:
                    errors.append(f"failed to remove owner from {resource.path}: {response.status_code}")
                continue
            if resource.uid != meta["uid"]:
                continue  # #L232-L235: a new object of the same name; forgotten
            if meta.get("deletionTimestamp"):
                pending.append(resource)  # #L237-L240: being finalized; wait for it
                continue
            # #L189-L192, #L242-L252: DELETE, Background, with a UID precondition.
            response = self.client.delete(resource.path, body={
                "kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background",
                "preconditions": {"uid": resource.uid}})
            self.deletes.append(DeleteAttempt(resource.path, response.status_code, _message(response),
                                              time.monotonic()))
            if response.status_code in (404, 409):
                continue  # #L253-L259: gone, or the UID precondition failed: forgotten
            if response.status_code >= 400:
                # #L260-L265: an error for this sync, and the object is NOT kept pending: never sent again.
                errors.append(f"failed to delete {resource.path}: {response.status_code} {_message(response)}")
                continue
            pending.append(resource)  # #L267: deleted; wait until it is gone
        return pending, errors

    def refused(self) -> list[DeleteAttempt]:
        return [d for d in self.deletes if d.status == 403]


class _Limiter:
    """client-go's ItemExponentialFailureRateLimiter for one key: When() counts a failure and returns
    base·2ⁿ; Forget() resets."""

    def __init__(self, backoff: Backoff) -> None:
        self.backoff, self.failures = backoff, 0

    def when(self) -> float:
        self.failures += 1
        return self.backoff.delay(self.failures)

    def forget(self) -> None:
        self.failures = 0


def _remove_finalizer(client: Client, path: str, obj: JSON, finalizer: str) -> None:
    """The sdk-go patcher's RemoveFinalizer: a merge patch of the remaining finalizers, guarded by the UID
    and resourceVersion (sdk-go pkg/patcher/patcher.go#L124-L184)."""
    meta = obj["metadata"]
    kept = [f for f in meta.get("finalizers", []) if f != finalizer]
    if len(kept) == len(meta.get("finalizers", [])):
        return
    response = client.merge_patch(path, {"metadata": {"uid": meta["uid"], "resourceVersion": meta["resourceVersion"],
                                                      "finalizers": kept or None}})
    if response.status_code not in (200, 404):
        raise RuntimeError(f"failed to remove finalizer from {path}: {response.status_code} {_message(response)}")


def _ok(response: httpx.Response) -> JSON:
    if response.status_code >= 400:
        raise AssertionError(f"{response.request.method} {response.request.url.path}: {response.status_code} "
                             f"{_message(response)}")
    body: JSON = response.json()
    return body


def _message(response: httpx.Response) -> str:
    if response.status_code < 400:
        return ""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:300]
    return str(body.get("message", "")) if isinstance(body, dict) else str(body)[:300]
