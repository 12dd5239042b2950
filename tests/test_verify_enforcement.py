"""The explorer's model of how a CriticalService becomes enforced (criticalsvc/verify/enforcement.py): the leader's
labelling, routing and probing interleaved every way, with an API server lagging on webhook configurations, judged by
the oracle's enforcement properties (criticalsvc/verify/oracle.py EnforcementOracle; design/routing.md, "No window,
on every API server").

* For one configuration of each provider in the catalogue, no interleaving lets a DELETE through any API server while
  Ready says Enforcing, and no label that protects can be removed; every run ends labelled and Enforcing. The runs
  reach what the design relies on: routes by name dropped once the labels are stored, probes answered by the lagging
  API server, and Enforcing while that API server holds no route at all.
* Negative controls: Ready claimed before the label is stored (status reading no label as missing) is found as a
  DELETE admitted through the lagging API server; with no gate, both properties fail.
* The simulator's routes leave what carries the label to the shipped protected.gate, as webhookconfigurations.render's
  objectSelector does, and match a DELETE by its oldObject as kube-apiserver's object matcher does; the explorer's
  teardowns start labelled, as the leader leaves a cluster once Ready says Enforcing.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from criticalsvc import status
from criticalsvc.api import DELETION_PROTECTED_LABEL, PROTECTED_LABEL, GroupResource, ObjectRef
from criticalsvc.cli import main
from criticalsvc.manifests import Manifest
from criticalsvc.routing import Route
from criticalsvc.sim.cluster import Cluster
from criticalsvc.sim.store import StatusError
from criticalsvc.sim.webhooks import ProviderRoutesRule, WrittenRoutesRule
from criticalsvc.verify import enforcement
from criticalsvc.verify.configurations import BOUNDS, Bound, Configuration, Service, configurations
from criticalsvc.verify.explorer import admitted, explore

DEPLOYMENTS = GroupResource("apps", "deployments")
DEPLOY = Configuration((Service("deploy", ("cm",)),))
WIDGET = Configuration((Service("widget", ("deploy",)),))


def _representatives() -> list[Configuration]:
    """The first admitted configuration of each provider at the ci bound (what `criticalsvc verify` explores)."""
    out: dict[str, Configuration] = {}
    for config in configurations(BOUNDS["ci"]):
        provider = config.services[0].provider
        if provider not in out and admitted(config) is None:
            out[provider] = config
    return list(out.values())


def test_no_interleaving_of_the_leaders_steps_admits_a_protected_delete_on_a_lagging_api_server():
    """Every provider of the catalogue: nothing found, every path run, and the paths reach the lagging API server."""
    steps: set[str] = set()
    configs = _representatives()
    assert len(configs) == 7
    for config in configs:
        explored = enforcement.explore_one(config)
        assert explored.findings == [], "\n".join(f"{r.describe()}: {r.violations}" for r in explored.findings)
        assert explored.runs >= 8, (config.label(), explored.runs)
    # What the design relies on, reached: a run in which the deployment's route by name is dropped after its label
    # is stored and the lagging API server answered a probe; Enforcing checked against a version with no route.
    for _path, run in enforcement.paths(lambda p: enforcement.run_one(DEPLOY, p), depth=enforcement.DEPTH):
        steps.update(s.split(" (")[0] for s in run.steps)
    assert {"the labeller labels deployments.apps a/d", "the labeller labels namespaces a",
            "the router writes version 2",
            "the probe is answered by an API server that has read no criticalsvc-providers yet"} <= steps, steps


def test_the_model_ends_labelled_and_enforcing_with_the_routes_by_name_dropped():
    """The canonical run of a custom provider: its Widget, namespace and CRD labelled, no route by name left, Ready
    Enforcing, and a DELETE of each refused through an API server holding no route."""
    model = enforcement.Model(WIDGET)
    run = enforcement.run_one(WIDGET, enforcement.Path(), model=model)
    assert run.violations == ()
    assert model.ready() == ["Enforcing"]
    assert model.history[model.written] == frozenset()
    labelled = sorted(str(r) for r in model.oracle.guarded(0))
    assert labelled == ["customresourcedefinitions.apiextensions.k8s.io widgets.ex.com", "namespaces b",
                        "widgets.ex.com b/w"]
    for ref in model.oracle.guarded(0):
        obj = model.store.get(ref.group_resource, ref.namespace, ref.name)
        assert obj is not None and obj["metadata"]["labels"][PROTECTED_LABEL] == "true"
        assert model.admitted("DELETE", ref) == [] and model.admitted("UNLABEL", ref) == []


def test_negative_control_ready_before_the_label_is_stored_is_found_on_the_lagging_api_server(monkeypatch):
    """Status that sees no label missing says Enforcing once the route by name is proven on one API server; the
    explorer finds the DELETE another API server, holding no route yet, admits."""
    monkeypatch.setattr(status.protectionlabels, "missing", lambda cs, state: [])
    explored = enforcement.explore_one(DEPLOY)
    assert len(explored.findings) == 1
    texts = [v.text for v in explored.findings[0].violations]
    assert any("with cs0 Ready=Enforcing, the DELETE of deployments.apps a/d was admitted by an API server that has "
               "read no criticalsvc-providers yet" in t or "the DELETE of namespaces a was admitted by an API server "
               "that has read no criticalsvc-providers yet" in t for t in texts), texts
    assert "the probe is answered by" in explored.findings[0].describe()


def test_negative_control_without_the_gate_both_enforcement_properties_fail(tmp_path, capsys):
    """No gate: the DELETE after Enforcing and the removal of the label are admitted; `verify` prints both, exit 1."""
    explored = enforcement.explore_one(DEPLOY, cluster_factory=lambda **kw: Cluster(gate=False, **kw))
    texts = " ".join(v.text for v in explored.findings[0].violations)
    assert "Ready=Enforcing, the DELETE of deployments.apps a/d was admitted by" in texts
    assert "an UPDATE removing criticalsvc.io/protected from deployments.apps a/d was admitted" in texts
    bound = ["--bound", "providers=deploy,criteria_menu=cm,depth=0", "--deleter", "kubectl", "-q"]
    assert main(["verify", *bound, "--no-gate", "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "explored for 1 configuration(s)" in out and "1 violating" in out
    assert "created, then leader's steps (choices" in out and "the labeller labels" in out


def test_the_enforcement_bound_is_what_it_says():
    """`enforcement=off` explores no leader's steps, `all` every admitted configuration, the default one a provider."""
    small = Bound(providers=("deploy", "cm-selector"), criteria_menu=("cm", "deploy", "widgets"), depth=0)
    counts = {}
    for value in ("off", "providers", "all"):
        report = explore(attrs.evolve(small, enforcement=value), deleters=("kubectl",))
        assert report.enforcement_findings == []
        counts[value] = report.enforced
    assert counts == {"off": 0, "providers": 2, "all": 4}
    assert main(["verify", "--bound", "enforcement=some"]) == 2


