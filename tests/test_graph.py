"""The dependency graphs: CriticalService edges, the cycle check, teardown phases, DOT and mermaid."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import networkx as nx
import pytest

from criticalsvc.api import CRDS, GroupResource, ObjectRef, parse_critical_service
from criticalsvc.errors import DependencyCycle
from criticalsvc.graph import check_no_cycle, plan, service_graph, to_dot, to_mermaid
from criticalsvc.manifests import load_path
from criticalsvc.objects import KubeObject
from criticalsvc.snapshot import build_state
from criticalsvc.state import MemoryState

STORY = str(Path(__file__).parent.parent / "api" / "examples" / "reference-story.yaml")
DEPLOYMENTS = GroupResource("apps", "deployments")


def cs(name: str, criterion: dict[str, Any], *, labels: dict[str, str] | None = None):
    """CriticalService `name` protecting Deployment ns-<name>/<name> with one criterion."""
    return parse_critical_service({
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": f"ns-{name}", "name": name},
                 "criteria": [criterion]}})


def waits_for_provider(other: str) -> dict[str, Any]:
    return {"type": "SpecificResource",
            "specificResource": {"group": "apps", "resource": "Deployment", "namespace": f"ns-{other}", "name": other}}


def state_of(*services, objects=()) -> MemoryState:
    state = MemoryState()
    for o in objects:
        state.upsert(o)
    for s in services:
        state.upsert_critical_service(s)
    return state


# --- service_graph --------------------------------------------------------------------------------
def test_edge_points_from_the_awaited_service_to_the_waiting_one():
    """a's criterion covering b's provider gives the edge b -> a, saying which criterion waits for what."""
    a, b = cs("a", waits_for_provider("b")), cs("b", {"type": "Resources", "resources": {"resource": "pods"}})
    graph = service_graph([a, b], state_of(a, b))
    assert list(graph.edges) == [("b", "a")]
    assert graph.edges["b", "a"]["why"] == "a.spec.criteria[0] waits for its provider deployments.apps ns-b/b of b"


@pytest.mark.parametrize(
    ("criterion", "labels", "word"),
    [({"type": "SpecificResource", "specificResource": {"resource": "Namespace", "name": "ns-b"}}, None,
      "its provider's namespace ns-b"),
     ({"type": "Resources", "resources": {"resource": "namespaces",
                                          "selector": {"matchLabels": {"kubernetes.io/metadata.name": "ns-b"}}}},
      None, "its provider's namespace ns-b"),
     ({"type": "Resources", "resources": {"group": "criticalsvc.io", "resource": "csvc",
                                          "selector": {"matchLabels": {"tier": "gold"}}}}, {"tier": "gold"},
      "CriticalService b")],
    ids=["namespace-by-name", "namespace-by-label", "service-by-label"])
def test_namespace_and_service_itself_are_part_of_the_teardown_set(criterion, labels, word):
    """Covering b's provider namespace or b itself also makes a wait for b."""
    a, b = cs("a", criterion), cs("b", {"type": "Resources", "resources": {"resource": "pods"}}, labels=labels)
    graph = service_graph([a, b], state_of(a, b))
    assert list(graph.edges) == [("b", "a")]
    assert graph.edges["b", "a"]["why"] == f"a.spec.criteria[0] waits for {word} of b"


def test_finalizer_criterion_waits_only_for_a_provider_carrying_it():
    """A Finalizer criterion on Deployments waits for b only while b's provider carries that finalizer."""
    a = cs("a", {"type": "Finalizer", "finalizer": {"group": "apps", "resource": "deployments",
                                                     "finalizerName": "example.com/f"}})
    b = cs("b", {"type": "Resources", "resources": {"resource": "pods"}})
    assert not service_graph([a, b], state_of(a, b)).edges
    carrying = KubeObject(DEPLOYMENTS, "ns-b", "b", finalizers=("example.com/f",))
    assert list(service_graph([a, b], state_of(a, b, objects=[carrying])).edges) == [("b", "a")]


