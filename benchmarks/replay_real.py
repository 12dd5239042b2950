"""benchmarks/replay.py's cases on the real control plane, in wall-clock time (`replay --real`).

    python -m benchmarks replay --real      (the simulator's tables, then this one)
    python -m benchmarks.replay_real [--runs 1] [--only DELETER] [--json]

One control plane (tests/realcluster: etcd, kube-apiserver, kube-controller-manager; skipped with the
reason when they cannot be built) with the gate installed as a user installs it, the shipped RBAC, and
the operator's replay grant (api/examples/replay.yaml) applied once. Every case tears down a fresh copy
of the reference story with names of its own (tests/realcluster/teardown.py Story), so no case meets
another's leftovers; the provider's finalizer work is a FinalizerController thread, as in the tests.

The deleters are the simulator's (criticalsvc/sim/clients.py), played for real:

    ideal          the tool-neutral ideal (benchmarks/ideal.py `neutral`): each DELETE the moment the safe
                   order allows it, the CRD once its instances are gone; ideal-one-pass, ideal-namespaces and
                   ideal-flux are the deleters' own orders (`own_ideal`), run when a case needs them
    kubectl        `kubectl delete -f - --ignore-not-found --wait=false`, once
    kubectl-rerun  the same, re-run 30 s after each run that did not exit 0
    manifestwork   the Open Cluster Management work agent's deletion path (tests/realcluster/manifestwork.py,
                   on the work CRDs of open-cluster-management.io/api): the story applied as a ManifestWork,
                   then the ManifestWork deleted; the agent's one pass of DELETEs (Background, refusals
                   dropped), and kube-controller-manager's garbage collector deleting what was refused
    namespace      the story's namespaces and what lies outside them (the CRD, the CriticalService),
                   retried the same way; the namespace controller deletes the content
    gc-*           one DELETE of the root ClusterRole owning the whole story (blockOwnerDeletion) with that
                   propagationPolicy; kube-controller-manager's garbage collector does the rest
    flux           Flux's kustomize-controller v1.9.6, the real binary (tests/realcluster/flux.py): the story
                   applied by a Kustomization (prune: true, deletionPolicy MirrorPrune), then the
                   Kustomization deleted; Flux re-sends the whole pass of DELETEs after each refusal on its
                   backoff (750 ms doubling); the simulator's FluxKustomization client models the same path
    helm           `helm uninstall` (helm v3.22.0, tests/realcluster/helm.py) of a release holding the whole story
                   (the CRD in templates/, the CRs added by an upgrade): one pass in Helm's uninstall order by kind,
                   never retried (design/helm.md); the simulator's HelmUninstall client models the same path
    argocd         Argo CD v3.2.3's application controller and repo-server, the real binary (tests/realcluster/
                   argocd.py): the story synced by an Application (resources-finalizer.argocd.argoproj.io) from a
                   local Git repository, then the Application deleted; Argo CD sends its DELETEs Foreground, the
                   whole sync wave at once, nothing while any of them terminates, and retries a refused pass on its
                   next refresh. It never deletes the CRD, so this case's story is the one design/criticalservice.md
                   §6 gives Argo CD users: the CriticalService's SpecificResource criterion on the CRD replaced by
                   Resources on the CR type (met once no instance is left, the CRD may stay). Done means everything
                   Argo CD deletes is gone and the Application with it; the CRD staying is reported, not waited for.
                   Its ideals (benchmarks/ideal.py) are played on that same story without the CRD: ideal-crd-stays
                   the tool-neutral one, ideal-argocd Argo CD's order with replay (Foreground; the gate re-sends
                   what a pass had refused the moment it may go), ideal-argocd-passes without (also nothing sent
                   while anything sent is still there). Argo CD runs only for these cases (built by
                   `python -m tests.realcluster build --argocd`)

Makespan: from the deleter's first DELETE until every object of the story (and its root) is seen gone,
polled every ~100 ms (for Argo CD: its controller's first DELETE, when the gate got it, until everything
but the CRD is gone; from the user's DELETE of the Application to that first DELETE is `reactionSeconds`).
Foreground cases (the Argo CD ones) start once the garbage collector watches the CR type, as on any
cluster whose CRD is older than the collector's 30 s discovery sync (`_wait_for_the_garbage_collector`).
A case is "stuck" after STUCK_CAP s, or, once its deleter has nothing left to do
(the kubectl pass has exited, a retrying deleter has had every DELETE accepted), after QUIET s in which
no object appeared, vanished or changed its deletion state: only the controllers could still move it,
and within QUIET they would have. The garbage collector never counts as done (its backoff grows to
1000 s), so gc cases only stop at the cap.

Refusals are the 403 answers the deleter got; for gc and manifestwork, the gate's log lines for refused
DELETEs of the story's objects by anyone but the gate itself (the garbage collector's too;
tests/realcluster runs it with the admin's credentials, so its user does not tell it apart). Replays
are the gate's "deletion replayed" log lines for the story's objects. The ideals are measured once per
run (on the story without an owner, as the gc bundle's ideal too: the root goes the moment its
dependents are gone) and each case's ratio divides by the ideal of its run. The main table (`ideal_table`)
times every case on the same objects (benchmarks/ideal.py `counted`, the workload) against the neutral
ideal and its own order's, and everything (the tool's records too) against its own order's; the `rows`
of the JSON keep the former columns (everything gone against the neutral ideal's everything gone). For manifestwork the
makespan runs from the user's DELETE of the ManifestWork until the story, the ManifestWork and the
AppliedManifestWork are gone; its rows also give "stack gone" (the last object of the story seen gone,
against the same ideal) beside it, since the agent's own wait for what it deleted (50 ms doubling to
60 s, design/replay.md) keeps the ManifestWork after the stack is gone (`stack_table`).

A second table repeats the ideal and manifestwork with a slow finalizer: each CR's finalizer is removed
SLOW_REAL seconds after the CR was marked for deletion (a cloud resource's cleanup), so the agent's wait
for what it deleted (50 ms doubling to 60 s) grows meanwhile.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import heapq
import json
import re
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import yaml

from benchmarks import ideal
from benchmarks.replay_cases import CASES, ROOT_OWNER, render
from criticalsvc.backoff import Backoff

CRITICAL_SERVICES = "/apis/criticalsvc.io/v1alpha1/criticalservices"
CLUSTER_ROLES = "/apis/rbac.authorization.k8s.io/v1/clusterroles"
GATE_USERS = "system:serviceaccount:criticalsvc-system:"  # the gate's own DELETEs are its replays
# The operator's grant (api/examples/replay.yaml) for every story at once. The gate replays only what
# it refused (provider, its namespace, the CriticalService), never the root owner or the CRD.
POLL = 0.1  # the observer's round; one round GETs the ~10 objects of a story, itself 20-50 ms here
RERUN = 30.0  # kubectl-rerun: the person's patience between runs, as in the simulator
# After its deleter is done, a teardown that nothing moved for this long is stuck: the slowest steps the
# controllers take alone here take ~5 s (the CRD's cleanup finalizer polls its instances every 5 s,
# apiextensions-apiserver pkg/controller/finalizer/crd_finalizer.go; a namespace's finalization).
QUIET = 30.0
STUCK_CAP = 300.0
RETRY = Backoff(initial=0.05, maximum=60.0)  # the namespace deleter's requeue of a refused deletion
SLOW_REAL = 15.0  # the slow-finalizer table: seconds from a CR's deletion until its finalizer is removed
SLOW_CASES = (("manifestwork", False), ("manifestwork", True))
# --crossplane-order: every story's CriticalService without its SpecificResource criterion on the CRD.
CROSSPLANE_ORDER = threading.Event()
# The ideals (benchmarks/ideal.py): "ideal" is the tool-neutral one; the others are a deleter's own order.
IDEALS: dict[str, Callable[..., ideal.Order]] = {
    "ideal": ideal.neutral, "ideal-one-pass": ideal.one_pass, "ideal-foreground": ideal.one_pass,
    "ideal-namespaces": ideal.namespaces, "ideal-flux": ideal.one_pass, "ideal-crd-stays": ideal.neutral,
    "ideal-argocd": ideal.neutral, "ideal-argocd-passes": ideal.neutral}
# The deleters that never delete the story's CRD, and the ideals played on their story (the CRD left out).
CRD_STAYS = frozenset({"argocd", "ideal-crd-stays", "ideal-argocd", "ideal-argocd-passes"})
FOREGROUND = frozenset({"ideal-foreground", "ideal-argocd", "ideal-argocd-passes"})
# Only on the real control plane: the simulator's table (benchmarks/replay.py) runs the reference story, whose
# criterion on the CRD Argo CD never meets (its ArgoCDApplication client would be stuck by design).
REAL_CASES = (("argocd", False), ("argocd", True))
ALL_CASES = (*CASES, *REAL_CASES)


def own_ideal(deleter: str, replay: bool) -> str:
    """The ideal of a deleter's own order: what it would take sending its own DELETEs the moment each is allowed.
    kubectl, the ManifestWork agent and the garbage collector's root deletion mark everything (the CRD too) at
    once; the namespace deleter sends only the namespaces and what lies outside them; Flux sends its passes on its
    rate limiter's grid, which replay lifts for the stack (the gate re-sends what a pass had refused)."""
    if deleter == "namespace":
        return "ideal-namespaces"
    if deleter == "flux" and not replay:
        return "ideal-flux"
    if deleter == "argocd":
        return "ideal-argocd" if replay else "ideal-argocd-passes"
    return "ideal-one-pass"


