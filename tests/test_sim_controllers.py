"""The simulated controllers behave as Kubernetes' do (design/kubernetes-semantics.md §3–§6), with the real gate
in the loop."""

from __future__ import annotations

import itertools
import textwrap
from typing import Any

import pytest

from criticalsvc.api import CRDS, NAMESPACES, GroupResource, ObjectRef
from criticalsvc.manifests import load_text
from criticalsvc.sim.cluster import Cluster
from criticalsvc.sim.controllers.workqueue import WorkQueue
from criticalsvc.sim.engine import VirtualEngine
from criticalsvc.sim.webhooks import RegisteredWebhook, WebhookRule

DEPLOYMENTS = GroupResource("apps", "deployments")
CONFIGMAPS = GroupResource("", "configmaps")
PODS = GroupResource("", "pods")
WIDGETS = GroupResource("example.com", "widgets")
NS_CONTROLLER = "system:serviceaccount:kube-system:namespace-controller"
GC = "system:serviceaccount:kube-system:generic-garbage-collector"

# An operator ("ctrl" in namespace ops) whose finalizer a Widget in namespace apps carries; the ops
# namespace carries a break-glass annotation, so deleting it is let through and the namespace
# controller then meets the gate on the protected Deployment.
OPERATOR = textwrap.dedent("""\
    apiVersion: v1
    kind: Namespace
    metadata: {name: ops, annotations: {criticalsvc.io/break-glass: "test: let the namespace go"}}
    ---
    apiVersion: v1
    kind: Namespace
    metadata: {name: apps}
    ---
    apiVersion: apps/v1
    kind: Deployment
    metadata: {name: ctrl, namespace: ops}
    ---
    apiVersion: apiextensions.k8s.io/v1
    kind: CustomResourceDefinition
    metadata: {name: widgets.example.com}
    spec:
      group: example.com
      scope: Namespaced
      names: {plural: widgets, singular: widget, kind: Widget}
      versions: [{name: v1, served: true, storage: true}]
    ---
    apiVersion: example.com/v1
    kind: Widget
    metadata: {name: w1, namespace: apps, finalizers: [example.com/cleanup]}
    ---
    apiVersion: criticalsvc.io/v1alpha1
    kind: CriticalService
    metadata: {name: ctrl}
    spec:
      provider: {group: apps, resource: deployments, namespace: ops, name: ctrl}
      criteria:
      - type: Finalizer
        finalizer: {group: example.com, resource: widgets, finalizerName: example.com/cleanup}
    """)


def cluster_with(text: str, **kw: Any) -> Cluster:
    cluster = Cluster(**kw)
    cluster.load(load_text(text, "test.yaml"))
    return cluster


def record_reviews(cluster: Cluster) -> list[tuple[float, dict[str, Any], dict[str, Any]]]:
    """Wrap the gate's webhook: every (time, request, response) it answers."""
    seen: list[tuple[float, dict[str, Any], dict[str, Any]]] = []
    webhook = cluster.store.webhooks[0]
    inner = webhook.hook

    def hook(review: dict[str, Any]) -> dict[str, Any]:
        reply = inner(review)
        seen.append((cluster.engine.now(), review["request"], reply["response"]))
        return reply

    webhook.hook = hook
    return seen


def add_webhook(cluster: Cluster, resources: set[GroupResource], *, allow: bool) -> list[tuple[float, dict[str, Any]]]:
    """A second webhook on DELETE of `resources` that allows or denies everything, recording each call."""
    seen: list[tuple[float, dict[str, Any]]] = []

    def hook(review: dict[str, Any]) -> dict[str, Any]:
        seen.append((cluster.engine.now(), review["request"]))
        response: dict[str, Any] = {"uid": review["request"]["uid"], "allowed": allow}
        if not allow:
            response["status"] = {"code": 403, "reason": "Forbidden", "message": "test policy says no"}
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}

    rules = (WebhookRule(frozenset({"DELETE"}), frozenset(resources)),)
    cluster.store.webhooks.append(RegisteredWebhook(hook, rules=rules, name="test.example.com"))
    return seen


def run_for(cluster: Cluster, seconds: float) -> None:
    cluster.engine.run(until=cluster.engine.now() + seconds)


def conditions(cluster: Cluster, name: str) -> dict[str, dict[str, str]]:
    ns = cluster.store.get(NAMESPACES, "", name)
    assert ns is not None
    return {c["type"]: c for c in ns["status"].get("conditions", [])}


def intervals(times: list[float]) -> list[float]:
    return [round(b - a, 6) for a, b in itertools.pairwise(times)]


