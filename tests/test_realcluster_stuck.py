"""`criticalsvc explain` on namespaces the real control plane leaves stuck Terminating (design/discover.md).

* **An APIService without a server**: its Deployment scaled to 0, the APIService unavailable (MissingEndpoints),
  a namespace deleted: kube-controller-manager's namespace controller cannot discover every group, sets
  NamespaceDeletionDiscoveryFailure, and waits. `explain ns/NAME` traces it to the APIService, its Service with
  no ready endpoints and the Deployment scaled to 0, with the ways out; once the APIService is deleted (the
  unsafe way out it names), the namespace goes.
* **CRs whose finalizer's controller was deleted first**: NamespaceFinalizersRemaining; `explain` names the
  finalizer, the objects, that no workload processes it, and the patch that removes it (marked unsafe); the
  patch applied, the namespace goes.

Both share the session's `realcluster`: the APIService is deleted in a `finally`, since while it is
unavailable no namespace of any other test can finish deleting either.
"""

from __future__ import annotations

import contextlib
import json
import shlex
from collections.abc import Iterator

import pytest

from criticalsvc.cli import main
from tests.backends import deployment_manifest, unique, widget_crd
from tests.realcluster.cluster import RealCluster
from tests.realcluster.teardown import wait_for

pytestmark = pytest.mark.realcluster

APISERVICES = "/apis/apiregistration.k8s.io/v1/apiservices"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
# The namespace controller retries a failed pass with backoff (seconds at first): a condition within a minute.
STUCK_WITHIN = 90.0


def _namespace(cluster: RealCluster, name: str) -> None:
    assert cluster.admin.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                       "metadata": {"name": name}}).status_code == 201


def _condition(cluster: RealCluster, namespace: str, kind: str) -> dict | None:
    ns = cluster.admin.get(f"/api/v1/namespaces/{namespace}") or {}
    return next((c for c in (ns.get("status") or {}).get("conditions") or []
                 if c.get("type") == kind and c.get("status") == "True"), None)


def _explain(cluster: RealCluster, target: str, capsys: pytest.CaptureFixture[str]) -> tuple[str, dict]:
    assert main(["explain", target, "--kubeconfig", str(cluster.kubeconfig)]) == 0
    text = capsys.readouterr().out
    assert main(["explain", target, "--kubeconfig", str(cluster.kubeconfig), "-o", "json"]) == 0
    return text, json.loads(capsys.readouterr().out)


@contextlib.contextmanager
def _apiservice(cluster: RealCluster, name: str, namespace: str, service: str) -> Iterator[None]:
    version, _, group = name.partition(".")
    body = {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": name},
            "spec": {"group": group, "version": version, "groupPriorityMinimum": 100, "versionPriority": 100,
                     "insecureSkipTLSVerify": True, "service": {"namespace": namespace, "name": service, "port": 443}}}
    assert cluster.admin.create(APISERVICES, body).status_code == 201
    try:
        yield
    finally:
        cluster.admin.delete(f"{APISERVICES}/{name}")


