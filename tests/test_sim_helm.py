"""The simulator's Helm client (criticalsvc/sim/clients.py HelmUninstall) against a description written here by
hand from helm v3.22.0, not from the client's code:

- `helm install` stores the release's manifest in InstallOrder (kinds it does not list last, by kind name);
  `helm uninstall` splits it into entries named `manifest-<i>`, walks them in the string order of those names
  and sorts them stably by UninstallOrder (pkg/releaseutil/kind_sorter.go, manifest_sorter.go#L77-L110);
- one Background DELETE per object, the objects of one kind together, every object tried despite refusals;
  a refused DELETE fails the command and nothing sends it again (pkg/action/uninstall.go#L123-L127,
  pkg/kube/client.go#L513-L628);
- a CRD of the chart's crds/ is not in the release's manifest: never deleted.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from criticalsvc.api import GroupResource, ObjectRef
from criticalsvc.manifests import load_path, load_text
from criticalsvc.sim.clients import HelmUninstall, helm_uninstall_order
from criticalsvc.sim.cluster import Cluster

STORY = "api/examples/reference-story.yaml"


def _story(*, replay: bool = False, finalizer_only: bool = False) -> str:
    docs = [d for d in yaml.safe_load_all(Path(STORY).read_text(encoding="utf-8")) if d]
    for d in docs:
        if d["kind"] == "CriticalService":
            if replay:
                d["spec"]["replayDeletion"] = "WhenTearingDown"
            if finalizer_only:
                d["spec"]["criteria"] = [c for c in d["spec"]["criteria"] if c["type"] == "Finalizer"]
    return yaml.safe_dump_all(docs, sort_keys=False)


def _helm(text: str, *, seed: int = 0, crds_dir: bool = False) -> tuple[Cluster, HelmUninstall]:
    cluster = Cluster(seed=seed)
    cluster.load(load_text(text, STORY))
    [client] = cluster.teardown("helm", helm_crds_dir=crds_dir)
    assert isinstance(client, HelmUninstall)
    return cluster, client


def _deletes(cluster: Cluster) -> list[tuple[str, str]]:
    return [(e.ref.name, e.outcome) for e in cluster.timeline if e.actor.startswith("helm/")
            and e.verb == "DELETE" and e.ref is not None]


def test_one_pass_in_uninstall_order_every_object_tried_and_nothing_retried() -> None:
    """The story in UninstallOrder (Deployment, CRD, Namespaces, then CoolResource and CriticalService, the kinds
    Helm does not list, by name); the three refusals are never sent again, and they are what is left."""
    cluster = Cluster(seed=0)
    cluster.load(load_path(STORY))
    [client] = cluster.teardown("helm")
    assert isinstance(client, HelmUninstall)
    verdict = cluster.run()
    deletes = _deletes(cluster)
    # Each kind's DELETEs at once (their order among themselves is the run's to choose).
    assert [{name for name, _ in group} for group in (deletes[:1], deletes[1:2], deletes[2:4], deletes[4:7],
                                                      deletes[7:])] == [
        {"finalizer-deployment"}, {"coolresources.my.crd.group"}, {"finalizer-namespace", "cool-apps"},
        {"alpha", "beta", "gamma"}, {"for-finalizer-deployment"}]
    assert [name for name, outcome in deletes if outcome == "denied"] == [
        "finalizer-deployment", "finalizer-namespace", "for-finalizer-deployment"]
    assert client.failed is True and client.done_at is not None and client.done_at < 0.1
    assert not verdict.completed
    assert sorted(h.ref.name for h in verdict.remaining) == [
        "finalizer-deployment", "finalizer-namespace", "for-finalizer-deployment"]


def test_with_replay_the_gate_finishes_what_helm_was_refused() -> None:
    """Replay on: Helm still makes one refused pass, and the gate's replays take the rest, in the safe order."""
    cluster, client = _helm(_story(replay=True))
    verdict = cluster.run()
    assert client.failed is True
    assert verdict.completed, verdict
    gone = {ref.name: mark.gone for ref, mark in cluster.marks.items() if mark.gone is not None}
    for provider, first in (("finalizer-deployment", ("alpha", "beta", "gamma", "coolresources.my.crd.group")),
                            ("finalizer-namespace", ("finalizer-deployment",)),
                            ("for-finalizer-deployment", ("finalizer-deployment",))):
        assert all(gone[f] <= gone[provider] for f in first), (provider, gone)
    assert cluster.replayer is not None and len(cluster.replayer.replayed) == 3


def test_a_crd_in_crds_is_never_deleted() -> None:
    """--helm-crds-dir: no DELETE of the CRD. With the story's criterion on the CRD the provider waits for it
    (replay or not); with a Finalizer criterion only, replay finishes everything but the CRD."""
    cluster, _ = _helm(_story(replay=True), crds_dir=True)
    verdict = cluster.run()
    assert "coolresources.my.crd.group" not in [name for name, _ in _deletes(cluster)]
    assert {h.ref.name for h in verdict.remaining} == {
        "coolresources.my.crd.group", "finalizer-deployment", "finalizer-namespace", "for-finalizer-deployment"}
    cluster, _ = _helm(_story(replay=True, finalizer_only=True), crds_dir=True)
    verdict = cluster.run()
    assert {h.ref.name for h in verdict.remaining} == {"coolresources.my.crd.group"}


