"""The simulator's Flux client (criticalsvc/sim/clients.py FluxKustomization) against a description written
here by hand from kustomize-controller v1.9.6 and fluxcd/pkg ssa v0.76.2, not from the client's code:

- ssa DeleteAll sorts the inventory by Flux's apply order and reverses it: ValidatingWebhookConfigurations,
  MutatingWebhookConfigurations, then every kind not in ReconcileOrder (by group, kind, namespace, name,
  all descending), then ReconcileOrder.First backwards (... Deployment, ..., Service, Secret, ConfigMap, ...,
  Namespace, CustomResourceDefinition) (https://github.com/fluxcd/pkg/blob/ssa/v0.76.2/ssa/sort.go);
- every object of the inventory gets a DELETE each pass, refused or not (manager_delete.go#L100-L120);
- a refused pass is retried whole after 750 ms, 1.5 s, 3 s, ... at most 15 min (fluxcd/pkg runtime
  v0.110.3 controller/rate_limiter.go), and the Kustomization goes after the first pass nothing refused
  (kustomization_controller.go#L1225-L1306); WaitForTermination first waits, polling every 2 s, until
  what that pass deleted is gone.
"""

from __future__ import annotations

import itertools
import textwrap

import pytest
from hypothesis import given
from hypothesis import strategies as st

from criticalsvc.api import GroupResource, ObjectRef
from criticalsvc.manifests import load_path, load_text
from criticalsvc.sim.clients import FluxKustomization, flux_delete_order
from criticalsvc.sim.cluster import Cluster

STORY = "api/examples/reference-story.yaml"


def _flux(cluster: Cluster, **kwargs: str) -> FluxKustomization:
    [client] = cluster.teardown("flux", **kwargs)
    assert isinstance(client, FluxKustomization)
    return client


def _deletes(cluster: Cluster) -> list[tuple[float, str, str]]:
    return [(e.time, e.ref.name, e.outcome) for e in cluster.timeline if e.actor.startswith("flux/")
            and e.verb == "DELETE" and e.ref is not None]


def test_the_first_pass_deletes_the_reference_story_in_reverse_apply_order_every_object_despite_refusals() -> None:
    cluster = Cluster(seed=0)
    cluster.load(load_path(STORY))
    _flux(cluster)
    cluster.engine.run(until=cluster.engine.now() + 0.5)  # the first pass only: the next is 750 ms later
    assert [(name, outcome) for _t, name, outcome in _deletes(cluster)] == [
        # custom resources: not in ReconcileOrder; group my.crd.group sorts after criticalsvc.io, names descending
        ("gamma", "marked"), ("beta", "marked"), ("alpha", "marked"),
        ("for-finalizer-deployment", "denied"),  # CriticalService: its criteria are unmet
        ("finalizer-deployment", "denied"),  # Deployment: the CRs still carry its finalizer
        ("finalizer-namespace", "denied"), ("cool-apps", "marked"),  # Namespaces, names descending
        ("coolresources.my.crd.group", "marked"),  # the CRD, applied first, deleted last
    ]


