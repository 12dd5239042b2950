"""The gate fails closed on a real control plane: stopped, restarted in the middle of a teardown, and
behind watches that expired (etcd compacted, the API server restarted: 410 Gone).

The webhooks are registered with failurePolicy: Fail, so while no gate answers, the API server refuses
every DELETE the webhooks match with "failed calling webhook" (HTTP 500), and a deleter that retries
finishes once the gate is back. These tests stop and restart the session's gate; each leaves one
replica serving.
"""

from __future__ import annotations

import base64
import contextlib
import threading
from collections.abc import Iterator

import httpx
import pytest

from tests.backends import RealBackend, deployment_manifest, protect_with_user, provider_webhook, unique
from tests.realcluster.cluster import RealCluster
from tests.realcluster.teardown import Observer, RepeatingDeleter, Story, apply_story, wait_for

pytestmark = pytest.mark.realcluster

CRITICAL_SERVICES = "/apis/criticalsvc.io/v1alpha1/criticalservices"


@pytest.fixture
def cluster(realcluster: RealCluster) -> Iterator[RealCluster]:
    """The session's real cluster; afterwards its gate serves again, whatever the test did to it."""
    try:
        yield realcluster
    finally:
        replicas = realcluster.gate.replicas
        if not replicas or any(r.process.popen is None or r.process.popen.poll() is not None for r in replicas):
            realcluster.gate.restart()


def _finalizers(cluster: RealCluster, story: Story) -> contextlib.AbstractContextManager[object]:
    """The provider's finalizer-removing controller (a test thread) while the block runs."""
    return RealBackend(cluster).finalizer_controller(story)


def _teardown(cluster: RealCluster, story: Story) -> None:
    with _finalizers(cluster, story):
        assert RepeatingDeleter(cluster.admin, story.paths()).run(timeout=120), "cleanup did not finish"


def test_a_stopped_gate_fails_gated_deletes_with_failed_calling_webhook(cluster: RealCluster) -> None:
    """No gate, no gated deletion: the API server answers 500 "failed calling webhook" for every DELETE its
    webhooks match - the provider, its namespace, its CriticalService - kubectl prints it, nothing is deleted;
    what no CriticalService protects is not routed and goes (design/routing.md). Once the gate is back, the
    same DELETE is answered by the gate again."""
    story = Story.make("stopped")
    apply_story(cluster.kubectl, cluster.admin, story)
    ns = unique("unguarded")
    assert cluster.admin.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                       "metadata": {"name": ns}}).status_code == 201
    assert cluster.admin.create(f"/apis/apps/v1/namespaces/{ns}/deployments",
                                deployment_manifest("free", ns, replicas=0)).status_code == 201
    assert cluster.admin.create(f"/api/v1/namespaces/{ns}/configmaps", {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}}).status_code == 201
    free = f"/apis/apps/v1/namespaces/{ns}/deployments/free"

    cluster.gate.stop()
    # Labelled by the gate (Enforcing), the provider and its namespace are the shipped protected.gate's.
    for path, webhook in ((story.deployment_path, "protected"),
                          (f"/api/v1/namespaces/{story.namespace}", "protected"),
                          (f"{CRITICAL_SERVICES}/{story.critical_service}", "criticalservices")):
        answer = cluster.admin.delete(path)
        assert answer.status_code == 500, f"{path}: {answer.status_code} {answer.text}"
        message = answer.json()["message"]
        assert message.startswith(f'Internal error occurred: failed calling webhook "{webhook}.gate.criticalsvc.io": '
                                  f'failed to call webhook: Post "{cluster.gate.url}/validate?timeout='), message
        assert cluster.admin.exists(path) and "deletionTimestamp" not in cluster.admin.get(path)["metadata"]  # type: ignore[index]
    printed = cluster.kubectl("delete", "deployment", story.deployment_path.rsplit("/", 1)[1], "-n",
                              story.namespace, "--wait=false")
    assert printed.returncode == 1
    assert provider_webhook(printed.stderr).startswith('Error from server (InternalError): Internal error occurred: '
                                                       'failed calling webhook "providers.gate.criticalsvc.io"'), \
        printed.stderr
    assert cluster.admin.delete(free).status_code == 200  # nothing protects it: not routed
    assert cluster.admin.delete(f"/api/v1/namespaces/{ns}/configmaps/cfg").status_code == 200
    assert cluster.admin.delete(f"/api/v1/namespaces/{ns}").status_code == 200

    cluster.gate.restart()
    assert cluster.admin.delete(story.deployment_path).status_code == 403
    _teardown(cluster, story)


