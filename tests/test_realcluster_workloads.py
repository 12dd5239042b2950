"""The real control plane runs workloads (issue 19, item 2), and the conditions examples hold on phases the
system set, not on phases a test wrote (item 2's last sentence).

kube-scheduler binds pods to the fake Node `kwok-node-0`, and kwok plays its kubelet with the stages its
own module ships (tests/realcluster/controlplane.py): a Deployment becomes Available, a Job Complete, a
bound pod Running and, for a Job, Succeeded; a deleted bound pod is kept with a deletionTimestamp until
its "kubelet" lets it go, and a namespace deletion waits for that. The bound claim of the OpenKruise
example is bound by kube-controller-manager's PersistentVolume binder to a static volume.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.backends import ok, unique
from tests.realcluster.cluster import RealCluster
from tests.realcluster.controlplane import KWOK_NODE
from tests.realcluster.teardown import wait_for

pytestmark = pytest.mark.realcluster

EXAMPLES = Path(__file__).resolve().parents[1] / "api" / "examples"
CRITICAL_SERVICES = "/apis/criticalsvc.io/v1alpha1/criticalservices"
CLUSTERROLES = "/apis/rbac.authorization.k8s.io/v1/clusterroles"
NAMESPACES = "/api/v1/namespaces"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
IMAGE = "registry.example.com/app:1"


def _pods(cluster: RealCluster, namespace: str, selector: str = "") -> list[dict[str, Any]]:
    listed = cluster.admin.get(f"{NAMESPACES}/{namespace}/pods" + (f"?labelSelector={selector}" if selector else ""))
    assert listed is not None
    items: list[dict[str, Any]] = listed["items"]
    return items


def _condition(obj: dict[str, Any] | None, type_: str) -> str | None:
    return next((c["status"] for c in ((obj or {}).get("status") or {}).get("conditions") or []
                 if c["type"] == type_), None)


def _dry_delete(cluster: RealCluster, *target: str) -> Any:
    return cluster.kubectl("delete", *target, "--dry-run=server", "--wait=false")


def _refusal(cluster: RealCluster, *target: str) -> str:
    """The gate's refusal of a server-side dry-run DELETE of `target` ('' when it is allowed)."""
    answer = _dry_delete(cluster, *target)
    return "" if answer.returncode == 0 else str(answer.stderr)


def _remove(cluster: RealCluster, *paths: str, timeout: float = 120) -> None:
    for path in paths:
        wait_for(lambda p=path: cluster.admin.delete(p).status_code == 404 and not cluster.admin.exists(p),
                 timeout=timeout, what=f"{path} to be gone", interval=0.5)


@pytest.fixture
def namespace(realcluster: RealCluster) -> Iterator[str]:
    name = unique("work")
    assert realcluster.admin.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": name}}).status_code == 201
    yield name
    realcluster.admin.delete(f"{NAMESPACES}/{name}")


@pytest.fixture
def kwok_paused(realcluster: RealCluster) -> Iterator[None]:
    """kwok stopped (SIGSTOP) for the test's body: a "kubelet" that has not yet stopped its containers."""
    kwok = realcluster.plane.kwok
    kwok.signal(signal.SIGSTOP)
    try:
        yield
    finally:
        kwok.signal(signal.SIGCONT)


def test_a_deployment_becomes_available_with_running_pods_on_the_node(realcluster: RealCluster,
                                                                       namespace: str) -> None:
    """Scheduled to the fake Node, its pods Ready and Running with an IP; the Deployment Available, 2/2."""
    manifest = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                         "template": {"metadata": {"labels": {"app": "web"}},
                                      "spec": {"containers": [{"name": "web", "image": IMAGE}]}}}}
    path = f"/apis/apps/v1/namespaces/{namespace}/deployments"
    assert realcluster.admin.create(path, manifest).status_code == 201
    wait_for(lambda: _condition(realcluster.admin.get(f"{path}/web"), "Available") == "True"
             and (realcluster.admin.get(f"{path}/web") or {})["status"].get("availableReplicas") == 2,
             timeout=90, what="the Deployment to be Available with 2 replicas")
    pods = _pods(realcluster, namespace, "app=web")
    assert [(p["spec"]["nodeName"], p["status"]["phase"], _condition(p, "Ready")) for p in pods] == [
        (KWOK_NODE, "Running", "True")] * 2
    assert all(p["status"]["podIP"] for p in pods)
    listed = ok(realcluster.kubectl("get", "deployment", "web", "-n", namespace, "--no-headers"))
    assert listed.split()[1] == "2/2"


