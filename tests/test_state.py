"""MemoryState's indexes against a plain dict oracle, and the compact Labels mapping.

The indexes answer "which objects of G/R carry finalizer F" and "which objects of G/R (in namespace N)
match selector S" as sorted views with an O(1) count; a decision's message names the first few and the
exact count. The oracle is a dict {(gr, namespace, name): object} replayed from the same random writes
and filtered and sorted by brute force, so a bookkeeping slip in an index (a finalizer removed by an
update left behind, a count off by one, a namespace bucket not dropped) shows up as a disagreement.
"""

from __future__ import annotations

import operator
import pickle
from typing import Any

import pytest
from hypothesis import find, given
from hypothesis import strategies as st

from criticalsvc.api import FinalizerCriterion, GroupResource, ObjectRef, ResourcesCriterion
from criticalsvc.criteria import evaluate
from criticalsvc.labels import LabelSelector, Requirement
from criticalsvc.objects import NO_LABELS, KubeObject, Labels, project
from criticalsvc.state import MemoryState

WIDGETS = GroupResource("example.com", "widgets")
GADGETS = GroupResource("example.com", "gadgets")
FINALIZERS = ("example.com/a", "example.com/b")
NAMESPACES = ("", "alpha", "beta", "gamma")
NAMES = ("w0", "w1", "w2", "w3", "w4", "w5")

objects = st.builds(
    KubeObject,
    group_resource=st.sampled_from((WIDGETS, GADGETS)),
    namespace=st.sampled_from(NAMESPACES),
    name=st.sampled_from(NAMES),
    labels=st.dictionaries(st.sampled_from(("tier", "app")), st.sampled_from(("web", "db")), max_size=2),
    finalizers=st.lists(st.sampled_from(FINALIZERS), max_size=2, unique=True).map(tuple),
)
writes = st.lists(st.one_of(objects.map(lambda o: ("upsert", o)),
                            objects.map(lambda o: ("remove", o.ref))), max_size=40)
SELECTORS = (None, LabelSelector((Requirement("tier", "In", frozenset({"web"})),)),
             LabelSelector((Requirement("app", "DoesNotExist", frozenset()),)))


def replay(ops: list[tuple[str, Any]]) -> tuple[MemoryState, dict[tuple[GroupResource, str, str], KubeObject]]:
    state, oracle = MemoryState(), {}
    for op, arg in ops:
        if op == "upsert":
            state.upsert(arg)
            oracle[(arg.group_resource, arg.namespace, arg.name)] = arg
        else:
            state.remove(arg)
            oracle.pop((arg.group_resource, arg.namespace, arg.name), None)
    return state, oracle


def in_order(objs: Any) -> list[KubeObject]:
    return sorted(objs, key=lambda o: (o.namespace, o.name))


def mismatches(state: MemoryState, oracle: dict[tuple[GroupResource, str, str], KubeObject],
               *, ordered: bool = True) -> list[str]:
    """Every query whose answer (content, order, count) differs from the oracle's."""
    out = []
    fix = in_order if ordered else list
    for gr in (WIDGETS, GADGETS):
        mine = [o for (g, _, _), o in oracle.items() if g == gr]
        for f in FINALIZERS:
            got = state.with_finalizer(gr, f)
            want = fix(o for o in mine if f in o.finalizers)
            if list(got) != want or list(got) != want or len(got) != len(want):  # twice: views re-read
                out.append(f"with_finalizer({gr}, {f})")
        for ns in (None, *NAMESPACES):
            for sel in SELECTORS:
                got = state.select(gr, namespace=ns, selector=sel)
                want = fix(o for o in mine if (ns is None or o.namespace == ns)
                           and (sel is None or sel.matches(o.labels)))
                if list(got) != want or list(got) != want or len(got) != len(want):
                    out.append(f"select({gr}, {ns}, {sel})")
        if state.count(gr) != len(mine):
            out.append(f"count({gr})")
        for ns in NAMESPACES:
            for name in NAMES:
                if state.get(ObjectRef(gr, ns, name)) != oracle.get((gr, ns, name)):
                    out.append(f"get({gr}, {ns}/{name})")
    return out