def neutral_ideal(deleter: str) -> str:
    """The tool-neutral ideal a deleter is compared with: of the same story, so of the one whose CRD stays for a
    deleter that never deletes it."""
    return "ideal-crd-stays" if deleter in CRD_STAYS else "ideal"


# --- deleters -------------------------------------------------------------------------------------------
class Deleter(threading.Thread):
    """One teardown client in a thread: when it sent its first DELETE, how many it had refused (403),
    whether it has nothing left to do (`done`), and what ended it if it failed (`error`)."""

    def __init__(self, name: str) -> None:
        super().__init__(daemon=True, name=name)
        self.first_delete: float | None = None
        self.refusals = 0
        self.done = False
        self.error = ""
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            self.work()
        except Exception as exc:  # reported as the case's outcome, not lost in a thread
            self.error = f"{type(exc).__name__}: {exc}"[:500]

    def work(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        self.stopping.set()
        self.join(60)

    def _send_delete(self, client: Any, path: str, **kwargs: Any) -> httpx.Response:
        sent = time.time()
        response: httpx.Response = client.delete(path, **kwargs)
        if self.first_delete is None:
            self.first_delete = sent
        if response.status_code == 403:
            self.refusals += 1
        return response


class OrderDeleter(Deleter):
    """An ideal (benchmarks/ideal.py `Order`) played by `run_order` with `propagation`: each DELETE sent the moment
    its order allows it. On a real API server Foreground costs time of its own (a CR deleted Foreground waits for
    the garbage collector to drop `foregroundDeletion`), which no ordering can save."""

    def __init__(self, client: Any, paths: dict[str, str], order: ideal.Order, *, propagation: str = "Background",
                 grid: tuple[float, ...] = (), settle: bool = False) -> None:
        super().__init__(f"ideal-{order.name}")
        self.client, self.paths, self.order, self.propagation, self.grid = client, paths, order, propagation, grid
        self.settle = settle
        self.timeline: ideal.Timeline | None = None

    def work(self) -> None:
        def first(at: float) -> None:
            self.first_delete = at

        self.timeline = ideal.run_order(self.client, self.paths, self.order, stopping=self.stopping,
                                        timeout=STUCK_CAP, propagation=self.propagation, grid=self.grid,
                                        settle=self.settle, on_first_delete=first)
        self.refusals = self.timeline.refusals
        self.done = True


class KubectlDeleter(Deleter):
    """`kubectl delete -f` of the story's text; with `repeat`, re-run that many seconds after each run that
    failed, as a person does until it exits 0. kubectl runs at -v=6 so that the first DELETE's time can be
    read from its log (its start-up and discovery come before it)."""

    def __init__(self, kubectl: Callable[..., Any], text: str, *, repeat: float | None = None) -> None:
        super().__init__("kubectl")
        self.kubectl, self.text, self.repeat = kubectl, text, repeat
        self.runs = 0

    def work(self) -> None:
        while not self.stopping.is_set():
            started = time.time()
            done = self.kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=false", "-v=6",
                                input=self.text, timeout=120)
            self.runs += 1
            self.refusals += done.stderr.count("Error from server (Forbidden)")
            if self.first_delete is None:
                self.first_delete = _first_request(done.stderr, "DELETE") or started
            if done.returncode == 0 or self.repeat is None or self.stopping.wait(self.repeat):
                break
        self.done = True


class BackoffDeleter(Deleter):
    """Sends a DELETE for every path at once and retries each refused one on its own exponential backoff
    (RETRY), as a tenant-removal controller does. An object whose DELETE was accepted (or is not found)
    is left to the API server and the controllers."""

    def __init__(self, client: Any, paths: dict[str, str], *, propagation: str) -> None:
        super().__init__("backoff-deleter")
        self.client, self.paths, self.propagation = client, paths, propagation

    def work(self) -> None:
        due = [(0.0, key) for key in self.paths]
        failures = dict.fromkeys(self.paths, 0)
        while due:
            at, key = heapq.heappop(due)
            if self.stopping.wait(max(0.0, at - time.monotonic())):
                return
            try:
                response = self._send_delete(self.client, self.paths[key], body={
                    "kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": self.propagation})
                accepted = response.status_code in (200, 202, 404)
            except httpx.HTTPError:
                accepted = False
            if not accepted:
                failures[key] += 1
                heapq.heappush(due, (time.monotonic() + RETRY.delay(failures[key]), key))
        self.done = True