# --- namespace controller ---------------------------------------------------------------------------
def test_namespace_controller_deletecollection_reaches_the_gate_with_an_empty_name():
    """Content DELETEs reach the gate per item with name "", from the namespace controller, 5 s after the deletion."""
    cluster = cluster_with(OPERATOR)
    reviews = record_reviews(cluster)
    assert cluster.store.delete(ObjectRef(NAMESPACES, "", "ops")).outcome == "marked"
    run_for(cluster, 10)
    (first, request, response), *_ = [r for r in reviews if r[1]["userInfo"]["username"] == NS_CONTROLLER]
    assert first == pytest.approx(cluster.engine.start + 5.0)
    assert request["name"] == "" and request["namespace"] == "ops"
    assert request["oldObject"]["metadata"]["name"] == "ctrl"
    assert request["options"]["propagationPolicy"] == "Background"
    assert response["allowed"] is False
    assert "CriticalService ctrl protects it" in response["status"]["message"]
    assert cluster.store.exists(DEPLOYMENTS, "ops", "ctrl")


def test_namespace_conditions_carry_the_denial_then_clear():
    """A refusal sets NamespaceDeletionContentFailure with Kubernetes' reason and message; finalizers get their own."""
    cluster = cluster_with(OPERATOR + textwrap.dedent("""\
        ---
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: held, namespace: ops, finalizers: [example.com/hold]}
        """))
    cluster.store.delete(ObjectRef(NAMESPACES, "", "ops"))
    run_for(cluster, 6)
    c = conditions(cluster, "ops")
    failure = c["NamespaceDeletionContentFailure"]
    assert (failure["status"], failure["reason"]) == ("True", "ContentDeletionFailed")
    assert failure["message"].startswith('Failed to delete all resource types, 1 remaining: admission webhook '
                                         '"gate.criticalsvc.io" denied the request: deployments.apps ops/ctrl '
                                         "may not be deleted yet")
    assert c["NamespaceContentRemaining"]["message"] == \
        "Some resources are remaining: configmaps. has 1 resource instances"
    assert c["NamespaceFinalizersRemaining"]["message"] == \
        "Some content in the namespace has finalizers remaining: example.com/hold in 1 resource instances"
    assert (c["NamespaceDeletionDiscoveryFailure"]["status"], c["NamespaceDeletionDiscoveryFailure"]["reason"]) == \
        ("False", "ResourcesDiscovered")
    # The operator's CR goes (a person removes the finalizer the dead operator never will) ...
    cluster.store.remove_finalizer(ObjectRef(WIDGETS, "apps", "w1"), "example.com/cleanup")
    run_for(cluster, 61)
    c = conditions(cluster, "ops")
    # ... so the Deployment may go: the failure clears to its "ok" variant; only the held ConfigMap remains.
    assert not cluster.store.exists(DEPLOYMENTS, "ops", "ctrl")
    assert (c["NamespaceDeletionContentFailure"]["status"], c["NamespaceDeletionContentFailure"]["reason"]) == \
        ("False", "ContentDeleted")
    assert c["NamespaceContentRemaining"]["status"] == "True"


def test_namespace_controller_backs_off_to_60_seconds_and_retries_forever():
    """Refused content is retried 5 ms·2ⁿ apart, capped at 60 s; once allowed, it goes at the next retry."""
    cluster = cluster_with(OPERATOR)
    reviews = record_reviews(cluster)
    cluster.store.delete(ObjectRef(NAMESPACES, "", "ops"))
    run_for(cluster, 600)
    times = [t for t, req, _resp in reviews if req["userInfo"]["username"] == NS_CONTROLLER]
    gaps = intervals(times)
    assert gaps[:4] == pytest.approx([0.005, 0.01, 0.02, 0.04], abs=1e-6)
    assert max(gaps) == pytest.approx(60.0) and gaps[-1] == pytest.approx(60.0)
    assert len(times) > 20
    cluster.store.remove_finalizer(ObjectRef(WIDGETS, "apps", "w1"), "example.com/cleanup")
    now = cluster.engine.now()
    run_for(cluster, 61)
    assert not cluster.store.exists(NAMESPACES, "", "ops")
    assert cluster.marks[ObjectRef(NAMESPACES, "", "ops")].gone is not None
    assert cluster.engine.now() - now <= 61


