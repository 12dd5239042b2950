"""Condition Covered: a CriticalService whose provider serves something its criteria do not cover says so."""

from __future__ import annotations

import asyncio
from typing import Any

from criticalsvc.api import parse_critical_service
from criticalsvc.cache import APIStatusError
from criticalsvc.discover.coverage import served_by, served_of
from criticalsvc.discover.inventory import from_objects
from criticalsvc.discover.propose import access_questions, propose
from criticalsvc.discover.rbac import review
from criticalsvc.discover.read import CoverageWatch, criteria_types
from criticalsvc.snapshot import build_state
from criticalsvc.state import MemoryState
from criticalsvc.status import compute_status
from tests.discover_cluster import (
    apiservice,
    cluster_role,
    cluster_role_binding,
    crd,
    custom,
    deployment,
    rule,
    webhook_configuration,
    workload_with_service,
)
from tests.test_discover_read import FakeCluster

NOW = 1_800_000_000.0


def server() -> list[dict]:
    """metrics-server serving an APIService and a validating webhook."""
    return [*workload_with_service("kube-system", "metrics-server"),
            apiservice("v1beta1.metrics.k8s.io", "kube-system", "metrics-server"),
            webhook_configuration("metrics-guard", "kube-system", "metrics-server")]


def critical_service(*criteria: dict) -> dict:
    return {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": "metrics"},
            "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": "kube-system",
                                  "name": "metrics-server"}, "criteria": list(criteria)}}


APISERVICE = {"type": "SpecificResource", "specificResource": {"group": "apiregistration.k8s.io",
                                                               "resource": "APIService",
                                                               "name": "v1beta1.metrics.k8s.io"}}
WEBHOOK = {"type": "SpecificResource", "specificResource": {"group": "admissionregistration.k8s.io",
                                                            "resource": "validatingwebhookconfigurations",
                                                            "name": "metrics-guard"}}


def covered(cs_obj: dict, *, state: MemoryState | None = None) -> dict:
    cs = parse_critical_service(cs_obj)
    served = served_of(cs, served_by(propose(from_objects(server()), {})))
    status = compute_status(cs, state or MemoryState(), now=NOW, served=served)
    return next(c for c in status["conditions"] if c["type"] == "Covered")


def test_a_missing_webhook_configuration_is_named():
    """A CriticalService covering the APIService but not the webhook configuration is Covered False
    (ServesUncovered), naming the configuration and the criterion to add."""
    c = covered(critical_service(APISERVICE))
    assert (c["status"], c["reason"]) == ("False", "ServesUncovered")
    assert c["message"].startswith(
        "deployments.apps kube-system/metrics-server also serves validatingwebhookconfigurations."
        "admissionregistration.k8s.io metrics-guard, which no criterion covers: add the criterion "
        "`validatingwebhookconfigurations.admissionregistration.k8s.io metrics-guard is gone`")


def test_covering_everything_is_true_and_a_kind_counts_as_its_resource():
    """Both things covered - the APIService named by its Kind, resolved by the state's REST mapper - is True."""
    state = build_state([])
    c = covered(critical_service(APISERVICE, WEBHOOK), state=state)
    assert (c["status"], c["reason"]) == ("True", "CoversServed")


def test_a_resources_criterion_over_the_type_covers_it():
    """`no validatingwebhookconfigurations exists` covers the one configuration too."""
    whole_type = {"type": "Resources", "resources": {"group": "admissionregistration.k8s.io",
                                                     "resource": "validatingwebhookconfigurations"}}
    assert covered(critical_service(APISERVICE, whole_type))["status"] == "True"


def test_no_condition_without_facts_or_for_a_selector():
    """Without coverage facts there is no Covered condition; a provider selector is not judged."""
    cs = parse_critical_service(critical_service(APISERVICE))
    status = compute_status(cs, MemoryState(), now=NOW)
    assert "Covered" not in {c["type"] for c in status["conditions"]}
    selector = critical_service(APISERVICE)
    selector["spec"]["provider"] = {"group": "apps", "resource": "deployments", "selector": {}}
    assert served_of(parse_critical_service(selector), {}) is None


def test_the_watch_reads_the_cluster_and_counts_changes():
    """CoverageWatch reads what workloads serve from the API server; `changes` moves only when that changes."""
    objs: dict[str, list[dict]] = {}
    for o in server():
        objs.setdefault({"Deployment": "deployments", "Service": "services", "ReplicaSet": "replicasets",
                         "Pod": "pods", "EndpointSlice": "endpointslices", "APIService": "apiservices",
                         "ValidatingWebhookConfiguration": "validatingwebhookconfigurations"}[o["kind"]], []).append(o)
    resources = {"/api/v1": [("services", "Service", True), ("pods", "Pod", True)],
                 "/apis/apps/v1": [("deployments", "Deployment", True), ("replicasets", "ReplicaSet", True)],
                 "/apis/discovery.k8s.io/v1": [("endpointslices", "EndpointSlice", True)],
                 "/apis/apiregistration.k8s.io/v1": [("apiservices", "APIService", False)],
                 "/apis/admissionregistration.k8s.io/v1": [("validatingwebhookconfigurations",
                                                            "ValidatingWebhookConfiguration", False)]}
    watch = CoverageWatch(FakeCluster(objs, allowed=set(), resources=resources), every=60,
                          gate_namespace="criticalsvc-system")
    asyncio.run(watch.read_once())
    asyncio.run(watch.read_once())
    assert watch.changes == 1
    served = watch.served(parse_critical_service(critical_service(APISERVICE)))
    assert served is not None and len(served) == 2