class ManifestWorkDeleter(Deleter):
    """The user's DELETE of the ManifestWork and the agent's finalize controllers until it is gone
    (tests/realcluster/manifestwork.py Teardown, run in this thread). The garbage collector deletes what
    the agent was refused, and keeps retrying, so this deleter is never `done`."""

    def __init__(self, client: Any, applied: Any) -> None:
        super().__init__("manifestwork")
        self.client, self.applied = client, applied
        self.teardown: Any = None

    def work(self) -> None:
        from tests.realcluster.manifestwork import Teardown

        self.teardown = Teardown(self.client, self.applied)
        self.teardown.stopping = self.stopping
        self.first_delete = time.time()
        self.teardown.run()


class ArgoCDDeleter(Deleter):
    """The user's DELETE of the Application; Argo CD's controller does the rest (a refused pass is tried again on
    its next refresh), so this deleter is never `done`: the case ends when all it deletes is gone. Its first DELETE
    is the controller's (`measure` reads it from the gate's log: every pass sends the whole wave at once, so the
    provider's DELETE is in the first); `requested` keeps the user's, and the gap is Argo CD's reaction."""

    def __init__(self, client: Any, application_path: str) -> None:
        super().__init__("argocd")
        self.client, self.path = client, application_path
        self.requested: float | None = None

    def work(self) -> None:
        response = self._send_delete(self.client, self.path)
        self.requested = self.first_delete
        if response.status_code not in (200, 202):
            raise AssertionError(f"DELETE {self.path}: {response.status_code} {response.text}")


class FluxDeleter(Deleter):
    """The user's DELETE of the Kustomization; kustomize-controller does the rest (its finalize retries every
    refused pass on its own backoff), so this deleter is never `done`: the case ends when all is gone."""

    def __init__(self, client: Any, kustomization_path: str) -> None:
        super().__init__("flux")
        self.client, self.path = client, kustomization_path

    def work(self) -> None:
        response = self._send_delete(self.client, self.path)
        if response.status_code != 200:
            raise AssertionError(f"DELETE {self.path}: {response.status_code} {response.text}")


class HelmDeleter(Deleter):
    """`helm uninstall` of the release holding the story, once; helm runs at --v=6 so that its first DELETE's time
    can be read from its log (its start-up, the release's history and the REST mapping come before it). Helm
    never retries, so this deleter is `done` once the command has returned (exit 1 when a DELETE was refused)."""

    def __init__(self, helm: Any, release: str) -> None:
        super().__init__("helm")
        self.helm, self.release = helm, release
        self.outcome: Any = None
        self.ended: float | None = None  # when helm returned: the gate's refusals after it are the cleanup's

    def work(self) -> None:
        started = time.time()
        self.outcome = self.helm.run("uninstall", self.release, "--v=6")
        self.ended = time.time()
        self.first_delete = _first_request(self.outcome.stderr, "DELETE") or started
        self.done = True


class RootDeleter(Deleter):
    """One DELETE of the root owner with `propagation`; the garbage collector does the rest, and keeps
    retrying what the gate refuses, so this deleter is never `done`."""

    def __init__(self, client: Any, path: str, *, propagation: str) -> None:
        super().__init__("root-deleter")
        self.client, self.path, self.propagation = client, path, propagation

    def work(self) -> None:
        response = self._send_delete(self.client, self.path, body={
            "kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": self.propagation})
        if response.status_code not in (200, 202):
            raise AssertionError(f"DELETE {self.path}: {response.status_code} {response.text}")


def _first_request(klog: str, verb: str) -> float | None:
    """When kubectl sent its first `verb` request: the klog header time of its -v=6 response line, less
    the round trip it reports."""
    for line in klog.splitlines():
        if verb not in line:
            continue
        header = re.match(r"^[IWE](\d\d)(\d\d) (\d\d):(\d\d):(\d\d\.\d+)", line)
        if header is None:
            continue
        month, day, hour, minute, second = header.groups()
        now = datetime.datetime.now()
        at = now.replace(month=int(month), day=int(day), hour=int(hour), minute=int(minute),
                         second=0, microsecond=0) + datetime.timedelta(seconds=float(second))
        took = re.search(r"milliseconds=(\d+)| in (\d+) milliseconds", line)
        return at.timestamp() - (int(next(g for g in took.groups() if g)) / 1000 if took else 0.0)
    return None


# --- stories -------------------------------------------------------------------------------------------
@attrs.frozen
class Bundle:
    """One case's story and, for gc, the root ClusterRole that owns all of it."""

    story: Any  # tests.realcluster.teardown.Story
    root: str | None = None
    extra: tuple[tuple[str, str], ...] = ()  # (key, path) of objects beside the story's: the ManifestWork's
    # Keys of the story's objects its deleter never deletes (Argo CD: the CRD): not waited for, only reported.
    stays: tuple[str, ...] = ()

    @property
    def root_path(self) -> str | None:
        return f"{CLUSTER_ROLES}/{self.root}" if self.root else None

    def story_paths(self) -> dict[str, str]:
        """The story's objects the teardown deletes (all of them, but what `stays`)."""
        return {k: p for k, p in self.story.paths().items() if k not in self.stays}

    def dependents(self) -> dict[str, list[str]]:
        """The story's safe order among what the teardown deletes."""
        return {k: [d for d in v if d not in self.stays] for k, v in self.story.dependents().items()
                if k not in self.stays}

    def paths(self) -> dict[str, str]:
        """Everything the teardown waits for: the story's objects it deletes, the tool's records, the root."""
        paths: dict[str, str] = self.story_paths() | dict(self.extra)
        return paths | ({f"ClusterRole/{self.root}": f"{CLUSTER_ROLES}/{self.root}"} if self.root else {})

    def stayed(self) -> dict[str, str]:
        return {k: p for k, p in self.story.paths().items() if k in self.stays}

    def namespace_targets(self) -> dict[str, str]:
        """The namespace deleter's targets: the namespaces and what lives outside them."""
        namespaces = {o["metadata"]["name"] for o in self.story.objects if o["kind"] == "Namespace"}
        keep = {f"{o['kind']}/{o['metadata']['name']}" for o in self.story.objects
                if o["kind"] == "Namespace" or o["metadata"].get("namespace") not in namespaces}
        return {k: p for k, p in self.story.paths().items() if k in keep}