@given(writes)
def test_indexes_agree_with_a_dict_oracle_in_content_order_and_count(ops: list[tuple[str, Any]]) -> None:
    """After any sequence of upserts and removes, every query answers what a brute-force scan answers, sorted."""
    state, oracle = replay(ops)
    assert mismatches(state, oracle) == []


def test_negative_control_the_comparison_checks_order() -> None:
    """An oracle that keeps write order instead of (namespace, name) order disagrees on some sequence."""
    ops = find(writes, lambda ops: bool(mismatches(*replay(ops), ordered=False)))
    assert mismatches(*replay(ops)) == []  # the real, sorted oracle agrees on that very sequence


def test_update_that_drops_a_finalizer_leaves_its_index() -> None:
    """An update removing a finalizer takes the object out of that finalizer's answer (and its count)."""
    state = MemoryState()
    state.upsert(KubeObject(WIDGETS, "alpha", "w0", finalizers=FINALIZERS))
    state.upsert(KubeObject(WIDGETS, "alpha", "w0", finalizers=FINALIZERS[1:]))
    assert len(state.with_finalizer(WIDGETS, FINALIZERS[0])) == 0
    assert [o.name for o in state.with_finalizer(WIDGETS, FINALIZERS[1])] == ["w0"]


def test_blocking_examples_are_the_first_three_in_namespace_name_order() -> None:
    """A verdict's examples are the 3 smallest (namespace, name) of all blocking objects, and the count is exact."""
    state = MemoryState()
    for i in reversed(range(2000)):
        state.upsert(KubeObject(WIDGETS, f"ns-{i % 7}", f"w{i:04d}", finalizers=(FINALIZERS[0],)))
    verdict = evaluate(FinalizerCriterion(WIDGETS, FINALIZERS[0]), _served(state))
    assert verdict.count == 2000
    assert [e.key for e in verdict.examples] == ["ns-0/w0000", "ns-0/w0007", "ns-0/w0014"]
    verdict = evaluate(ResourcesCriterion(WIDGETS, "ns-3", LabelSelector()), _served(state))
    assert verdict.count == 286
    assert [e.key for e in verdict.examples] == ["ns-3/w0003", "ns-3/w0010", "ns-3/w0017"]


def test_views_are_live_until_copied() -> None:
    """A copied answer survives writes; the state can be changed while walking the copy."""
    state = MemoryState()
    for name in NAMES:
        state.upsert(KubeObject(WIDGETS, "alpha", name, finalizers=(FINALIZERS[0],)))
    for obj in list(state.with_finalizer(WIDGETS, FINALIZERS[0])):
        state.remove(obj.ref)
    assert state.count() == 0 and len(state.with_finalizer(WIDGETS, FINALIZERS[0])) == 0


def _served(state: MemoryState) -> MemoryState:
    from criticalsvc.restmapper import ResourceType

    state.mapper.add(ResourceType("example.com", "v1", "Widget", "widgets", "widget", namespaced=True))
    return state


# --- Labels -------------------------------------------------------------------------------------------
@given(st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=6))
def test_labels_behave_like_the_dict_they_came_from(raw: dict[str, str]) -> None:
    """Lookups, membership, iteration, length and equality of Labels match the source dict."""
    labels = Labels.of(raw)
    assert labels == raw and dict(labels) == raw and len(labels) == len(raw)
    assert operator.ne(labels, raw) is False  # != is the Mapping one too, not the tuple one
    assert list(labels) == sorted(raw) and list(labels.values()) == [raw[k] for k in sorted(raw)]
    for key in [*raw, "absent-key"]:
        assert (key in labels) == (key in raw)
        assert labels.get(key) == raw.get(key)
    assert pickle.loads(pickle.dumps(labels)) == labels
    assert hash(labels) == hash(Labels.of(dict(reversed(list(raw.items())))))  # order-independent


def test_labels_are_immutable_and_smaller_than_a_dict() -> None:
    """Labels cannot be changed after projection, and two labels cost less than half a dict's bytes."""
    import sys

    raw = {"app.kubernetes.io/instance": "widget-0000001", "app.kubernetes.io/managed-by": "op0"}
    labels = Labels.of(raw)
    with pytest.raises(AttributeError):
        labels.extra = "x"  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        labels["x"] = "y"  # type: ignore[index]
    assert sys.getsizeof(labels) < sys.getsizeof(raw) / 2
    assert Labels.of({}) is NO_LABELS and Labels.of(labels) is labels


