"""The gate's rules as a user meets them, on both clusters (the stand-in and the real control plane,
through the `cluster` fixture): namespace deletion through the namespace controller, deletecollection,
server-side dry-run, CRD deletion, the deletion-protected label, Warn enforcement, invalid and cyclic
CriticalServices, status and Events across a delete-and-recreate, foreground deletion, and the
finalizer rule the Finalizer criterion relies on. The real API server is the reference: each test
asserts what it answers and prints, so a stand-in that departs from it fails.

Most tests protect a Deployment "provider" with a CriticalService whose one criterion is another
Deployment "user" (SpecificResource): the provider is protected while its user exists, and deleting
the user meets the criterion. ("user" sorts after "provider": clients that delete in name order meet
the provider first.) Names are unique per test; each test removes what it made
(the real cluster is shared by the session).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from typing import Any

from tests.backends import Backend, deployment_manifest, ok, unique
from tests.realcluster.teardown import Story, apply_story, wait_for

CRITICAL_SERVICES = "/apis/criticalsvc.io/v1alpha1/criticalservices"
GATE = "criticalsvc.io"


def _deployments(ns: str) -> str:
    return f"/apis/apps/v1/namespaces/{ns}/deployments"


def _critical_service(name: str, provider_ns: str, provider: str, criteria: list[dict[str, Any]],
                      **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": name},
            "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": provider_ns,
                                  "name": provider}, "criteria": criteria, **spec}}


def _deployment_exists(ns: str, name: str) -> dict[str, Any]:
    return {"type": "SpecificResource", "specificResource": {"group": "apps", "resource": "deployments",
                                                             "namespace": ns, "name": name}}


def _create(cluster: Backend, path: str, body: dict[str, Any]) -> dict[str, Any]:
    created = cluster.admin.create(path, body)
    assert created.status_code == 201, created.text
    result: dict[str, Any] = created.json()
    return result


def _refused(cluster: Backend, path: str) -> bool:
    """The gate refuses a dry-run DELETE of `path` (protected, or labelled): a refusal because it cannot
    verify (a cache still listing a type another test's CriticalService just started naming) says
    nothing about protection and is waited out."""
    answer = cluster.admin.delete(path, params={"dryRun": "All"})
    return answer.status_code == 403 and "could not verify" not in answer.text


def _delete_when_allowed(cluster: Backend, path: str, *, timeout: float = 60, **params: str) -> None:
    """DELETE until the gate (whose caches follow the cluster by watch) lets it through, then until it is gone."""
    wait_for(lambda: cluster.admin.delete(path, params=params or None).status_code in (200, 202, 404),
             timeout=timeout, what=f"DELETE {path} to be allowed")
    wait_for(lambda: not cluster.admin.exists(path), timeout=timeout, what=f"{path} to be gone")


def _ready_reason(cluster: Backend, service: str) -> str:
    cs = cluster.admin.get(f"{CRITICAL_SERVICES}/{service}") or {}
    ready = [c for c in (cs.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"]
    return str(ready[0].get("reason")) if ready else ""


@contextlib.contextmanager
def _protected(cluster: Backend, ns: str, *, enforcement: str | None = None) -> Iterator[tuple[str, str]]:
    """Deployments `provider` and `user` in `ns` and a CriticalService protecting `provider` until
    `user` is gone; yields (service name, provider path). Afterwards: user, provider, service."""
    for name in ("provider", "user"):
        _create(cluster, _deployments(ns), deployment_manifest(name, ns, replicas=0))
    service = f"protects-{ns}"
    spec = {"enforcement": enforcement} if enforcement else {}
    _create(cluster, CRITICAL_SERVICES, _critical_service(service, ns, "provider", [_deployment_exists(ns, "user")],
                                                          **spec))
    provider = f"{_deployments(ns)}/provider"
    try:
        if enforcement is None:
            wait_for(lambda: _refused(cluster, provider), timeout=60, what=f"the gate to protect {provider}")
            # Enforcing: the gate's label is stored, so the shipped protected.gate is the webhook that answers.
            wait_for(lambda: _ready_reason(cluster, service) == "Enforcing", timeout=60,
                     what=f"{service} Ready=True/Enforcing")
        yield service, provider
    finally:
        for path in (f"{_deployments(ns)}/user", provider, f"{CRITICAL_SERVICES}/{service}"):
            if cluster.admin.exists(path):
                _delete_when_allowed(cluster, path)


def _denial(webhook: str, what: str, service: str) -> str:
    """The start of what the API server answers for a gate denial (the webhook's message after its prefix)."""
    return f'admission webhook "{webhook}.gate.{GATE}" denied the request: {what} may not be deleted yet: ' \
           f"CriticalService {service} protects it until:"


def _events(cluster: Backend, service: str) -> list[dict[str, Any]]:
    listed = cluster.admin.get("/api/v1/namespaces/default/events") or {}
    return [e for e in listed.get("items") or []
            if e.get("involvedObject", {}).get("name") == service and e.get("reason") == "DeletionBlocked"]


# --- namespace deletion ------------------------------------------------------------------------------
def test_a_denied_namespace_delete_changes_nothing_and_the_namespace_controller_finishes_later(
        cluster: Backend) -> None:
    """A provider's namespace may not go while the provider is needed; the denial leaves the namespace
    Active (no deletionTimestamp). Once allowed, the namespace controller deletes pods first (ordered
    namespace deletion, GA in 1.34): a pod held by a finalizer keeps the Deployments in place."""
    ns = unique("nsdel")
    ns_path = f"/api/v1/namespaces/{ns}"
    _create(cluster, "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "held", "finalizers": ["example.com/hold"]},
           "spec": {"containers": [{"name": "c", "image": "registry.example.com/c:1"}]}}
    _create(cluster, f"{ns_path}/pods", pod)
    with _protected(cluster, ns) as (_, provider):
        denied = cluster.admin.delete(ns_path)
        assert denied.status_code == 403, denied.text
        assert denied.json()["message"].startswith(
            f'admission webhook "protected.gate.{GATE}" denied the request: namespaces {ns} may not be deleted yet: ')
        after = cluster.admin.get(ns_path) or {}
        assert "deletionTimestamp" not in after["metadata"] and after["status"]["phase"] == "Active"
        printed = cluster.kubectl("delete", "namespace", ns, "--wait=false")
        assert printed.returncode == 1
        assert _error_line(printed.stderr).startswith(f"Error from server (Forbidden): {denied.json()['message']}"), \
            printed.stderr
        assert printed.stderr.startswith(f"Warning: namespaces {ns} may not be deleted while "), printed.stderr

        cluster.admin.delete(f"{_deployments(ns)}/user")
        wait_for(lambda: cluster.admin.delete(ns_path).status_code == 200, timeout=60,
                 what=f"namespace {ns} DELETE to be allowed")
        wait_for(lambda: (cluster.admin.get(f"{ns_path}/pods/held") or {}).get("metadata", {}).get("deletionTimestamp"),
                 timeout=60, what="the namespace controller to delete the pod")
        # Pods first: while the held pod remains, the namespace controller leaves the provider alone.
        # (An observation window, not a wait for readiness: 2 s in which the controller would have acted.)
        for _ in range(10):
            provider_now = cluster.admin.get(provider)
            assert provider_now is not None and "deletionTimestamp" not in provider_now["metadata"]
            time.sleep(0.2)
        cluster.admin.merge_patch(f"{ns_path}/pods/held", {"metadata": {"finalizers": None}})
        wait_for(lambda: not cluster.admin.exists(ns_path), timeout=90, what=f"namespace {ns} to be gone")
        assert not cluster.admin.exists(provider)


# --- deletecollection, kubectl delete --all ----------------------------------------------------------
def test_deletecollection_admits_each_item_with_an_empty_name(cluster: Backend, namespace: str) -> None:
    """DELETE on the collection: the API server admits each item on its own (the request's name is "",
    the gate reads oldObject); a protected item answers 403 with the gate's words and stays."""
    with _protected(cluster, namespace) as (service, provider):
        answer = cluster.admin.delete(_deployments(namespace))
        assert answer.status_code == 403, answer.text
        assert answer.json()["message"].startswith(
            _denial("protected", f"deployments.apps {namespace}/provider", service)), answer.text
        left = cluster.admin.get(provider)
        assert left is not None and "deletionTimestamp" not in left["metadata"]
        # The API server stops at the first refused item (one delete-collection worker by default), so
        # `user`, after the provider in name order, was not deleted either.
        assert cluster.admin.exists(f"{_deployments(namespace)}/user")


def test_kubectl_delete_all_deletes_the_unprotected_and_prints_the_denial(cluster: Backend, namespace: str) -> None:
    """`kubectl delete deployments --all` deletes item by item: the unprotected ones go, the protected one
    prints the gate's Forbidden line, and kubectl exits 1 without retrying."""
    with _protected(cluster, namespace) as (service, provider):
        _create(cluster, _deployments(namespace), deployment_manifest("web", namespace, replicas=0))
        # The user goes too, after the provider in name order: kubectl asks once, so the provider stays.
        done = cluster.kubectl("delete", "deployments", "--all", "-n", namespace, "--wait=false")
        assert done.returncode == 1
        assert done.stdout.splitlines() == [f'deployment.apps "{name}" deleted from {namespace} namespace'
                                            for name in ("user", "web")], done.stdout
        assert ("Error from server (Forbidden): " + _denial("protected", f"deployments.apps {namespace}/provider",
                                                           service)) in done.stderr
        assert cluster.admin.exists(provider)
        assert not cluster.admin.exists(f"{_deployments(namespace)}/web")


# --- dry-run --------------------------------------------------------------------------------------------
def test_a_server_dry_run_is_denied_like_the_real_delete_and_writes_no_event(cluster: Backend,
                                                                             namespace: str) -> None:
    """`--dry-run=server` answers exactly what the real DELETE would, and leaves no trace: no Event is
    written or counted for it, only for real denials."""
    with _protected(cluster, namespace) as (service, provider):
        dry = cluster.kubectl("delete", "deployment", "provider", "-n", namespace, "--dry-run=server")
        assert dry.returncode == 1
        assert _error_line(dry.stderr).startswith("Error from server (Forbidden): " + _denial(
            "protected", f"deployments.apps {namespace}/provider", service)), dry.stderr
        assert cluster.admin.delete(provider).status_code == 403  # one real denial
        wait_for(lambda: [e.get("count") for e in _events(cluster, service)] == [1], timeout=30,
                 what="one DeletionBlocked Event with count 1")
        for _ in range(3):
            assert cluster.kubectl("delete", "deployment", "provider", "-n", namespace,
                                   "--dry-run=server").returncode == 1
        assert cluster.admin.delete(provider).status_code == 403  # the second real denial
        wait_for(lambda: [e.get("count") for e in _events(cluster, service)] == [2], timeout=30,
                 what="the Event's count to be 2 (two real denials; the dry-runs not counted)")


# --- CRDs -------------------------------------------------------------------------------------------------
def test_crd_deletion_waits_for_its_crs_and_the_criticalservices_crd_is_refused(cluster: Backend) -> None:
    """A CRD with CRs may be deleted (the gate guards providers, not criteria objects): CRD cleanup marks
    the CRs without admission, and the CRD waits for their finalizers, which only the provider removes;
    meanwhile the provider stays protected. The CriticalService CRD itself is refused while any
    CriticalService exists (its cleanup would delete them without asking the gate)."""
    story = Story.make("crd")
    apply_story(cluster.kubectl, cluster.admin, story)
    # (dry-run: the real cluster is shared by the session, and its CriticalServices depend on this CRD)
    refused = cluster.admin.delete("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                                   "criticalservices.criticalsvc.io", params={"dryRun": "All"})
    assert refused.status_code == 403, refused.text
    assert refused.json()["message"].startswith(
        f'admission webhook "crds.gate.{GATE}" denied the request: '
        "customresourcedefinitions.apiextensions.k8s.io criticalservices.criticalsvc.io may not be deleted yet: "
        f"1 CriticalService still exists (first: {story.critical_service})"), refused.text
    crd = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{story.crd_name}"
    crs = f"/apis/{story.group}/v1/namespaces/{story.cr_namespace}/coolresources"
    assert ok(cluster.kubectl("delete", "crd", story.crd_name, "--wait=false")).strip() == \
        f'customresourcedefinition.apiextensions.k8s.io "{story.crd_name}" deleted'
    wait_for(lambda: all(cr["metadata"].get("deletionTimestamp") for cr in (cluster.admin.get(crs) or {})
                          .get("items", [{"metadata": {}}])), timeout=60, what="CRD cleanup to mark the CRs")
    terminating = cluster.admin.get(crd) or {}
    assert "deletionTimestamp" in terminating["metadata"], "the CRD went before its CRs' finalizers were removed"
    late = cluster.admin.create(crs, {"apiVersion": f"{story.group}/v1", "kind": "CoolResource",
                                      "metadata": {"name": "late"}})
    assert (late.status_code, late.json()["message"]) == (403, (
        f'coolresources.{story.group} "late" is forbidden: create not allowed while custom resource definition '
        "is terminating")), late.text
    assert _refused(cluster, story.deployment_path), "the provider lost its protection while CRs were waiting"
    with cluster.finalizer_controller(story):
        wait_for(lambda: not cluster.admin.exists(crd), timeout=90, what="the CRD to be gone")
    paths = story.paths()
    for key in ("Deployment/" + story.name("finalizer-deployment"), f"CriticalService/{story.critical_service}",
                f"Namespace/{story.namespace}", f"Namespace/{story.cr_namespace}"):
        _delete_when_allowed(cluster, paths[key])


# --- the label, Warn ------------------------------------------------------------------------------------
def test_the_deletion_protected_label_refuses_until_removed(cluster: Backend, namespace: str) -> None:
    """`criticalsvc.io/deletion-protected=Always` refuses every DELETE of the object, whatever protects it;
    removing the label (kubectl label ...-) is the way out. The labelled-objects webhook reviews it (the
    workloads webhook selects unlabelled objects only); other types: test_clusters_labels.py."""
    body = deployment_manifest("keep", namespace, replicas=0)
    body["metadata"]["labels"] = {f"{GATE}/deletion-protected": "Always"}
    _create(cluster, _deployments(namespace), body)
    wait_for(lambda: _refused(cluster, f"{_deployments(namespace)}/keep"), timeout=60,
             what="the gate to see the label")
    done = cluster.kubectl("delete", "deployment", "keep", "-n", namespace, "--wait=false")
    assert done.returncode == 1
    assert done.stderr.startswith(f'Error from server (Forbidden): admission webhook "labelled.gate.{GATE}" '
                                  f"denied the request: deployments.apps {namespace}/keep is labelled "
                                  f"{GATE}/deletion-protected=Always; remove the label to delete it"), done.stderr
    ok(cluster.kubectl("label", "deployment", "keep", "-n", namespace, f"{GATE}/deletion-protected-"))
    _delete_when_allowed(cluster, f"{_deployments(namespace)}/keep")


def test_warn_enforcement_allows_with_the_denial_as_a_warning(cluster: Backend, namespace: str) -> None:
    """`enforcement: Warn`: the DELETE goes through and kubectl prints what Enforce would have denied."""
    with _protected(cluster, namespace, enforcement="Warn") as (service, _):
        expected = (f"Warning: (enforcement: Warn) would deny deleting deployments.apps {namespace}/provider: "
                    f"CriticalService {service} protects it until:")

        def warned() -> bool:
            done = cluster.kubectl("delete", "deployment", "provider", "-n", namespace, "--dry-run=server")
            assert done.returncode == 0, done.stderr
            return expected in done.stderr

        wait_for(warned, timeout=60, what="the Warn CriticalService to take effect")
        done = cluster.kubectl("delete", "deployment", "provider", "-n", namespace, "--wait=false")
        assert done.returncode == 0 and expected in done.stderr, done
        assert done.stdout.strip() == f'deployment.apps "provider" deleted from {namespace} namespace'


# --- CREATE of a CriticalService -------------------------------------------------------------------------
def test_an_invalid_criticalservice_is_refused_with_the_field_path(cluster: Backend) -> None:
    """A spec the CRD's schema refuses: 422 Invalid naming the field, as kubectl prints it."""
    name = unique("invalid")
    bad = _critical_service(name, "default", "x", [{"type": "Bogus"}])
    answer = cluster.admin.create(CRITICAL_SERVICES, bad)
    assert answer.status_code == 422, answer.text
    status = answer.json()
    assert status["reason"] == "Invalid"
    assert 'spec.criteria[0].type: Unsupported value: "Bogus": supported values: "Finalizer", "SpecificResource", ' \
           '"Resources"' in status["message"]
    import yaml

    done = cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(bad))
    assert done.returncode == 1
    assert done.stderr.startswith(f'The CriticalService "{name}" is invalid: '), done.stderr
    assert not cluster.admin.exists(f"{CRITICAL_SERVICES}/{name}")


def test_a_criticalservice_closing_a_cycle_is_refused(cluster: Backend, namespace: str) -> None:
    """`provider` must outlive `user`; a second CriticalService making `user` outlive `provider` closes a
    cycle (neither could ever be deleted): the gate refuses to create it and names the cycle."""
    with _protected(cluster, namespace) as (service, _):
        second = _critical_service(f"{service}-back", namespace, "user", [_deployment_exists(namespace, "provider")])
        answer = cluster.admin.create(CRITICAL_SERVICES, second)
        assert answer.status_code in (400, 403, 422), answer.text
        message = answer.json()["message"]
        assert message.startswith(f'admission webhook "criticalservices.gate.{GATE}" denied the request: '), message
        assert f"dependency cycle: {service}-back -> {service} -> {service}-back" in message, message
        assert not cluster.admin.exists(f"{CRITICAL_SERVICES}/{service}-back")


# --- status and Events -----------------------------------------------------------------------------------
def _conditions(cs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (cs.get("status") or {}).get("conditions") or []}


def test_status_blockers_and_events_follow_a_recreated_criticalservice(cluster: Backend, namespace: str) -> None:
    """The leader writes Ready/Blocking conditions and blockers; a denial becomes a DeletionBlocked Event
    that `kubectl describe` shows. A CriticalService deleted and created again under the same name gets
    a status and an Event of its own (conditions not older than the new object; the Event names its uid)."""
    path = f"{CRITICAL_SERVICES}/protects-{namespace}"
    for generation in (1, 2):
        with _protected(cluster, namespace) as (service, provider):
            cs = cluster.admin.get(path) or {}
            created, uid = cs["metadata"]["creationTimestamp"], cs["metadata"]["uid"]

            def blocked() -> bool:
                status = (cluster.admin.get(path) or {}).get("status") or {}
                conditions = _conditions({"status": status})
                # Ready turns Enforcing only after the routing probe (design/routing.md), which may come after the
                # first Blocking status: wait for both rather than race them.
                return conditions.get("Blocking", {}).get("status") == "True" and status.get("unmetCriteria") == 1 \
                    and conditions.get("Ready", {}).get("status") == "True"

            wait_for(blocked, timeout=60, what=f"generation {generation}'s status to say it is blocking and Ready")
            cs = cluster.admin.get(path) or {}
            conditions = _conditions(cs)
            assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == ("True", "Enforcing")
            assert conditions["Blocking"]["reason"] == "CriteriaUnmet"
            assert all(c["lastTransitionTime"] >= created for c in conditions.values()), conditions
            assert f"{namespace}/user" in str(cs["status"]["blockers"])
            assert cluster.admin.delete(provider).status_code == 403
            wait_for(lambda uid=uid: [e.get("count") for e in _events(cluster, service)  # type: ignore[misc]
                                      if e["involvedObject"].get("uid") == uid] == [1], timeout=30,
                     what=f"generation {generation}'s own DeletionBlocked Event")
            described = ok(cluster.kubectl("describe", "csvc", service))
            events = described.split("Events:", 1)[1]
            assert re.search(r"Warning\s+DeletionBlocked\s+", events), described
            assert f"deletion of deployments.apps {namespace}/provider denied" in events


# --- foreground deletion, finalizers ----------------------------------------------------------------------
def test_a_foreground_delete_of_a_protected_provider_is_denied_and_changes_nothing(cluster: Backend,
                                                                                   namespace: str) -> None:
    """propagationPolicy=Foreground is admitted like any DELETE: denied, the provider gets neither a
    deletionTimestamp nor the foregroundDeletion finalizer; once allowed, it goes after its dependents."""
    foreground = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground"}
    with _protected(cluster, namespace) as (_, provider):
        denied = cluster.admin.delete(provider, body=foreground)
        assert denied.status_code == 403, denied.text
        metadata = (cluster.admin.get(provider) or {})["metadata"]
        assert "deletionTimestamp" not in metadata and "foregroundDeletion" not in metadata.get("finalizers", [])
        cluster.admin.delete(f"{_deployments(namespace)}/user")
        wait_for(lambda: cluster.admin.delete(provider, body=foreground).status_code in (200, 202), timeout=60,
                 what="the foreground DELETE to be allowed")
        wait_for(lambda: not cluster.admin.exists(provider), timeout=60, what="the garbage collector to finish")


def test_no_new_finalizers_after_deletion_timestamp(cluster: Backend, namespace: str) -> None:
    """Once an object is being deleted, the API server refuses to add finalizers (removing them is fine):
    the set of objects a Finalizer criterion waits for can only shrink."""
    path = f"/api/v1/namespaces/{namespace}/configmaps/held"
    _create(cluster, f"/api/v1/namespaces/{namespace}/configmaps",
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "held", "finalizers": ["example.com/a"]}})
    assert cluster.admin.delete(path).status_code == 200
    added = cluster.admin.merge_patch(path, {"metadata": {"finalizers": ["example.com/a", "example.com/b"]}})
    assert added.status_code == 422, added.text
    assert added.json()["message"] == (
        'ConfigMap "held" is invalid: metadata.finalizers: Forbidden: no new finalizers can be added if the object '
        'is being deleted, found new finalizers []string{"example.com/b"}')
    assert cluster.admin.merge_patch(path, {"metadata": {"finalizers": None}}).status_code == 200
    wait_for(lambda: not cluster.admin.exists(path), timeout=30, what="the configmap to go")


