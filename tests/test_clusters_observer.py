"""The ordering observer (tests/realcluster/teardown.py) must catch a gate that allows too early.

Every teardown test's "no wrong order" rests on `Observer.order_violations`. Its negative control: a
cluster with no CriticalService (a gate that allows everything) where a "provider" is deleted a few
milliseconds before the object it would protect. Both deletions fall inside one round of a polling
observer (which then saw both gone at once and took that for "in order"); the watching observer orders
them by resourceVersion and must report it. The two objects are of different types and scopes (a
cluster-scoped ClusterRole, a namespaced ConfigMap), as a provider and its dependents are. Runs on both
clusters: the resourceVersions compared come from the stand-in's store and from etcd.
"""

from __future__ import annotations

from tests.backends import Backend, unique
from tests.realcluster.teardown import Observer, wait_for

CLUSTERROLES = "/apis/rbac.authorization.k8s.io/v1/clusterroles"


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


def test_the_observer_reports_a_provider_deleted_just_before_what_it_protects_and_not_the_safe_order(
        cluster: Backend, namespace: str) -> None:
    """One test for both (a stand-in costs seconds to start): the wrong order is caught, the right one is not."""
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