def make_bundle(cluster: Any, suffix: str, *, replay: bool, owned: bool, crd_stays: bool = False) -> Bundle:
    """The renamed reference story, edited as benchmarks/replay.py's story_text edits the original; an owned
    story's root is created first, since an ownerReference needs its owner's UID on a real API server. With
    `crd_stays`, the story of a deleter that never deletes the CRD: the CriticalService waits for no CR left
    (Resources on the CR type) instead of for the CRD (design/criticalservice.md §6), and the CRD `stays`."""
    from tests.realcluster.teardown import Story

    story = Story.make(suffix)
    root = f"{ROOT_OWNER}-{suffix}" if owned else None
    uid = ""
    if root is not None:
        # A ClusterRole without rules costs nothing to delete (as in the simulator's story).
        created = cluster.admin.create(CLUSTER_ROLES, {"apiVersion": "rbac.authorization.k8s.io/v1",
                                                       "kind": "ClusterRole", "metadata": {"name": root},
                                                       "rules": []})
        if created.status_code != 201:
            raise AssertionError(f"creating {root}: {created.status_code} {created.text}")
        uid = created.json()["metadata"]["uid"]
    docs = story.objects
    for d in docs:
        if d["kind"] == "CriticalService" and replay:
            d["spec"]["replayDeletion"] = "WhenTearingDown"
        if d["kind"] == "CriticalService" and CROSSPLANE_ORDER.is_set():
            # Crossplane's order: the provider waits for its CRs' finalizer only, not for their CRD to be gone.
            d["spec"]["criteria"] = [c for c in d["spec"]["criteria"] if c["type"] != "SpecificResource"]
        if d["kind"] == "CriticalService" and crd_stays:
            d["spec"]["criteria"] = [c if c["type"] != "SpecificResource" else {
                "type": "Resources", "resources": {"group": story.group, "resource": "coolresources"}}
                for c in d["spec"]["criteria"]]
        if root is not None:
            d["metadata"]["ownerReferences"] = [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                                                 "name": root, "uid": uid, "blockOwnerDeletion": True}]
    stays = (f"CustomResourceDefinition/{story.crd_name}",) if crd_stays else ()
    return Bundle(attrs.evolve(story, text=yaml.safe_dump_all(docs, sort_keys=False)), root, stays=stays)


def _replay_permitted(client: Any, name: str) -> bool:
    status = (client.get(f"{CRITICAL_SERVICES}/{name}") or {}).get("status") or {}
    return any(c.get("type") == "ReplayPermitted" and c.get("status") == "True"
               for c in status.get("conditions") or [])


# --- one case ------------------------------------------------------------------------------------------
@attrs.define
class Outcome:
    completed: bool
    makespan: float | None
    refusals: int
    replayed: int
    why: str = ""
    gone: dict[str, float] = attrs.Factory(dict)  # key -> seconds after the first DELETE it was seen gone
    # When the last object of the story itself was seen gone (for manifestwork: not its ManifestWork and
    # AppliedManifestWork, which the agent removes only after its own backoff); None when stuck.
    stack_gone: float | None = None
    # The refused DELETEs in the gate's log order, as `resource/name` without the case's suffix (gc, manifestwork
    # and flux, whose refusals only the gate's log shows): what the simulator's timeline is compared with.
    refused: tuple[str, ...] = ()
    # When the last of the objects every tool is timed on was seen gone (benchmarks/ideal.py `counted`).
    workload_gone: float | None = None
    timeline: Any = None  # an ideal's: benchmarks/ideal.py Timeline
    stayed: tuple[str, ...] = ()  # what the deleter never deletes (Bundle.stays), seen still there at the end
    reaction: float | None = None  # Argo CD: from the user's DELETE of the Application to the controller's first


class GateLog:
    """The gate's log lines written since `mark()`, as JSON objects."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0

    def mark(self) -> None:
        self.offset = self.path.stat().st_size

    def since_mark(self) -> Iterator[dict[str, Any]]:
        with self.path.open("rb") as f:
            f.seek(self.offset)
            for line in f:
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if isinstance(entry, dict):
                    yield entry


def _state(client: Any, paths: dict[str, str]) -> dict[str, tuple[bool, tuple[str, ...]]]:
    """key -> (being deleted, finalizers) of every object that exists."""
    found = {}
    for key, path in paths.items():
        obj = client.get(path)
        if obj is not None:
            meta = obj["metadata"]
            found[key] = (bool(meta.get("deletionTimestamp")), tuple(meta.get("finalizers") or ()))
    return found


class SlowFinalizerController(threading.Thread):
    """The provider's finalizer work taking `delay` s: while the Deployment exists, removes the finalizer of
    each CR `delay` s after the CR's deletionTimestamp."""

    def __init__(self, client: Any, story: Any, delay: float) -> None:
        super().__init__(daemon=True, name="slow-finalizer-controller")
        self.client, self.story, self.delay = client, story, delay
        self.stopping = threading.Event()

    def run(self) -> None:
        crs = f"/apis/{self.story.group}/v1/coolresources"
        while not self.stopping.wait(0.2):
            try:
                if not self.client.exists(self.story.deployment_path):
                    continue
                for item in (self.client.get(crs) or {}).get("items", []):
                    meta = item["metadata"]
                    stamp = meta.get("deletionTimestamp")
                    if not stamp or self.story.finalizer not in (meta.get("finalizers") or []):
                        continue
                    since = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
                    if time.time() - since >= self.delay:
                        kept = [f for f in meta["finalizers"] if f != self.story.finalizer]
                        self.client.json_patch(f"{crs.rsplit('/coolresources', 1)[0]}/namespaces/{meta['namespace']}"
                                               f"/coolresources/{meta['name']}", [
                            {"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]},
                            {"op": "replace", "path": "/metadata/finalizers", "value": kept}])
            except Exception:  # a controller keeps going through API errors
                continue

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)