def test_unserved_criteria_add_no_edges():
    """A criterion on a type nobody serves waits for nothing."""
    a = cs("a", {"type": "Resources", "resources": {"group": "example.com", "resource": "gizmos"}})
    graph = service_graph([a], state_of(a))
    assert list(graph.nodes) == ["a"] and not graph.edges


# --- check_no_cycle ---------------------------------------------------------------------------------
def test_closing_a_three_cycle_raises_in_waiting_order():
    """The service closing a -> b -> c -> a is rejected with the cycle in waiting order, starting at itself."""
    a, b, c = cs("a", waits_for_provider("b")), cs("b", waits_for_provider("c")), cs("c", waits_for_provider("a"))
    with pytest.raises(DependencyCycle) as info:
        check_no_cycle(c, state_of(a, b))
    assert info.value.cycle == ("c", "a", "b")
    assert str(info.value) == "dependency cycle: c -> a -> b -> c"


def test_open_chain_passes():
    """A chain a waits for b waits for c is no cycle."""
    a, b = cs("a", waits_for_provider("b")), cs("b", waits_for_provider("c"))
    check_no_cycle(cs("c", {"type": "Resources", "resources": {"resource": "pods"}}), state_of(a, b))


def test_existing_cycle_elsewhere_is_not_the_candidates_fault():
    """A new service that only reaches an existing x <-> y cycle closes nothing and passes."""
    y = cs("y", waits_for_provider("x"))
    x = parse_critical_service({"metadata": {"name": "x"}, "spec": {
        "provider": {"group": "apps", "resource": "deployments", "namespace": "ns-x", "name": "x"},
        "criteria": [waits_for_provider("y"), waits_for_provider("z")]}})
    z = cs("z", {"type": "Resources", "resources": {"resource": "pods"}})
    state = state_of(x, y)
    assert ("z", "x") in service_graph([x, y, z], state).edges
    check_no_cycle(z, state)
    with pytest.raises(DependencyCycle):
        check_no_cycle(y, state)


def test_replacing_a_service_ignores_its_old_version():
    """Checking a new version of a service leaves its stored version out of the graph."""
    a, b_old = cs("a", waits_for_provider("b")), cs("b", waits_for_provider("a"))
    state = state_of(a, b_old)
    check_no_cycle(cs("b", {"type": "Resources", "resources": {"resource": "pods"}}), state)
    with pytest.raises(DependencyCycle):
        check_no_cycle(b_old, state)


# --- teardown phases on the reference story --------------------------------------------------------------
def story_plan():
    state = build_state(load_path(STORY))
    return plan(list(state.objects()), state.critical_services(), state), state


def test_reference_story_tears_down_in_a_safe_order():
    """CRs before the CRD, both before the Deployment and its namespace, the CriticalService last."""
    p, state = story_plan()
    assert p.cycle is None
    phase = {ref: i for i, refs in enumerate(p.phases) for ref in refs}
    assert sorted(phase) == sorted(o.ref for o in state.objects())  # every object exactly once
    crs = [r for r in phase if r.group_resource == GroupResource("my.crd.group", "coolresources")]
    crd = ObjectRef(CRDS, "", "coolresources.my.crd.group")
    deployment = ObjectRef(DEPLOYMENTS, "finalizer-namespace", "finalizer-deployment")
    namespace = ObjectRef(GroupResource("", "namespaces"), "", "finalizer-namespace")
    service = ObjectRef(GroupResource("criticalsvc.io", "criticalservices"), "", "for-finalizer-deployment")
    assert len(crs) == 3
    for cr in crs:
        assert phase[cr] < phase[crd] < phase[deployment] < phase[namespace] < phase[service]
        assert phase[cr] < phase[ObjectRef(GroupResource("", "namespaces"), "", "cool-apps")]
    assert p.phases[-1] == (service,)