def test_a_gate_restarted_mid_teardown_lets_it_complete(cluster: RealCluster) -> None:
    """The reference story torn down by a retrying deleter while the gate stops and starts again: the
    DELETEs sent meanwhile fail (500), the deleter retries, and the teardown completes in the safe order."""
    story = Story.make("restart")
    apply_story(cluster.kubectl, cluster.admin, story)
    observer = Observer(cluster.admin, story.paths())
    deleter = RepeatingDeleter(cluster.admin, story.paths())
    finished: list[bool] = []
    with _finalizers(cluster, story):
        observer.start()
        worker = threading.Thread(target=lambda: finished.append(deleter.run(timeout=180)), daemon=True)
        worker.start()
        try:
            wait_for(lambda: any(a.status == 403 for a in deleter.attempts), timeout=60,
                     what="the first refusal (the teardown under way)")
            cluster.gate.stop()
            wait_for(lambda: any(a.status == 500 for a in deleter.attempts), timeout=30,
                     what="a DELETE failing while no gate answers")
            cluster.gate.restart()
            worker.join(200)
        finally:
            observer.stop()
    assert finished == [True], f"teardown did not finish; last answers: {deleter.attempts[-3:]}"
    assert observer.order_violations(story.dependents()) == []
    failed = [a for a in deleter.attempts if a.status == 500]
    assert failed and all("failed calling webhook" in a.message for a in failed)


def _etcd(cluster: RealCluster, method: str, body: dict[str, object]) -> dict[str, object]:
    """etcd's gRPC gateway (JSON over HTTP on the client URL)."""
    answer = httpx.post(f"{cluster.plane.etcd_url}/v3/{method}", json=body, timeout=30)
    answer.raise_for_status()
    result: dict[str, object] = answer.json()
    return result


def test_an_expired_watch_relists_and_allows_nothing_wrongly(cluster: RealCluster) -> None:
    """etcd compacted to its newest revision and the API server restarted: the gate's watches come back
    to versions that no longer exist (410 Gone) and list again. A protection restored right after the
    restart is honoured at once: the gate's ALLOW is confirmed by a fresh read, never taken from a
    cache that has not caught up."""
    admin = cluster.admin
    ns, provider, user, service = protect_with_user(admin, "expired")
    deployments = f"/apis/apps/v1/namespaces/{ns}/deployments"

    def dry_run() -> int:
        return admin.delete(provider, params={"dryRun": "All"}).status_code

    wait_for(lambda: dry_run() == 403, timeout=60, what="the gate to protect the provider")
    assert admin.delete(user).status_code == 200
    wait_for(lambda: dry_run() == 200, timeout=60, what="the gate to see the criterion met")

    log = cluster.gate.replicas[0].process.log_path
    seen = log.stat().st_size
    revision = int(_etcd(cluster, "kv/range", {"key": base64.b64encode(b"/").decode()})["header"]["revision"])  # type: ignore[index]
    _etcd(cluster, "kv/compaction", {"revision": revision, "physical": True})
    cluster.plane.restart_apiserver()
    # The protection comes back while the gate's watches are still finding their way back.
    assert admin.create(deployments, deployment_manifest("user", ns, replicas=0)).status_code == 201
    assert dry_run() == 403, "a DELETE was allowed on a cache that had not caught up"
    wait_for(lambda: "410 Gone" in log.read_text(errors="replace")[seen:], timeout=60,
             what="the gate's watches to meet 410 Gone and list again")
    wait_for(cluster.gate.replicas[0].ready, timeout=60, what="the gate to be ready again")
    assert dry_run() == 403
    # The restarts are counted per resource, in kubectl's spelling (what test_realcluster_load reads).
    for resource in ("criticalservices.criticalsvc.io", "namespaces", "deployments.apps"):
        assert cluster.gate.replicas[0].metric("criticalsvc_watch_restarts_total", resource=resource) >= 1, resource

    assert admin.delete(user).status_code == 200
    wait_for(lambda: admin.delete(provider).status_code in (200, 404), timeout=60, what="the provider DELETE")
    wait_for(lambda: admin.delete(f"{CRITICAL_SERVICES}/{service}").status_code in (200, 404), timeout=60,
             what="the CriticalService DELETE")
    assert admin.delete(f"/api/v1/namespaces/{ns}").status_code == 200
