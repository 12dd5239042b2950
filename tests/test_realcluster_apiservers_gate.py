"""Protection on every API server (issue 34; design/routing.md, "No window, on every API server").

Three kube-apiservers over one etcd, the gate behind the balancer, API server 1 reading its webhook
configurations through a pausable link (tests/realcluster/controlplane.py, `webhook_lag`). Each test pauses
API server 1 *before* it creates its CriticalServices, so nothing the gate writes into a webhook configuration
from then on reaches API server 1 - far beyond an informer's usual lag - and then does what the issue measured:

* `kubectl wait --for=condition=Ready` through API server 0 (reason Enforcing), then at once, through the
  lagging API server 1: the DELETE (`dryRun`) of a named provider, of a member of a selected provider, of the
  namespace that holds one, and a held UPDATE: refused, every time (three trials for the named provider).
  What refuses them is the label the gate stored on each object, which the shipped configuration - held by
  every API server since the install - selects.
* The negative control in the same pause: a provider the gate may not label (a ConfigMap: its ClusterRole
  grants no `patch` on ConfigMaps) says Ready True **EnforcingByRoute**, not Enforcing, and its DELETE through
  API server 1 is admitted: the route by name alone is what a lagging API server does not have.
* CREATE then DELETE at once through another API server: a provider created through API server 0 under the
  name an existing CriticalService protects is refused when deleted at once through 1 and through 2.
* The outage on every API server: every gate replica frozen, an unprotected DELETE and UPDATE go through at
  once through each API server, the lagging one too, and the protected DELETEs fail closed on each.
* Upgrade with no window: the shipped configuration as it was before the labels (no protected.gate; Ready
  says EnforcingByRoute once the leader has read it), then the current one applied, while a dry-run DELETE of
  the provider is sent in a loop through the balancer: every one refused, and Ready turns Enforcing.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from criticalsvc.api import PROTECTED_LABEL
from criticalsvc.routing import LABELLED_UPDATES_WEBHOOK, LABELS_WEBHOOK, SHIPPED_CONFIGURATION
from criticalsvc.webhookconfigurations import configuration_name, shard_in
from tests.backends import deployment_manifest, unique
from tests.realcluster.client import Client
from tests.realcluster.cluster import RealCluster, built_binaries, real_cluster
from tests.realcluster.teardown import wait_for

pytestmark = pytest.mark.realcluster

LAGGING = 1
CRITICAL_SERVICES = "/apis/criticalsvc.io/v1alpha1/criticalservices"
SHIPPED = f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{SHIPPED_CONFIGURATION}"
DRY_RUN = {"dryRun": "All"}
AT_ONCE = 2.0  # seconds: an answer that did not wait for a webhook's timeout (5 s)


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    binaries = built_binaries()
    with real_cluster(binaries, tmp_path_factory.mktemp("apiservers"), apiservers=3, lagging=(LAGGING,),
                      workloads=False) as cluster:
        # The gate may read ConfigMaps (the criteria's blockers), as a user grants it (api/examples/rbac/).
        role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "read-configmaps", "labels": {"criticalsvc.io/aggregate-to-reader": "true"}},
                "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}]}
        assert cluster.admin.create("/apis/rbac.authorization.k8s.io/v1/clusterroles", role).status_code == 201
        yield cluster


@contextlib.contextmanager
def clients(cluster: RealCluster) -> Iterator[list[Client]]:
    each = [Client(cluster.plane.kubeconfig_for(i)) for i in range(3)]
    try:
        yield each
    finally:
        for client in each:
            client.close()


def _namespace(client: Client, name: str, labels: dict[str, str] | None = None) -> None:
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}}
    assert client.create("/api/v1/namespaces", body).status_code == 201


def _deployment(client: Client, namespace: str, name: str, labels: dict[str, str] | None = None) -> str:
    body = deployment_manifest(name, namespace, replicas=0)
    body["metadata"]["labels"] = labels or {}
    answer = client.create(f"/apis/apps/v1/namespaces/{namespace}/deployments", body)
    assert answer.status_code == 201, answer.text
    return f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}"


def _critical_service(client: Client, name: str, provider: dict[str, Any], namespace: str, **spec: Any) -> None:
    """Protects `provider` while ConfigMap `blocker` exists in a namespace of its own (`namespace`-blockers,
    created here): a criterion inside the provider's namespace would let that namespace go first (nsorder)."""
    blocker_namespace = f"{namespace}-blockers"
    client.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                         "metadata": {"name": blocker_namespace}})
    client.create(f"/api/v1/namespaces/{blocker_namespace}/configmaps", {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "blocker"}})
    body = {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": name},
            "spec": {"provider": provider, "criteria": [{"type": "SpecificResource", "specificResource": {
                "resource": "configmaps", "namespace": blocker_namespace, "name": "blocker"}}], **spec}}
    wait_for(lambda: client.create(CRITICAL_SERVICES, body).status_code in (201, 409), timeout=60,
             what=f"CriticalService {name} created (the gate refuses a CREATE it cannot check yet)")