def test_a_bundle_that_can_never_finish_reports_its_cycle():
    """A criterion covering the provider's own namespace makes the plan a cycle with no phases."""
    state = build_state(load_path(STORY))
    state.upsert(KubeObject(GroupResource("", "namespaces"), "", "finalizer-namespace",
                            labels={"kubernetes.io/metadata.name": "finalizer-namespace"}))
    wedged = parse_critical_service({"metadata": {"name": "wedged"}, "spec": {
        "provider": {"group": "apps", "resource": "deployments", "namespace": "finalizer-namespace",
                     "name": "finalizer-deployment"},
        "criteria": [{"type": "Resources", "resources": {"resource": "namespaces", "selector": {
            "matchLabels": {"kubernetes.io/metadata.name": "finalizer-namespace"}}}}]}})
    p = plan(list(state.objects()), [*state.critical_services(), wedged], state)
    assert p.phases == () and p.cycle is not None
    assert {r.name for r in p.cycle} == {"finalizer-namespace", "finalizer-deployment"}


# --- DOT and mermaid -----------------------------------------------------------------------------------
_QUOTED = r'"((?:[^"\\]|\\.)*)"'
_DOT_NODE = re.compile(rf"^  {_QUOTED};$")
_DOT_EDGE = re.compile(rf'^  {_QUOTED} -> {_QUOTED}(?: \[label={_QUOTED}\])?;$')


def parse_dot(text: str) -> tuple[set[str], set[tuple[str, str]]]:
    """A strict reader for the DOT subset to_dot writes; fails on any line outside it."""
    lines = text.splitlines()
    assert re.fullmatch(r"digraph \w+ \{", lines[0]) and lines[1] == "  rankdir=LR;" and lines[-1] == "}"
    assert text.endswith("}\n")
    nodes: set[str] = set()
    edges: set[tuple[str, str]] = set()
    unescape = lambda s: re.sub(r"\\(.)", r"\1", s)  # noqa: E731
    for line in lines[2:-1]:
        if m := _DOT_EDGE.match(line):
            edges.add((unescape(m[1]), unescape(m[2])))
        elif m := _DOT_NODE.match(line):
            nodes.add(unescape(m[1]))
        else:
            pytest.fail(f"not DOT: {line!r}")
    assert {u for e in edges for u in e} <= nodes
    return nodes, edges


def parse_mermaid(text: str) -> tuple[set[str], set[tuple[str, str]]]:
    """A strict reader for the mermaid flowchart subset to_mermaid writes."""
    lines = text.splitlines()
    assert lines[0] == "flowchart LR" and text.endswith("\n")
    labels: dict[str, str] = {}
    edges: set[tuple[str, str]] = set()
    for line in lines[1:]:
        if m := re.fullmatch(r'  (n\d+)\["([^"]*)"\]', line):
            assert m[1] not in labels
            labels[m[1]] = m[2].replace("#quot;", '"')
        elif m := re.fullmatch(r"  (n\d+) --> (n\d+)", line):
            edges.add((labels[m[1]], labels[m[2]]))
        else:
            pytest.fail(f"not mermaid: {line!r}")
    return set(labels.values()), edges


def test_dot_and_mermaid_describe_the_same_graph():
    """The reference story's plan graph renders as well-formed DOT and mermaid with every node and edge."""
    p, _ = story_plan()
    expected_nodes = {str(n) for n in p.graph.nodes}
    expected_edges = {(str(u), str(v)) for u, v in p.graph.edges}
    assert parse_dot(to_dot(p.graph)) == (expected_nodes, expected_edges)
    assert parse_mermaid(to_mermaid(p.graph)) == (expected_nodes, expected_edges)
    assert 'label="instances go before their CRD"' in to_dot(p.graph)


def test_renderings_survive_quotes_in_names():
    """A legal object name containing a double quote (RBAC names allow it) still renders well-formed."""
    graph = nx.DiGraph()
    odd = ObjectRef(GroupResource("rbac.authorization.k8s.io", "clusterroles"), "", 'say"hi"')
    ns = ObjectRef(GroupResource("", "namespaces"), "", "n")
    graph.add_edge(odd, ns, why='waits for "x"')
    assert parse_dot(to_dot(graph)) == ({str(odd), str(ns)}, {(str(odd), str(ns))})
    assert parse_mermaid(to_mermaid(graph)) == ({str(odd), str(ns)}, {(str(odd), str(ns))})