def test_a_job_completes_and_its_pod_succeeded_by_itself(realcluster: RealCluster, namespace: str) -> None:
    """The Job controller creates the pod, kwok runs it to Succeeded (exit 0), the Job is Complete."""
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "report"},
           "spec": {"template": {"spec": {"restartPolicy": "Never",
                                          "containers": [{"name": "report", "image": IMAGE}]}}}}
    path = f"/apis/batch/v1/namespaces/{namespace}/jobs"
    assert realcluster.admin.create(path, job).status_code == 201
    wait_for(lambda: _condition(realcluster.admin.get(f"{path}/report"), "Complete") == "True", timeout=90,
             what="the Job to be Complete")
    assert (realcluster.admin.get(f"{path}/report") or {})["status"]["succeeded"] == 1
    [pod] = _pods(realcluster, namespace, "batch.kubernetes.io/job-name=report")
    assert pod["status"]["phase"] == "Succeeded"
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0


def test_a_bound_pod_is_deleted_gracefully_and_its_namespace_waits_for_it(
        realcluster: RealCluster, namespace: str, kwok_paused: None) -> None:
    """A DELETE of a pod bound to a node only marks it (deletionTimestamp, 30 s grace): the "kubelet"
    deletes it once its containers stopped. A pod bound to no node goes at once. The namespace stays
    Terminating while a pod terminates, and goes when the pod does."""
    pods = f"{NAMESPACES}/{namespace}/pods"
    bound = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bound"},
             "spec": {"nodeName": KWOK_NODE, "containers": [{"name": "c", "image": IMAGE}]}}
    unbound = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "unbound"},
               "spec": {"nodeSelector": {"no-such-label": "x"}, "containers": [{"name": "c", "image": IMAGE}]}}
    for pod in (bound, unbound):
        assert realcluster.admin.create(pods, pod).status_code == 201
    # Nothing runs while kwok is paused; the Node is still the bound pod's, so its DELETE is graceful.
    deleted = realcluster.admin.delete(f"{pods}/bound")
    assert deleted.status_code == 200, deleted.text
    assert deleted.json()["metadata"]["deletionGracePeriodSeconds"] == 30
    assert realcluster.admin.delete(f"{pods}/unbound").status_code == 200
    assert not realcluster.admin.exists(f"{pods}/unbound")
    assert realcluster.admin.delete(f"{NAMESPACES}/{namespace}").status_code == 200
    time.sleep(5)  # what a kubelet slow to stop the containers looks like: both still there
    still = realcluster.admin.get(f"{pods}/bound")
    assert still is not None and still["metadata"]["deletionTimestamp"]
    assert (realcluster.admin.get(f"{NAMESPACES}/{namespace}") or {})["status"]["phase"] == "Terminating"
    realcluster.plane.kwok.signal(signal.SIGCONT)
    wait_for(lambda: not realcluster.admin.exists(f"{NAMESPACES}/{namespace}"), timeout=120,
             what="the namespace to go once its pod's kubelet let the pod go")


# --- the conditions examples, on phases the system set ------------------------------------------------

def _apply(cluster: RealCluster, docs: list[dict[str, Any]]) -> None:
    text = yaml.safe_dump_all(docs)
    last: list[str] = [""]

    def applied() -> bool:
        done = cluster.kubectl("apply", "-f", "-", input=text)
        last[0] = done.stderr
        return bool(done.returncode == 0)

    wait_for(applied, timeout=60, what=f"kubectl apply to succeed ({last[0]})", interval=0.5)