@pytest.mark.parametrize(("labels", "routed"), [
    ({}, True),
    ({PROTECTED_LABEL: "true"}, False),
    ({DELETION_PROTECTED_LABEL: "Always"}, False),
])
def test_a_written_route_leaves_labelled_objects_to_the_shipped_webhooks(labels: dict[str, str], routed: bool):
    """A DELETE (object null, oldObject stored) matches the written route by name only while the stored object
    carries neither label, as webhookconfigurations.render's objectSelector and the object matcher decide."""
    rule = WrittenRoutesRule(frozenset({Route("DELETE", DEPLOYMENTS, namespace="a", name="d")}))
    stored: dict[str, Any] = {"apiVersion": "apps/v1", "kind": "Deployment",
                              "metadata": {"name": "d", "namespace": "a", "labels": labels}}
    assert rule.matches("DELETE", DEPLOYMENTS, None, stored, name="d", namespace="a") is routed
    assert rule.matches("DELETE", DEPLOYMENTS, None, None, name="d", namespace="a") is False
    assert WrittenRoutesRule(frozenset()).matches("DELETE", DEPLOYMENTS, None, stored, name="d", namespace="a") is False


def test_the_teardowns_start_labelled_and_the_route_by_name_gives_way_to_the_label():
    """The explorer's teardowns start where Ready=Enforcing stands: the provider and its namespace labelled, their
    routes by name no longer matching them, the DELETE refused by the shipped rule that selects the label."""
    cluster = Cluster()
    cluster.load(Manifest(d, f"document {i + 1}") for i, d in enumerate(enforcement.manifests(DEPLOY)))
    routes = next(r for r in cluster.store.webhooks[0].rules if isinstance(r, ProviderRoutesRule))
    stored = cluster.store.get(DEPLOYMENTS, "a", "d")
    assert routes.matches("DELETE", DEPLOYMENTS, None, stored, name="d", namespace="a")
    assert enforcement.label(cluster) == 2
    stored = cluster.store.get(DEPLOYMENTS, "a", "d")
    assert stored is not None and stored["metadata"]["labels"][PROTECTED_LABEL] == "true"
    assert not routes.matches("DELETE", DEPLOYMENTS, None, stored, name="d", namespace="a")
    with pytest.raises(StatusError, match="CriticalService cs0 protects it until: configmaps b/c still exists"):
        cluster.store.delete(ObjectRef(DEPLOYMENTS, "a", "d"), dry_run=True)
