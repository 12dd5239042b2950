"""Why is it stuck terminating? The diagnosis `criticalsvc explain` adds, on snapshots of the two causes the real
control plane reproduces (tests/test_realcluster_stuck.py), and a few more."""

from __future__ import annotations

import json

import yaml

from criticalsvc.api import NAMESPACES, GroupResource, ObjectRef
from criticalsvc.cli import main
from criticalsvc.discover.diagnose import diagnose
from criticalsvc.discover.inventory import from_objects
from criticalsvc.discover.propose import access_questions
from criticalsvc.discover.rbac import review
from tests.discover_cluster import (
    apiservice,
    cluster_role,
    cluster_role_binding,
    crd,
    custom,
    deployment,
    namespace,
    rule,
    webhook_configuration,
    workload_with_service,
)

DELETED = "2026-12-07T02:00:00Z"
DISCOVERY_FAILED = ("Discovery failed for some groups, 1 failing: unable to retrieve the complete list of server APIs: "
                    "x.example.com/v1beta1: stale GroupVersion discovery: x.example.com/v1beta1")


def terminating_namespace(name: str, *conditions: tuple[str, str, str]) -> dict:
    ns = namespace(name)
    ns["metadata"]["deletionTimestamp"] = DELETED
    ns["spec"] = {"finalizers": ["kubernetes"]}
    ns["status"] = {"phase": "Terminating", "conditions": [
        {"type": t, "status": "True", "reason": r, "message": m} for t, r, m in conditions]}
    return ns


def diagnosis_of(objs: list[dict], target: ObjectRef):
    inv = from_objects(objs)
    return diagnose(target, inv, {q: review(q, inv) for q in access_questions(inv)})


def apiservice_without_server(*, deployment_state: str) -> list[dict]:
    objs = [terminating_namespace("victim", ("NamespaceDeletionDiscoveryFailure", "DiscoveryFailed", DISCOVERY_FAILED)),
            apiservice("v1beta1.x.example.com", "x", "x-api", available="False", reason="MissingEndpoints",
                       message='endpoints for service/x-api in "x" have no addresses with port name ""')]
    server = workload_with_service("x", "x-api", ready=False)
    if deployment_state == "terminating":
        server[0]["metadata"]["deletionTimestamp"] = DELETED
        server[0]["metadata"]["finalizers"] = ["foregroundDeletion"]
    elif deployment_state == "gone":
        server = [o for o in server if o["kind"] == "Service"]
    return objs + server


def test_apiservice_without_a_server_is_traced_to_its_deleted_deployment():
    """NamespaceDeletionDiscoveryFailure is traced to the APIService, its Service with no ready endpoints and the
    Deployment deleted behind it; deleting the APIService is offered as a way out, marked unsafe."""
    d = diagnosis_of(apiservice_without_server(deployment_state="terminating"), ObjectRef(NAMESPACES, "", "victim"))
    assert d is not None and d.deletion_timestamp == DELETED
    assert d.conditions == (f"NamespaceDeletionDiscoveryFailure (DiscoveryFailed): {DISCOVERY_FAILED}",)
    (cause,) = d.causes
    assert cause.summary.startswith(
        'APIService v1beta1.x.example.com is unavailable (MissingEndpoints: endpoints for service/x-api in "x" have '
        "no addresses with port name \"\"): Service x/x-api has no ready endpoints; its Deployment x/x-api was "
        f"deleted at {DELETED} (still terminating)")
    safe, unsafe = cause.ways_out
    assert not safe.unsafe and "re-create Deployment x/x-api" in safe.text
    assert unsafe.text.startswith("kubectl delete apiservice v1beta1.x.example.com") and unsafe.unsafe
    assert d.last_resort is not None and "/api/v1/namespaces/victim/finalize" in d.last_resort.text
    assert "left in storage" in d.last_resort.unsafe


def test_apiservice_whose_deployment_is_gone():
    """With the Deployment gone altogether, the cause says no workload is behind the Service."""
    d = diagnosis_of(apiservice_without_server(deployment_state="gone"), ObjectRef(NAMESPACES, "", "victim"))
    assert d is not None
    (cause,) = d.causes
    assert "Service x/x-api has no ready endpoints; Service x/x-api: no pod or workload in namespace x matches its " \
           "selector app=x-api (was it deleted?)" in cause.summary


def crs_stuck(*, controller: str) -> list[dict]:
    objs = [terminating_namespace("cool-apps", ("NamespaceFinalizersRemaining", "SomeFinalizersRemain",
                                                "Some content in the namespace has finalizers remaining: "
                                                "my.crd.group/super-important in 2 resource instances")),
            crd("my.crd.group", "coolresources", "CoolResource")]
    objs += [custom("my.crd.group/v1", "CoolResource", "cool-apps", n, finalizers=["my.crd.group/super-important"],
                    deleting=DELETED) for n in ("alpha", "beta")]
    if controller != "gone":
        objs += [deployment("finalizer-namespace", "finalizer-deployment", sa="finalizer-sa",
                            replicas=0 if controller == "scaled-to-zero" else 1),
                 cluster_role("cool", [rule(["my.crd.group"], ["coolresources"])]),
                 cluster_role_binding("cool", "cool", ("finalizer-namespace", "finalizer-sa"))]
    return objs


