"""The API-server stand-in's REST semantics, in-process (httpx against the ASGI app, no sockets)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from criticalsvc.api import DELETION_PROTECTED_LABEL, NAMESPACES, GroupResource, ObjectRef
from criticalsvc.manifests import load_path
from criticalsvc.sim.apiserver.discovery import DISCOVERY_V2
from criticalsvc.sim.apiserver.openapi import OPENAPI_V2_PROTOBUF
from criticalsvc.sim.apiserver.patches import json_patch, strategic_merge_patch
from criticalsvc.sim.apiserver.selectors import parse_label_selector_text
from criticalsvc.sim.apiserver.standin import StandIn, StandInEngine
from criticalsvc.sim.cluster import Cluster
from criticalsvc.sim.engine import Engine
from criticalsvc.sim.store import Store, gate_hook
from criticalsvc.sim.webhook_client import register_webhooks
from criticalsvc.sim.webhooks import DEFAULT_RULES, ProviderRoutesRule, RegisteredWebhook, WebhookRule

ROOT = Path(__file__).resolve().parents[1]
PROTECTED = DELETION_PROTECTED_LABEL
KUBECTL_DISCOVERY_ACCEPT = ("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,"
                            "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,"
                            "application/json")
MERGE = {"Content-Type": "application/merge-patch+json"}
STRATEGIC = {"Content-Type": "application/strategic-merge-patch+json"}
JSON_PATCH = {"Content-Type": "application/json-patch+json"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@contextlib.asynccontextmanager
async def standin(store: Store | None = None, **kwargs: Any) -> AsyncIterator[tuple[StandIn, httpx.AsyncClient]]:
    server = StandIn(store or Store(clock=time.time), **kwargs)
    transport = httpx.ASGITransport(app=server.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://standin") as client:
        try:
            yield server, client
        finally:
            await server.stop()


def namespace(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def deployment(name: str, ns: str = "default", **labels: str) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": ns,
                                                                       "labels": labels},
            "spec": {"replicas": 1, "template": {"spec": {"containers": [
                {"name": "web", "image": "nginx:1.27"}, {"name": "sidecar", "image": "envoy:1"}]}}}}


def crd(group: str = "example.com", plural: str = "widgets", kind: str = "Widget", *,
        status: bool = False) -> dict[str, Any]:
    version: dict[str, Any] = {"name": "v1", "served": True, "storage": True,
                               "schema": {"openAPIV3Schema": {"type": "object", "description": "A widget."}}}
    if status:
        version["subresources"] = {"status": {}}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{group}"},
            "spec": {"group": group, "scope": "Namespaced", "versions": [version],
                     "names": {"plural": plural, "singular": kind.lower(), "kind": kind, "shortNames": ["wd"]}}}


def widget(name: str, ns: str = "default", finalizers: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": name, "namespace": ns, "finalizers": list(finalizers)}}


WIDGETS = "/apis/example.com/v1/namespaces/default/widgets"
DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"


async def watch_lines(client: httpx.AsyncClient, url: str, **params: str) -> list[dict[str, Any]]:
    reply = await client.get(url, params={"watch": "true", **params})
    assert reply.status_code == 200, reply.text
    return [orjson.loads(line) for line in reply.content.splitlines() if line.strip()]


# --- discovery and documents ---------------------------------------------------------------------------
@pytest.mark.anyio
async def test_version_reports_minor_32() -> None:
    """/version reports 1.32, so the kubectl dispatcher runs the kubectl the stand-in was measured with."""
    async with standin() as (_, client):
        body = (await client.get("/version")).json()
    assert (body["major"], body["minor"]) == ("1", "32")


@pytest.mark.anyio
async def test_aggregated_discovery_only_when_v2_is_accepted() -> None:
    """kubectl's Accept gets the aggregated v2 list with its exact Content-Type; plain JSON gets legacy."""
    async with standin() as (_, client):
        v2 = await client.get("/apis", headers={"Accept": KUBECTL_DISCOVERY_ACCEPT})
        v2beta1_only = await client.get("/apis", headers={
            "Accept": "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"})
        core = await client.get("/api", headers={"Accept": KUBECTL_DISCOVERY_ACCEPT})
    assert v2.headers["content-type"] == DISCOVERY_V2
    apps = next(g for g in v2.json()["items"] if g["metadata"]["name"] == "apps")
    deploy = next(r for r in apps["versions"][0]["resources"] if r["resource"] == "deployments")
    assert deploy["shortNames"] == ["deploy"] and deploy["scope"] == "Namespaced"
    assert v2beta1_only.headers["content-type"] == "application/json"
    assert v2beta1_only.json()["kind"] == "APIGroupList"
    assert [item["metadata"]["name"] for item in core.json()["items"]] == [""]


@pytest.mark.anyio
async def test_crd_group_is_discovered_while_the_crd_exists() -> None:
    """A CRD's group appears in discovery when it is created, stays while it terminates, and goes with it."""
    async with standin() as (_, client):
        assert (await client.get("/apis/example.com/v1")).status_code == 404
        created = await client.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd())
        assert created.status_code == 201
        listed = (await client.get("/apis/example.com/v1")).json()
        groups = [g["name"] for g in (await client.get("/apis")).json()["groups"]]
        crd_url = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com"
        assert (await client.delete(crd_url)).status_code == 200
        terminating = (await client.get("/apis/example.com/v1")).status_code
        await client.patch(crd_url, headers=JSON_PATCH, content=b'[{"op":"remove","path":"/metadata/finalizers"}]')
        gone = await client.get("/apis/example.com/v1")
        groups_after = [g["name"] for g in (await client.get("/apis")).json()["groups"]]
    widget_entry = next(r for r in listed["resources"] if r["name"] == "widgets")
    assert (widget_entry["kind"], widget_entry["namespaced"], widget_entry["shortNames"]) == ("Widget", True, ["wd"])
    assert "example.com" in groups and terminating == 200
    assert gone.status_code == 404 and gone.json()["kind"] == "Status"
    assert "example.com" not in groups_after