def measure(cluster: Any, log: GateLog, bundle: Bundle, deleter: Deleter, *, finalizer_delay: float = 0.0) -> Outcome:
    """Run `deleter` with the story's finalizer controller until everything is gone or it is stuck."""
    from tests.realcluster.teardown import FinalizerController

    story, paths = bundle.story, bundle.paths()
    controller: Any = (SlowFinalizerController(cluster.admin, story, finalizer_delay) if finalizer_delay else
                       FinalizerController(cluster.admin, deployment_path=story.deployment_path,
                                           crs_path=f"/apis/{story.group}/v1/coolresources",
                                           finalizer=story.finalizer))
    controller.start()
    log.mark()
    gone_at: dict[str, float] = {}
    last: dict[str, tuple[bool, tuple[str, ...]]] = {}
    changed = time.time()
    why = ""
    try:
        deleter.start()
        while True:
            state = _state(cluster.admin, paths)
            now = time.time()
            for key in paths.keys() - state.keys():
                gone_at.setdefault(key, now)
            if state != last:
                last, changed = state, now
            if not state:
                break
            started = deleter.first_delete
            if deleter.error:
                why = f"the deleter failed ({deleter.error}); left: {', '.join(sorted(state))}"
                break
            if started is not None and now - started > STUCK_CAP:
                why = f"not done after {STUCK_CAP:.0f} s; left: {', '.join(sorted(state))}"
                break
            if deleter.done and now - changed > QUIET:
                why = f"nothing moved for {QUIET:.0f} s after the deleter was done; left: {', '.join(sorted(state))}"
                break
            time.sleep(POLL)
    finally:
        deleter.stop()
        stayed = tuple(k.replace(f"-{story.suffix}", "") for k, p in bundle.stayed().items()
                       if cluster.admin.exists(p))
        leftover = cleanup(cluster, bundle)
        controller.stop()
    refusals, replayed = deleter.refusals, 0
    refused: list[str] = []
    suffix = f"-{story.suffix}"
    for entry in log.since_mark():
        if entry.get("event") == "deletion replayed" and str(entry.get("object", "")).endswith(suffix):
            replayed += 1
        elif (isinstance(deleter, (RootDeleter, ManifestWorkDeleter, FluxDeleter, HelmDeleter, ArgoCDDeleter))
              and entry.get("event") == "decision"
              and entry.get("result") == "denied"
              and entry.get("operation") == "DELETE" and not entry.get("dry_run")
              and str(entry.get("name", "")).endswith(suffix)
              and not str(entry.get("user", "")).startswith(GATE_USERS)
              and not (isinstance(deleter, HelmDeleter) and _logged_after(entry, deleter.ended))):
            refusals += 1
            refused.append(f"{entry.get('resource')}/{entry.get('name')}".replace(suffix, ""))
    reaction = None
    if isinstance(deleter, ArgoCDDeleter) and deleter.requested is not None:
        from tests.realcluster.argocd import CONTROLLER_USER

        sent = [_arrived(e) for e in log.since_mark() if e.get("event") == "decision"
                and e.get("operation") == "DELETE" and e.get("user") == CONTROLLER_USER
                and str(e.get("name", "")).endswith(suffix)]
        if sent:
            deleter.first_delete = min(sent)
            reaction = round(deleter.first_delete - deleter.requested, 2)
    if leftover:
        print(f"  cleanup left {', '.join(leftover)} behind", file=sys.stderr, flush=True)
    if deleter.first_delete is None:
        return Outcome(False, None, refusals, replayed, why or "no DELETE was sent")
    gone = {k.replace(suffix, ""): round(t - deleter.first_delete, 2)
            for k, t in sorted(gone_at.items(), key=lambda kv: kv[1])}
    if why:
        return Outcome(False, None, refusals, replayed, why, gone, refused=tuple(refused), stayed=stayed,
                       reaction=reaction)
    stack = last_gone(gone_at, bundle.story_paths()) - deleter.first_delete
    workload = last_gone(gone_at, ideal.counted(bundle.story_paths())) - deleter.first_delete
    return Outcome(True, max(gone_at.values()) - deleter.first_delete, refusals, replayed, gone=gone,
                   stack_gone=stack, refused=tuple(refused), workload_gone=workload,
                   timeline=getattr(deleter, "timeline", None), stayed=stayed, reaction=reaction)


def _arrived(entry: dict[str, Any]) -> float:
    """When the gate got the request it logged in `entry`: its `time` (UTC, ISO 8601 with a Z) less `latency_ms`."""
    logged = datetime.datetime.fromisoformat(entry["time"]).timestamp()
    return float(logged - float(entry.get("latency_ms") or 0) / 1000)


def _logged_after(entry: dict[str, Any], moment: float | None) -> bool:
    """Whether the gate logged `entry` after `moment` (epoch seconds); its `time` is UTC, ISO 8601 with a Z."""
    if moment is None or not isinstance(entry.get("time"), str):
        return False
    return datetime.datetime.fromisoformat(entry["time"]).timestamp() > moment


def last_gone(gone_at: dict[str, float], keys: Iterable[str]) -> float:
    """When the last of `keys` was seen gone (every one of them was)."""
    return max(gone_at[k] for k in keys)


def cleanup(cluster: Any, bundle: Bundle) -> list[str]:
    """Delete whatever the case left (the finalizer controller still running); the keys still there."""
    from tests.realcluster.teardown import RepeatingDeleter

    left = {k: p for k, p in (bundle.paths() | bundle.stayed()).items() if cluster.admin.exists(p)}
    for key, path in left.items():
        if key in dict(bundle.extra):  # the agent's finalizers: nobody else removes them
            cluster.admin.merge_patch(path, {"metadata": {"finalizers": None}})
    if left:
        RepeatingDeleter(cluster.admin, left).run(timeout=120)
    cluster.kubectl("delete", "clusterrole", f"criticalsvc-read-{bundle.story.group}", "--ignore-not-found")
    return [k for k, p in left.items() if cluster.admin.exists(p)]


