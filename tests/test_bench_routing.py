"""The routing benchmarks' pure parts (benchmarks/population.py, the summaries of benchmarks/realcluster.py):
the population is what it says, the requests the unprotected cells send are routed by none of its routes, and
the summaries read what they claim to read. No timing here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from benchmarks import population
from benchmarks.realcluster import (
    FREE_NAMESPACE,
    decisions_total,
    match_condition_seconds,
    process_cpu_seconds,
    stored_body,
    unprotected_summary,
)
from criticalsvc.api import GroupResource, parse_critical_service
from criticalsvc.restmapper import RESTMapper
from criticalsvc.routing import call_of, covers, desired

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = yaml.safe_load((ROOT / "deploy/base/webhook.yaml").read_text())


def test_a_small_population_is_the_start_of_a_large_one_and_mixes_every_kind() -> None:
    small, large = population.population(10), population.population(1000, cluster_wide=3)
    assert large[:10] == small and len(large) == 1003
    specs = [s["spec"] for s in large]
    assert sum("name" in s["provider"] for s in specs) == 750  # named: kinds 0-3, 6, 7
    assert sum("selector" in s["provider"] and "namespace" in s["provider"] for s in specs) == 250
    assert sum("selector" in s["provider"] and "namespace" not in s["provider"] for s in specs) == 3
    assert sum(s.get("holdUpdates") == "WhileBlocking" for s in specs) == 250
    assert len({s["metadata"]["name"] for s in large}) == len(large)
    for body in large:
        parse_critical_service(body)  # each is a valid CriticalService


def test_nothing_the_unprotected_cells_send_is_routed_by_the_population() -> None:
    """The DELETE of a Deployment and the label UPDATE of a ConfigMap in FREE_NAMESPACE, and the namespace's
    own DELETE... no route of 1,000 namespaced CriticalServices covers them: the gate is not on their path."""
    wanted = desired([parse_critical_service(s) for s in population.population(1000)], RESTMapper().lookup)
    assert FREE_NAMESPACE not in population.namespaces(1000)
    deployment = {"metadata": {"name": "u1000-c1-gate-0-3", "namespace": FREE_NAMESPACE, "labels": {"app": "x"}}}
    configmap = {"metadata": {"name": "u1000-c1-gate-0-3", "namespace": FREE_NAMESPACE}}
    labelled = {"metadata": {**configmap["metadata"], "labels": {"touched": "x"}}}
    calls = [call_of(operation="DELETE", group_resource=GroupResource("apps", "deployments"),
                     namespace=FREE_NAMESPACE, name="u1000-c1-gate-0-3", obj=None, old=deployment),
             call_of(operation="UPDATE", group_resource=GroupResource("", "configmaps"), namespace=FREE_NAMESPACE,
                     name="u1000-c1-gate-0-3", obj=labelled, old=configmap),
             call_of(operation="DELETE", group_resource=GroupResource("", "namespaces"), namespace="",
                     name=FREE_NAMESPACE, obj=None, old={"metadata": {"name": FREE_NAMESPACE}})]
    assert not [(r, c) for r in wanted.routes for c in calls if covers(r, c)]
    # The control: a provider of the population is routed.
    named = call_of(operation="DELETE", group_resource=GroupResource("apps", "deployments"),
                    namespace=population.protected_namespace(0), name="dep-0", obj=None,
                    old={"metadata": {"name": "dep-0"}})
    assert any(covers(r, named) for r in wanted.routes)


def test_the_rendered_size_fits_at_1000_and_stays_narrow_past_the_limit() -> None:
    """At 10,000 the routes are spread over the shards (none holds a third of the bytes) and none is broad; past what
    one condition may hold, a shard splits them over more webhooks (tests/test_routing.py)."""
    at_1000 = population.render_offline(population.population(1000), SHIPPED)
    assert at_1000["broad"] == [] and at_1000["webhooksWithoutCondition"] == []
    assert 0 < at_1000["longestExpressionChars"] < 90_000
    wide = population.render_offline(population.population(1000, cluster_wide=1), SHIPPED)
    assert wide["webhooksWithoutCondition"] == ["namespaces.gate.criticalsvc.io"]
    past = population.render_offline(population.population(10_000), SHIPPED)
    assert past["broad"] == [] and past["webhooksWithoutCondition"] == []
    assert past["configurations"] == 8 and past["largestBytes"] < past["bytes"] / 3
    assert past["longestExpressionChars"] < 90_000


def test_rendered_size_counts_bytes_webhooks_and_the_longest_condition() -> None:
    config = {"webhooks": [{"name": "a", "matchConditions": [{"name": "x", "expression": "abc"}]},
                           {"name": "b"}]}
    size = population.rendered_size([config, {"webhooks": [{"name": "b"}]}])
    one = len('{"webhooks":[{"name":"a","matchConditions":[{"name":"x","expression":"abc"}]},{"name":"b"}]}')
    assert size == {"bytes": one + len('{"webhooks":[{"name":"b"}]}'), "largestBytes": one, "configurations": 2,
                    "webhooks": 3, "matchConditions": 1, "longestExpressionChars": 3,
                    "webhooksWithoutCondition": ["b"]}


def test_decisions_are_summed_over_series_and_replicas() -> None:
    page = ("# HELP criticalsvc_decisions_total x\n"
            'criticalsvc_decisions_total{resource="deployments",result="allow"} 3.0\n'
            'criticalsvc_decisions_total{resource="namespaces",result="deny"} 2.0\n'
            "criticalsvc_decision_duration_seconds_count 9.0\n")
    assert decisions_total([page, page]) == 10.0
    assert process_cpu_seconds("process_cpu_seconds_total 12.5\nprocess_open_fds 3\n") == 12.5


def test_unprotected_summary_reports_the_noise_beside_the_ratio() -> None:
    summary = unprotected_summary({"gate": [0.004] * 10, "none": [0.002] * 10, "none2": [0.003] * 10})
    assert summary["ratio"] == {"gateNoneP50": 2.0, "gateNoneP99": 2.0, "none2NoneP50": 1.5, "none2NoneP99": 1.5}
    assert summary["gate"] == {"p50Ms": 4.0, "p99Ms": 4.0, "deletes": 10}


def test_a_stored_configuration_is_created_again_with_its_owner_but_no_server_fields() -> None:
    stored: dict[str, Any] = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
              "metadata": {"name": "criticalsvc-providers", "uid": "u", "resourceVersion": "9",
                           "labels": {"app.kubernetes.io/managed-by": "criticalsvc"},
                           "ownerReferences": [{"kind": "ValidatingWebhookConfiguration", "name": "criticalsvc",
                                                "uid": "o"}], "managedFields": []},
              "webhooks": [{"name": "probe.gate.criticalsvc.io"}]}
    body = stored_body(stored)
    assert body["metadata"] == {"name": "criticalsvc-providers", "labels": stored["metadata"]["labels"],
                                "ownerReferences": stored["metadata"]["ownerReferences"]}
    assert body["webhooks"] == stored["webhooks"]


def test_match_condition_time_is_summed_per_webhook() -> None:
    metric, labels = "apiserver_admission_match_condition_evaluation_seconds", 'kind="webhook",name="p.gate"'
    page = (f'{metric}_bucket{{{labels},operation="DELETE",type="validating",le="0.001"}} 4\n'
            f'{metric}_sum{{{labels},operation="DELETE",type="validating"}} 0.0002\n'
            f'{metric}_count{{{labels},operation="DELETE",type="validating"}} 4\n'
            f'{metric}_sum{{{labels},operation="UPDATE",type="validating"}} 0.0001\n'
            f'{metric}_count{{{labels},operation="UPDATE",type="validating"}} 1\n')
    assert match_condition_seconds(page) == {"p.gate": (0.0002 + 0.0001, 5.0)}