@pytest.mark.anyio
async def test_openapi_documents() -> None:
    """/openapi/v2 is an empty protobuf document; /openapi/v3 describes CriticalService for `kubectl explain`."""
    async with standin() as (_, client):
        v2 = await client.get("/openapi/v2")
        index = (await client.get("/openapi/v3")).json()
        url = index["paths"]["apis/criticalsvc.io/v1alpha1"]["serverRelativeURL"]
        doc = (await client.get(url)).json()
    assert v2.status_code == 200 and v2.content == b"" and v2.headers["content-type"] == OPENAPI_V2_PROTOBUF
    schema = doc["components"]["schemas"]["io.criticalsvc.v1alpha1.CriticalService"]
    assert schema["x-kubernetes-group-version-kind"] == [
        {"group": "criticalsvc.io", "version": "v1alpha1", "kind": "CriticalService"}]
    assert "spec" in schema["properties"] and schema["description"]


# --- CRUD and errors -----------------------------------------------------------------------------------
@pytest.mark.anyio
async def test_create_get_and_not_found_status() -> None:
    """POST answers 201 with the stored object; a missing object is a NotFound Status naming it."""
    async with standin() as (_, client):
        created = await client.post(DEPLOYMENTS, json=deployment("web"))
        fetched = await client.get(f"{DEPLOYMENTS}/web")
        missing = await client.get(f"{DEPLOYMENTS}/nope")
        core_missing = await client.get("/api/v1/namespaces/nope")
    assert created.status_code == 201 and created.json()["metadata"]["uid"]
    assert fetched.json()["metadata"]["resourceVersion"] == created.json()["metadata"]["resourceVersion"]
    assert missing.status_code == 404
    assert missing.json() == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                              "message": 'deployments.apps "nope" not found', "reason": "NotFound",
                              "details": {"name": "nope", "group": "apps", "kind": "deployments"}, "code": 404}
    assert core_missing.json()["message"] == 'namespaces "nope" not found'


@pytest.mark.anyio
async def test_create_conflicts_and_missing_namespace() -> None:
    """A second create is 409 AlreadyExists; a create in a namespace that does not exist is 404."""
    async with standin() as (_, client):
        await client.post(DEPLOYMENTS, json=deployment("web"))
        again = await client.post(DEPLOYMENTS, json=deployment("web"))
        elsewhere = await client.post("/apis/apps/v1/namespaces/ghost/deployments", json=deployment("web", "ghost"))
        mismatched = await client.post(DEPLOYMENTS, json=namespace("x"))
    assert (again.status_code, again.json()["reason"]) == (409, "AlreadyExists")
    assert (elsewhere.status_code, elsewhere.json()["message"]) == (404, 'namespaces "ghost" not found')
    assert mismatched.status_code == 400


@pytest.mark.anyio
async def test_put_with_a_stale_resource_version_conflicts() -> None:
    """PUT is optimistic: an old resourceVersion is 409 Conflict, the current one succeeds."""
    async with standin() as (_, client):
        obj = (await client.post(DEPLOYMENTS, json=deployment("web"))).json()
        obj["spec"]["replicas"] = 2
        first = await client.put(f"{DEPLOYMENTS}/web", json=obj)
        stale = await client.put(f"{DEPLOYMENTS}/web", json=obj)
    assert first.status_code == 200 and first.json()["spec"]["replicas"] == 2
    assert (stale.status_code, stale.json()["reason"]) == (409, "Conflict")


@pytest.mark.anyio
async def test_list_selectors_and_all_namespaces() -> None:
    """Lists honour labelSelector and fieldSelector and span namespaces on the cluster-wide path."""
    async with standin() as (_, client):
        await client.post("/api/v1/namespaces", json=namespace("other"))
        await client.post(DEPLOYMENTS, json=deployment("web", tier="front"))
        await client.post(DEPLOYMENTS, json=deployment("db", tier="back"))
        await client.post("/apis/apps/v1/namespaces/other/deployments", json=deployment("web", "other", tier="front"))
        everywhere = (await client.get("/apis/apps/v1/deployments", params={"limit": "500"})).json()
        front = (await client.get("/apis/apps/v1/deployments", params={"labelSelector": "tier in (front)"})).json()
        not_back = (await client.get(DEPLOYMENTS, params={"labelSelector": "tier!=back"})).json()
        by_field = (await client.get("/apis/apps/v1/deployments",
                                     params={"fieldSelector": "metadata.name=web,metadata.namespace=other"})).json()

    def keys(doc: dict[str, Any]) -> list[str]:
        return [f"{o['metadata']['namespace']}/{o['metadata']['name']}" for o in doc["items"]]

    assert everywhere["kind"] == "DeploymentList" and int(everywhere["metadata"]["resourceVersion"]) > 0
    assert sorted(keys(everywhere)) == ["default/db", "default/web", "other/web"]
    assert sorted(keys(front)) == ["default/web", "other/web"]
    assert keys(not_back) == ["default/web"]
    assert keys(by_field) == ["other/web"]


# --- patch ---------------------------------------------------------------------------------------------
@pytest.mark.anyio
async def test_strategic_merge_patch_merges_containers_by_name() -> None:
    """kubectl apply's strategic patch of a Deployment changes one container and keeps the other."""
    patch = {"spec": {"template": {"spec": {"$setElementOrder/containers": [{"name": "web"}, {"name": "sidecar"}],
                                            "containers": [{"name": "web", "image": "nginx:1.28"}]}}}}
    async with standin() as (_, client):
        await client.post(DEPLOYMENTS, json=deployment("web"))
        reply = await client.patch(f"{DEPLOYMENTS}/web", headers=STRATEGIC, content=orjson.dumps(patch))
    spec = reply.json()["spec"]["template"]["spec"]
    assert spec["containers"] == [{"name": "web", "image": "nginx:1.28"}, {"name": "sidecar", "image": "envoy:1"}]
    assert "$setElementOrder/containers" not in spec


@pytest.mark.anyio
async def test_strategic_merge_patch_is_refused_for_custom_resources() -> None:
    """As in Kubernetes, custom resources take merge and JSON patches but not strategic merge (415)."""
    async with standin() as (_, client):
        await client.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd())
        await client.post(WIDGETS, json=widget("w1"))
        smp = await client.patch(f"{WIDGETS}/w1", headers=STRATEGIC, content=b'{"metadata":{"labels":{"a":"b"}}}')
        merge = await client.patch(f"{WIDGETS}/w1", headers=MERGE, content=b'{"metadata":{"labels":{"a":"b"}}}')
    assert smp.status_code == 415
    assert merge.status_code == 200 and merge.json()["metadata"]["labels"] == {"a": "b"}