def run_case(cluster: Any, log: GateLog, deleter: str, *, replay: bool, suffix: str,
             finalizer_delay: float = 0.0, flux_server: Any = None, helm: Any = None, argo: Any = None) -> Outcome:
    from tests.realcluster.manifestwork import ManifestWorkAgent
    from tests.realcluster.teardown import apply_story, wait_for

    owned = deleter.startswith("gc-")
    bundle = make_bundle(cluster, suffix, replay=replay, owned=owned, crd_stays=deleter in CRD_STAYS)
    story = bundle.story
    applied = None
    if deleter == "manifestwork":
        done = cluster.kubectl("apply", "-f", "-", input=story.reader_role())
        if done.returncode != 0:
            raise AssertionError(f"applying the reader role: {done.stderr}")
        applied = ManifestWorkAgent(cluster.admin).apply(f"story-{suffix}", story.objects)
        bundle = attrs.evolve(bundle, extra=(("ManifestWork", applied.path),
                                             ("AppliedManifestWork", applied.applied_path)))
        wait_for(lambda: cluster.admin.delete(story.deployment_path, params={"dryRun": "All"}).status_code == 403,
                 timeout=60, what=f"the gate to protect {story.deployment_path}")
    elif deleter == "flux":
        from tests.realcluster.flux import FLUX_NAMESPACE, FluxKustomization

        done = cluster.kubectl("apply", "-f", "-", input=story.reader_role())
        if done.returncode != 0:
            raise AssertionError(f"applying the reader role: {done.stderr}")
        kustomization = FluxKustomization(cluster.admin, flux_server, FLUX_NAMESPACE, f"story-{suffix}")
        kustomization.create_source()
        revision = kustomization.publish({"story.yaml": story.text})
        kustomization.create(prune=True, deletion_policy="MirrorPrune")
        # The GitRepository is no part of the teardown (nobody deletes it): left, one small object per case.
        bundle = attrs.evolve(bundle, extra=(("Kustomization", kustomization.path),))
        wait_for(lambda: kustomization.ready(revision), timeout=120, what=f"{kustomization.path} Ready")
        wait_for(lambda: cluster.admin.delete(story.deployment_path, params={"dryRun": "All"}).status_code == 403,
                 timeout=60, what=f"the gate to protect {story.deployment_path}")
    elif deleter == "helm":
        from tests.realcluster.helm import write_chart

        done = cluster.kubectl("apply", "-f", "-", input=story.reader_role())
        if done.returncode != 0:
            raise AssertionError(f"applying the reader role: {done.stderr}")
        helm.install(f"story-{suffix}", write_chart(helm.home / "charts" / suffix, "story", story.objects))
        wait_for(lambda: cluster.admin.delete(story.deployment_path, params={"dryRun": "All"}).status_code == 403,
                 timeout=60, what=f"the gate to protect {story.deployment_path}")
    elif deleter == "argocd":
        from tests.realcluster.argocd import Application, GitRepository

        done = cluster.kubectl("apply", "-f", "-", input=story.reader_role())
        if done.returncode != 0:
            raise AssertionError(f"applying the reader role: {done.stderr}")
        repo = GitRepository(argo.directory / "git" / suffix).init()
        revision = repo.commit({"story.yaml": story.text}, "the story")
        app = Application(cluster.admin, f"story-{suffix}", repo.url)
        app.create()
        bundle = attrs.evolve(bundle, extra=(("Application", app.url),))
        wait_for(lambda: argo.check_alive() or app.synced(revision), timeout=300, interval=0.5,
                 what=f"{app.url} Synced at {revision}")
        wait_for(lambda: cluster.admin.delete(story.deployment_path, params={"dryRun": "All"}).status_code == 403,
                 timeout=60, what=f"the gate to protect {story.deployment_path}")
    else:
        apply_story(cluster.kubectl, cluster.admin, story)
    if deleter in FOREGROUND or deleter == "argocd":
        _wait_for_the_garbage_collector(cluster.admin, story)
    if replay:
        wait_for(lambda: _replay_permitted(cluster.admin, story.critical_service), timeout=60,
                 what=f"{story.critical_service}: ReplayPermitted=True")
    client = cluster.admin
    running: Deleter
    if deleter in IDEALS:
        order = IDEALS[deleter](bundle.story_paths(), bundle.dependents())
        running = OrderDeleter(client, bundle.story_paths(), order,
                               propagation="Foreground" if deleter in FOREGROUND else "Background",
                               grid=ideal.flux_passes() if deleter == "ideal-flux" else (),
                               settle=deleter == "ideal-argocd-passes")
    elif deleter in ("kubectl", "kubectl-rerun"):
        running = KubectlDeleter(cluster.kubectl, story.text, repeat=RERUN if deleter == "kubectl-rerun" else None)
    elif deleter == "manifestwork":
        running = ManifestWorkDeleter(client, applied)
    elif deleter == "flux":
        running = FluxDeleter(client, dict(bundle.extra)["Kustomization"])
    elif deleter == "helm":
        running = HelmDeleter(helm, f"story-{suffix}")
    elif deleter == "argocd":
        running = ArgoCDDeleter(client, dict(bundle.extra)["Application"])
    elif deleter == "namespace":
        running = BackoffDeleter(client, bundle.namespace_targets(), propagation="Background")
    elif owned and bundle.root_path is not None:
        running = RootDeleter(client, bundle.root_path, propagation=deleter.removeprefix("gc-").capitalize())
    else:
        raise ValueError(f"no deleter {deleter!r}")
    outcome = measure(cluster, log, bundle, running, finalizer_delay=finalizer_delay)
    if deleter == "helm":  # the release's record, `uninstalling` after a refused pass
        cluster.kubectl("delete", "secret", "-n", helm.namespace, "-l", f"owner=helm,name=story-{suffix}")
    return outcome


def _wait_for_the_garbage_collector(client: Any, story: Any) -> None:
    """Wait until the garbage collector watches the story's CR type, as it does for any CRD older than its discovery
    sync (every 30 s, kube-controller-manager core.go `syncPeriod`,
    https://github.com/kubernetes/kubernetes/blob/v1.37.2/cmd/kube-controller-manager/app/core.go#L694-L705).
    Until then a CR deleted Foreground keeps its foregroundDeletion finalizer (measured: it went ~5 s later, with its
    namespace's content), so Foreground teardowns timed before and after that sync differ by ~5 s (Argo CD's slower
    set-up made it land on either side). A probe CR, deleted Foreground, is gone once the collector handles the type."""
    from tests.realcluster.teardown import wait_for

    crs = f"/apis/{story.group}/v1/namespaces/{story.cr_namespace}/coolresources"
    created = client.create(crs, {"apiVersion": f"{story.group}/v1", "kind": "CoolResource",
                                  "metadata": {"name": "gc-probe", "namespace": story.cr_namespace}})
    if created.status_code != 201:
        raise AssertionError(f"creating the probe in {crs}: {created.status_code} {created.text}")
    client.delete(f"{crs}/gc-probe", body={"kind": "DeleteOptions", "apiVersion": "v1",
                                           "propagationPolicy": "Foreground"})
    wait_for(lambda: not client.exists(f"{crs}/gc-probe"), timeout=90, interval=0.2,
             what=f"the garbage collector to delete {crs}/gc-probe (Foreground)")