def test_crs_whose_controller_was_deleted_first():
    """NamespaceFinalizersRemaining with no controller left: the cause names the finalizer, the objects and that
    no workload processes it; removing the finalizer by hand is a way out marked unsafe, with a patch that tests
    the finalizer's index."""
    d = diagnosis_of(crs_stuck(controller="gone"), ObjectRef(NAMESPACES, "", "cool-apps"))
    assert d is not None
    (cause,) = d.causes
    assert cause.summary.startswith(
        "2 coolresources.my.crd.group (cool-apps/alpha, cool-apps/beta) wait for finalizer "
        f"my.crd.group/super-important since {DELETED}: no running workload processes it")
    reinstall, patch = cause.ways_out
    assert not reinstall.unsafe and patch.unsafe.startswith("the cleanup the finalizer guards never runs")
    assert patch.text == ("kubectl patch coolresources.my.crd.group alpha -n cool-apps --type=json -p "
                          '\'[{"op":"test","path":"/metadata/finalizers/0","value":"my.crd.group/super-important"},'
                          '{"op":"remove","path":"/metadata/finalizers/0"}]\'')


def test_crs_whose_controller_is_scaled_to_zero():
    """The controller found by the access inference is scaled to 0: the way out is to scale it back up."""
    d = diagnosis_of(crs_stuck(controller="scaled-to-zero"), ObjectRef(NAMESPACES, "", "cool-apps"))
    assert d is not None
    (cause,) = d.causes
    assert "its controller is Deployment finalizer-namespace/finalizer-deployment (medium confidence), which is " \
           "scaled to 0 replicas" in cause.summary
    assert cause.ways_out[0].text == \
        "kubectl scale -n finalizer-namespace deployments.apps/finalizer-deployment --replicas=1"


def test_an_object_is_diagnosed_by_its_finalizers_and_a_live_one_is_not_stuck():
    """A terminating custom resource gets the same finalizer cause; one not being deleted gets no diagnosis."""
    objs = [*crs_stuck(controller="gone"), custom("my.crd.group/v1", "CoolResource", "cool-apps", "live",
                                                  finalizers=["my.crd.group/super-important"])]
    gr = GroupResource("my.crd.group", "coolresources")
    d = diagnosis_of(objs, ObjectRef(gr, "cool-apps", "alpha"))
    assert d is not None and "1 coolresources.my.crd.group (cool-apps/alpha)" in d.causes[0].summary
    assert diagnosis_of(objs, ObjectRef(gr, "cool-apps", "live")) is None


def test_a_fail_closed_webhook_without_server_refusing_deletes():
    """NamespaceDeletionContentFailure naming a webhook is traced to that webhook's Service and workload."""
    message = ('Failed to delete all resource types, 1 remaining: Internal error occurred: failed calling webhook '
               '"guard.example.io": failed to call webhook: Post "https://guard.guard:443/validate": no endpoints')
    hook = webhook_configuration("guard", "guard", "guard", rules=[
        {"operations": ["DELETE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"]}])
    hook["webhooks"][0]["name"] = "guard.example.io"
    server = workload_with_service("guard", "guard", ready=False)
    server[0]["spec"]["replicas"] = 0
    objs = [terminating_namespace("apps", ("NamespaceDeletionContentFailure", "ContentDeletionFailed", message)),
            hook, *server]
    d = diagnosis_of(objs, ObjectRef(NAMESPACES, "", "apps"))
    assert d is not None
    (cause,) = d.causes
    assert cause.summary == ("ValidatingWebhookConfiguration guard (webhook guard.example.io, failurePolicy Fail) "
                             "refuses the namespace controller's deletes: Service guard/guard has no ready endpoints; "
                             "its Deployment guard/guard is scaled to 0 replicas")
    assert cause.ways_out[0].text == "kubectl scale -n guard deployments.apps/guard --replicas=1"


def test_explain_shows_the_diagnosis(tmp_path, capsys):
    """`criticalsvc explain ns/NAME --state` adds the stuck diagnosis under the gate's answer, text and JSON."""
    snapshot = tmp_path / "cluster.yaml"
    snapshot.write_text(yaml.safe_dump_all(apiservice_without_server(deployment_state="terminating")))
    assert main(["explain", "ns/victim", "--state", str(snapshot)]) == 0
    out = capsys.readouterr().out
    assert "ALLOWED now (rule: already-terminating)" in out
    assert f"STUCK TERMINATING since {DELETED}:" in out
    assert "    cause: APIService v1beta1.x.example.com is unavailable" in out
    assert "      way out (UNSAFE: whatever its server stored is left in that server's storage, not deleted): " \
           "kubectl delete apiservice v1beta1.x.example.com" in out
    assert main(["explain", "ns/victim", "--state", str(snapshot), "-o", "json"]) == 0
    stuck = json.loads(capsys.readouterr().out)["stuck"]
    assert stuck["causes"][0]["waysOut"][-1]["unsafe"]