def _wait_ready(cluster: RealCluster, name: str) -> str:
    """`kubectl wait --for=condition=Ready` through API server 0, as a user runs it; returns Ready's reason."""
    waited = cluster.plane.kubectl("wait", "--for=condition=Ready", f"csvc/{name}", "--timeout=90s", timeout=100,
                                   kubeconfig=cluster.plane.kubeconfig_for(0))
    assert waited.returncode == 0, waited.stderr
    cs = cluster.admin.get(f"{CRITICAL_SERVICES}/{name}") or {}
    ready = next(c for c in cs["status"]["conditions"] if c["type"] == "Ready")
    return str(ready["reason"])


def _refused(answer: Any) -> bool:
    return answer.status_code == 403 and "denied the request" in answer.text


def test_ready_then_at_once_through_a_lagging_api_server_every_protected_request_is_refused(
        three: RealCluster) -> None:
    cluster = three
    with clients(cluster) as (first, lagging, _third), cluster.plane.webhook_lag(LAGGING):
        for trial in range(3):
            ns = unique(f"named{trial}")
            _namespace(first, ns)
            provider = _deployment(first, ns, "p")
            name = unique("named")
            _critical_service(first, name, {"group": "apps", "resource": "deployments", "namespace": ns,
                                            "name": "p"}, ns)
            assert _wait_ready(cluster, name) == "Enforcing"
            answer = lagging.delete(provider, params=DRY_RUN)
            assert _refused(answer), (trial, answer.status_code, answer.text)
            assert "still exists" in answer.text  # the gate's own reason, not a failed call
            assert (first.get(provider) or {})["metadata"]["labels"][PROTECTED_LABEL] == "true"
            namespace = lagging.delete(f"/api/v1/namespaces/{ns}", params=DRY_RUN)
            assert _refused(namespace), (trial, namespace.text)

        # A selected provider, and a held UPDATE, in one namespace.
        shop = unique("shop")
        _namespace(first, shop)
        member = _deployment(first, shop, "db", {"app": "db"})
        selected = unique("selected")
        _critical_service(first, selected, {"group": "apps", "resource": "deployments", "namespace": shop,
                                            "selector": {"matchLabels": {"app": "db"}}}, shop)
        locked = _deployment(first, shop, "locked")
        held = unique("held")
        _critical_service(first, held, {"group": "apps", "resource": "deployments", "namespace": shop,
                                        "name": "locked"}, shop, holdUpdates="WhileBlocking")
        assert _wait_ready(cluster, selected) == "Enforcing"
        assert _wait_ready(cluster, held) == "Enforcing"
        assert _refused(lagging.delete(member, params=DRY_RUN))
        update = lagging.request("PATCH", locked, params=DRY_RUN, json={"spec": {"replicas": 3}},
                                 headers={"Content-Type": "application/merge-patch+json"})
        assert _refused(update) and "may not be updated yet" in update.text, update.text
        # Nor can the label that does this be taken off, through any API server.
        unlabel = lagging.request("PATCH", member, params=DRY_RUN, json={"metadata": {"labels": {
            PROTECTED_LABEL: None}}}, headers={"Content-Type": "application/merge-patch+json"})
        assert _refused(unlabel) and "may not be removed" in unlabel.text, unlabel.text

        # The negative control: a ConfigMap provider, which the gate may not label, rests on its route by name,
        # which API server 1 does not hold: Ready says so, and API server 1 lets its DELETE through.
        plain = unique("plain")
        _namespace(first, plain)
        assert first.create(f"/api/v1/namespaces/{plain}/configmaps", {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}}).status_code == 201
        by_route = unique("byroute")
        _critical_service(first, by_route, {"resource": "configmaps", "namespace": plain, "name": "settings"}, plain)
        assert _wait_ready(cluster, by_route) == "EnforcingByRoute"
        assert first.delete(f"/api/v1/namespaces/{plain}/configmaps/settings", params=DRY_RUN).status_code == 403
        assert lagging.delete(f"/api/v1/namespaces/{plain}/configmaps/settings",
                              params=DRY_RUN).status_code == 200