@pytest.mark.anyio
async def test_removing_the_last_finalizer_by_json_patch_deletes_the_object() -> None:
    """A deleted object with a finalizer stays (marked) until a JSON patch removes the finalizer."""
    async with standin() as (_, client):
        await client.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd())
        await client.post(WIDGETS, json=widget("w1", finalizers=("example.com/cleanup",)))
        marked = await client.delete(f"{WIDGETS}/w1")
        still = await client.get(f"{WIDGETS}/w1")
        add = await client.patch(f"{WIDGETS}/w1", headers=MERGE,
                                 content=b'{"metadata":{"finalizers":["example.com/cleanup","x.io/new"]}}')
        removed = await client.patch(f"{WIDGETS}/w1", headers=JSON_PATCH,
                                     content=b'[{"op":"test","path":"/metadata/finalizers/0","value":'
                                             b'"example.com/cleanup"},{"op":"remove","path":"/metadata/finalizers/0"}]')
        after = await client.get(f"{WIDGETS}/w1")
    assert marked.status_code == 200 and marked.json()["metadata"]["deletionTimestamp"]
    assert still.status_code == 200
    assert add.status_code == 422  # no new finalizers once deletion started
    assert removed.status_code == 200
    assert after.status_code == 404


@pytest.mark.anyio
async def test_failed_json_patch_test_is_422_and_changes_nothing() -> None:
    """A JSON patch whose `test` fails is rejected with 422 and leaves the object as it was."""
    async with standin() as (_, client):
        before = (await client.post(DEPLOYMENTS, json=deployment("web"))).json()
        reply = await client.patch(f"{DEPLOYMENTS}/web", headers=JSON_PATCH,
                                   content=b'[{"op":"test","path":"/spec/replicas","value":5},'
                                           b'{"op":"replace","path":"/spec/replicas","value":9}]')
        after = (await client.get(f"{DEPLOYMENTS}/web")).json()
    assert reply.status_code == 422
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


# --- delete --------------------------------------------------------------------------------------------
@pytest.mark.anyio
async def test_delete_outcomes() -> None:
    """DELETE returns a Success Status when the object is gone, the object when only marked, 404 after."""
    async with standin() as (_, client):
        await client.post(DEPLOYMENTS, json=deployment("web"))
        gone = await client.request("DELETE", f"{DEPLOYMENTS}/web", json={"propagationPolicy": "Background"})
        again = await client.delete(f"{DEPLOYMENTS}/web")
        await client.post(DEPLOYMENTS, json=deployment("api"))
        foreground = await client.request("DELETE", f"{DEPLOYMENTS}/api", json={"propagationPolicy": "Foreground"})
    assert gone.status_code == 200 and gone.json()["status"] == "Success"
    assert gone.json()["details"]["name"] == "web"
    assert again.status_code == 404
    assert foreground.json()["metadata"]["finalizers"] == ["foregroundDeletion"]


@pytest.mark.anyio
async def test_delete_preconditions_and_dry_run() -> None:
    """A wrong preconditions.uid is 409; dryRun (query or body) deletes nothing."""
    async with standin() as (_, client):
        await client.post(DEPLOYMENTS, json=deployment("web"))
        wrong_uid = await client.request("DELETE", f"{DEPLOYMENTS}/web", json={"preconditions": {"uid": "nope"}})
        dry_query = await client.delete(f"{DEPLOYMENTS}/web", params={"dryRun": "All"})
        dry_body = await client.request("DELETE", f"{DEPLOYMENTS}/web", json={"dryRun": ["All"]})
        still = await client.get(f"{DEPLOYMENTS}/web")
    assert (wrong_uid.status_code, wrong_uid.json()["reason"]) == (409, "Conflict")
    assert dry_query.status_code == 200 and dry_body.status_code == 200
    assert still.status_code == 200 and "deletionTimestamp" not in still.json()["metadata"]


@pytest.mark.anyio
async def test_delete_collection_honours_the_label_selector() -> None:
    """DELETE on a collection removes exactly the selected items."""
    async with standin() as (_, client):
        await client.post(DEPLOYMENTS, json=deployment("a", team="x"))
        await client.post(DEPLOYMENTS, json=deployment("b", team="y"))
        reply = await client.delete(DEPLOYMENTS, params={"labelSelector": "team=x"})
        left = (await client.get(DEPLOYMENTS)).json()["items"]
    assert [o["metadata"]["name"] for o in reply.json()["items"]] == ["a"]
    assert [o["metadata"]["name"] for o in left] == ["b"]


@pytest.mark.anyio
async def test_custom_resource_create_is_forbidden_while_its_crd_terminates() -> None:
    """Creating an instance of a terminating CRD is 403 Forbidden (the real cluster's answer is checked by
    tests/test_clusters_scenarios.py::test_crd_deletion_waits_for_its_crs_and_the_criticalservices_crd_is_refused)."""
    async with standin() as (_, client):
        await client.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd())
        await client.post(WIDGETS, json=widget("w1", finalizers=("example.com/cleanup",)))
        await client.delete("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com")
        reply = await client.post(WIDGETS, json=widget("w2"))
    assert (reply.status_code, reply.json()["reason"]) == (403, "Forbidden")
    assert reply.json()["message"] == ('widgets.example.com "w2" is forbidden: create not allowed while custom '
                                       "resource definition is terminating")


@pytest.mark.anyio
async def test_namespace_delete_then_finalize() -> None:
    """A deleted namespace is Terminating until PUT namespaces/{name}/finalize empties its finalizers."""
    async with standin() as (_, client):
        await client.post("/api/v1/namespaces", json=namespace("team"))
        deleted = (await client.delete("/api/v1/namespaces/team")).json()
        finalized = await client.put("/api/v1/namespaces/team/finalize",
                                     json={**namespace("team"), "spec": {"finalizers": []}})
        after = await client.get("/api/v1/namespaces/team")
    assert deleted["status"]["phase"] == "Terminating"
    assert finalized.status_code == 200
    assert after.status_code == 404


