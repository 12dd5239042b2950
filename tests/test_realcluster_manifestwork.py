"""Stacks delivered as an Open Cluster Management ManifestWork and torn down by deleting the ManifestWork,
on the real control plane with the gate installed (tests/realcluster/manifestwork.py is the agent's
deletion path: one pass of DELETEs, refusals dropped, the garbage collector finishing the teardown).

What a ManifestWork user sees, checked here: everything goes, in the safe order; no finalizer is left;
the ManifestWork is gone while the objects the gate refused still exist (without replay: the garbage
collector deletes them after it); what a deleteOption orphans is never deleted.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from criticalsvc.manifests import load_path
from criticalsvc.sim.cluster import Cluster
from tests.backends import RealBackend
from tests.realcluster import admission_metrics, examples, ocmcrds
from tests.realcluster.cluster import RealCluster
from tests.realcluster.manifestwork import APPLIED_FINALIZER, MANIFESTWORK_FINALIZER, ManifestWorkAgent, Teardown
from tests.realcluster.teardown import STORY, Observer, RepeatingDeleter, Story, all_gone, replay_grant, wait_for

pytestmark = pytest.mark.realcluster

TEARDOWN_TIMEOUT = 120
EXAMPLES_TIMEOUT = 240
GC_SLACK = 12  # see _compare_with_the_simulator


@pytest.fixture(scope="module")
def agent(realcluster: RealCluster) -> Iterator[ManifestWorkAgent]:
    """The work CRDs of open-cluster-management.io/api installed once, and the agent for the cluster namespace."""
    agent = ManifestWorkAgent(realcluster.admin, cluster_namespace="cluster1")
    agent.install_crds(realcluster.kubectl, [p.read_text() for p in ocmcrds.ensure_crds()])
    done = realcluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(replay_grant()))
    assert done.returncode == 0, done.stderr
    yield agent


def story_objects(story: Story, *, replay: bool) -> list[dict[str, Any]]:
    objects = story.objects
    if replay:
        for o in objects:
            if o["kind"] == "CriticalService":
                o["spec"]["replayDeletion"] = "WhenTearingDown"
    return objects


def keep_configmap(suffix: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"kept-{suffix}", "namespace": "default"},
            "data": {"why": "orphaned by the ManifestWork's deleteOption"}}


def _denied_deletes(before: Any, after: Any) -> int:
    """The gate's DELETE denials the API server counted between two scrapes (every client's)."""
    return sum(v for (metric, labels), v in (after - before).items()
               if metric == admission_metrics.REJECTIONS and ("operation", "DELETE") in labels
               and ("error_type", "no_error") in labels)


@pytest.mark.parametrize("replay", [False, True], ids=["replay-off", "replay-on"])
def test_reference_story_as_a_manifestwork(realcluster: RealCluster, agent: ManifestWorkAgent, replay: bool) -> None:
    """Deleting the story's ManifestWork: one pass of DELETEs, the refused ones dropped; the ManifestWork goes
    first, the garbage collector (and the gate's replay, when on) finish in the safe order; the object a
    SelectivelyOrphan rule names survives, its ownerReference never set."""
    suffix = f"mw{'on' if replay else 'off'}-{uuid.uuid4().hex[:4]}"
    story = Story.make(suffix)
    kept = keep_configmap(suffix)
    assert realcluster.kubectl("apply", "-f", "-", input=story.reader_role()).returncode == 0
    rule = {"group": "", "resource": "configmaps", "namespace": "default", "name": kept["metadata"]["name"]}
    work = agent.apply(f"story-{suffix}", [*story_objects(story, replay=replay), kept],
                       delete_option={"propagationPolicy": "SelectivelyOrphan", "selectivelyOrphans": {
                           "orphaningRules": [rule]}})
    kept_path = f"/api/v1/namespaces/default/configmaps/{kept['metadata']['name']}"
    assert [r.path for r in work.orphaned] == [kept_path]
    assert not (realcluster.admin.get(kept_path) or {})["metadata"].get("ownerReferences")
    owner = (realcluster.admin.get(story.deployment_path) or {})["metadata"]["ownerReferences"]
    assert owner == [{"apiVersion": "work.open-cluster-management.io/v1", "kind": "AppliedManifestWork",
                      "name": work.applied_name, "uid": work.applied_uid}]
    wait_for(lambda: realcluster.admin.delete(story.deployment_path, params={"dryRun": "All"}).status_code == 403,
             timeout=60, what="the gate to protect the provider")

    paths = {**story.paths(), "ManifestWork": work.path, "AppliedManifestWork": work.applied_path}
    observer = Observer(realcluster.admin, paths)
    before = admission_metrics.scrape(realcluster.plane)
    teardown = Teardown(realcluster.admin, work)
    with RealBackend(realcluster).finalizer_controller(story):
        observer.start()
        teardown.start()
        try:
            wait_for(lambda: all_gone(realcluster.admin, paths.values()), timeout=TEARDOWN_TIMEOUT,
                     what=f"the whole story gone after deleting ManifestWork {work.name}", interval=0.2)
            wait_for(lambda: set(paths) <= set(observer.first_gone), timeout=10, what="the observer's last round")
        finally:
            observer.stop()
            teardown.stop()
    denied = _denied_deletes(before, admission_metrics.scrape(realcluster.plane))

    assert observer.order_violations(story.dependents()) == []
    # One pass: every applied object got at most one DELETE from the agent, in status order (sorted).
    sent = [d.path for d in teardown.deletes]
    assert len(sent) == len(set(sent)), f"the agent sent a DELETE twice: {sent}"
    order = [r.path for r in work.resources]
    assert sent == sorted(sent, key=order.index)
    refused = {d.path for d in teardown.refused()}
    assert story.deployment_path in refused, "the gate never refused the agent's DELETE of the provider"
    for d in teardown.refused():
        assert d.message.startswith('admission webhook "') and "denied the request" in d.message
    # The refusals are the agent's sync errors; the objects were dropped from appliedResources.
    assert any("403" in e for e in teardown.errors)
    # The agent's AppliedManifestWork is gone before any object it was refused (the garbage collector deletes
    # those only once their owner is gone; the observer checks it last in each round, so a refused object
    # seen gone means it was seen gone too), and the ManifestWork right after it: the ManifestWork is gone
    # while refused objects still exist.
    keys = {p: k for k, p in story.paths().items()}
    gone = observer.first_gone
    if not replay:
        assert all(gone["AppliedManifestWork"] <= gone[keys[p]] for p in refused), observer.order()
        assert gone["ManifestWork"] <= max(gone[keys[p]] for p in refused), observer.order()
    else:  # the gate's replay may take the provider earlier; its CriticalService still goes after
        assert gone["ManifestWork"] <= gone[f"CriticalService/{story.critical_service}"], observer.order()
    # The garbage collector's DELETEs were refused too, until their dependents were gone (the API server's
    # count of the gate's denials is more than the agent's own).
    assert denied >= len(refused)
    # No finalizer left: the ManifestWork and AppliedManifestWork are gone (their finalizers removed).
    assert realcluster.admin.get(work.path) is None and realcluster.admin.get(work.applied_path) is None
    assert teardown.manifestwork_gone_at is not None
    # The orphaned ConfigMap survives: never DELETEd, not owned, so not collected.
    assert kept_path not in sent
    assert realcluster.admin.get(kept_path) is not None
    realcluster.admin.delete(kept_path)
    if not replay:
        _compare_with_the_simulator(story, observer, agent_refusals=len(teardown.refused()), denied=denied)


def _compare_with_the_simulator(story: Story, observer: Observer, *, agent_refusals: int, denied: int) -> None:
    """The simulator's `manifestwork` client on the same story (no replay): the plan's phases complete in the same
    order, and the agent is refused as often.

    Tolerances, and why: phases 4 (the provider's namespace) and 5 (the CriticalService) may swap - the gate lets
    the CriticalService go while its provider's namespace is not terminating yet, and which of the two the
    garbage collector reaches first is a race of its workers. The garbage collector's own refusals (the
    CriticalService or the namespace retried 5 ms·2ⁿ while the other finalizes, about 5 s: at most ~11 tries
    each) depend on that race, so the totals may differ by up to GC_SLACK; the agent's one pass is
    deterministic, so its refusals must be equal."""
    sim = Cluster(seed=0)
    refs = sim.load(load_path(str(STORY)))
    sim.teardown("manifestwork")
    verdict = sim.run()
    assert verdict.completed
    phases = json.loads(subprocess.run([sys.executable, "-m", "criticalsvc", "plan", "-f", str(STORY), "-o", "json"],
                                       capture_output=True, text=True, check=True).stdout)["phases"]
    phase_of = {(o["kind"], o["name"]): i + 1 for i, phase in enumerate(phases) for o in phase}
    original = [d for d in yaml.safe_load_all(STORY.read_text()) if d]
    sim_gone = {}
    for ref, doc in zip(refs, original, strict=True):
        assert ref.name == doc["metadata"]["name"]
        gone = [e.time for e in sim.timeline.of(ref) if e.outcome in ("gone", "deleted")]
        assert gone, ref
        sim_gone[(doc["kind"], ref.name)] = min(gone)
    real_gone = {(k.split("/", 1)[0], k.split("/", 1)[1]): observer.first_gone[k] for k in story.paths()
                 if k in observer.first_gone}

    def completion_order(gone: dict[tuple[str, str], float], name: Any) -> list[int]:
        done: dict[int, float] = {}
        for (kind, obj), at in gone.items():
            phase = phase_of[(kind, name(kind, obj))]
            done[phase] = max(done.get(phase, at), at)
        order = sorted(done, key=lambda p: (done[p], p))
        return [4 if p == 5 else p for p in order]  # 4 and 5 may swap (see above)

    real_name = {r["metadata"]["name"]: o["metadata"]["name"] for r, o in zip(story.objects, original, strict=True)}
    assert completion_order(sim_gone, lambda k, n: n) == completion_order(
        real_gone, lambda k, n: real_name.get(n, n)), (sim_gone, real_gone)
    sim_agent = sum(1 for e in sim.timeline.events if e.actor.startswith("manifestwork/") and e.outcome == "denied")
    assert sim_agent == agent_refusals
    assert abs(verdict.denials - denied) <= GC_SLACK, (verdict.denials, denied)


def test_an_orphan_manifestwork_leaves_its_objects(realcluster: RealCluster, agent: ManifestWorkAgent) -> None:
    """deleteOption Orphan: the ManifestWork and its AppliedManifestWork go, every object stays, unowned."""
    suffix = uuid.uuid4().hex[:4]
    objects = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"orphan-{suffix}"}},
               {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": f"orphan-{suffix}"}}]
    work = agent.apply(f"orphan-{suffix}", objects, delete_option={"propagationPolicy": "Orphan"})
    assert len(work.orphaned) == 2
    teardown = Teardown(realcluster.admin, work)
    teardown.start()
    try:
        wait_for(lambda: teardown.manifestwork_gone_at is not None, timeout=60, what="the ManifestWork gone")
    finally:
        teardown.stop()
    assert teardown.deletes == [] and teardown.errors == []
    assert realcluster.admin.get(work.applied_path) is None
    for r in work.resources:
        found = realcluster.admin.get(r.path)
        assert found is not None and not found["metadata"].get("ownerReferences"), r.path
    realcluster.admin.delete(f"/api/v1/namespaces/orphan-{suffix}")


def test_finalizers_are_the_agents_own(agent: ManifestWorkAgent, realcluster: RealCluster) -> None:
    """The agent's ManifestWork and AppliedManifestWork carry upstream's finalizers while they exist."""
    suffix = uuid.uuid4().hex[:4]
    work = agent.apply(f"fin-{suffix}", [keep_configmap(f"fin-{suffix}")])
    assert (realcluster.admin.get(work.path) or {})["metadata"]["finalizers"] == [MANIFESTWORK_FINALIZER]
    assert (realcluster.admin.get(work.applied_path) or {})["metadata"]["finalizers"] == [APPLIED_FINALIZER]
    teardown = Teardown(realcluster.admin, work)
    teardown.start()
    try:
        wait_for(lambda: all_gone(realcluster.admin, [work.path, *(r.path for r in work.resources)]), timeout=60,
                 what="the ConfigMap and its ManifestWork gone")
    finally:
        teardown.stop()
    assert len(teardown.deletes) == 1 and teardown.deletes[0].status == 200



@pytest.mark.parametrize("replay", [False, True], ids=["replay-off", "replay-on"])
def test_every_example_as_a_manifestwork(realcluster: RealCluster, agent: ManifestWorkAgent, replay: bool) -> None:
    """Every example of api/examples/ that a ManifestWork can carry (examples.NOT_TORN_DOWN says why the others
    cannot) delivered as one ManifestWork each, the operator's set-up applied first; all the ManifestWorks
    deleted at once: everything goes, in the order each example's plan promises, and no finalizer is left.
    An object several examples share (namespace shop) goes with the first example's ManifestWork only."""
    mode = "on" if replay else "off"
    roles: list[dict[str, Any]] = []
    works: list[Any] = []
    paths: dict[str, str] = {}
    dependents: dict[str, list[str]] = {}
    services: list[str] = []
    seen: set[str] = set()
    for example in examples.torn_down():
        docs = examples.documents(example)
        roles += examples.operator_roles(docs, f"mw-{mode}-{example.removesuffix('.yaml')}")
        planned = examples.plan(example)
        paths |= planned.paths
        for provider, needs in planned.dependents().items():
            dependents.setdefault(provider, []).extend(needs)
        manifests = []
        for doc in examples.delivered(docs, replay=replay):
            k = examples.key(doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"])
            if k not in seen:
                seen.add(k)
                manifests.append(doc)
        services += [d["metadata"]["name"] for d in manifests if d["kind"] == "CriticalService"]
        works.append(manifests)
    done = realcluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(roles))
    assert done.returncode == 0, done.stderr
    applied = [agent.apply(f"example-{mode}-{i}", manifests, timeout=120) for i, manifests in enumerate(works)]
    for w in applied:
        paths |= {f"ManifestWork/{w.name}": w.path, f"AppliedManifestWork/{w.name}": w.applied_path}
    teardowns = [Teardown(realcluster.admin, w) for w in applied]
    observer = Observer(realcluster.admin, paths, interval=0.0)
    started = 0.0
    try:
        wait_for(lambda: all(examples.enforcing(realcluster.admin, s) for s in services), timeout=120,
                 what=f"every example's CriticalService Ready (Enforcing): {services}")
        observer.start()
        started = time.monotonic()
        for t in teardowns:
            t.start()
        wait_for(lambda: all_gone(realcluster.admin, paths.values()), timeout=EXAMPLES_TIMEOUT, interval=0.5,
                 what="every example gone after deleting their ManifestWorks: left "
                      f"{[k for k, p in paths.items() if realcluster.admin.exists(p)]}")
        wait_for(lambda: set(paths) <= set(observer.first_gone), timeout=30, what="the observer's last round")
    finally:
        observer.stop()
        for t in teardowns:
            t.stop()
        _clean_up(realcluster, applied, paths, roles)
    took = time.monotonic() - started
    print(f"every example as a ManifestWork, replay {mode}: all gone {took:.1f} s after the first DELETE")
    assert observer.order_violations(dependents) == [], observer.order()
    refused = [d for t in teardowns for d in t.refused()]
    assert refused, "the gate refused none of the agents' DELETEs: the examples were not protected"
    for t in teardowns:
        sent = [d.path for d in t.deletes]
        assert len(sent) == len(set(sent)), f"an agent sent a DELETE twice: {sent}"
        assert t.manifestwork_gone_at is not None


def _clean_up(realcluster: RealCluster, applied: list[Any], paths: dict[str, str], roles: list[dict[str, Any]]) -> None:
    """After a failure, what is left goes (the agents' finalizers dropped, the rest deleted until gone), so the
    session's other tests do not meet it; the operator's roles go last."""
    for w in applied:
        for path in (w.path, w.applied_path):
            if realcluster.admin.exists(path):
                realcluster.admin.merge_patch(path, {"metadata": {"finalizers": None}})
    left = {k: p for k, p in paths.items() if realcluster.admin.exists(p)}
    if left:
        RepeatingDeleter(realcluster.admin, left).run(timeout=120)
    for role in roles:
        realcluster.admin.delete(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{role['metadata']['name']}")



# The ApplySet's parent: kubectl accepts a Secret or ConfigMap parent only with --namespace, which then must be
# every object's namespace; a stack spanning namespaces and cluster-scoped objects needs a cluster-scoped
# parent of a custom type labelled as a parent type, created beforehand with kubectl's tooling annotation
# and the ApplySet's ID label (KEP-3659,
# https://github.com/kubernetes/enhancements/blob/master/keps/sig-cli/3659-kubectl-apply-prune/README.md).
PARENT_CRD = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
              "metadata": {"name": "applysets.criticalsvc.test",
                           "labels": {"applyset.kubernetes.io/is-parent-type": "true"}},
              "spec": {"group": "criticalsvc.test", "scope": "Cluster",
                       "names": {"plural": "applysets", "singular": "applyset", "kind": "ApplySet"},
                       "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                           "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}


def _applyset_parent(realcluster: RealCluster, name: str) -> str:
    """Create the cluster-scoped parent `name`; the --applyset value that names it."""
    done = realcluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(PARENT_CRD))
    assert done.returncode == 0, done.stderr
    done = realcluster.kubectl("wait", "--for=condition=Established", f"crd/{PARENT_CRD['metadata']['name']}")
    assert done.returncode == 0, done.stderr
    # The ID: "applyset-" + base64url(sha256("<name>.<namespace>.<Kind>.<group>")) + "-v1" (the KEP's formula).
    digest = hashlib.sha256(f"{name}..ApplySet.criticalsvc.test".encode()).digest()
    applyset_id = f"applyset-{base64.urlsafe_b64encode(digest).decode().rstrip('=')}-v1"
    done = realcluster.kubectl("apply", "-f", "-", input=yaml.safe_dump({
        "apiVersion": "criticalsvc.test/v1", "kind": "ApplySet", "metadata": {
            "name": name, "labels": {"applyset.kubernetes.io/id": applyset_id},
            "annotations": {"applyset.kubernetes.io/tooling": "kubectl/v1.37.2",
                            "applyset.kubernetes.io/contains-group-kinds": ""}}}))
    assert done.returncode == 0, done.stderr
    return f"applysets.criticalsvc.test/{name}"


@pytest.mark.parametrize("replay", [False, True], ids=["replay-off", "replay-on"])
def test_reference_story_pruned_as_an_applyset(realcluster: RealCluster, agent: ManifestWorkAgent, replay: bool,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """`kubectl apply --prune --applyset` (KUBECTL_APPLYSET=true) as the deleter: the story applied as an ApplySet,
    then pruned by applying a set without it. kubectl's prune stops at the first DELETE refused (its
    deleteObjects returns the first error, kubernetes v1.37.2
    staging/src/k8s.io/kubectl/pkg/cmd/apply/applyset_pruner.go) and exits non-zero naming it, in an order
    that varies from run to run (a map of the set's types): one run leaves the story, with or without
    replay, since what kubectl never reached was never refused and the gate has nothing to replay."""
    monkeypatch.setenv("KUBECTL_APPLYSET", "true")
    suffix = f"as{'on' if replay else 'off'}-{uuid.uuid4().hex[:4]}"
    story = Story.make(suffix)
    applyset = _applyset_parent(realcluster, f"story-{suffix}")
    assert realcluster.kubectl("apply", "-f", "-", input=story.reader_role()).returncode == 0
    text = yaml.safe_dump_all(story_objects(story, replay=replay))
    last: list[Any] = []

    def applied() -> bool:  # twice on a fresh cluster: the CRs need their CRD first
        last[:] = [realcluster.kubectl("apply", "--prune", f"--applyset={applyset}", "-f", "-", input=text)]
        return bool(last[0].returncode == 0)

    paths = story.paths()
    with RealBackend(realcluster).finalizer_controller(story):
        try:
            try:
                wait_for(applied, timeout=60, interval=1.0, what="kubectl apply --applyset of the story")
            except AssertionError as exc:
                raise AssertionError(f"{exc}: {last[0].stderr}") from None
            wait_for(lambda: realcluster.admin.delete(story.deployment_path, params={"dryRun": "All"}).status_code
                     == 403, timeout=60, what="the gate to protect the provider")
            pruned = realcluster.kubectl("apply", "--prune", f"--applyset={applyset}", "-f", "-",
                                         input=yaml.safe_dump(keep_configmap(suffix)), timeout=120)
            left = sorted(k for k, p in paths.items() if realcluster.admin.exists(p))
            print(f"ApplySet prune, replay {'on' if replay else 'off'}: exit {pruned.returncode}; left {left}; "
                  f"{pruned.stderr.strip()}")
            assert pruned.returncode != 0, pruned.stdout
            error = pruned.stderr.strip().splitlines()[-1]
            assert error.startswith("error: pruning ") and "denied the request" in error, pruned.stderr
            assert f"Deployment/{story.name('finalizer-deployment')}" in left
            assert f"CriticalService/{story.critical_service}" in left
        finally:
            RepeatingDeleter(realcluster.admin, {
                **paths, "kept": f"/api/v1/namespaces/default/configmaps/kept-{suffix}",
                "parent": f"/apis/criticalsvc.test/v1/applysets/story-{suffix}"}).run(timeout=120)


def test_a_provider_recreated_mid_teardown_is_orphaned_by_spec_recreated_provider(
        realcluster: RealCluster, agent: ManifestWorkAgent) -> None:
    """The seed's open question on the real control plane (design/criticalservice.md §6). A ManifestWork carries a
    CriticalService and its provider Deployment, which waits for a StatefulSet "user" of another owner. Deleting
    the ManifestWork: the agent's one pass is refused both, the ManifestWork finalizes, and the garbage collector
    retries both with its doubling backoff. "user" goes, and a controller replaces the provider: deleted (now
    allowed) and re-created under the same name at once. The CriticalService is stuck (its provider exists; the
    garbage collector would retry forever), its status says so (previousProviderUID, ProviderRecreated), and
    `spec.recreatedProvider: Orphan` set by hand lets the garbage collector's next retry through: the teardown
    finishes, the re-created Deployment stays, unprotected."""
    suffix = uuid.uuid4().hex[:4]
    ns, name, csvc = f"recreate-{suffix}", "ctrl", f"recreate-{suffix}"
    deployment_path = f"/apis/apps/v1/namespaces/{ns}/deployments/{name}"
    user_path = f"/apis/apps/v1/namespaces/{ns}/statefulsets/user"
    cs_path = f"/apis/criticalsvc.io/v1alpha1/criticalservices/{csvc}"

    def workload(kind: str, name: str) -> dict[str, Any]:
        labels = {"app": name}
        spec = {"replicas": 0, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "registry.invalid/c"}]}}}
        if kind == "StatefulSet":
            spec["serviceName"] = name
        return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name, "namespace": ns}, "spec": spec}

    def deployment() -> dict[str, Any]:
        return workload("Deployment", name)

    manifests = [
        deployment(),
        {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": csvc},
         "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": ns, "name": name},
                  "criteria": [{"type": "SpecificResource", "specificResource": {
                      "group": "apps", "resource": "statefulsets", "namespace": ns, "name": "user"}}]}},
    ]
    # The namespace and "user" are not the ManifestWork's: the re-created provider needs a namespace that is not
    # terminating, and the test decides when "user" goes. (A StatefulSet: the gate reads apps workloads without
    # a grant of the test's own.)
    realcluster.admin.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    assert realcluster.admin.create(f"/apis/apps/v1/namespaces/{ns}/statefulsets",
                                    workload("StatefulSet", "user")).status_code == 201
    work = agent.apply(f"recreate-{suffix}", manifests)
    original_uid = (realcluster.admin.get(deployment_path) or {})["metadata"]["uid"]
    paths = {"StatefulSet": user_path, "CriticalService": cs_path, "ManifestWork": work.path,
             "AppliedManifestWork": work.applied_path}
    teardown = Teardown(realcluster.admin, work)
    try:
        wait_for(lambda: examples.enforcing(realcluster.admin, csvc), timeout=60, what=f"{csvc} Ready (Enforcing)")
        teardown.start()
        wait_for(lambda: teardown.manifestwork_gone_at is not None, timeout=30, what="the ManifestWork gone")
        assert {d.path for d in teardown.refused()} == {deployment_path, cs_path}, teardown.deletes
        # The garbage collector retries both, 5 ms doubling: after ~5 s its next retry of the CriticalService is
        # ~5 s away, so the controller's delete-and-create below fits in between (otherwise the retry could find
        # the provider gone for a moment and delete the CriticalService, and nothing would be stuck).
        time.sleep(5)
        assert realcluster.admin.delete(user_path).status_code == 200
        wait_for(lambda: realcluster.admin.delete(deployment_path, params={"dryRun": "All"}).status_code == 200,
                 timeout=20, what="the provider's DELETE allowed once user is gone", interval=0.05)
        realcluster.admin.delete(deployment_path)  # the controller (or the garbage collector's retry)
        wait_for(lambda: not realcluster.admin.exists(deployment_path), timeout=10, what="the provider gone",
                 interval=0.02)
        created = realcluster.admin.create(f"/apis/apps/v1/namespaces/{ns}/deployments", deployment())
        assert created.status_code == 201, created.text
        new_uid = created.json()["metadata"]["uid"]
        assert realcluster.admin.exists(cs_path), "the CriticalService went in the gap: nothing to test"

        def recreated() -> dict[str, Any] | None:
            status = (realcluster.admin.get(cs_path) or {}).get("status") or {}
            return next((c for c in status.get("conditions") or [] if c["type"] == "ProviderRecreated"), None)

        wait_for(lambda: recreated() is not None, timeout=20, what="the status to show the re-creation")
        status = (realcluster.admin.get(cs_path) or {})["status"]
        assert (status["providerUID"], status["previousProviderUID"]) == (new_uid, original_uid)
        assert recreated()["reason"] == "Protected"  # type: ignore[index]
        # Stuck: the CriticalService's DELETE is refused, and the refusal names the way out.
        dry = realcluster.admin.delete(cs_path, params={"dryRun": "All"})
        assert dry.status_code == 403 and "set spec.recreatedProvider: Orphan" in dry.json()["message"], dry.text
        # The intent, set by hand: an UPDATE the gate reviews, warns about and lets through.
        set_intent = realcluster.admin.merge_patch(cs_path, {"spec": {"recreatedProvider": "Orphan"}})
        assert set_intent.status_code == 200, set_intent.text
        assert "set to Orphan by" in set_intent.headers.get("warning", ""), set_intent.headers
        started = time.monotonic()
        wait_for(lambda: not realcluster.admin.exists(cs_path), timeout=40,
                 what="the garbage collector's retry deleting the CriticalService")
        print(f"recreated provider: the CriticalService went {time.monotonic() - started:.1f} s after the intent")
        # The re-created provider stays, now unprotected: its DELETE is allowed.
        assert (realcluster.admin.get(deployment_path) or {})["metadata"]["uid"] == new_uid
        wait_for(lambda: realcluster.admin.delete(deployment_path, params={"dryRun": "All"}).status_code == 200,
                 timeout=20, what="the orphaned provider's DELETE allowed")
        assert all_gone(realcluster.admin, paths.values())
    finally:
        teardown.stop()
        left = {**paths, "Deployment": deployment_path, "Namespace": f"/api/v1/namespaces/{ns}"}
        _clean_up(realcluster, [work], left, [])
