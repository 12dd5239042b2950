"""What a missing read grant does on the real control plane: the status says "cannot verify" (never "may
go"), another team's CriticalService goes on as if it did not exist, and the quick start `up` prints works
verbatim. The stand-in has no RBAC, so a type the gate may not list exists only here; the stand-in side of
the status is tests/test_statuswriter.py (the writer against the stand-in, the type made unreadable)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.backends import RealBackend, deployment_manifest, protect_with_user, unique, widget_crd
from tests.realcluster.__main__ import quick_start
from tests.realcluster.cluster import RealCluster
from tests.realcluster.teardown import RepeatingDeleter, Story, wait_for

pytestmark = pytest.mark.realcluster

ROOT = Path(__file__).resolve().parents[1]
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
CLUSTERROLES = "/apis/rbac.authorization.k8s.io/v1/clusterroles"
CSVCS = "/apis/criticalsvc.io/v1alpha1/criticalservices"


def _reader(group: str) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": f"read-{group}", "labels": {"criticalsvc.io/aggregate-to-reader": "true"}},
            "rules": [{"apiGroups": [group], "resources": ["widgets"], "verbs": ["get", "list", "watch"]}]}


@pytest.fixture
def widgets(realcluster: RealCluster) -> Iterator[str]:
    """A CRD of a unique group that no ClusterRole lets the gate read (the test may grant it)."""
    group = f"{unique('unread')}.example.com"
    assert realcluster.admin.create(CRDS, widget_crd(group)).status_code == 201
    wait_for(lambda: realcluster.admin.get(f"/apis/{group}/v1") is not None, timeout=60, what=f"{group}/v1 served")
    try:
        yield group
    finally:
        realcluster.admin.delete(f"{CRDS}/widgets.{group}")
        realcluster.admin.delete(f"{CLUSTERROLES}/read-{group}")


def _namespace(realcluster: RealCluster, prefix: str) -> str:
    name = unique(prefix)
    created = realcluster.admin.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                              "metadata": {"name": name}})
    assert created.status_code == 201, created.text
    return name


def _status(realcluster: RealCluster, name: str) -> dict[str, Any]:
    cs = realcluster.admin.get(f"{CSVCS}/{name}") or {}
    return dict(cs.get("status") or {})


def _condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), {})


def _blocking(realcluster: RealCluster, name: str) -> tuple[str, str]:
    c = _condition(_status(realcluster, name), "Blocking")
    return c.get("status", ""), c.get("reason", "")


def _columns(realcluster: RealCluster, name: str) -> dict[str, str]:
    """`kubectl get csvc NAME`'s printer columns, cut at the header's offsets (a column may be empty)."""
    done = realcluster.kubectl("get", "csvc", name)
    assert done.returncode == 0, done.stderr
    header, row = done.stdout.splitlines()[:2]
    names = ["NAME", "PROVIDER", "PROVIDER NAMESPACE", "CRITERIA", "UNMET", "BLOCKING", "AGE"]
    starts = [header.index(n) if n != "PROVIDER" else header.index("PROVIDER ") for n in names]
    return {n: row[s:e].strip() for n, s, e in zip(names, starts, [*starts[1:], len(row)], strict=True)}


def _dry_run_delete(realcluster: RealCluster, path: str) -> tuple[int, str]:
    response = realcluster.admin.delete(path, params={"dryRun": "All"})
    return response.status_code, str(response.json().get("message", ""))


def test_status_says_cannot_verify_until_the_grant_then_flips_and_follows_the_provider(
        realcluster: RealCluster, widgets: str) -> None:
    ns = _namespace(realcluster, "unverified")
    name = f"status-{ns}"
    deployments = f"/apis/apps/v1/namespaces/{ns}/deployments"
    cs = {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": name},
          "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": ns, "name": "provider"},
                   "criteria": [{"type": "Resources", "resources": {"group": widgets, "resource": "widgets",
                                                                    "namespace": ns}}]}}
    try:
        # The CREATE is admitted, and kubectl shows the warning naming the grant.
        applied = realcluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(cs))
        assert applied.returncode == 0, applied.stderr
        assert (f"Warning: spec.criteria[0]: the gate may not list widgets.{widgets}; what depends on it is refused "
                f'as unverifiable until a ClusterRole labelled criticalsvc.io/aggregate-to-reader="true" grants get, '
                f"list, watch on widgets.{widgets}\n") in applied.stderr, applied.stderr

        # Withheld: Blocking Unknown with the webhook's own reason, no Unmet count; a provider created meanwhile
        # is followed; its DELETE is refused, never allowed.
        wait_for(lambda: _blocking(realcluster, name) == ("Unknown", "CannotVerify"), timeout=30,
                 what="Blocking Unknown (CannotVerify)")
        status = _status(realcluster, name)
        message = _condition(status, "Blocking")["message"]
        assert message.startswith("criticalsvc could not verify the cluster state, so it does not allow this yet: "
                                  f"the gate may not list widgets.{widgets} (403 Forbidden)"), message
        assert 'ClusterRole labelled criticalsvc.io/aggregate-to-reader="true"' in message
        assert "unmetCriteria" not in status
        # Enforced once the API server is seen routing the provider (the routing probe, design/routing.md).
        wait_for(lambda: _condition(_status(realcluster, name), "Ready")["reason"] == "Enforcing", timeout=30,
                 what="Ready Enforcing")
        columns = _columns(realcluster, name)
        assert columns["BLOCKING"] == "Unknown" and columns["UNMET"] in ("", "<none>"), columns
        created = realcluster.admin.create(deployments, deployment_manifest("provider", ns, replicas=0))
        assert created.status_code == 201
        uid = created.json()["metadata"]["uid"]
        wait_for(lambda: _status(realcluster, name).get("providerUID") == uid, timeout=30,
                 what="providerUID to follow the provider created while unverifiable")
        code, denial = _dry_run_delete(realcluster, f"{deployments}/provider")
        assert code == 403 and f"the gate may not list widgets.{widgets} (403 Forbidden)" in denial, denial
        widget = {"apiVersion": f"{widgets}/v1", "kind": "Widget", "metadata": {"name": "w"}}
        assert realcluster.admin.create(f"/apis/{widgets}/v1/namespaces/{ns}/widgets", widget).status_code == 201

        # Granted: the status flips to what the criteria say.
        assert realcluster.admin.create(CLUSTERROLES, _reader(widgets)).status_code == 201
        wait_for(lambda: _blocking(realcluster, name) == ("True", "CriteriaUnmet"), timeout=90,
                 what="Blocking True once the gate may read the widgets")
        assert _status(realcluster, name)["unmetCriteria"] == 1
        assert _columns(realcluster, name)["UNMET"] == "1"
        assert realcluster.admin.delete(f"/apis/{widgets}/v1/namespaces/{ns}/widgets/w").status_code == 200
        wait_for(lambda: _blocking(realcluster, name) == ("False", "CriteriaMet"), timeout=30, what="CriteriaMet")

        # Re-created provider: the uid follows.
        wait_for(lambda: realcluster.admin.delete(f"{deployments}/provider").status_code == 200, timeout=30,
                 what="the provider's DELETE once the criteria hold")
        wait_for(lambda: realcluster.admin.get(f"{deployments}/provider") is None, timeout=30, what="provider gone")
        again = realcluster.admin.create(deployments, deployment_manifest("provider", ns, replicas=0))
        assert again.status_code == 201
        new_uid = again.json()["metadata"]["uid"]
        assert new_uid != uid
        wait_for(lambda: _status(realcluster, name).get("providerUID") == new_uid, timeout=30,
                 what="providerUID to follow the re-created provider")
    finally:
        realcluster.admin.delete(f"{deployments}/provider")
        wait_for(lambda: realcluster.admin.get(f"{deployments}/provider") is None, timeout=30, what="provider gone")
        wait_for(lambda: realcluster.admin.delete(f"{CSVCS}/{name}").status_code in (200, 404), timeout=30,
                 what="the CriticalService's DELETE")
        realcluster.admin.delete(f"/api/v1/namespaces/{ns}")


def test_one_unreadable_type_holds_up_only_what_needs_it(realcluster: RealCluster, widgets: str) -> None:
    """Team A names a type the gate may not read; team B's CREATE, status and DELETEs go on as if A did not exist."""
    ns_a = _namespace(realcluster, "team-a")
    team_a = f"team-a-{ns_a}"
    widget_path = f"/apis/{widgets}/v1/namespaces/{ns_a}/widgets"
    widget = {"apiVersion": f"{widgets}/v1", "kind": "Widget", "metadata": {"name": "w"}}
    assert realcluster.admin.create(widget_path, widget).status_code == 201
    created = realcluster.admin.create(CSVCS, {
        "apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": team_a},
        "spec": {"provider": {"group": widgets, "resource": "widgets", "namespace": ns_a, "name": "w"},
                 "criteria": [{"type": "Resources", "resources": {"group": widgets, "resource": "widgets",
                                                                  "namespace": ns_a,
                                                                  "selector": {"matchLabels": {"tier": "cache"}}}}]}})
    assert created.status_code == 201, created.text
    ns_b = ""
    try:
        wait_for(lambda: _blocking(realcluster, team_a) == ("Unknown", "CannotVerify"), timeout=30,
                 what="team A's status: cannot verify")
        ns_b, provider, user, team_b = protect_with_user(realcluster.admin, "team-b")  # asserts the CREATE: 201
        wait_for(lambda: _blocking(realcluster, team_b) == ("True", "CriteriaUnmet"), timeout=30,
                 what="team B's status, written as usual")
        code, denial = _dry_run_delete(realcluster, provider)
        assert code == 403 and f"deployments.apps {ns_b}/user still exists" in denial, denial
        assert realcluster.admin.delete(user).status_code == 200
        wait_for(lambda: _dry_run_delete(realcluster, provider)[0] == 200, timeout=30,
                 what="team B's provider DELETE once its criterion holds")
        wait_for(lambda: _blocking(realcluster, team_b) == ("False", "CriteriaMet"), timeout=30,
                 what="team B's status: CriteriaMet")
        # Team A's provider is still refused as unverifiable, never allowed.
        code, denial = _dry_run_delete(realcluster, f"{widget_path}/w")
        assert code == 403 and f"the gate may not list widgets.{widgets} (403 Forbidden)" in denial, denial
        assert _blocking(realcluster, team_a) == ("Unknown", "CannotVerify")
    finally:
        if ns_b:
            realcluster.admin.delete(f"/apis/apps/v1/namespaces/{ns_b}/deployments/provider")
            wait_for(lambda: realcluster.admin.delete(f"{CSVCS}/protects-{ns_b}").status_code in (200, 404),
                     timeout=30, what="team B's CriticalService's DELETE")
            realcluster.admin.delete(f"/api/v1/namespaces/{ns_b}")
        # Team A's teardown needs the grant: its provider's DELETE is refused until the gate may read widgets.
        realcluster.admin.create(CLUSTERROLES, _reader(widgets))
        wait_for(lambda: realcluster.admin.delete(f"{widget_path}/w").status_code in (200, 404), timeout=90,
                 what="team A's provider's DELETE once granted")
        wait_for(lambda: realcluster.admin.delete(f"{CSVCS}/{team_a}").status_code in (200, 404), timeout=30,
                 what="team A's CriticalService's DELETE")
        realcluster.admin.delete(f"/api/v1/namespaces/{ns_a}")