@pytest.mark.anyio
async def test_gate_denial_is_a_forbidden_status_with_the_webhook_message() -> None:
    """A DELETE the gate denies is HTTP 403 with `admission webhook "gate.criticalsvc.io" denied the request`."""
    store = Store(clock=time.time)
    store.webhooks.append(RegisteredWebhook(gate_hook(store), rules=(*DEFAULT_RULES, ProviderRoutesRule(store.state))))
    cs = {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": "web"},
          "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": "default", "name": "web"},
                   "criteria": [{"type": "SpecificResource", "specificResource": {
                       "group": "", "resource": "configmaps", "namespace": "default", "name": "keep"}}]}}
    async with standin(store) as (_, client):
        await client.post(DEPLOYMENTS, json=deployment("web"))
        await client.post("/api/v1/namespaces/default/configmaps",
                          json={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "keep"}})
        assert (await client.post("/apis/criticalsvc.io/v1alpha1/criticalservices", json=cs)).status_code == 201
        denied = await client.delete(f"{DEPLOYMENTS}/web")
        still = await client.get(f"{DEPLOYMENTS}/web")
    assert denied.status_code == 403
    body = denied.json()
    assert (body["kind"], body["status"], body["reason"]) == ("Status", "Failure", "Forbidden")
    assert body["message"].startswith('admission webhook "gate.criticalsvc.io" denied the request: ')
    assert still.status_code == 200


@pytest.mark.anyio
async def test_webhook_warnings_become_warning_headers() -> None:
    """Warnings in a webhook's reply reach the client as `Warning: 299 - "..."` headers, also on denial."""
    def hook(review: dict[str, Any]) -> dict[str, Any]:
        allowed = review["request"]["name"] == "ok"
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "response": {"uid": review["request"]["uid"], "allowed": allowed, "warnings": ['mind the "gap"'],
                             "status": {"code": 403, "reason": "Forbidden", "message": "no"}}}

    store = Store(clock=time.time)
    store.webhooks.append(RegisteredWebhook(hook, rules=(WebhookRule(frozenset({"DELETE"}),
                                                           frozenset({GroupResource("apps", "deployments")})),)))
    async with standin(store) as (_, client):
        await client.post(DEPLOYMENTS, json=deployment("ok"))
        await client.post(DEPLOYMENTS, json=deployment("no"))
        allowed = await client.delete(f"{DEPLOYMENTS}/ok")
        denied = await client.delete(f"{DEPLOYMENTS}/no")
    assert allowed.headers.get_list("warning") == ['299 - "mind the \\"gap\\""']
    assert denied.status_code == 403 and denied.headers.get_list("warning") == ['299 - "mind the \\"gap\\""']