def test_content_held_by_finalizers_is_rechecked_every_8_seconds():
    """With only finalizers left the namespace controller returns every 15/2+1 = 8 s (5 s after its status write)."""
    cluster = cluster_with(textwrap.dedent("""\
        apiVersion: v1
        kind: Namespace
        metadata: {name: work}
        ---
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: held, namespace: work, finalizers: [example.com/hold]}
        """), gate=False)
    calls = add_webhook(cluster, {CONFIGMAPS}, allow=True)
    cluster.store.delete(ObjectRef(NAMESPACES, "", "work"))
    run_for(cluster, 60)
    gaps = intervals([t for t, _req in calls])
    assert gaps[0] == pytest.approx(5.0) and gaps[1:] == pytest.approx([8.0] * len(gaps[1:]))


# A namespace with a pod its finalizer holds and a ConfigMap.
_POD_AND_CONFIGMAP = textwrap.dedent("""\
    apiVersion: v1
    kind: Namespace
    metadata: {name: work}
    ---
    apiVersion: v1
    kind: Pod
    metadata: {name: p, namespace: work, finalizers: [example.com/hold]}
    ---
    apiVersion: v1
    kind: ConfigMap
    metadata: {name: c, namespace: work}
    """)


@pytest.mark.parametrize("ordered", [True, False])
def test_pods_go_first_unless_legacy_namespace_deletion(ordered):
    """KEP-5080: while a pod remains nothing else is deleted; the legacy mode deletes everything in one pass."""
    cluster = cluster_with(_POD_AND_CONFIGMAP, gate=False, ordered_namespace_deletion=ordered)
    cluster.store.delete(ObjectRef(NAMESPACES, "", "work"))
    run_for(cluster, 30)
    assert cluster.store.state.get(ObjectRef(PODS, "work", "p")).terminating
    assert cluster.store.exists(CONFIGMAPS, "work", "c") is ordered
    cluster.store.remove_finalizer(ObjectRef(PODS, "work", "p"), "example.com/hold")
    run_for(cluster, 10)
    assert not cluster.store.exists(NAMESPACES, "", "work")
    pod_gone = cluster.marks[ObjectRef(PODS, "work", "p")].gone
    cm_gone = cluster.marks[ObjectRef(CONFIGMAPS, "work", "c")].gone
    assert (cm_gone[1] > pod_gone[1]) is ordered


def test_while_pods_remain_the_conditions_do_not_count_the_content():
    """kube-controller-manager v1.37 ends a pass early while pods remain and writes the conditions without the
    content totals: ContentRemaining reads "all removed" although the pod is still there (checked on the real
    control plane and in namespaced_resources_deleter.go); once only finalized content remains it counts."""
    cluster = cluster_with(_POD_AND_CONFIGMAP, gate=False)
    cluster.store.delete(ObjectRef(NAMESPACES, "", "work"))
    run_for(cluster, 6)
    c = conditions(cluster, "work")
    assert (c["NamespaceContentRemaining"]["status"], c["NamespaceContentRemaining"]["reason"]) == \
        ("False", "ContentRemoved")
    assert c["NamespaceFinalizersRemaining"]["status"] == "False"
    assert cluster.store.state.get(ObjectRef(PODS, "work", "p")).terminating


def test_a_refused_pod_deletion_does_not_hold_back_the_other_types():
    """A webhook refusing the pods' deletecollection is an error, not a remaining pod: the pass goes on and the
    ConfigMap is deleted while the pod stays (v1.37 counts no remaining items for an erroring type)."""
    cluster = cluster_with(_POD_AND_CONFIGMAP.replace("finalizers: [example.com/hold]", "labels: {app: p}"),
                           gate=False)
    add_webhook(cluster, {PODS}, allow=False)
    cluster.store.delete(ObjectRef(NAMESPACES, "", "work"))
    run_for(cluster, 10)
    assert cluster.store.exists(PODS, "work", "p")
    assert not cluster.store.exists(CONFIGMAPS, "work", "c")
    assert conditions(cluster, "work")["NamespaceDeletionContentFailure"]["status"] == "True"


def test_one_deletecollection_worker_stops_at_the_first_refused_item():
    """Items are deleted in name order and the call stops at a refusal: later items wait for the next retry."""
    cluster = cluster_with(OPERATOR + textwrap.dedent("""\
        ---
        apiVersion: apps/v1
        kind: Deployment
        metadata: {name: later, namespace: ops}
        ---
        apiVersion: apps/v1
        kind: Deployment
        metadata: {name: before, namespace: ops}
        """))
    cluster.store.delete(ObjectRef(NAMESPACES, "", "ops"))
    run_for(cluster, 30)
    assert not cluster.store.exists(DEPLOYMENTS, "ops", "before")  # "before" < "ctrl" (refused) < "later"
    assert cluster.store.exists(DEPLOYMENTS, "ops", "ctrl") and cluster.store.exists(DEPLOYMENTS, "ops", "later")