def test_mixed_kinds_follow_ssa_reverse_apply_order() -> None:
    def ref(group: str, resource: str, name: str, namespace: str = "") -> ObjectRef:
        return ObjectRef(GroupResource(group, resource), namespace, name)

    objects = [
        (ref("", "configmaps", "cm", "a"), "ConfigMap"),
        (ref("apiextensions.k8s.io", "customresourcedefinitions", "x.example.com"), "CustomResourceDefinition"),
        (ref("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "m"), "MutatingWebhookConfiguration"),
        (ref("", "services", "svc", "a"), "Service"),
        (ref("example.com", "widgets", "w", "a"), "Widget"),
        (ref("", "pods", "p", "a"), "Pod"),
        (ref("admissionregistration.k8s.io", "validatingwebhookconfigurations", "v"),
         "ValidatingWebhookConfiguration"),
        (ref("apps", "deployments", "d", "a"), "Deployment"),
        (ref("", "namespaces", "a"), "Namespace"),
        (ref("rbac.authorization.k8s.io", "clusterroles", "r"), "ClusterRole"),
        (ref("", "configmaps", "cm", "b"), "ConfigMap"),
    ]
    assert [r.name + (f"@{r.namespace}" if r.namespace else "") for r in flux_delete_order(objects)] == [
        "v", "m",  # webhook registrations: applied last, so deleted first
        "w@a", "p@a",  # kinds Flux does not list: group example.com after "" (descending)
        "d@a", "svc@a", "cm@b", "cm@a",  # Deployment, Service, ConfigMap (namespace descending)
        "r", "a", "x.example.com",  # ClusterRole, Namespace, CRD
    ]


# A CriticalService whose provider lives in another bundle (never deleted): refused for as long as we look.
ORPHAN = textwrap.dedent("""\
    apiVersion: v1
    kind: Namespace
    metadata: {name: ops}
    ---
    apiVersion: apps/v1
    kind: Deployment
    metadata: {name: ctrl, namespace: ops}
    ---
    apiVersion: v1
    kind: ConfigMap
    metadata: {name: anything, namespace: ops}
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


def _orphan_cluster() -> Cluster:
    cluster = Cluster(seed=0)
    infra, service = ORPHAN.rsplit("---\n", 1)
    cluster.load(load_text(infra, "infra.yaml", bundle="infra"))
    cluster.load(load_text(service, "svc.yaml", bundle="svc"))
    return cluster


def test_a_refused_pass_is_retried_whole_on_flux_backoff_and_the_kustomization_stays() -> None:
    cluster = _orphan_cluster()
    [client] = cluster.teardown("flux", bundles=["svc"])
    assert isinstance(client, FluxKustomization)
    cluster.engine.run(until=cluster.engine.now() + 3 * 3600)
    times = [t for t, _name, outcome in _deletes(cluster) if outcome == "denied"]
    assert len(times) == len(_deletes(cluster)), "every DELETE of the CriticalService was refused"
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # 750 ms doubling, at most 15 min; each gap also holds the pass's own GET and DELETE (10 ms here).
    expected = [min(900.0, 0.75 * 2**k) for k in range(len(gaps))]
    assert gaps == pytest.approx(expected, abs=0.02)
    assert expected[-1] == 900.0, "three hours reach the 15-minute cap"
    assert client.gone_at is None, "the finalizer stays while a pass is refused"


def test_the_kustomization_goes_after_the_first_pass_without_refusal_and_not_before() -> None:
    cluster = Cluster(seed=0)
    cluster.load(load_path(STORY))
    client = _flux(cluster)
    verdict = cluster.run()
    assert verdict.completed
    deletes = _deletes(cluster)
    assert client.gone_at is not None
    last_refusal = max(t for t, _n, outcome in deletes if outcome == "denied")
    last_pass = [d for d in deletes if d[0] > last_refusal]
    assert last_pass and all(outcome != "denied" for _t, _n, outcome in last_pass)
    assert client.gone_at >= last_pass[-1][0]
    # Four refused passes: 0.75 + 1.5 + 3 + 6 s of backoff before the fifth.
    assert len(client.passes) == 5
    assert client.gone_at == pytest.approx(11.25, abs=0.5)


NAMESPACE_WITH_CONTENT = textwrap.dedent("""\
    apiVersion: v1
    kind: Namespace
    metadata: {name: shop}
    ---
    apiVersion: v1
    kind: ConfigMap
    metadata: {name: settings, namespace: shop}
    """)


@pytest.mark.parametrize("policy", ["MirrorPrune", "WaitForTermination"])
def test_wait_for_termination_keeps_the_kustomization_until_what_it_deleted_is_gone(policy: str) -> None:
    cluster = Cluster(seed=0)
    [namespace, _configmap] = cluster.load(load_text(NAMESPACE_WITH_CONTENT, "shop.yaml", bundle="shop"))
    client = _flux(cluster, flux_deletion_policy=policy)
    assert cluster.run().completed
    gone = [e.time for e in cluster.timeline.of(namespace) if e.outcome == "gone"]
    assert gone and client.gone_at is not None
    if policy == "MirrorPrune":
        assert client.gone_at < gone[0], "MirrorPrune removes the finalizer once the DELETEs are accepted"
    else:
        assert client.gone_at >= gone[0]
        # WaitForSetTermination polls every 2 s from the end of the pass.
        assert (client.gone_at - client.passes[-1]) % 2.0 == pytest.approx(0.0, abs=0.05)


# The gate's refusals of the real kustomize-controller v1.9.6 deleting a Kustomization holding the reference
# story, replay off, in its log order (`python -m benchmarks.replay_real --only flux --json`, cases["flux replay
# off"][0]["refused"], one run; 10 refusals in both runs, design/replay.md "What a Flux user sees").
REAL_REFUSALS = [
    *(["criticalservices.criticalsvc.io/for-finalizer-deployment", "deployments.apps/finalizer-deployment",
       "namespaces/finalizer-namespace"] * 3),
    "criticalservices.criticalsvc.io/for-finalizer-deployment",
]
REAL_KUSTOMIZATION_GONE = (11.60, 11.83)  # seconds after the Kustomization's DELETE, the same two runs
MARGIN = 0.5  # seconds: the real runs differ from each other by 0.23 s


@pytest.mark.parametrize("seed", range(3))
def test_the_simulated_teardown_refuses_what_the_real_binary_refused_and_ends_as_it_did(seed: int) -> None:
    cluster = Cluster(seed=seed)
    cluster.load(load_path(STORY))
    client = _flux(cluster)
    assert cluster.run().completed
    refused = [f"{e.ref.group_resource}/{e.ref.name}" for e in cluster.timeline.denials() if e.ref is not None]
    assert refused == REAL_REFUSALS
    assert client.gone_at is not None
    assert min(REAL_KUSTOMIZATION_GONE) - MARGIN <= client.gone_at <= max(REAL_KUSTOMIZATION_GONE) + MARGIN


# ssa's comparator as sort.go writes it (kind2index: ReconcileOrder.First at -len(First)+i, Last at 1+i, any
# other kind 0; then group, kind; equal GroupKinds by namespace, then name), transcribed literally:
# DeleteAll sends the inventory in sort.Reverse of it.
_GO_FIRST = ["CustomResourceDefinition", "Namespace", "ClusterRole", "ClusterClass", "RuntimeClass", "PriorityClass",
             "StorageClass", "VolumeSnapshotClass", "IngressClass", "GatewayClass", "ClusterRoleBinding",
             "ResourceQuota", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Secret", "Service", "LimitRange",
             "Deployment", "StatefulSet", "CronJob", "PodDisruptionBudget"]
_GO_LAST = ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]
_KIND2INDEX = {**{k: -len(_GO_FIRST) + i for i, k in enumerate(_GO_FIRST)},
               **{k: 1 + i for i, k in enumerate(_GO_LAST)}}


def _go_less(a: tuple[ObjectRef, str], b: tuple[ObjectRef, str]) -> bool:
    (ra, ka), (rb, kb) = a, b
    if not (ra.group_resource.group == rb.group_resource.group and ka == kb):
        ia, ib = _KIND2INDEX.get(ka, 0), _KIND2INDEX.get(kb, 0)
        if ia != ib:
            return ia < ib
        if ra.group_resource.group != rb.group_resource.group:
            return ra.group_resource.group < rb.group_resource.group
        return ka < kb
    if ra.namespace != rb.namespace:
        return ra.namespace < rb.namespace
    return ra.name < rb.name


_KINDS = [("", "Namespace"), ("", "ConfigMap"), ("", "Service"), ("", "Pod"), ("apps", "Deployment"),
          ("apps", "StatefulSet"), ("apiextensions.k8s.io", "CustomResourceDefinition"),
          ("admissionregistration.k8s.io", "ValidatingWebhookConfiguration"),
          ("admissionregistration.k8s.io", "MutatingWebhookConfiguration"), ("criticalsvc.io", "CriticalService"),
          ("my.crd.group", "CoolResource"), ("rbac.authorization.k8s.io", "ClusterRole")]
_objects = st.lists(st.tuples(st.sampled_from(_KINDS), st.sampled_from(["", "a", "b"]),
                              st.sampled_from(["x", "y", "z"])), max_size=12, unique=True).map(
    lambda items: [(ObjectRef(GroupResource(g, k.lower() + "s"), ns, name), k) for (g, k), ns, name in items])


def _in_delete_order(order: list[ObjectRef], kinds: dict[ObjectRef, str]) -> bool:
    """No object is sent before one that ssa's comparator puts after it (the reverse of the apply order)."""
    return not any(_go_less((a, kinds[a]), (b, kinds[b])) for a, b in itertools.pairwise(order))


@given(_objects)
def test_the_delete_order_is_ssa_comparator_reversed(objects: list[tuple[ObjectRef, str]]) -> None:
    kinds = dict(objects)
    order = flux_delete_order(objects)
    assert sorted(order) == sorted(kinds)
    assert _in_delete_order(order, kinds)


def test_negative_control_the_apply_order_itself_is_not_a_delete_order() -> None:
    objects = [(ObjectRef(GroupResource("", "namespaces"), "", "a"), "Namespace"),
               (ObjectRef(GroupResource("apps", "deployments"), "a", "d"), "Deployment")]
    kinds = dict(objects)
    assert not _in_delete_order(list(reversed(flux_delete_order(objects))), kinds)