@pytest.mark.anyio
async def test_configured_webhook_skips_excluded_namespaces() -> None:
    """A webhook registered from a ValidatingWebhookConfiguration honours rules and namespaceSelector."""
    calls: list[str] = []

    def factory(url: str, **_: Any) -> Any:
        def hook(review: dict[str, Any]) -> dict[str, Any]:
            calls.append(f"{review['request'].get('namespace', '')}/{review['request']['name']}")
            return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                    "response": {"uid": review["request"]["uid"], "allowed": False,
                                 "status": {"code": 403, "reason": "Forbidden", "message": url}}}

        return hook

    config = {"webhooks": [{
        "name": "gate.example.com", "admissionReviewVersions": ["v1"], "sideEffects": "None",
        "clientConfig": {"url": "https://gate.example.com/validate"},
        "rules": [{"operations": ["DELETE"], "apiGroups": ["apps"], "apiVersions": ["*"], "resources": ["*"]}],
        "namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                                    "values": ["kube-system"]}]}}]}
    store = Store(clock=time.time)
    register_webhooks(store, config, hook_factory=factory)
    async with standin(store, bootstrap_namespaces=("default", "kube-system")) as (_, client):
        await client.post(DEPLOYMENTS, json=deployment("web"))
        await client.post("/apis/apps/v1/namespaces/kube-system/deployments", json=deployment("dns", "kube-system"))
        denied = await client.delete(f"{DEPLOYMENTS}/web")
        skipped = await client.delete("/apis/apps/v1/namespaces/kube-system/deployments/dns")
        unmatched = await client.delete("/api/v1/namespaces/default")
    assert denied.status_code == 403 and "https://gate.example.com/validate" in denied.json()["message"]
    assert skipped.status_code == 200 and unmatched.status_code == 200
    assert calls == ["default/web"]


def test_the_project_webhook_configuration_registers_and_matches() -> None:
    """deploy/'s ValidatingWebhookConfiguration registers five webhooks that gate what the rules say; on
    DELETE the objectSelectors are matched on oldObject, so each object goes to exactly one webhook; the CRD
    webhook's matchCondition lets only the CriticalService CRD through (a deletecollection item by oldObject's
    name); nothing else - no namespace, no workload - reaches the gate."""
    import yaml

    config = yaml.safe_load((ROOT / "deploy/base/webhook.yaml").read_text())
    made: list[tuple[str, Any]] = []

    def factory(url: str, **options: Any) -> Any:
        made.append((url, options["timeout_seconds"]))
        return lambda review: {}

    store = Store(clock=time.time)
    for name in ("team", "kube-system", "criticalsvc-system"):
        store.create(namespace(name))
    webhooks = register_webhooks(store, config, ca_bundle=b"-----BEGIN CERTIFICATE-----", hook_factory=factory,
                                 resolve_service=lambda ns, name, port, path: f"https://127.0.0.1:8443{path}")
    deploys, cs = GroupResource("apps", "deployments"), GroupResource("criticalsvc.io", "criticalservices")
    configmaps = GroupResource("", "configmaps")
    crds = GroupResource("apiextensions.k8s.io", "customresourcedefinitions")
    clusterroles = GroupResource("rbac.authorization.k8s.io", "clusterroles")
    plain, locked = {"metadata": {"name": "x"}}, {"metadata": {"name": "x", "labels": {PROTECTED: "Always"}}}

    def called(operation: str, gr: GroupResource, ns: str, old: Any = plain, obj: Any = None,
               name: str = "x") -> list[str]:
        request = {"operation": operation, "name": name, "namespace": ns, "object": obj, "oldObject": old,
                   "resource": {"group": gr.group, "version": "v1", "resource": gr.resource}, "dryRun": False}
        return [w.name for w in store.webhooks if w.matches(operation, gr, ns, obj, old, name=name,
                                                            request=lambda: request)]

    assert [w.name for w in webhooks] == ["criticalservices.gate.criticalsvc.io", "crds.gate.criticalsvc.io",
                                          "labelled.gate.criticalsvc.io", "protected.gate.criticalsvc.io",
                                          "protected-updates.gate.criticalsvc.io"]
    assert made == [("https://127.0.0.1:8443/validate", 5)] * 5
    assert called("DELETE", deploys, "team") == []
    assert called("DELETE", deploys, "team", locked) == ["labelled.gate.criticalsvc.io"]
    assert called("DELETE", deploys, "kube-system") == called("DELETE", deploys, "kube-system", locked) == []
    assert called("UPDATE", deploys, "team", locked, locked) == []
    assert called("DELETE", NAMESPACES, "team") == []
    assert called("DELETE", NAMESPACES, "criticalsvc-system", locked) == []
    assert called("DELETE", NAMESPACES, "team", locked) == ["labelled.gate.criticalsvc.io"]
    assert called("CREATE", cs, "", None, plain) == ["criticalservices.gate.criticalsvc.io"]
    assert called("CREATE", cs, "", None, locked) == ["criticalservices.gate.criticalsvc.io"]
    assert called("DELETE", cs, "", locked) == ["criticalservices.gate.criticalsvc.io", "labelled.gate.criticalsvc.io"]
    crd = {"metadata": {"name": "criticalservices.criticalsvc.io"}}
    assert called("DELETE", crds, "", crd, name="criticalservices.criticalsvc.io") == ["crds.gate.criticalsvc.io"]
    assert called("DELETE", crds, "", crd, name="") == ["crds.gate.criticalsvc.io"]  # a deletecollection item
    assert called("DELETE", crds, "", {"metadata": {"name": "widgets.example.com"}}, name="widgets.example.com") == []
    # Any other type: only when labelled, cluster-scoped ones included; never the webhook configurations.
    assert called("DELETE", configmaps, "team") == []
    assert called("DELETE", configmaps, "team", locked) == ["labelled.gate.criticalsvc.io"]
    assert called("DELETE", configmaps, "kube-system", locked) == []
    assert called("DELETE", clusterroles, "", locked) == ["labelled.gate.criticalsvc.io"]
    assert called("DELETE", GroupResource("widgets.example.com", "widgets"), "team", locked) == [
        "labelled.gate.criticalsvc.io"]
    vwc = GroupResource("admissionregistration.k8s.io", "validatingwebhookconfigurations")
    assert called("DELETE", vwc, "", locked) == []
    # What the gate labelled criticalsvc.io/protected: its DELETE, and an UPDATE only when it drops the label.
    carried = {"metadata": {"name": "x", "labels": {"criticalsvc.io/protected": "true"}}}
    assert called("DELETE", deploys, "team", carried) == ["protected.gate.criticalsvc.io"]
    assert called("DELETE", NAMESPACES, "team", carried) == ["protected.gate.criticalsvc.io"]
    assert called("UPDATE", deploys, "team", carried, carried) == []
    assert called("UPDATE", deploys, "team", carried, plain) == ["protected-updates.gate.criticalsvc.io"]
    assert called("UPDATE", deploys, "team", plain, carried) == []  # the gate's own label write
    assert called("CREATE", configmaps, "team", None, locked) == []


def _selecting(selector: dict[str, Any], **extra: Any) -> Any:
    """A store with namespace "team" and one registered webhook with this objectSelector (any rule fields
    in `extra` replace the DELETE-everything default); the webhook's matches() as a function."""
    rule = {"operations": ["DELETE"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"], **extra}
    config = {"webhooks": [{"name": "sel.example.com", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                            "clientConfig": {"url": "https://sel.example.com/"}, "rules": [rule],
                            "objectSelector": selector}]}
    store = Store(clock=time.time)
    store.create(namespace("team"))
    (webhook,) = register_webhooks(store, config, hook_factory=lambda url, **_: (lambda review: {}))
    return webhook.matches


def _labelled(**labels: str) -> dict[str, Any]:
    return {"metadata": {"name": "x", "labels": labels}}


@pytest.mark.parametrize(("selector", "obj", "old", "expected"), [
    # On DELETE, object is null: only oldObject's labels count.
    ({"matchLabels": {"a": "1"}}, None, _labelled(a="1"), True),
    ({"matchLabels": {"a": "1"}}, None, _labelled(a="2"), False),
    ({"matchLabels": {"a": "1"}}, None, _labelled(), False),
    ({"matchLabels": {"a": "1"}}, None, {"metadata": {"name": "x"}}, False),
    # Either object or oldObject matching is enough (an UPDATE that adds or removes the label).
    ({"matchLabels": {"a": "1"}}, _labelled(a="1"), _labelled(), True),
    ({"matchLabels": {"a": "1"}}, _labelled(), _labelled(a="1"), True),
    # A null object never matches, not even a selector that matches an empty label set.
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, None, None, False),
    ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, None, None, False),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, None, _labelled(), True),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, None, _labelled(a="1"), False),
    ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, None, _labelled(a=""), True),
    # Requirements are ANDed.
    ({"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "In", "values": ["2", "3"]}]},
     None, _labelled(a="1", b="3"), True),
    ({"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "In", "values": ["2", "3"]}]},
     None, _labelled(a="1"), False),
    # An empty (or absent) selector matches every request, null objects included.
    ({}, None, None, True),
    (None, None, None, True),
], ids=["old-matches", "old-other-value", "old-no-labels", "old-no-labels-field", "object-matches",
        "old-matches-object-not", "null-notin", "null-doesnotexist", "notin-unlabelled", "notin-labelled",
        "exists-empty-value", "anded", "anded-one-missing", "empty", "absent"])
def test_object_selector_matches_object_or_old_object(selector: Any, obj: Any, old: Any, expected: bool) -> None:
    """objectSelector as in apiserver predicates/object/matcher.go: an empty selector matches everything,
    otherwise object or oldObject must match and a null object never does."""
    matches = _selecting(selector, operations=["DELETE", "UPDATE"])
    operation = "DELETE" if obj is None else "UPDATE"
    assert matches(operation, GroupResource("", "configmaps"), "team", obj, old) is expected


def test_a_selected_object_still_needs_the_rules_to_match() -> None:
    """A labelled object is skipped when the rules do not match; `*` means every resource but no
    subresource, `*/*` both, `deployments/*` deployments and their subresources (rules.go: a `*` after
    the slash matches "no subresource" too)."""
    old = _labelled(a="1")
    deployments = _selecting({"matchLabels": {"a": "1"}}, apiGroups=["apps"], resources=["deployments"])
    assert deployments("DELETE", GroupResource("apps", "deployments"), "team", None, old)
    assert not deployments("DELETE", GroupResource("", "configmaps"), "team", None, old)
    assert not deployments("DELETE", GroupResource("apps", "deployments/scale"), "team", None, old)
    assert not deployments("UPDATE", GroupResource("apps", "deployments"), "team", old, old)
    for resources, top, sub in ((["*"], True, False), (["*/*"], True, True), (["deployments/*"], True, True),
                                (["*/scale"], False, True)):
        matches = _selecting({"matchLabels": {"a": "1"}}, resources=resources)
        assert matches("DELETE", GroupResource("apps", "deployments"), "team", None, old) is top, resources
        assert matches("DELETE", GroupResource("apps", "deployments/scale"), "team", None, old) is sub, resources


def test_a_bad_object_selector_names_the_field() -> None:
    """An objectSelector the API server would reject is refused with its path."""
    from criticalsvc.errors import InvalidSpec

    with pytest.raises(InvalidSpec, match=r"webhooks\[0\]\.objectSelector\.matchExpressions\[0\]\.operator"):
        _selecting({"matchExpressions": [{"key": "a", "operator": "Equals", "values": ["1"]}]})


@pytest.mark.anyio
async def test_the_stand_in_sends_only_labelled_objects_to_a_selecting_webhook() -> None:
    """Through the HTTP stand-in: a DELETE reaches a webhook with an objectSelector only when the stored
    object (oldObject) carries the label; unlabelled objects of the same type are deleted untouched."""
    calls: list[str] = []

    def factory(url: str, **_: Any) -> Any:
        def hook(review: dict[str, Any]) -> dict[str, Any]:
            calls.append(review["request"]["name"])
            return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                    "response": {"uid": review["request"]["uid"], "allowed": False,
                                 "status": {"code": 403, "reason": "Forbidden", "message": "locked"}}}

        return hook

    config = {"webhooks": [{
        "name": "locks.example.com", "admissionReviewVersions": ["v1"], "sideEffects": "None",
        "clientConfig": {"url": "https://locks.example.com/validate"},
        "rules": [{"operations": ["DELETE"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"]}],
        "objectSelector": {"matchExpressions": [{"key": PROTECTED, "operator": "In", "values": ["Always"]}]}}]}
    store = Store(clock=time.time)
    register_webhooks(store, config, hook_factory=factory)
    configmaps = "/api/v1/namespaces/default/configmaps"
    async with standin(store) as (_, client):
        for name, labels in (("locked", {PROTECTED: "Always"}), ("open", {}), ("other", {PROTECTED: "Never"})):
            created = await client.post(configmaps, json={"apiVersion": "v1", "kind": "ConfigMap",
                                                          "metadata": {"name": name, "labels": labels}})
            assert created.status_code == 201, created.text
        denied = await client.delete(f"{configmaps}/locked")
        opened = await client.delete(f"{configmaps}/open")
        other = await client.delete(f"{configmaps}/other")
    assert denied.status_code == 403
    assert denied.json()["message"] == 'admission webhook "locks.example.com" denied the request: locked'
    assert opened.status_code == 200 and other.status_code == 200
    assert calls == ["locked"]


def test_bad_webhook_configuration_names_the_field() -> None:
    """A configuration the API server would reject is refused with the offending field's path."""
    from criticalsvc.errors import InvalidSpec

    config = {"webhooks": [{"name": "x", "admissionReviewVersions": ["v1beta1"], "clientConfig": {"url": "https://x"}}]}
    with pytest.raises(InvalidSpec) as info:
        register_webhooks(Store(clock=time.time), config)
    assert info.value.path == "webhooks[0].admissionReviewVersions"


@pytest.mark.anyio
async def test_unresolvable_service_webhook_follows_failure_policy() -> None:
    """A service-backed webhook without a resolver fails every call: 500 under Fail, allowed under Ignore."""
    def config(policy: str) -> dict[str, Any]:
        return {"webhooks": [{"name": f"{policy.lower()}.example.com", "admissionReviewVersions": ["v1"],
                              "failurePolicy": policy,
                              "clientConfig": {"service": {"namespace": "gate", "name": "gate"}},
                              "rules": [{"operations": ["DELETE"], "apiGroups": ["apps"], "apiVersions": ["v1"],
                                         "resources": ["deployments"]}]}]}

    failing, ignoring = Store(clock=time.time), Store(clock=time.time)
    register_webhooks(failing, config("Fail"))
    register_webhooks(ignoring, config("Ignore"))
    replies = []
    for store in (failing, ignoring):
        async with standin(store) as (_, client):
            await client.post(DEPLOYMENTS, json=deployment("web"))
            replies.append(await client.delete(f"{DEPLOYMENTS}/web"))
    assert replies[0].status_code == 500
    assert replies[0].json()["message"].startswith(
        'Internal error occurred: failed calling webhook "fail.example.com": failed to call webhook: service "gate"')
    assert replies[1].status_code == 200


# --- subresources, events, leases -------------------------------------------------------------------
CS = "/apis/criticalsvc.io/v1alpha1/criticalservices"


def critical_service(name: str) -> dict[str, Any]:
    return {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": name},
            "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": "default",
                                  "name": "web"},
                     "criteria": [{"type": "SpecificResource", "specificResource": {
                         "group": "", "resource": "configmaps", "namespace": "default", "name": "x"}}]}}


@pytest.mark.anyio
async def test_status_subresource_writes_only_status() -> None:
    """PATCH/PUT on /status change only .status; a main-resource update keeps the status it had."""
    async with standin() as (_, client):
        await client.post(CS, json=critical_service("web"))
        patched = await client.patch(f"{CS}/web/status", headers=MERGE,
                                     content=b'{"status":{"providerUID":"u1"},"spec":{"criteria":[]}}')
        obj = patched.json()
        obj["status"] = {"providerUID": "ignored"}
        obj["metadata"]["labels"] = {"a": "b"}
        main = await client.put(f"{CS}/web", json=obj)
        got = await client.get(f"{CS}/web/status")
    assert patched.status_code == 200 and patched.json()["status"] == {"providerUID": "u1"}
    assert len(patched.json()["spec"]["criteria"]) == 1
    assert main.status_code == 200 and main.json()["metadata"]["labels"] == {"a": "b"}
    assert got.json()["status"] == {"providerUID": "u1"}


@pytest.mark.anyio
async def test_events_and_leases() -> None:
    """Core and events.k8s.io Events can be created and patched; Leases update optimistically."""
    event = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "cs.1"}, "reason": "DeletionBlocked",
             "involvedObject": {"kind": "CriticalService", "name": "web"}, "count": 1}
    new_event = {"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"generateName": "cs."},
                 "reason": "DeletionBlocked", "action": "Deny", "eventTime": "2026-01-01T00:00:00.000000Z"}
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "leader"},
             "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}}
    async with standin() as (_, client):
        created = await client.post("/api/v1/namespaces/default/events", json=event)
        counted = await client.patch("/api/v1/namespaces/default/events/cs.1", headers=MERGE, content=b'{"count":2}')
        v1 = await client.post("/apis/events.k8s.io/v1/namespaces/default/events", json=new_event)
        listed = (await client.get("/api/v1/events", params={"fieldSelector": "involvedObject.name=web"})).json()
        held = (await client.post("/apis/coordination.k8s.io/v1/namespaces/default/leases", json=lease)).json()
        held["spec"]["holderIdentity"] = "b"
        renewed = await client.put("/apis/coordination.k8s.io/v1/namespaces/default/leases/leader", json=held)
        stale = await client.put("/apis/coordination.k8s.io/v1/namespaces/default/leases/leader", json=held)
    assert created.status_code == 201 and counted.json()["count"] == 2
    assert v1.status_code == 201 and v1.json()["metadata"]["name"].startswith("cs.")
    assert [e["metadata"]["name"] for e in listed["items"]] == ["cs.1"]
    assert renewed.status_code == 200 and renewed.json()["spec"]["holderIdentity"] == "b"
    assert stale.status_code == 409