def _example(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text(encoding="utf-8")) if d]


def _reader(name: str, *resources: str) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name, "labels": {"criticalsvc.io/aggregate-to-reader": "true"}},
            "rules": [{"apiGroups": [""], "resources": list(resources), "verbs": ["get", "list", "watch"]}]}


def test_conditions_example_a_jobs_succeeded_pod_stops_counting_and_running_pods_block(
        realcluster: RealCluster) -> None:
    """api/examples/conditions.yaml with its finished report a Job and its running one a bare Pod, their
    phases set by the system: job-broker is refused for batch/report-2 (Running) and the Deployment ingest
    (2 replicas, its pods Running), never for the Job's Succeeded pod nor the archiver (0 replicas); with
    report-2 deleted (gracefully) and ingest scaled to zero, job-broker may go."""
    docs = [d for d in _example("conditions.yaml") if d["kind"] != "Pod"]  # their status was the snapshot's
    report_job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "report-1", "namespace": "batch"},
                  "spec": {"template": {"spec": {"restartPolicy": "Never",
                                                 "containers": [{"name": "report", "image": IMAGE}]}}}}
    running = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "report-2", "namespace": "batch"},
               "spec": {"restartPolicy": "Never", "containers": [{"name": "report", "image": IMAGE}]}}
    reader = _reader("criticalsvc-read-conditions-example", "pods")
    jobs = "/apis/batch/v1/namespaces/batch/jobs"
    try:
        _apply(realcluster, [reader, *docs, report_job, running])
        wait_for(lambda: _condition(realcluster.admin.get(f"{jobs}/report-1"), "Complete") == "True", timeout=90,
                 what="the Job report-1 to be Complete")
        [finished] = _pods(realcluster, "batch", "batch.kubernetes.io/job-name=report-1")
        assert finished["status"]["phase"] == "Succeeded"
        wait_for(lambda: sorted(p["status"].get("phase", "") for p in _pods(realcluster, "batch")) ==
                 ["Running", "Running", "Running", "Succeeded"], timeout=90,
                 what="report-2 and ingest's two pods Running")
        ingest = sorted(p["metadata"]["name"] for p in _pods(realcluster, "batch", "app=ingest"))

        def refused_for_the_running_ones() -> bool:
            answer = _refusal(realcluster, "deployment", "job-broker", "-n", "broker")
            return "CriticalService for-job-broker" in answer and all(clause in answer for clause in (
                "pods in namespace batch still exist (3 objects;",
                "deployments.apps batch/ingest in namespace batch still exists", "batch/report-2",
                *(f"batch/{name}" for name in ingest)))

        wait_for(refused_for_the_running_ones, timeout=120,
                 what="job-broker to be refused for report-2, ingest and ingest's pods")
        answer = _refusal(realcluster, "deployment", "job-broker", "-n", "broker")
        assert finished["metadata"]["name"] not in answer and "archiver" not in answer, answer

        ok(realcluster.kubectl("delete", "pod", "report-2", "-n", "batch", "--wait=false"))
        ok(realcluster.kubectl("scale", "deployment", "ingest", "-n", "batch", "--replicas=0"))
        wait_for(lambda: _refusal(realcluster, "deployment", "job-broker", "-n", "broker") == "", timeout=90,
                 what="job-broker to be deletable once no pod is active and no Deployment has replicas")
        # The Job's Succeeded pod is still there: it never counted.
        assert [p["metadata"]["name"] for p in _pods(realcluster, "batch")] == [finished["metadata"]["name"]]
    finally:
        # The criteria's namespace first, then the provider's, then the CriticalService (it goes after its provider).
        _remove(realcluster, f"{NAMESPACES}/batch", f"{NAMESPACES}/broker", f"{CRITICAL_SERVICES}/for-job-broker",
                f"{CLUSTERROLES}/criticalsvc-read-conditions-example")