def test_the_quick_start_up_prints_runs_verbatim(realcluster: RealCluster, tmp_path: Path) -> None:
    """Every line `python -m tests.realcluster up` prints, run as it is in bash from the repository's root, takes the
    reference story from apply to gone (the read grant included)."""
    kubectl = realcluster.plane.binaries.kubectl
    text = quick_start(realcluster.kubeconfig, kubectl)
    # No `set -e`: the first apply fails for the CRs by design (their CRD is not established yet), as it does
    # for a person pasting these lines; what counts is where the lines end.
    script = "\n".join(line.strip() for line in text.splitlines())
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env["HOME"] = str(tmp_path)
    story = Story.make("")
    with RealBackend(realcluster).finalizer_controller(story):
        done = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=240, check=False)
    output = f"{done.stdout}\n{done.stderr}"
    # kubectl wait --for=jsonpath=...unmetCriteria=2: the gate could read the story (no count while it cannot).
    assert "criticalservice.criticalsvc.io/for-finalizer-deployment condition met" in done.stdout, output
    lines = done.stdout.splitlines()
    header = next(line for line in lines if line.startswith("NAME ") and " UNMET " in line)
    row = next(line for line in lines if line.startswith("for-finalizer-deployment "))
    cells = {name: row[header.index(name):].split()[0] for name in ("UNMET", "BLOCKING")}
    assert cells == {"UNMET": "2", "BLOCKING": "True"}, output
    assert done.returncode == 0, output
    for path in [*story.paths().values(), f"{CLUSTERROLES}/criticalsvc-read-coolresources"]:
        assert realcluster.admin.get(path) is None, path