# The gate's refusals of the real helm v3.22.0 uninstalling one release holding the reference story (the CRD in
# templates/), replay off, in the gate's log order (`python -m benchmarks.replay_real --only helm --json`,
# cases["helm replay off"][0]["refused"]; design/helm.md).
REAL_REFUSALS = ["deployments.apps/finalizer-deployment", "namespaces/finalizer-namespace",
                 "criticalservices.criticalsvc.io/for-finalizer-deployment"]


def test_the_simulated_uninstall_refuses_what_the_real_helm_was_refused_in_order() -> None:
    for seed in range(3):
        cluster, _ = _helm(_story(), seed=seed)
        cluster.run()
        refused = [f"{e.ref.group_resource}/{e.ref.name}" for e in cluster.timeline.denials() if e.ref is not None]
        assert refused == REAL_REFUSALS


# UninstallOrder as kind_sorter.go writes it, and lessByKind transcribed literally.
_GO_UNINSTALL = ["APIService", "Ingress", "IngressClass", "Service", "CronJob", "Job", "StatefulSet",
                 "HorizontalPodAutoscaler", "Deployment", "ReplicaSet", "ReplicationController", "Pod", "DaemonSet",
                 "RoleBindingList", "RoleBinding", "RoleList", "Role", "ClusterRoleBindingList", "ClusterRoleBinding",
                 "ClusterRoleList", "ClusterRole", "CustomResourceDefinition", "PersistentVolumeClaim",
                 "PersistentVolume", "StorageClass", "ConfigMap", "SecretList", "Secret", "ServiceAccount",
                 "PodDisruptionBudget", "PodSecurityPolicy", "LimitRange", "ResourceQuota", "NetworkPolicy",
                 "Namespace", "PriorityClass"]


def _go_less(kind_a: str, kind_b: str) -> bool:
    ordering = {k: i for i, k in enumerate(_GO_UNINSTALL)}
    first, second = ordering.get(kind_a), ordering.get(kind_b)
    if first is None and second is None:
        return kind_a < kind_b
    if first is None:
        return False
    if second is None:
        return True
    return first < second


_KINDS = [("", "Namespace"), ("", "ConfigMap"), ("", "Service"), ("apps", "Deployment"),
          ("apiextensions.k8s.io", "CustomResourceDefinition"), ("criticalsvc.io", "CriticalService"),
          ("my.crd.group", "CoolResource"), ("rbac.authorization.k8s.io", "ClusterRole")]
_objects = st.lists(st.tuples(st.sampled_from(_KINDS), st.sampled_from(["x", "y", "z", "w"])), max_size=14,
                    unique=True).map(lambda items: [(ObjectRef(GroupResource(g, k.lower() + "s"), "", name), k)
                                                    for (g, k), name in items])


@given(_objects)
def test_the_uninstall_order_never_puts_a_kind_before_one_lessbykind_puts_first(
        objects: list[tuple[ObjectRef, str]]) -> None:
    kinds = dict(objects)
    order = helm_uninstall_order(objects)
    assert sorted(order) == sorted(kinds)
    assert not any(_go_less(kinds[b], kinds[a]) for a, b in itertools.pairwise(order))


def test_objects_of_one_kind_go_in_the_string_order_of_their_manifest_entries() -> None:
    """Twelve ConfigMaps: uninstall walks manifest-0, manifest-1, manifest-10, manifest-11, manifest-2, ..."""
    maps = [(ObjectRef(GroupResource("", "configmaps"), "a", f"cm-{i}"), "ConfigMap") for i in range(12)]
    assert [r.name for r in helm_uninstall_order(maps)] == [
        "cm-0", "cm-1", "cm-10", "cm-11", "cm-2", "cm-3", "cm-4", "cm-5", "cm-6", "cm-7", "cm-8", "cm-9"]


def test_simulate_says_helm_gave_up_and_takes_no_refusal_for_warn(capsys: pytest.CaptureFixture[str]) -> None:
    """`criticalsvc simulate --client helm`: the verdict names helm and its ways out; the refusals' own warnings
    (what each waits for) are not taken for `enforcement: Warn` letting DELETEs through."""
    from criticalsvc import cli

    assert cli.main(["simulate", "-f", STORY, "--client", "helm"]) == 1
    out = capsys.readouterr().out
    verdict = out.rstrip().splitlines()[-1]
    assert verdict.startswith("STUCK: 3 of 8 objects remain"), verdict
    assert "helm uninstall gave up on 3 refused objects" in verdict and "replayDeletion" in verdict, verdict
    assert "only warned" not in out and "Warnings from the gate" not in out, out