# --- the table -----------------------------------------------------------------------------------------
def run(runs: int = 1, only: tuple[str, ...] = (), *, slow: bool = True) -> dict[str, Any]:
    """Every case of benchmarks/replay.py `runs` times on one real control plane; rows as its sim_table's.
    `only`: just those deleters (and the ideal each ratio needs); the slow-finalizer table only if one of
    its cases is among them."""
    cases = [c for c in (CASES if not only else ALL_CASES) if not only or c[0] in only]
    slow_cases = [c for c in SLOW_CASES if slow and (not only or c[0] in only)]
    from tests.realcluster import build
    from tests.realcluster.cluster import real_cluster

    reason = build.missing_toolchain() if build.cached(build.selected_minor()) is None else None
    if reason is not None:
        return {"skipped": reason}
    binaries = build.ensure_built(build.selected_minor())
    ideal: list[float] = []
    ideal_slow: list[float] = []
    ideal_outcomes: list[Outcome] = []
    runs_ideals: list[dict[str, Outcome]] = []
    outcomes: dict[tuple[str, bool], list[Outcome]] = {case: [] for case in cases}
    slow: dict[tuple[str, bool], list[Outcome]] = {case: [] for case in slow_cases}
    with contextlib.ExitStack() as running:
        tmp = running.enter_context(tempfile.TemporaryDirectory(prefix="bench-replay-"))
        cluster = running.enter_context(real_cluster(binaries, Path(tmp)))
        flux_server = None
        if any(d == "flux" for d, _ in cases):
            from tests.realcluster import flux

            _, flux_server = running.enter_context(flux.running(cluster.plane, Path(tmp) / "flux"))
        helm = None
        if any(d == "helm" for d, _ in cases):
            from tests.realcluster import helm as helmcli

            binary = helmcli.binary()
            if binary is None:
                return {"skipped": build.missing_toolchain() or "helm is not built"}
            helm = helmcli.Helm(binary, Path(tmp) / "helm", cluster.kubeconfig, "default")
        argo = None
        if any(d == "argocd" for d, _ in cases):
            from tests.realcluster import argocd

            if build.cached_argocd() is None and build.missing_toolchain() is not None:
                return {"skipped": build.missing_toolchain() or "Argo CD is not built"}
            argo = running.enter_context(argocd.running(cluster.plane, Path(tmp) / "argocd"))
        from tests.realcluster import ocmcrds
        from tests.realcluster.manifestwork import ManifestWorkAgent
        from tests.realcluster.teardown import replay_grant

        done = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(replay_grant()))
        if done.returncode != 0:
            raise AssertionError(f"applying the replay grant: {done.stderr}")
        ManifestWorkAgent(cluster.admin).install_crds(cluster.kubectl, [p.read_text() for p in ocmcrds.ensure_crds()])
        log = GateLog(cluster.gate.replicas[0].process.log_path)
        needed = ["ideal", *sorted({own_ideal(d, r) for d, r in cases} | {record_ideal(d, r) for d, r in cases}
                                     | {neutral_ideal(d) for d, _ in cases} - {"ideal"})]
        for r in range(runs):
            ideals: dict[str, Outcome] = {}
            for name in needed:
                base = run_case(cluster, log, name, replay=False, suffix=f"{name}-{r}")
                if base.makespan is None:
                    raise AssertionError(f"the {name} teardown did not complete: {base.why}")
                ideals[name] = base
                _progress(f"run {r + 1}/{runs} {name}", base, base.makespan)
            base = ideals["ideal"]
            ideal.append(base.makespan)
            ideal_outcomes.append(base)
            runs_ideals.append(ideals)
            for deleter, replay in cases:
                outcome = run_case(cluster, log, deleter, replay=replay, flux_server=flux_server, helm=helm,
                                   argo=argo, suffix=f"{deleter}-{'on' if replay else 'off'}-{r}")
                outcomes[deleter, replay].append(outcome)
                _progress(f"run {r + 1}/{runs} {deleter} replay {'on' if replay else 'off'}", outcome, base.makespan)
            if not slow_cases:
                continue
            base_slow = run_case(cluster, log, "ideal", replay=False, suffix=f"ideal-slow-{r}",
                                 finalizer_delay=SLOW_REAL)
            if base_slow.makespan is None:
                raise AssertionError(f"the ideal teardown with a slow finalizer did not complete: {base_slow.why}")
            ideal_slow.append(base_slow.makespan)
            _progress(f"run {r + 1}/{runs} ideal, slow finalizer", base_slow, base_slow.makespan)
            for deleter, replay in slow_cases:
                outcome = run_case(cluster, log, deleter, replay=replay, finalizer_delay=SLOW_REAL,
                                   suffix=f"{deleter}-slow-{'on' if replay else 'off'}-{r}")
                slow[deleter, replay].append(outcome)
                _progress(f"run {r + 1}/{runs} {deleter} replay {'on' if replay else 'off'}, slow finalizer",
                          outcome, base_slow.makespan)
    # Beside the table's rows: per case and run, why it was stuck and when each object was seen gone.
    details = {f"{d} replay {'on' if r else 'off'}": [({"stuck": o.why} if o.why else {}) | {"goneAfter": o.gone}
                                                     | ({"refused": list(o.refused)} if o.refused else {})
                                                     | ({"stayed": list(o.stayed)} if o.stayed else {})
                                                     | ({"reactionSeconds": o.reaction} if o.reaction is not None
                                                        else {})
                                                     for o in outcomes[d, r]] for d, r in cases}
    details |= {f"{d} replay {'on' if r else 'off'}, slow finalizer": [
        ({"stuck": o.why} if o.why else {}) | {"goneAfter": o.gone} for o in slow[d, r]] for d, r in slow_cases}
    rows = [_row(case, outcomes[case], ideal) for case in cases]
    slow_rows = [_row(case, slow[case], ideal_slow) for case in slow_cases]
    ideal_rows = [ideal_row(case, outcomes[case], runs_ideals) for case in cases]
    ideals_seen = [{name: {"goneAfter": o.gone, "workloadSeconds": _round(o.workload_gone),
                           "allGoneSeconds": _round(o.makespan), "refusals": o.refusals,
                           "sentAfter": ({k: round(t, 2) for k, t in sorted(o.timeline.sent.items(),
                                                                            key=lambda kv: kv[1])}
                                         if o.timeline else {}),
                           "passes": [round(t, 2) for t in o.timeline.passes] if o.timeline else []}
                    for name, o in run_ideals.items()} for run_ideals in runs_ideals]
    return {"kubernetes": binaries.kubernetes_version, "rows": rows, "idealRows": ideal_rows, "slowRows": slow_rows,
            "slowFinalizerSeconds": SLOW_REAL, "ideal": [{"goneAfter": o.gone} for o in ideal_outcomes],
            "ideals": ideals_seen, "cases": details}


def record_ideal(deleter: str, replay: bool) -> str:
    """The ideal of a deleter's own order for when its own record can go: Flux's Kustomization waits for the first
    pass with nothing refused, on its grid with or without replay; for the others, as `own_ideal`."""
    return "ideal-flux" if deleter == "flux" else own_ideal(deleter, replay)


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def ideal_row(case: tuple[str, bool], outcomes: list[Outcome], ideals: list[dict[str, Outcome]]) -> dict[str, Any]:
    """A case against the tool-neutral ideal and against its own order's ideal, each of its own run: the workload
    (benchmarks/ideal.py `counted`) gone, and everything gone (the tool's records too, the CriticalService)."""
    deleter, replay = case
    own, record, neutral = own_ideal(deleter, replay), record_ideal(deleter, replay), neutral_ideal(deleter)
    row: dict[str, Any] = {"deleter": deleter, "replay": replay, "seeds": len(outcomes),
                           "completed": sum(o.completed for o in outcomes), "ownIdeal": own, "recordIdeal": record,
                           "neutralIdeal": neutral,
                           "refusals": round(statistics.mean(o.refusals for o in outcomes), 1),
                           "replayed": round(statistics.mean(o.replayed for o in outcomes), 1)}
    pairs = list(zip(outcomes, ideals, strict=True))
    if any(o.workload_gone is None or o.makespan is None for o in outcomes):
        return row

    def mean(xs: Iterable[float]) -> float:
        return round(statistics.mean(xs), 3)

    row |= {"workloadSeconds": mean(o.workload_gone or 0.0 for o in outcomes),
            "neutralSeconds": mean(i[neutral].workload_gone or 0.0 for i in ideals),
            "ownSeconds": mean(i[own].workload_gone or 0.0 for i in ideals),
            "ratioNeutral": mean((o.workload_gone or 0.0) / (i[neutral].workload_gone or 1.0) for o, i in pairs),
            "ratioOwn": mean((o.workload_gone or 0.0) / (i[own].workload_gone or 1.0) for o, i in pairs),
            "allGoneSeconds": mean(o.makespan or 0.0 for o in outcomes),
            "recordIdealSeconds": mean(i[record].makespan or 0.0 for i in ideals),
            "ratioAllOwn": mean((o.makespan or 0.0) / (i[record].makespan or 1.0) for o, i in pairs)}
    return row