# --- watch ---------------------------------------------------------------------------------------------
@pytest.mark.anyio
async def test_watch_from_a_resource_version_sends_later_events_then_bookmark() -> None:
    """A watch from a list's resourceVersion sends the later events, then a bookmark with only the RV."""
    async with standin() as (_, client):
        await client.post(DEPLOYMENTS, json=deployment("before"))
        rv = (await client.get(DEPLOYMENTS)).json()["metadata"]["resourceVersion"]
        await client.post(DEPLOYMENTS, json=deployment("web"))
        await client.patch(f"{DEPLOYMENTS}/before", headers=MERGE, content=b'{"metadata":{"labels":{"a":"b"}}}')
        await client.delete(f"{DEPLOYMENTS}/web")
        await client.post("/api/v1/namespaces", json=namespace("unrelated"))  # moves the bookmark's version on
        events = await watch_lines(client, DEPLOYMENTS, resourceVersion=rv, allowWatchBookmarks="true",
                                   timeoutSeconds="0.2")
    assert [(e["type"], e["object"]["metadata"].get("name")) for e in events[:3]] == [
        ("ADDED", "web"), ("MODIFIED", "before"), ("DELETED", "web")]
    bookmark = events[3]
    assert bookmark["type"] == "BOOKMARK"
    assert bookmark["object"] == {"kind": "Deployment", "apiVersion": "apps/v1",
                                  "metadata": {"resourceVersion": bookmark["object"]["metadata"]["resourceVersion"]}}
    deleted_rv = int(events[2]["object"]["metadata"]["resourceVersion"])
    assert int(bookmark["object"]["metadata"]["resourceVersion"]) > deleted_rv