def test_project_rejects_non_string_labels_with_the_field_path() -> None:
    """A label value that is not a string is a clear metadata.labels error, not a crash later in a selector."""
    from criticalsvc.errors import MalformedManifest

    with pytest.raises(MalformedManifest, match=r"metadata\.labels"):
        project({"metadata": {"name": "x", "labels": {"a": 1}}}, WIDGETS)


def test_critical_services_that_come_and_go_leave_no_memory_behind():
    """A cluster that keeps creating and tearing down stacks, each with a namespace and CriticalService of its
    own, ends where it began: the provider indexes hold nothing for services that are gone (a 600 s soak on
    the real control plane grew the gate's RSS; empty buckets per gone stack were one cause)."""
    import tracemalloc

    from criticalsvc.api import parse_critical_service
    from criticalsvc.state import MemoryState

    def service(i: int):
        return parse_critical_service({"metadata": {"name": f"cs-{i}"}, "spec": {
            "provider": {"group": "apps", "resource": "deployments", "namespace": f"stack-{i}", "name": "p"},
            "criteria": [{"type": "Resources", "resources": {"resource": "configmaps", "namespace": f"stack-{i}"}}]}})

    state = MemoryState()
    services = [service(i) for i in range(2000)]
    for cs in services[:10]:  # warm up whatever the first insertions allocate
        state.upsert_critical_service(cs)
        state.remove_critical_service(cs.name)
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for cs in services[10:]:
            state.upsert_critical_service(cs)
            state.remove_critical_service(cs.name)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename")
                if stat.traceback[0].filename.endswith("state.py"))
    assert grown < 10_000, f"{grown} bytes kept by state.py for 1990 services that are gone"
    assert list(state.critical_services()) == []


def test_a_write_that_changes_nothing_the_gate_reads_keeps_the_object_and_counts_no_write() -> None:
    """A status update (a Deployment's rollout, a CriticalService's own conditions) projects to an equal object: the
    state keeps the one it has and counts no write, so what the router, the labeller and the status writer worked
    out from these objects stands (issue 34: at 10,000 CriticalServices each counted write of their type made each
    walk all 10,000 again). A change they read (a label, a finalizer, a spec) is stored and counted."""
    from criticalsvc.api import CRITICAL_SERVICES, parse_critical_service

    deployments = GroupResource("apps", "deployments")
    state = MemoryState()
    first = KubeObject(deployments, "team", "p", uid="u1", labels={"app": "x"})
    state.upsert(first)
    counted = state.writes(deployments, "team")
    state.upsert(KubeObject(deployments, "team", "p", uid="u1", labels={"app": "x"}))
    assert state.writes(deployments, "team") == counted and state.get(first.ref) is first
    state.upsert(KubeObject(deployments, "team", "p", uid="u1", labels={"app": "y"}))
    assert state.writes(deployments, "team") == counted + 1 and state.get(first.ref).labels["app"] == "y"

    def service(labels: dict[str, str], name: str = "p") -> Any:
        return parse_critical_service({"metadata": {"name": "cs", "uid": "u-cs", "labels": labels}, "spec": {
            "provider": {"group": "apps", "resource": "deployments", "namespace": "team", "name": name},
            "criteria": [{"type": "SpecificResource", "specificResource": {
                "resource": "configmaps", "namespace": "team", "name": "c"}}]}})

    cs = service({})
    state.upsert_critical_service(cs)
    counted = state.writes(CRITICAL_SERVICES, None)
    state.upsert_critical_service(service({}))  # its conditions written
    assert state.writes(CRITICAL_SERVICES, None) == counted and next(iter(state.critical_services())) is cs
    state.upsert_critical_service(service({"team": "a"}))  # labels are not part of its equality: still a change
    state.upsert_critical_service(service({"team": "a"}, name="q"))
    assert state.writes(CRITICAL_SERVICES, None) == counted + 4  # each replacement: a removal and a store
    assert next(iter(state.critical_services())).provider.name == "q"