def test_a_namespace_stuck_on_an_apiservice_without_server(realcluster: RealCluster,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """NamespaceDeletionDiscoveryFailure is traced to the APIService, its Service's missing endpoints and the
    Deployment scaled to 0; deleting the APIService (the unsafe way out it names) lets the namespace go."""
    server, victim = unique("x-server"), unique("victim")
    group = f"{server}.example.com"
    name = f"v1beta1.{group}"
    for ns in (server, victim):
        _namespace(realcluster, ns)
    admin = realcluster.admin
    assert admin.create(f"/apis/apps/v1/namespaces/{server}/deployments",
                        deployment_manifest("x-api", server, replicas=0)).status_code == 201
    assert admin.create(f"/api/v1/namespaces/{server}/services", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "x-api"},
        "spec": {"selector": {"app": "x-api"}, "ports": [{"port": 443, "targetPort": 8443}]}}).status_code == 201
    with _apiservice(realcluster, name, server, "x-api"):
        wait_for(lambda: ((admin.get(f"{APISERVICES}/{name}") or {}).get("status") or {}).get("conditions"),
                 timeout=30, what=f"APIService {name} to get its Available condition")
        assert admin.delete(f"/api/v1/namespaces/{victim}").status_code == 200
        wait_for(lambda: _condition(realcluster, victim, "NamespaceDeletionDiscoveryFailure") is not None,
                 timeout=STUCK_WITHIN, what=f"namespace {victim} to report NamespaceDeletionDiscoveryFailure")
        text, data = _explain(realcluster, f"ns/{victim}", capsys)
        assert "STUCK TERMINATING since" in text, text
        assert f"cause: APIService {name} is unavailable" in text, text
        assert f"Service {server}/x-api has no ready endpoints; its Deployment {server}/x-api is scaled to 0 " \
               "replicas" in text, text
        assert f"way out: kubectl scale -n {server} deployments.apps/x-api --replicas=1" in text, text
        (cause,) = data["stuck"]["causes"]
        assert cause["waysOut"][-1]["text"].startswith(f"kubectl delete apiservice {name}")
        assert cause["waysOut"][-1]["unsafe"]
    wait_for(lambda: not admin.exists(f"/api/v1/namespaces/{victim}"), timeout=STUCK_WITHIN,
             what=f"namespace {victim} to go once the APIService is deleted")
    admin.delete(f"/api/v1/namespaces/{server}")


def test_a_namespace_stuck_on_crs_whose_controller_was_deleted(realcluster: RealCluster,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """NamespaceFinalizersRemaining with the controller deleted first: explain names the finalizer, the objects
    and that nothing processes it, and the unsafe patch; applied, the namespace goes."""
    group, controller_ns, apps = f"{unique('stuck')}.example.com", unique("widget-system"), unique("apps")
    finalizer = f"{group}/cleanup"
    admin = realcluster.admin
    assert admin.create(CRDS, widget_crd(group)).status_code == 201
    try:
        done = realcluster.kubectl("wait", "--for=condition=Established", "--timeout=30s", f"crd/widgets.{group}",
                                   timeout=40)
        assert done.returncode == 0, done.stderr
        for ns in (controller_ns, apps):
            _namespace(realcluster, ns)
        deployments = f"/apis/apps/v1/namespaces/{controller_ns}/deployments"
        assert admin.create(deployments, deployment_manifest("widget-controller", controller_ns, 1)).status_code == 201
        widgets = f"/apis/{group}/v1/namespaces/{apps}/widgets"
        for n in ("alpha", "beta"):
            assert admin.create(widgets, {"apiVersion": f"{group}/v1", "kind": "Widget",
                                          "metadata": {"name": n, "finalizers": [finalizer]}}).status_code == 201
        # The controller goes first: what a `kubectl delete -f` of the operator and its users does in file order.
        assert admin.delete(f"{deployments}/widget-controller").status_code == 200
        assert admin.delete(f"/api/v1/namespaces/{apps}").status_code == 200
        wait_for(lambda: _condition(realcluster, apps, "NamespaceFinalizersRemaining") is not None,
                 timeout=STUCK_WITHIN, what=f"namespace {apps} to report NamespaceFinalizersRemaining")
        text, data = _explain(realcluster, f"ns/{apps}", capsys)
        assert f"2 widgets.{group} ({apps}/alpha, {apps}/beta) wait for finalizer {finalizer}" in text, text
        assert "no running workload processes it" in text, text
        (cause,) = data["stuck"]["causes"]
        patch = cause["waysOut"][-1]
        assert patch["unsafe"].startswith("the cleanup the finalizer guards never runs")
        for n in ("alpha", "beta"):  # the way out it printed, for each object
            command = shlex.split(patch["text"].replace(" alpha ", f" {n} "))
            assert command[:2] == ["kubectl", "patch"]
            done = realcluster.kubectl(*command[1:])
            assert done.returncode == 0, done.stderr
        wait_for(lambda: not admin.exists(f"/api/v1/namespaces/{apps}"), timeout=STUCK_WITHIN,
                 what=f"namespace {apps} to go once the finalizers are removed")
    finally:
        admin.delete(f"{CRDS}/widgets.{group}")
        admin.delete(f"/api/v1/namespaces/{controller_ns}")