# --- CRD cleanup ------------------------------------------------------------------------------------
CRD_AND_WIDGETS = textwrap.dedent("""\
    apiVersion: v1
    kind: Namespace
    metadata: {name: a}
    ---
    apiVersion: v1
    kind: Namespace
    metadata: {name: b}
    ---
    apiVersion: apiextensions.k8s.io/v1
    kind: CustomResourceDefinition
    metadata: {name: widgets.example.com}
    spec:
      group: example.com
      scope: Namespaced
      names: {plural: widgets, singular: widget, kind: Widget}
      versions: [{name: v1, served: true, storage: true}]
    ---
    apiVersion: example.com/v1
    kind: Widget
    metadata: {name: w1, namespace: a}
    ---
    apiVersion: example.com/v1
    kind: Widget
    metadata: {name: w2, namespace: b}
    ---
    apiVersion: example.com/v1
    kind: Widget
    metadata: {name: held, namespace: b, finalizers: [example.com/hold]}
    """)


def test_crd_cleanup_deletes_instances_without_admission_and_waits_for_finalizers():
    """Instances go without any webhook seeing them; held ones keep the CRD Terminating until they are gone."""
    cluster = cluster_with(CRD_AND_WIDGETS, gate=False)
    calls = add_webhook(cluster, {WIDGETS}, allow=False)
    crd = ObjectRef(CRDS, "", "widgets.example.com")
    cluster.store.delete(crd)
    run_for(cluster, 1)
    assert calls == []
    assert not cluster.store.exists(WIDGETS, "a", "w1") and not cluster.store.exists(WIDGETS, "b", "w2")
    assert cluster.store.state.get(ObjectRef(WIDGETS, "b", "held")).terminating

    def statuses() -> list[tuple[float, str]]:
        return [(e.time, e.reason) for e in cluster.timeline.of(crd) if e.outcome == "status"]

    crd_obj = cluster.store.get(CRDS, "", "widgets.example.com")
    (terminating,) = [c for c in crd_obj["status"]["conditions"] if c["type"] == "Terminating"]
    assert terminating["reason"] == "InstanceDeletionInProgress"
    run_for(cluster, 200)
    # After a minute of polling: InstanceDeletionCheck, and again after each backoff (5 ms, 10 ms, ...) + a minute.
    checks = [t for t, reason in statuses() if "InstanceDeletionCheck" in reason]
    assert checks[:2] == pytest.approx([60.0, 120.005], abs=0.01)
    assert any("could not confirm zero CustomResources remaining" in reason for _t, reason in statuses())
    assert cluster.store.exists(CRDS, "", "widgets.example.com")
    cluster.store.remove_finalizer(ObjectRef(WIDGETS, "b", "held"), "example.com/hold")
    run_for(cluster, 6)  # the next poll (every 5 s, as v1.37.2 does)
    assert not cluster.store.exists(CRDS, "", "widgets.example.com")
    assert statuses()[-1][1].startswith("Terminating=False InstanceDeletionCompleted")


# --- garbage collector ------------------------------------------------------------------------------
def test_garbage_collector_deletes_a_protected_dependent_through_the_gate_with_backoff_to_1000_s():
    """An orphaned provider is deleted by the GC through admission; refusals back off 5 ms·2ⁿ up to 1000 s."""
    owned = OPERATOR.replace("metadata: {name: ctrl, namespace: ops}",
                             "metadata: {name: ctrl, namespace: ops, ownerReferences: "
                             "[{apiVersion: v1, kind: ConfigMap, name: bundle}]}")
    cluster = cluster_with("apiVersion: v1\nkind: Namespace\nmetadata: {name: ops}\n---\n"
                           "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: bundle, namespace: ops}\n---\n"
                           + owned.split("---\n", 1)[1])
    reviews = record_reviews(cluster)
    cluster.store.delete(ObjectRef(CONFIGMAPS, "ops", "bundle"))
    run_for(cluster, 4000)
    gc = [(t, resp) for t, req, resp in reviews if req["userInfo"]["username"] == GC]
    assert all(not resp["allowed"] for _t, resp in gc)
    gaps = intervals([t for t, _resp in gc])
    assert gaps[0] < 0.05 and max(gaps) == pytest.approx(1000.0)
    cluster.store.delete(ObjectRef(WIDGETS, "apps", "w1"))  # the operator finalizes it; the criterion is met
    run_for(cluster, 1001)
    assert not cluster.store.exists(DEPLOYMENTS, "ops", "ctrl")
    (deleted,) = [e for e in cluster.timeline.of(ObjectRef(DEPLOYMENTS, "ops", "ctrl")) if e.outcome == "deleted"]
    assert deleted.actor == "garbage-collector"