def ideal_table(rows: list[dict[str, Any]], title: str) -> str:
    """Each case against the neutral ideal and against its own order's ideal (benchmarks/ideal.py)."""
    out = [title, f"{'deleter':<13} {'replay':<6} {'done':>4} {'workload s':>10} {'neutral s':>9} {'x neutral':>9} "
                  f"{'own ideal':<17} {'own s':>6} {'x own':>6} {'all gone s':>10} {'own s':>6} {'x own':>6} "
                  f"{'refused':>7} {'replayed':>8}"]
    for r in rows:
        done = f"{r['completed']}/{r['seeds']}"
        if "workloadSeconds" not in r:
            out.append(f"{r['deleter']:<13} {'on' if r['replay'] else 'off':<6} {done:>4} {'stuck':>10}")
            continue
        out.append(f"{r['deleter']:<13} {'on' if r['replay'] else 'off':<6} {done:>4} {r['workloadSeconds']:>10.2f} "
                   f"{r['neutralSeconds']:>9.2f} {r['ratioNeutral']:>9.3f} {r['ownIdeal']:<17} {r['ownSeconds']:>6.2f} "
                   f"{r['ratioOwn']:>6.3f} {r['allGoneSeconds']:>10.2f} {r['recordIdealSeconds']:>6.2f} "
                   f"{r['ratioAllOwn']:>6.3f} {r['refusals']:>7} {r['replayed']:>8}")
    return "\n".join(out)


def _row(case: tuple[str, bool], outcomes: list[Outcome], ideal: list[float]) -> dict[str, Any]:
    deleter, replay = case
    row: dict[str, Any] = {"deleter": deleter, "replay": replay, "seeds": len(outcomes),
                           "completed": sum(o.completed for o in outcomes),
                           "idealSeconds": round(statistics.mean(ideal), 3),
                           "refusals": round(statistics.mean(o.refusals for o in outcomes), 1),
                           "replayed": round(statistics.mean(o.replayed for o in outcomes), 1)}
    spans = [o.makespan for o in outcomes if o.makespan is not None]
    if len(spans) == len(outcomes):
        ratios = [s / b for s, b in zip(spans, ideal, strict=True)]
        row |= {"makespanSeconds": round(statistics.mean(spans), 3),
                "ratioMean": round(statistics.mean(ratios), 3), "ratioMax": round(max(ratios), 3)}
        stacks = [o.stack_gone for o in outcomes]
        if deleter in ("manifestwork", "flux") and all(s is not None for s in stacks):
            stack_ratios = [s / b for s, b in zip(stacks, ideal, strict=True) if s is not None]
            row |= {"stackGoneSeconds": round(statistics.mean(s for s in stacks if s is not None), 3),
                    "stackRatioMean": round(statistics.mean(stack_ratios), 3),
                    "stackRatioMax": round(max(stack_ratios), 3)}
    return row


def print_stack_tables(result: dict[str, Any]) -> None:
    """The ManifestWork rows of both tables as `stack_table`s (nothing when manifestwork was not measured)."""
    for key, title in (("rows", "ManifestWork teardown: the stack gone, and the ManifestWork gone, against the ideal:"),
                       ("slowRows", f"The same, a slow finalizer ({result.get('slowFinalizerSeconds', SLOW_REAL):g} "
                                    "s per CR):")):
        if any(r["deleter"] == "manifestwork" for r in result.get(key, [])):
            print(stack_table(result[key], title))


def stack_table(rows: list[dict[str, Any]], title: str) -> str:
    """The ManifestWork rows twice against the ideal: when the stack was gone (its last object) and when the
    ManifestWork was (the row's makespan); the gap is the agent's own wait for what it deleted."""
    out = [title, f"{'replay':<7} {'done':>5} {'ideal s':>8} {'stack gone s':>13} {'ratio':>7} {'worst':>7} "
                  f"{'ManifestWork gone s':>20} {'ratio':>7} {'worst':>7}"]
    for r in rows:
        if r["deleter"] != "manifestwork":
            continue
        done = f"{r['completed']}/{r['seeds']}"
        if "stackGoneSeconds" in r:
            stack = (f"{r['stackGoneSeconds']:>13.2f} {r['stackRatioMean']:>7.3f} {r['stackRatioMax']:>7.3f} "
                     f"{r['makespanSeconds']:>20.2f} {r['ratioMean']:>7.3f} {r['ratioMax']:>7.3f}")
        else:
            stack = f"{'stuck':>13} {'-':>7} {'-':>7} {'stuck':>20} {'-':>7} {'-':>7}"
        out.append(f"{'on' if r['replay'] else 'off':<7} {done:>5} {r['idealSeconds']:>8.2f} {stack}")
    return "\n".join(out)


def _progress(what: str, outcome: Outcome, ideal: float) -> None:
    if outcome.makespan is not None:
        told = f"{outcome.makespan:.2f} s (ideal {ideal:.2f} s, ratio {outcome.makespan / ideal:.2f})"
    else:
        told = f"stuck: {outcome.why}"
    gone = ", ".join(f"{k} {t:.1f}" for k, t in outcome.gone.items())
    print(f"[replay --real] {what}: {told}, refused {outcome.refusals}, replayed {outcome.replayed}; "
          f"seen gone after s: {gone or '-'}", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks replay_real", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="teardowns per case (default %(default)s)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON (last line)")
    parser.add_argument("--no-slow", action="store_true", help="skip the slow-finalizer table")
    parser.add_argument("--crossplane-order", action="store_true",
                        help="the reference story without its criterion on the CRD (the provider waits for its "
                             "CRs only, as a Crossplane provider); the ideals keep the safety check's order")
    parser.add_argument("--only", action="append", default=[], metavar="DELETER",
                        choices=sorted({d for d, _ in ALL_CASES}),
                        help="measure just this deleter (repeatable; the ideal always runs)")
    args = parser.parse_args(argv)
    if args.crossplane_order:
        CROSSPLANE_ORDER.set()
    result = run(args.runs, tuple(args.only), slow=not args.no_slow)
    if "skipped" in result:
        print(f"real control plane: skipped ({result['skipped']})")
    else:
        print(ideal_table(result["idealRows"], "Real control plane (wall time), reference story, against the neutral "
                                               "ideal and the deleter's own order's (benchmarks/ideal.py):"))
        if result["slowRows"]:
            print(render(result["slowRows"], f"The same, a slow finalizer ({SLOW_REAL:g} s per CR):"))
        print_stack_tables(result)
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