# --- empty lists ------------------------------------------------------------------------------------------
def test_criteria_over_types_with_no_objects_hold_and_keep_the_gate_ready(cluster: Backend, namespace: str) -> None:
    """A Resources criterion that matches nothing and a Finalizer criterion over a CRD with no instances
    both hold: the provider may go, and the gate stays ready. (The real API server answers an empty
    metadata-only LIST with `"items": null`; the gate once took that for a malformed answer, denied the
    provider forever and never became ready.)"""
    group = f"{unique('empty')}.example.com"
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": f"gadgets.{group}"},
           "spec": {"group": group, "scope": "Namespaced",
                    "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
                    "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                        "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}
    crd_path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/gadgets.{group}"
    _create(cluster, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    reader = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
              "metadata": {"name": f"read-{group}", "labels": {"criticalsvc.io/aggregate-to-reader": "true"}},
              "rules": [{"apiGroups": [group], "resources": ["gadgets"], "verbs": ["get", "list", "watch"]}]}
    _create(cluster, "/apis/rbac.authorization.k8s.io/v1/clusterroles", reader)
    ok(cluster.kubectl("wait", "--for=condition=Established", f"crd/gadgets.{group}", "--timeout=60s"))
    _create(cluster, _deployments(namespace), deployment_manifest("provider", namespace, replicas=0))
    service = f"empty-{namespace}"
    _create(cluster, CRITICAL_SERVICES, _critical_service(service, namespace, "provider", [
        {"type": "Resources", "resources": {"group": "apps", "resource": "deployments", "namespace": namespace,
                                            "selector": {"matchLabels": {"role": "none"}}}},
        {"type": "Finalizer", "finalizer": {"group": group, "resource": "gadgets",
                                            "finalizerName": f"{group}/cleanup"}}]))
    provider = f"{_deployments(namespace)}/provider"
    try:
        wait_for(lambda: (cluster.admin.get(f"{CRITICAL_SERVICES}/{service}") or {}).get("status", {})
                 .get("unmetCriteria") == 0, timeout=60, what="the status to say no criterion is unmet")
        dry = cluster.admin.delete(provider, params={"dryRun": "All"})
        assert dry.status_code == 200, dry.text
        # Nothing else is held up: the gate answers (not 500 "failed calling webhook" from a gate not ready).
        other = _create(cluster, _deployments(namespace), deployment_manifest("other", namespace, replicas=0))
        assert cluster.admin.delete(f"{_deployments(namespace)}/{other['metadata']['name']}").status_code == 200
    finally:
        for path in (provider, f"{CRITICAL_SERVICES}/{service}", crd_path,
                     f"/apis/rbac.authorization.k8s.io/v1/clusterroles/read-{group}"):
            _delete_when_allowed(cluster, path)


def _error_line(stderr: str) -> str:
    """kubectl's error line for a refusal; the gate's warnings (what it waits for) come before it."""
    return next((line for line in stderr.splitlines() if line.startswith("Error from server")), stderr)