OWNER_AND_DEPENDENT = textwrap.dedent("""\
    apiVersion: v1
    kind: Namespace
    metadata: {name: x}
    ---
    apiVersion: v1
    kind: ConfigMap
    metadata: {name: owner, namespace: x}
    ---
    apiVersion: v1
    kind: ConfigMap
    metadata:
      name: dependent
      namespace: x
      finalizers: [example.com/hold]
      ownerReferences: [{apiVersion: v1, kind: ConfigMap, name: owner, blockOwnerDeletion: true}]
    """)


def test_foreground_deletion_waits_for_blocking_dependents():
    """Foreground: the dependent is deleted first and the owner stays until it is gone."""
    cluster = cluster_with(OWNER_AND_DEPENDENT, gate=False)
    cluster.store.delete(ObjectRef(CONFIGMAPS, "x", "owner"), propagation="Foreground")
    run_for(cluster, 5)
    assert cluster.store.state.get(ObjectRef(CONFIGMAPS, "x", "dependent")).terminating
    assert cluster.store.exists(CONFIGMAPS, "x", "owner")
    cluster.store.remove_finalizer(ObjectRef(CONFIGMAPS, "x", "dependent"), "example.com/hold")
    run_for(cluster, 1)
    assert not cluster.store.exists(CONFIGMAPS, "x", "owner")


def test_orphan_deletion_keeps_dependents_without_their_owner_reference():
    """Orphan: the owner goes, the dependent stays, no longer owned."""
    cluster = cluster_with(OWNER_AND_DEPENDENT, gate=False)
    cluster.store.delete(ObjectRef(CONFIGMAPS, "x", "owner"), propagation="Orphan")
    run_for(cluster, 5)
    assert not cluster.store.exists(CONFIGMAPS, "x", "owner")
    dependent = cluster.store.get(CONFIGMAPS, "x", "dependent")
    assert dependent is not None and not dependent["metadata"].get("ownerReferences")
    assert not dependent["metadata"].get("deletionTimestamp")


# --- the operators --------------------------------------------------------------------------------
def test_finalizer_controller_works_only_while_its_provider_runs():
    """The operator removes its finalizer while its Deployment runs; once its namespace terminates, finalizers stay."""
    cluster = cluster_with(OPERATOR + textwrap.dedent("""\
        ---
        apiVersion: example.com/v1
        kind: Widget
        metadata: {name: w2, namespace: apps, finalizers: [example.com/cleanup]}
        """))
    cluster.store.delete(ObjectRef(WIDGETS, "apps", "w1"))
    run_for(cluster, 2.01)
    assert not cluster.store.exists(WIDGETS, "apps", "w1")
    cluster.store.delete(ObjectRef(NAMESPACES, "", "ops"))  # break-glass lets it through
    cluster.store.delete(ObjectRef(WIDGETS, "apps", "w2"))
    run_for(cluster, 30)
    w2 = ObjectRef(WIDGETS, "apps", "w2")
    assert cluster.store.exists(WIDGETS, "apps", "w2")
    (event,) = [e for e in cluster.timeline.of(w2) if e.outcome == "not running"]
    assert "the namespace ops" in event.reason and "is terminating" in event.reason
    hold = cluster.hold(w2)
    assert any("stays forever" in r for r in hold.reasons)


# --- the work queue ---------------------------------------------------------------------------------
def test_work_queue_keeps_the_earliest_run_and_backs_off_per_key():
    """add_after keeps one pending run (the earliest); failures double the delay up to the cap; forget resets."""
    engine = VirtualEngine(start=0.0)
    runs: list[tuple[float, str]] = []
    queue: WorkQueue[str] = WorkQueue(engine, lambda k: runs.append((engine.now(), k)), base=1.0, cap=4.0)
    queue.add_after("a", 5.0)
    queue.add_after("a", 2.0)
    queue.add_after("a", 3.0)
    engine.run()
    assert runs == [(2.0, "a")]
    delays = [queue.add_rate_limited("b") for _ in range(5)]
    assert delays == [1.0, 2.0, 4.0, 4.0, 4.0]
    queue.forget("b")
    assert queue.add_rate_limited("b") == 1.0