def test_openkruise_example_bound_claim_and_running_pods_hold_the_namespace(realcluster: RealCluster) -> None:
    """api/examples/openkruise-cascading.yaml plus a claim bound by the PersistentVolume binder to a static
    volume: the namespace is refused for the Bound claim and the worker's Running pod; the claim deleted
    (the PVC-protection controller lets it go, no pod uses it) and the worker scaled to zero (its pod
    deleted gracefully), the namespace may go."""
    ns, volume = "kruise-demo", unique("kruise-pv")
    pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": volume},
          "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                   "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": f"/tmp/{volume}"}}}
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data", "namespace": ns},
             "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": volume,
                      "resources": {"requests": {"storage": "1Gi"}}}}
    claim_path = f"{NAMESPACES}/{ns}/persistentvolumeclaims/data"
    try:
        _apply(realcluster, [*_example("openkruise-cascading.yaml"), pv, claim])
        wait_for(lambda: ((realcluster.admin.get(claim_path) or {}).get("status") or {}).get("phase") == "Bound",
                 timeout=90, what="the PersistentVolume binder to bind the claim")
        bound = (realcluster.admin.get(f"/api/v1/persistentvolumes/{volume}") or {})["status"]["phase"]
        assert bound == "Bound"
        wait_for(lambda: [p["status"].get("phase") for p in _pods(realcluster, ns, "app=worker")] == ["Running"],
                 timeout=90, what="the worker's pod Running")
        [worker] = _pods(realcluster, ns, "app=worker")

        def refused_for_claim_and_pod() -> bool:
            answer = _refusal(realcluster, "namespace", ns)
            return "CriticalService kruise-demo-cascading" in answer and all(
                n in answer for n in (f"{ns}/data", f"{ns}/{worker['metadata']['name']}"))

        wait_for(refused_for_claim_and_pod, timeout=120, what="the namespace to be refused for the claim and the pod")

        ok(realcluster.kubectl("delete", "pvc", "data", "-n", ns, "--wait=false"))
        wait_for(lambda: not realcluster.admin.exists(claim_path), timeout=60,
                 what="the claim to go (PVC protection: no pod uses it)")
        assert f"{ns}/data" not in _refusal(realcluster, "namespace", ns)
        ok(realcluster.kubectl("scale", "deployment", "worker", "-n", ns, "--replicas=0"))
        wait_for(lambda: _refusal(realcluster, "namespace", ns) == "", timeout=90,
                 what="the namespace to be deletable once its pod is gone and nothing has replicas")
        assert _pods(realcluster, ns) == []
    finally:
        realcluster.kubectl("scale", "deployment", "worker", "-n", ns, "--replicas=0")
        _remove(realcluster, f"/apis/kruise-demo.example.com/v1/namespaces/{ns}/widgets/first",
                f"{CRDS}/widgets.kruise-demo.example.com", claim_path, f"{NAMESPACES}/{ns}",
                f"/api/v1/persistentvolumes/{volume}",
                f"{CRITICAL_SERVICES}/kruise-demo-cascading", f"{CRITICAL_SERVICES}/widgets-crd-cascading",
                f"{CLUSTERROLES}/criticalsvc-read-kruise-demo")


def test_the_node_is_ready_and_keeps_its_heartbeat(realcluster: RealCluster) -> None:
    """The fake Node is Ready, untainted (the node-lifecycle controller took the not-ready taint off), and
    kwok's heartbeat stage renews its Ready condition (every 20-25 s), so the Node never turns NotReady."""
    def heartbeat() -> str:
        node = json.loads(ok(realcluster.kubectl("get", "node", KWOK_NODE, "-o", "json")))
        return str(next(c["lastHeartbeatTime"] for c in node["status"]["conditions"] if c["type"] == "Ready"))

    assert realcluster.plane.node_ready()
    first = heartbeat()
    wait_for(lambda: heartbeat() != first, timeout=60, what="kwok to renew the Node's heartbeat", interval=1)
    assert realcluster.plane.node_ready()
