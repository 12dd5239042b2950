"""The deleting clients keep their real habits: order, retries, and what they delete themselves."""

from __future__ import annotations

import itertools
import textwrap

import pytest

from criticalsvc.api import NAMESPACES, GroupResource, ObjectRef
from criticalsvc.manifests import load_path, load_text
from criticalsvc.sim.cluster import Cluster

STORY = "api/examples/reference-story.yaml"
SERVICE = ObjectRef(GroupResource("criticalsvc.io", "criticalservices"), "", "for-finalizer-deployment")

# A CriticalService and (in another bundle, never deleted) its provider: its DELETE is refused for as long as we look.
ORPHAN_SERVICE = textwrap.dedent("""\
    apiVersion: v1
    kind: Namespace
    metadata: {name: ops}
    ---
    apiVersion: apps/v1
    kind: Deployment
    metadata: {name: ctrl, namespace: ops}
    ---
    apiVersion: criticalsvc.io/v1alpha1
    kind: CriticalService
    metadata: {name: ctrl}
    spec:
      provider: {group: apps, resource: deployments, namespace: ops, name: ctrl}
      criteria:
      - type: SpecificResource
        specificResource: {group: "", resource: configmaps, namespace: ops, name: anything}
    """)


def test_kubectl_deletes_in_file_order_one_request_at_a_time_and_continues_after_a_refusal():
    """kubectl tries every object once, in file order, 10 ms apart, going on past refusals."""
    cluster = Cluster(seed=0)
    refs = cluster.load(load_path(STORY))
    cluster.teardown("kubectl")
    cluster.run()
    calls = [e for e in cluster.timeline if e.actor == "kubectl"]
    assert [e.ref for e in calls] == refs
    assert [round(e.time, 6) for e in calls] == [round(0.01 * i, 6) for i in range(len(refs))]
    assert [e.outcome for e in calls][:3] == ["denied", "denied", "marked"]


def test_manifestwork_agent_sends_one_delete_and_the_garbage_collector_retries_the_refusal():
    """The agent's one DELETE of a refused object, never repeated; then the garbage collector's, 5 ms·2ⁿ apart,
    once the AppliedManifestWork that owned it is gone."""
    cluster = Cluster(seed=0)
    infra, service_doc = ORPHAN_SERVICE.rsplit("---\n", 1)
    cluster.load(load_text(infra, "infra.yaml", bundle="manifestwork/infra"))
    cluster.load(load_text(service_doc, "svc.yaml", bundle="manifestwork/svc"))
    service = ObjectRef(GroupResource("criticalsvc.io", "criticalservices"), "", "ctrl")
    cluster.teardown("manifestwork", bundles=["manifestwork/svc"])
    cluster.engine.run(until=cluster.engine.now() + 600)
    denied = [e for e in cluster.timeline.of(service) if e.outcome == "denied"]
    assert [e.actor for e in denied if e.actor != "garbage-collector"] == ["manifestwork/svc"]
    times = [e.time for e in denied if e.actor == "garbage-collector"]
    gaps = [round(b - a, 6) for a, b in itertools.pairwise(times)]
    assert gaps[:4] == pytest.approx([0.005, 0.01, 0.02, 0.04])
    assert all(b == pytest.approx(2 * a) for a, b in itertools.pairwise(gaps))  # no 60 s cap: it is 1000 s
    assert not any(e.actor == "manifestwork/svc" and e.verb == "DELETE" for e in cluster.timeline.events
                   if e.time > denied[0].time)


def test_manifestwork_agent_deletes_in_background_in_its_sorted_order():
    """One pass, Background (no foregroundDeletion), in the AppliedManifestWork's order: group, version, resource,
    namespace, name - the core group's namespaces first, the CRs last, not the file's order."""
    cluster = Cluster(seed=0)
    cluster.load(load_path(STORY))
    cluster.teardown("manifestwork")
    cluster.run()
    calls = [e for e in cluster.timeline if e.actor.startswith("manifestwork/") and e.verb == "DELETE"]
    assert not any("foregroundDeletion" in e.reason for e in calls)
    assert len({e.ref for e in calls}) == len(calls) == 8, "one DELETE per object, none repeated"
    assert [e.ref.name for e in calls if e.ref is not None] == [
        "cool-apps", "finalizer-namespace", "coolresources.my.crd.group", "finalizer-deployment",
        "for-finalizer-deployment", "alpha", "beta", "gamma"]


def test_namespace_client_deletes_only_namespaces_and_what_lives_outside_them():
    """The namespace client leaves namespaced content of its namespaces to the namespace controller."""
    cluster = Cluster(seed=0)
    cluster.load(load_path(STORY))
    (client,) = cluster.teardown("namespace")
    assert {str(r) for r in client.targets()} == {
        "namespaces finalizer-namespace", "namespaces cool-apps",
        "customresourcedefinitions.apiextensions.k8s.io coolresources.my.crd.group",
        "criticalservices.criticalsvc.io for-finalizer-deployment"}
    cluster.run()
    tried = {e.ref for e in cluster.timeline if e.actor.startswith("namespace-cleanup")}
    assert tried == set(client.targets())
    assert ObjectRef(NAMESPACES, "", "cool-apps") in tried and SERVICE in tried