def test_stuck_says_when_a_finalizer_waits_on_a_provider_with_no_replica(realcluster: RealCluster) -> None:
    """Condition Stuck on the real control plane (design/criticalservice.md §6, "Finalizers held by an absent
    controller"): a StatefulSet carries the finalizer the provider Deployment would remove, and the Deployment is
    scaled to 0: Stuck is True (FinalizerControllerDown) with the way out; scaled back up (kwok runs its pod, the
    Deployment controller counts it available), Stuck is False (ControllerAvailable). This needs the gate's cache
    to hold the Deployment's spec.replicas and status.availableReplicas, which a metadata-only watch would not."""
    ns = _namespace(realcluster, "stuck")
    finalizer = f"criticalsvc.test/{ns}"
    name = unique("stuck")
    deployments = f"/apis/apps/v1/namespaces/{ns}/deployments"
    statefulsets = f"/apis/apps/v1/namespaces/{ns}/statefulsets"
    assert realcluster.admin.create(deployments, deployment_manifest("ctrl", ns, replicas=0)).status_code == 201
    held = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "held", "finalizers": [finalizer]},
            "spec": {"replicas": 0, "serviceName": "held", "selector": {"matchLabels": {"app": "held"}},
                     "template": {"metadata": {"labels": {"app": "held"}},
                                  "spec": {"containers": [{"name": "c", "image": "registry.example.com/c:1"}]}}}}
    assert realcluster.admin.create(statefulsets, held).status_code == 201
    assert realcluster.admin.create(CSVCS, {
        "apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": name},
        "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": ns, "name": "ctrl"},
                 "criteria": [{"type": "Finalizer", "finalizer": {
                     "group": "apps", "resource": "statefulsets", "finalizerName": finalizer}}]}}).status_code == 201

    def stuck() -> tuple[str, str]:
        c = _condition(_status(realcluster, name), "Stuck")
        return c.get("status", ""), c.get("reason", "")

    try:
        wait_for(lambda: stuck() == ("True", "FinalizerControllerDown"), timeout=30,
                 what="Stuck True (FinalizerControllerDown)")
        message = _condition(_status(realcluster, name), "Stuck")["message"]
        assert f"deployments.apps {ns}/ctrl is scaled to 0 replicas" in message
        assert f"kubectl scale -n {ns} deployments.apps/ctrl --replicas=<n>" in message
        patch = f"kubectl patch statefulsets.apps held -n {ns} --type=json -p '"
        assert patch in message
        realcluster.admin.merge_patch(f"{deployments}/ctrl", {"spec": {"replicas": 1}})
        wait_for(lambda: stuck() == ("False", "ControllerAvailable"), timeout=90,
                 what="Stuck False (ControllerAvailable) once the pod runs")
        # The way out the message gave, run as printed: the finalizer goes, and nothing waits any more.
        found = re.search(r"kubectl patch .*? -p '[^']*'", message)
        assert found is not None, message
        command = found.group(0)
        done = realcluster.kubectl(*shlex.split(command)[1:])
        assert done.returncode == 0, (command, done.stderr)
        wait_for(lambda: stuck() == ("False", "NoFinalizerPending"), timeout=30,
                 what="Stuck False (NoFinalizerPending)")
    finally:
        realcluster.admin.merge_patch(f"{statefulsets}/held", {"metadata": {"finalizers": None}})
        RepeatingDeleter(realcluster.admin, {
            "StatefulSet": f"{statefulsets}/held", "Deployment": f"{deployments}/ctrl",
            "CriticalService": f"{CSVCS}/{name}", "Namespace": f"/api/v1/namespaces/{ns}"}).run(timeout=60)