@pytest.mark.anyio
async def test_watch_without_resource_version_starts_with_the_current_objects() -> None:
    """A watch with no resourceVersion first sends ADDED for every matching object (fieldSelector honoured)."""
    async with standin() as (_, client):
        await client.post(DEPLOYMENTS, json=deployment("a"))
        await client.post(DEPLOYMENTS, json=deployment("b"))
        events = await watch_lines(client, DEPLOYMENTS, fieldSelector="metadata.name=b", timeoutSeconds="0.1")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "b")]


@pytest.mark.anyio
async def test_watch_with_an_expired_resource_version_gets_410() -> None:
    """A resourceVersion older than the kept history gets one ERROR event carrying a 410 Expired Status."""
    async with standin(Store(clock=time.time, history=3)) as (_, client):
        for name in "abcdef":
            await client.post(DEPLOYMENTS, json=deployment(name))
        events = await watch_lines(client, DEPLOYMENTS, resourceVersion="1", timeoutSeconds="5")
    assert len(events) == 1 and events[0]["type"] == "ERROR"
    status = events[0]["object"]
    assert (status["kind"], status["code"], status["reason"]) == ("Status", 410, "Expired")


@pytest.mark.anyio
async def test_live_watch_streams_changes_and_periodic_bookmarks() -> None:
    """An open watch receives objects created and deleted after it started, and periodic bookmarks."""
    async with standin(bookmark_interval=0.05) as (server, client):
        rv = (await client.get(DEPLOYMENTS)).json()["metadata"]["resourceVersion"]
        task = asyncio.ensure_future(watch_lines(client, DEPLOYMENTS, resourceVersion=rv,
                                                 allowWatchBookmarks="true", timeoutSeconds="10"))
        for _ in range(500):  # until the watch is subscribed
            if server.open_watches:
                break
            await asyncio.sleep(0.01)
        await client.post(DEPLOYMENTS, json=deployment("web"))
        await asyncio.sleep(0.15)
        await client.delete(f"{DEPLOYMENTS}/web")
        await asyncio.sleep(0.05)
        server.close_watches()
        events = await asyncio.wait_for(task, 5)
    changes = [(e["type"], e["object"]["metadata"]["name"]) for e in events if e["type"] != "BOOKMARK"]
    assert changes == [("ADDED", "web"), ("DELETED", "web")]
    assert sum(e["type"] == "BOOKMARK" for e in events) >= 2