# --- rule 4's edge: a custom-resource provider's CRD waits for its criteria (issue 30) ------------------
WIDGET_CRD = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
              "metadata": {"name": "widgets.ex.com"},
              "spec": {"group": "ex.com", "scope": "Namespaced",
                       "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                       "versions": [{"name": "v1", "served": True, "storage": True}]}}


def _service(name: str, provider: dict[str, Any], *criteria: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": name},
            "spec": {"provider": provider, "criteria": list(criteria)}}


def _crd_cycle_bundle(*, widget_waits: bool = True) -> list[dict[str, Any]]:
    """Deployment a/d waits for the CRD widgets.ex.com to be gone (criterion of `on-crd`); the Widget b/w is a
    provider waiting for that Deployment (criterion of `on-deploy`). Deleting the CRD is refused while `on-deploy`
    is unmet (rule 4), so each waits for the other."""
    waits = [{"type": "SpecificResource", "specificResource": {"group": "apps", "resource": "deployments",
                                                                 "namespace": "a", "name": "d"}}] if widget_waits \
        else [{"type": "Resources", "resources": {"resource": "configmaps", "namespace": "b"}}]
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}},
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "b"}},
            {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": "a"}},
            WIDGET_CRD,
            {"apiVersion": "ex.com/v1", "kind": "Widget", "metadata": {"name": "w", "namespace": "b"}},
            _service("on-crd", {"group": "apps", "resource": "deployments", "namespace": "a", "name": "d"},
                     {"type": "SpecificResource", "specificResource": {
                         "group": "apiextensions.k8s.io", "resource": "customresourcedefinitions",
                         "name": "widgets.ex.com"}}),
            _service("on-deploy", {"group": "ex.com", "resource": "widgets", "namespace": "b", "name": "w"}, *waits)]


def _load(objects: list[dict[str, Any]]) -> None:
    from criticalsvc.manifests import Manifest
    from criticalsvc.sim.cluster import Cluster

    Cluster().load([Manifest(o, f"document {i + 1}") for i, o in enumerate(objects)])


def test_a_cycle_through_a_custom_resource_providers_crd_is_refused_at_create():
    """The second CriticalService is refused, and the message names the CRD edge; with either one alone it loads."""
    from criticalsvc.errors import MalformedManifest

    with pytest.raises(MalformedManifest, match=r"document 7.*would close a dependency cycle: on-deploy -> on-crd "
                                                r"-> on-deploy; .*on-crd.spec.criteria\[0\] waits for its provider's "
                                                r"CRD widgets.ex.com of on-deploy"):
        _load(_crd_cycle_bundle())
    _load(_crd_cycle_bundle(widget_waits=False))


def test_the_crd_edge_is_named_in_the_graph():
    """`criticalsvc graph` shows why: on-crd's criterion waits for the Widget provider's CRD."""
    objects = _crd_cycle_bundle()
    state = build_state_of(objects)
    services = [parse_critical_service(o) for o in objects if o["kind"] == "CriticalService"]
    graph = service_graph(services, state)
    assert graph.edges["on-deploy", "on-crd"]["why"] == ("on-crd.spec.criteria[0] waits for its provider's CRD "
                                                        "widgets.ex.com of on-deploy")


def test_waiting_for_the_critical_service_crd_is_a_cycle_of_one():
    """The CRD criticalservices.criticalsvc.io is deleted only after every CriticalService (rule 4): waiting for it
    (by name, or for every CRD to be gone) can never end."""
    a = cs("a", {"type": "SpecificResource", "specificResource": {
        "group": "apiextensions.k8s.io", "resource": "customresourcedefinitions",
        "name": "criticalservices.criticalsvc.io"}})
    with pytest.raises(DependencyCycle, match=r"a -> a"):
        check_no_cycle(a, state_of())
    every_crd = cs("a", {"type": "Resources", "resources": {"group": "apiextensions.k8s.io",
                                                            "resource": "customresourcedefinitions"}})
    with pytest.raises(DependencyCycle, match=r"a -> a"):
        check_no_cycle(every_crd, state_of())


def build_state_of(objects: list[dict[str, Any]]) -> MemoryState:
    from criticalsvc.manifests import Manifest

    return build_state([Manifest(o, f"document {i + 1}") for i, o in enumerate(objects)])