def test_a_finalizer_the_provider_processes_is_named_too():
    """Where the finalizer inference is sure (high confidence), a CriticalService missing that Finalizer criterion
    is Covered False naming the finalizer and its type."""
    objs = [deployment("cert-manager", "cert-manager", sa="cert-manager"),
            crd("acme.cert-manager.io", "challenges", "Challenge"),
            custom("acme.cert-manager.io/v1", "Challenge", "apps", "c", finalizers=["finalizer.acme.cert-manager.io"]),
            cluster_role("challenges", [rule(["acme.cert-manager.io"], ["challenges"])]),
            cluster_role_binding("challenges", "challenges", ("cert-manager", "cert-manager"))]
    inv = from_objects(objs)
    served = served_by(propose(inv, {q: review(q, inv) for q in access_questions(inv)}))
    cs = parse_critical_service({"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService",
                                 "metadata": {"name": "cm"},
                                 "spec": {"provider": {"group": "apps", "resource": "deployments",
                                                       "namespace": "cert-manager", "name": "cert-manager"},
                                          "criteria": [WEBHOOK]}})
    status = compute_status(cs, MemoryState(), now=NOW, served=served_of(cs, served))
    c = next(c for c in status["conditions"] if c["type"] == "Covered")
    assert c["status"] == "False"
    assert "also serves finalizer finalizer.acme.cert-manager.io on challenges.acme.cert-manager.io" in c["message"]


def _finalizer_cluster(cluster_type: type[FakeCluster] = FakeCluster) -> FakeCluster:
    """cert-manager's controller, a Challenge carrying its finalizer, and the RBAC saying it may update Challenges."""
    objs = {"deployments": [deployment("cert-manager", "cert-manager", sa="cert-manager")],
            "challenges": [custom("acme.cert-manager.io/v1", "Challenge", "apps", "c",
                                  finalizers=["finalizer.acme.cert-manager.io"])],
            "clusterroles": [cluster_role("challenges", [rule(["acme.cert-manager.io"], ["challenges"])])],
            "clusterrolebindings": [cluster_role_binding("challenges", "challenges", ("cert-manager", "cert-manager"))]}
    resources = {"/api/v1": [], "/apis/apps/v1": [("deployments", "Deployment", True)],
                 "/apis/acme.cert-manager.io/v1": [("challenges", "Challenge", True)],
                 "/apis/rbac.authorization.k8s.io/v1": [("clusterroles", "ClusterRole", False),
                                                        ("clusterrolebindings", "ClusterRoleBinding", False),
                                                        ("roles", "Role", True), ("rolebindings", "RoleBinding", True)]}
    return cluster_type(objs, allowed=set(), resources=resources)


class _RBACForbidden(FakeCluster):
    async def get(self, path: str, params: Any = (), *, timeout: float, accept: str = "application/json") -> Any:
        if path.startswith("/apis/rbac.authorization.k8s.io/v1/"):
            raise APIStatusError(403, "Forbidden", f"{path} is forbidden")
        return await super().get(path, params, timeout=timeout, accept=accept)


CERT_MANAGER = {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": "cm"},
                "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": "cert-manager",
                                      "name": "cert-manager"},
                         "criteria": [{"type": "Resources", "resources": {"group": "acme.cert-manager.io",
                                                                          "resource": "Challenge",
                                                                          "namespace": "elsewhere"}}]}}


def test_the_live_watch_judges_finalizers_on_the_criteria_types_with_the_rbac_grant():
    """With the optional RBAC read grant, the gate's own watch finds the finalizer its provider processes on a type a
    criterion names (by Kind) and Covered says False naming it; without the grant, or when no criterion names the
    type, it does not judge finalizers (and reads no RBAC), Covered True on what it saw."""
    cs = parse_critical_service(CERT_MANAGER)
    types = lambda: criteria_types([cs])  # noqa: E731 - what serve passes: the live CriticalServices' types

    def condition(cluster: FakeCluster, finalizer_types: Any) -> tuple[dict, CoverageWatch]:
        watch = CoverageWatch(cluster, every=60, gate_namespace="criticalsvc-system", finalizer_types=finalizer_types)
        asyncio.run(watch.read_once())
        status = compute_status(cs, MemoryState(), now=NOW, served=watch.served(cs))
        return next(c for c in status["conditions"] if c["type"] == "Covered"), watch

    judged, watch = condition(_finalizer_cluster(), types)
    assert watch.finalizers_judged and judged["status"] == "False", judged
    assert "also serves finalizer finalizer.acme.cert-manager.io on challenges.acme.cert-manager.io" in \
        judged["message"]
    forbidden, watch = condition(_finalizer_cluster(_RBACForbidden), types)
    assert not watch.finalizers_judged and forbidden["status"] == "True", forbidden
    cluster = _finalizer_cluster()
    unnamed, watch = condition(cluster, frozenset)
    assert not watch.finalizers_judged and unnamed["status"] == "True", unnamed
    listed = {path.rsplit("/", 1)[1] for path, params, _ in cluster.gets if "limit" in params}
    assert listed == {"deployments"}, listed  # of what this cluster serves: no RBAC, no Challenges