@pytest.mark.anyio
async def test_watch_reports_objects_leaving_the_label_selector_as_deleted() -> None:
    """An object relabelled out of a watch's selector is DELETED to that watch."""
    async with standin() as (_, client):
        await client.post(DEPLOYMENTS, json=deployment("web", tier="front"))
        task = asyncio.ensure_future(watch_lines(client, DEPLOYMENTS, labelSelector="tier=front",
                                                 timeoutSeconds="0.3"))
        await asyncio.sleep(0.1)
        await client.patch(f"{DEPLOYMENTS}/web", headers=MERGE, content=b'{"metadata":{"labels":{"tier":"back"}}}')
        events = await task
    assert [e["type"] for e in events] == ["ADDED", "DELETED"]


# --- controllers -----------------------------------------------------------------------------------
@pytest.mark.anyio
async def test_controllers_run_on_the_writer_thread_with_real_time() -> None:
    """start_controllers gets a real-time engine whose callbacks run on the writer thread and may write."""
    threads: list[str] = []

    def start_controllers(store: Store, engine: Engine) -> None:
        def tick() -> None:
            threads.append(threading.current_thread().name)
            store.remove_finalizer(ObjectRef(GroupResource("example.com", "widgets"), "default", "w1"),
                                   "example.com/cleanup")

        def on_event(event: Any) -> None:
            if event.object["metadata"].get("deletionTimestamp"):
                engine.schedule(0.05, tick)

        store.subscribe(on_event)

    async with standin(start_controllers=start_controllers) as (_, client):
        await client.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd())
        await client.post(WIDGETS, json=widget("w1", finalizers=("example.com/cleanup",)))
        await client.delete(f"{WIDGETS}/w1")
        for _ in range(200):
            if (await client.get(f"{WIDGETS}/w1")).status_code == 404:
                break
            await asyncio.sleep(0.01)
        gone = (await client.get(f"{WIDGETS}/w1")).status_code
    assert gone == 404
    assert threads and all(name.startswith("standin-writer") for name in threads)


@pytest.mark.anyio
async def test_a_cluster_built_on_the_stand_in_engine_tears_down_over_http() -> None:
    """The simulator's Cluster, built on a StandInEngine and served, runs its controllers in real time."""
    engine = StandInEngine()
    cluster = Cluster(engine=engine, finalizer_delay=(0.01, 0.02))
    cluster.load(load_path(str(ROOT / "api/examples/reference-story.yaml")))
    crd_url = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/coolresources.my.crd.group"
    async with standin(cluster.store, engine=engine) as (_, client):
        assert (await client.delete(crd_url)).status_code == 200
        for _ in range(500):  # the CRD cleanup deletes the CRs, their operator finalizes them
            if (await client.get(crd_url)).status_code == 404:
                break
            await asyncio.sleep(0.01)
        crd_status = (await client.get(crd_url)).status_code
        served = (await client.get("/apis/my.crd.group/v1")).status_code
    assert (crd_status, served) == (404, 404)
    assert {e.actor for e in cluster.timeline} >= {"crd-cleanup"}


@pytest.mark.anyio
async def test_builtin_namespaces_exist_at_start() -> None:
    """The stand-in starts with default, kube-system, kube-public and kube-node-lease, like a new cluster."""
    async with standin(Store(clock=time.time), bootstrap_namespaces=("default", "kube-system", "kube-public",
                                                                     "kube-node-lease")) as (server, client):
        names = [n["metadata"]["name"] for n in (await client.get("/api/v1/namespaces")).json()["items"]]
    assert names == ["default", "kube-node-lease", "kube-public", "kube-system"]
    assert server.store.exists(NAMESPACES, "", "default")


# --- pure helpers ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "labels", "expected"), [
    ("app=web", {"app": "web"}, True),
    ("app==web", {"app": "db"}, False),
    ("app!=web", {}, True),
    ("env in (a, b),tier notin (db)", {"env": "b", "tier": "web"}, True),
    ("env in (a,b)", {"env": "c"}, False),
    ("!legacy", {"legacy": "1"}, False),
    ("team", {"team": ""}, True),
    ("", {}, True),
])
def test_label_selector_text(text: str, labels: dict[str, str], expected: bool) -> None:
    """Query-string label selectors follow the Kubernetes syntax (=, ==, !=, in, notin, exists, !key)."""
    assert parse_label_selector_text(text).matches(labels) is expected


def test_malformed_label_selector_is_a_bad_request() -> None:
    """A selector that cannot be parsed is a 400 BadRequest, not a crash."""
    from criticalsvc.sim.store import StatusError

    with pytest.raises(StatusError) as info:
        parse_label_selector_text("app in (a")
    assert info.value.code == 400


def test_strategic_merge_directives() -> None:
    """$patch delete/replace, $deleteFromPrimitiveList and merged finalizers behave as in Kubernetes."""
    target = {"metadata": {"finalizers": ["a", "b"]},
              "spec": {"containers": [{"name": "x", "image": "1"}, {"name": "y", "image": "2"}],
                       "tolerations": [{"key": "k"}], "selector": {"a": "1"}}}
    patch = {"metadata": {"finalizers": ["c"], "$deleteFromPrimitiveList/finalizers": ["a"]},
             "spec": {"containers": [{"name": "y", "$patch": "delete"}], "tolerations": [{"key": "z"}],
                      "selector": {"$patch": "replace", "b": "2"}}}
    result = strategic_merge_patch(target, patch)
    assert result["metadata"]["finalizers"] == ["b", "c"]
    assert result["spec"]["containers"] == [{"name": "x", "image": "1"}]
    assert result["spec"]["tolerations"] == [{"key": "z"}]
    assert result["spec"]["selector"] == {"b": "2"}


def test_json_patch_operations() -> None:
    """add (with -), move, copy, replace and remove follow RFC 6902."""
    doc = {"a": [1, 2], "b": {"c": 1}}
    ops = [{"op": "add", "path": "/a/-", "value": 3}, {"op": "copy", "from": "/b/c", "path": "/d"},
           {"op": "move", "from": "/b", "path": "/e"}, {"op": "replace", "path": "/d", "value": 5},
           {"op": "remove", "path": "/a/0"}, {"op": "add", "path": "/x~1y", "value": True}]
    assert json_patch(doc, ops) == {"a": [2, 3], "d": 5, "e": {"c": 1}, "x/y": True}
    assert doc == {"a": [1, 2], "b": {"c": 1}}  # the input is not modified