def test_an_outage_on_every_api_server_refuses_only_what_is_protected(three: RealCluster) -> None:
    """Round 4's outage (tests/test_realcluster_routing.py, where its negative controls are) on three API servers,
    one of them lagging: with every gate replica frozen, through each API server an unprotected DELETE and UPDATE
    go through at once and the protected DELETE fails closed ("failed calling webhook")."""
    cluster = three
    with clients(cluster) as each, cluster.plane.webhook_lag(LAGGING):
        first = each[0]
        guarded, free = unique("outage-guarded"), unique("outage-free")
        _namespace(first, guarded)
        _namespace(first, free)
        provider = _deployment(first, guarded, "p")
        free_deployments = [_deployment(first, free, f"app-{i}") for i in range(len(each))]
        settings = f"/api/v1/namespaces/{free}/configmaps/settings"
        assert first.create(f"/api/v1/namespaces/{free}/configmaps", {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}}).status_code == 201
        name = unique("outage")
        _critical_service(first, name, {"group": "apps", "resource": "deployments", "namespace": guarded,
                                        "name": "p"}, guarded)
        assert _wait_ready(cluster, name) == "Enforcing"

        answers: dict[tuple[int, str], tuple[int, float, str]] = {}

        def through(index: int, client: Client) -> None:
            for what, send in (
                    ("unprotected DELETE", lambda: client.delete(free_deployments[index])),
                    ("unprotected UPDATE", lambda: client.request(
                        "PATCH", settings, json={"metadata": {"labels": {"outage": str(index)}}},
                        headers={"Content-Type": "application/merge-patch+json"})),
                    ("protected DELETE", lambda: client.delete(
                        provider if index != LAGGING else f"/api/v1/namespaces/{guarded}", params=DRY_RUN))):
                started = time.monotonic()
                answer = send()
                answers[(index, what)] = (answer.status_code, time.monotonic() - started, answer.text)

        with cluster.gate.frozen():
            # One thread per API server: each protected request waits out the webhook's timeout on its own.
            threads = [threading.Thread(target=through, args=(i, c), daemon=True) for i, c in enumerate(each)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
        for index in range(len(each)):
            for what in ("unprotected DELETE", "unprotected UPDATE"):
                status, took, text = answers[(index, what)]
                assert status == 200 and took < AT_ONCE, (index, what, status, took, text)
            # The provider through 0 and 2, its namespace through lagging 1 (each waits out the webhook's timeout).
            status, _took, text = answers[(index, "protected DELETE")]
            assert status == 500 and "failed calling webhook" in text, (index, status, text)


def test_a_provider_created_and_deleted_at_once_through_another_api_server_is_refused(
        three: RealCluster) -> None:
    cluster = three
    with clients(cluster) as (first, lagging, third):
        for trial, other in enumerate((lagging, third, lagging)):
            ns = unique(f"recreate{trial}")
            _namespace(first, ns)
            name = unique("later")
            _critical_service(first, name, {"group": "apps", "resource": "deployments", "namespace": ns,
                                            "name": "p"}, ns)
            assert _wait_ready(cluster, name) == "Enforcing"  # nothing to label yet: routed by name, probed
            # Every API server holds the route by name before the provider exists (no pause here), as it does
            # for a CriticalService older than its lag.
            wait_for(lambda o=other, n=ns: _route_held(o, n), timeout=30, what="the route by name everywhere")
            provider = _deployment(first, ns, "p")
            answer = other.delete(provider, params=DRY_RUN)
            assert _refused(answer), (trial, answer.status_code, answer.text)


def _route_held(client: Client, namespace: str) -> bool:
    """Whether the gate's configuration for `namespace` (its shard of criticalsvc-providers), read through `client`'s
    API server, routes Deployment `namespace`/p by name (a dry-run DELETE of a Deployment that does not exist is 404
    either way, so the route is read instead)."""
    owned = client.get("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/"
                       f"{configuration_name(shard_in(namespace))}") or {}
    return any(f"'{namespace}/p'" in c.get("expression", "") for w in owned.get("webhooks") or []
               for c in w.get("matchConditions") or [])


def test_upgrading_to_the_labels_leaves_no_window(three: RealCluster) -> None:
    cluster = three
    original = cluster.admin.get(SHIPPED)
    assert original is not None
    ns = unique("upgrade")
    _namespace(cluster.admin, ns)
    provider = _deployment(cluster.admin, ns, "p")
    name = unique("upgrade")
    before = copy.deepcopy(original)
    before["webhooks"] = [w for w in before["webhooks"] if w["name"] not in (LABELS_WEBHOOK, LABELLED_UPDATES_WEBHOOK)]
    assert cluster.admin.request("PUT", SHIPPED, json=before).status_code == 200
    answers: list[int] = []
    stop = threading.Event()
    try:
        _critical_service(cluster.admin, name, {"group": "apps", "resource": "deployments", "namespace": ns,
                                                "name": "p"}, ns)
        # The leader reads the shipped configuration at its next resync (10 s): from then on it routes by name
        # what the older configuration cannot route by label, and Ready says so.
        wait_for(lambda: _reason(cluster, name) == "EnforcingByRoute", timeout=60,
                 what="Ready EnforcingByRoute under the configuration from before the labels")

        def deleting() -> None:
            with contextlib.closing(Client(cluster.kubeconfig)) as client:  # through the balancer
                while not stop.is_set():
                    answers.append(client.delete(provider, params=DRY_RUN).status_code)

        thread = threading.Thread(target=deleting, daemon=True)
        thread.start()
        wait_for(lambda: len(answers) >= 5, timeout=30, what="the DELETE loop under way")
        current = copy.deepcopy(original)
        current["metadata"]["resourceVersion"] = cluster.admin.get(SHIPPED)["metadata"]["resourceVersion"]
        assert cluster.admin.request("PUT", SHIPPED, json=current).status_code == 200
        wait_for(lambda: _reason(cluster, name) == "Enforcing", timeout=60, what="Ready Enforcing after the upgrade")
        sent = len(answers)
        wait_for(lambda: len(answers) >= sent + 20, timeout=60, what="20 more DELETEs after the upgrade")
    finally:
        stop.set()
        restored = copy.deepcopy(original)
        restored["metadata"]["resourceVersion"] = cluster.admin.get(SHIPPED)["metadata"]["resourceVersion"]
        cluster.admin.request("PUT", SHIPPED, json=restored)
    assert answers and set(answers) == {403}, sorted(set(answers))


def _reason(cluster: RealCluster, name: str) -> str:
    cs = cluster.admin.get(f"{CRITICAL_SERVICES}/{name}") or {}
    ready = [c for c in (cs.get("status") or {}).get("conditions") or [] if c["type"] == "Ready"]
    return str(ready[0]["reason"]) if ready else ""
