"""The ordering observer (tests/realcluster/teardown.py) must catch a gate that allows too early.

Every teardown test's "no wrong order" rests on `Observer.order_violations`. Its negative controls: the
reference story torn down at once while its CriticalService only warns (enforcement: Warn), judged by
the story's own `dependents()` (on the stand-in, whose server ends with the test: the stranded CRs need
no cleaning up); and, on both clusters with no CriticalService at all, a "provider" deleted a few
milliseconds before the object it would protect. Both deletions fall inside one round of a polling
observer (which then saw both gone at once and took that for "in order"); the watching observer orders
them by resourceVersion and must report it. The two objects are of different types and scopes (a
cluster-scoped ClusterRole, a namespaced ConfigMap), as a provider and its dependents are. Runs on both
clusters: the resourceVersions compared come from the stand-in's store and from etcd.
"""

from __future__ import annotations

from tests.backends import Backend, unique
from tests.realcluster.teardown import (
    Observer,
    RepeatingDeleter,
    Story,
    apply_story,
    wait_for,
)

CLUSTERROLES = "/apis/rbac.authorization.k8s.io/v1/clusterroles"
CRITICAL_SERVICES = "/apis/criticalsvc.io/v1alpha1/criticalservices"


def _objects(cluster: Backend, namespace: str) -> dict[str, str]:
    role, configmap = unique("provider"), "dependent"
    created = cluster.admin.create(CLUSTERROLES, {"apiVersion": "rbac.authorization.k8s.io/v1",
                                                  "kind": "ClusterRole", "metadata": {"name": role}, "rules": []})
    assert created.status_code == 201, created.text
    created = cluster.admin.create(f"/api/v1/namespaces/{namespace}/configmaps",
                                   {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": configmap}})
    assert created.status_code == 201, created.text
    return {f"ClusterRole/{role}": f"{CLUSTERROLES}/{role}",
            "ConfigMap/dependent": f"/api/v1/namespaces/{namespace}/configmaps/{configmap}"}


def _delete_in_order(cluster: Backend, paths: dict[str, str], order: list[str]) -> Observer:
    observer = Observer(cluster.admin, paths)
    observer.start()
    try:
        for key in order:  # back to back: milliseconds apart
            assert cluster.admin.delete(paths[key]).status_code == 200
        wait_for(lambda: len(observer.first_gone) == len(paths), timeout=30, what="both deletions to be seen")
    finally:
        observer.stop()
    return observer


def _warn_story_is_caught(cluster: Backend) -> None:
    """The story under a gate that only warns: the Deployment goes in the first pass, its CRs' finalizer is
    then removed by nobody, and the observer must say so in the story's own terms."""
    story = Story.make("warn")
    apply_story(cluster.kubectl, cluster.admin, story)
    warn = cluster.admin.merge_patch(f"{CRITICAL_SERVICES}/{story.critical_service}", {"spec": {"enforcement": "Warn"}})
    assert warn.status_code == 200, warn.text
    wait_for(lambda: cluster.admin.delete(story.deployment_path, params={"dryRun": "All"}).status_code == 200,
             timeout=60, what="the gate to only warn")
    observer = Observer(cluster.admin, story.paths())
    with cluster.finalizer_controller(story):
        observer.start()
        try:  # one pass takes milliseconds; the stranded CRs stay (this stand-in ends with the test)
            RepeatingDeleter(cluster.admin, story.paths()).run(timeout=2)
        finally:
            observer.stop()
    violations = observer.order_violations(story.dependents())
    deployment = f"Deployment/{story.name('finalizer-deployment')}"
    assert any(v.startswith(f"{deployment} deleted at resourceVersion") and "CoolResource/" in v
               for v in violations), violations


def test_the_observer_reports_a_provider_deleted_just_before_what_it_protects_and_not_the_safe_order(
        cluster: Backend, namespace: str) -> None:
    """One test for all (a stand-in costs seconds to start): the wrong orders are caught, the right one is not."""
    if cluster.name == "standin":  # its own server, gone after the test; the real one is shared by the session
        _warn_story_is_caught(cluster)

    paths = _objects(cluster, namespace)
    provider, dependent = list(paths)
    observer = _delete_in_order(cluster, paths, [provider, dependent])
    [violation] = observer.order_violations({provider: [dependent]})
    assert violation.startswith(f"{provider} deleted at resourceVersion") and "only later" in violation
    assert observer.order() == [provider, dependent] and observer.gaps == []

    paths = _objects(cluster, namespace)
    provider, dependent = list(paths)
    observer = _delete_in_order(cluster, paths, [dependent, provider])
    assert observer.order_violations({provider: [dependent]}) == []
    assert observer.order() == [dependent, provider] and observer.gaps == []
    # A provider gone while the dependent is never deleted is a violation too.
    assert observer.order_violations({provider: ["ConfigMap/never-deleted"]}) == \
        [f"{provider} deleted at resourceVersion {observer.first_gone[provider]}, ConfigMap/never-deleted never"]
