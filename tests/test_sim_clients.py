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


def test_manifestwork_agent_retries_each_refusal_with_backoff_capped_at_60_seconds():
    """A refused object is retried 50 ms·2ⁿ apart, up to 60 s, for as long as it is refused."""
    cluster = Cluster(seed=0)
    infra, service_doc = ORPHAN_SERVICE.rsplit("---\n", 1)
    cluster.load(load_text(infra, "infra.yaml", bundle="manifestwork/infra"))
    cluster.load(load_text(service_doc, "svc.yaml", bundle="manifestwork/svc"))
    service = ObjectRef(GroupResource("criticalsvc.io", "criticalservices"), "", "ctrl")
    cluster.teardown("manifestwork", bundles=["manifestwork/svc"])
    cluster.engine.run(until=cluster.engine.now() + 600)
    times = [e.time for e in cluster.timeline.of(service) if e.outcome == "denied"]
    gaps = [round(b - a, 6) for a, b in itertools.pairwise(times)]
    assert gaps[:4] == pytest.approx([0.05, 0.1, 0.2, 0.4])
    assert max(gaps) == pytest.approx(60.0) and gaps[-1] == pytest.approx(60.0)


def test_manifestwork_agent_uses_foreground_propagation():
    """The OCM agent deletes with Foreground, so deleted objects first carry foregroundDeletion."""
    cluster = Cluster(seed=0)
    cluster.load(load_path(STORY))
    cluster.teardown("manifestwork")
    cluster.run()
    marked = [e for e in cluster.timeline if e.actor.startswith("manifestwork/") and e.outcome == "marked"]
    assert marked and all("foregroundDeletion" in e.reason for e in marked)


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
