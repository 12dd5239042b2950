"""Conditions on criteria (issue 11): compiled when a CriticalService is written, evaluated when an object
enters a state, honoured by decisions, explain and status, failing closed on evaluation errors."""

from __future__ import annotations

import contextlib
import functools
import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import find, given
from hypothesis import strategies as st
from kubefakes import RunningStandIn, eventually, running_standin, started_cache
from strategies_core import RestrictedCondition, condition_pods, restricted_conditions

from criticalsvc import criteria
from criticalsvc.admission import AdmissionRequest, parse_review, render_review
from criticalsvc.api import GroupResource, ObjectRef, parse_critical_service
from criticalsvc.cache import CacheState, KubeTransport
from criticalsvc.condition import MAX_LENGTH, compile_condition, evaluate_condition
from criticalsvc.decision import Decision, Rule, decide
from criticalsvc.errors import InvalidSpec
from criticalsvc.explain import explain, render_text
from criticalsvc.live import LiveReader
from criticalsvc.manifests import Manifest
from criticalsvc.objects import KubeObject
from criticalsvc.sim.store import Store
from criticalsvc.snapshot import build_state
from criticalsvc.state import MemoryState
from criticalsvc.status import compute_status

DEPLOYMENTS = GroupResource("apps", "deployments")
PODS = GroupResource("", "pods")
PROVIDER = ObjectRef(DEPLOYMENTS, "ns-b", "db")
ACTIVE = "object.status.phase in ['Pending', 'Running']"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# --- builders -------------------------------------------------------------------------------------------
def service(condition: str | None = ACTIVE, *, name: str = "db") -> dict[str, Any]:
    criterion: dict[str, Any] = {"type": "Resources", "resources": {"resource": "pods", "namespace": "ns-a"}}
    if condition is not None:
        criterion["condition"] = condition
    return {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": name},
            "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": "ns-b", "name": "db"},
                     "criteria": [criterion]}}


def pod(name: str, phase: str | None, namespace: str = "ns-a") -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
                           "spec": {"containers": [{"name": "c", "image": "registry.example.com/c:1"}]}}
    if phase is not None:
        obj["status"] = {"phase": phase}
    return obj


def provider() -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "db", "namespace": "ns-b"},
            "spec": {"replicas": 1}}


def state_of(*objects: dict[str, Any]) -> MemoryState:
    return build_state([Manifest(o, f"doc {i}") for i, o in enumerate(objects)])


def delete_provider(state: Any) -> Decision:
    request = AdmissionRequest(uid="u", group_resource=DEPLOYMENTS, operation="DELETE", name="db", namespace="ns-b",
                               old_object={"metadata": {"name": "db", "namespace": "ns-b"}})
    return decide(request, state)


def write(obj: dict[str, Any], operation: str = "CREATE") -> Decision:
    request = AdmissionRequest(uid="u", group_resource=GroupResource("criticalsvc.io", "criticalservices"),
                               operation=operation, name=obj["metadata"]["name"], namespace="", object=obj)
    return decide(parse_review(json.loads(json.dumps(render_review(request)))), MemoryState())


# --- compiled when written ------------------------------------------------------------------------------
@pytest.mark.parametrize(("condition", "problem"), [
    ("objekt.status.phase == 'Running'", "undeclared reference to 'objekt'"),
    ("object.metadata.labels.exists(k, k == v)", "undeclared reference to 'v'"),
    ("object.status.phase ==", "syntax error at line 1, column 21"),
    ("", "must not be empty"),
    (7, "must be a string (a CEL expression)"),
    ("o" * (MAX_LENGTH + 1), f"Too long: may not be more than {MAX_LENGTH} bytes"),
    ("(" * 300 + "true" + ")" * 300, "syntax error: expression recursion limit exceeded"),
    ("!" * 1000 + "true", "syntax error: expression recursion limit exceeded"),
])
def test_a_condition_that_does_not_compile_is_refused_naming_its_field(condition: Any, problem: str) -> None:
    """The webhook refuses CREATE and UPDATE with 422 Invalid and one line naming spec.criteria[i].condition."""
    obj = service()
    other = {"resource": "configmaps", "namespace": "ns-a", "name": "x"}
    obj["spec"]["criteria"].insert(0, {"type": "SpecificResource", "specificResource": other})
    obj["spec"]["criteria"][1]["condition"] = condition
    with pytest.raises(InvalidSpec) as raised:
        parse_critical_service(obj)
    assert str(raised.value) == f"spec.criteria[1].condition: {problem}"
    for operation in ("CREATE", "UPDATE"):
        refused = write(obj, operation)
        assert (refused.allowed, refused.code, refused.reason, refused.rule) == \
            (False, 422, "Invalid", Rule.INVALID_SPEC)
        assert refused.message == f'CriticalService "db" is invalid: spec.criteria[1].condition: {problem}'


@pytest.mark.parametrize("expression", [
    "string(" * 12 + "object.spec.replicas" + ")" * 12 + " == '1'",  # 12 nested calls
    "[" * 12 + "1" + "]" * 12 + " != []",  # 12 nested list literals
    "has(object" + ".a" * 12 + ")",  # 12 selections in a row
    " ".join(f"object.spec.replicas == {i} ? true :" for i in range(24)) + " false",  # 24 ternaries
    " && ".join(f"object.spec.replicas > {-i}" for i in range(1, 33)),  # 32 terms
], ids=["calls", "lists", "selections", "ternaries", "and-terms"])
def test_what_cel_spec_requires_compiles_and_evaluates_within_the_nesting_limit(expression: str) -> None:
    """cel-spec's minimums (langdef.md, "Syntax") are accepted and evaluate without exhausting the stack."""
    outcome = evaluate_condition(compile_condition(expression, "c"), {"spec": {"replicas": 1}})
    assert isinstance(outcome, bool), outcome


def test_the_crd_and_the_parser_cap_a_condition_alike() -> None:
    """The CRD's maxLength for spec.criteria[].condition is the parser's MAX_LENGTH."""
    import yaml

    crd = yaml.safe_load(Path("api/criticalservices.criticalsvc.io.yaml").read_text(encoding="utf-8"))
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["criteria"]["items"]["properties"]["condition"]["maxLength"] == MAX_LENGTH


@pytest.mark.parametrize("condition", [
    ACTIVE, "object.spec.replicas > 0", "object.status.phase == 'Bound'",
    "object.metadata.labels.exists(k, k == 'app') && has(object.status)", "type(object.spec) == map",
])
def test_a_condition_that_compiles_is_accepted(condition: str) -> None:
    """Conditions in the issue's forms (and macros binding a variable) pass the webhook's check."""
    assert write(service(condition)).allowed


# --- decided on the stored outcome ----------------------------------------------------------------------
def test_a_namespace_whose_only_pod_succeeded_no_longer_blocks_with_the_condition() -> None:
    """With `phase in [Pending, Running]` a Succeeded pod does not count; without a condition it blocks."""
    assert delete_provider(state_of(provider(), service(), pod("done", "Succeeded"))).rule == Rule.CRITERIA_MET
    refused = delete_provider(state_of(provider(), service(None), pod("done", "Succeeded")))
    assert not refused.allowed and "pods ns-a/done in namespace ns-a still exists" in refused.message


def test_only_the_objects_the_condition_holds_for_are_named_and_counted() -> None:
    """Two running pods block and are named; the succeeded one is neither counted nor named."""
    state = state_of(provider(), service(), pod("a-done", "Succeeded"), pod("b-run", "Running"),
                     pod("c-wait", "Pending"))
    refused = delete_provider(state)
    assert not refused.allowed
    assert "still exist (2 objects; first: ns-a/b-run, ns-a/c-wait)" in refused.message
    assert "a-done" not in refused.message


def test_an_evaluation_error_counts_as_blocking_and_is_reported() -> None:
    """A pod without status makes `object.status.phase` fail: it blocks (never an ALLOW) and the denial,
    the status blockers and explain all carry the error."""
    state = state_of(provider(), service(), pod("new", None))
    refused = delete_provider(state)
    assert not refused.allowed and refused.rule == Rule.BLOCKED
    assert "its condition could not be evaluated on ns-a/new (no such key: status): such objects count" \
        in refused.message
    cs = next(iter(state.critical_services()))
    (blocker,) = compute_status(cs, state, now=0)["blockers"]
    assert "ns-a/new (no such key: status)" in blocker["description"]
    report = explain(PROVIDER, state).to_dict()["criticalServices"][0]["criteria"][0]
    assert report["conditionErrors"] == [{"object": "ns-a/new", "error": "no such key: status"}]


def test_a_wrong_type_is_an_error_not_a_false() -> None:
    """`object.spec.replicas > 0` on a string replicas is CEL's "no such overload": the object counts."""
    obj = pod("odd", "Running")
    obj["spec"]["replicas"] = "2"
    state = state_of(provider(), service("object.spec.replicas > 0"), obj)
    assert "ns-a/odd (no such overload)" in delete_provider(state).message


def test_an_object_whose_outcome_was_never_evaluated_counts() -> None:
    """A state holding an object projected without the condition (its CriticalService came later and
    nothing re-read it) fails closed."""
    state = MemoryState()
    state.upsert(KubeObject(PODS, "ns-a", "old"))
    state.upsert_critical_service(parse_critical_service(service()))
    verdict = criteria.evaluate(parse_critical_service(service()).criteria[0], state)
    assert (verdict.satisfied, verdict.errors) == (False, ((ObjectRef(PODS, "ns-a", "old"), "not evaluated yet"),))


def test_explain_says_which_objects_the_condition_excluded_and_why() -> None:
    """explain shows each excluded object under its criterion, in text and JSON."""
    state = state_of(provider(), service(), pod("done", "Succeeded"), pod("failed", "Failed"), pod("run", "Running"))
    e = explain(PROVIDER, state)
    text = render_text(e)
    assert "excluded: the condition is false for 2 objects (first: ns-a/done, ns-a/failed), so they do not count" \
        in text
    assert f"(counting only objects where {ACTIVE})" in text
    report = e.to_dict()["criticalServices"][0]["criteria"][0]
    assert (report["condition"], report["count"], report["excluded"], report["excludedExamples"]) == \
        (ACTIVE, 1, 2, ["ns-a/done", "ns-a/failed"])


def test_the_simulated_store_evaluates_objects_stored_before_their_critical_service() -> None:
    """Pods first, CriticalService later (and a status change after that): the store's state follows,
    as the gate's caches do by re-listing."""
    store = Store(clock=lambda: 0.0)
    for obj in ({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns-a"}},
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns-b"}}, provider(),
                pod("done", "Succeeded")):
        store.create(obj)
    store.create(service())
    assert delete_provider(store.state).rule == Rule.CRITERIA_MET
    store.set_status(ObjectRef(PODS, "ns-a", "done"), {"phase": "Running"})
    assert "ns-a/done" in delete_provider(store.state).message


# --- against an independent oracle ----------------------------------------------------------------------
def oracle_counts(obj: dict[str, Any], condition: RestrictedCondition, *, fail_closed: bool = True) -> bool:
    """Plain Python's reading of the restricted forms; a missing field or a non-integer is an error."""
    if condition.form == "phase-in":
        if "status" not in obj:
            return fail_closed
        return obj["status"]["phase"] in condition.phases
    replicas = obj["spec"].get("replicas")
    if not isinstance(replicas, int):
        return fail_closed
    return bool(replicas > condition.bound)


def gate_count(pods: list[dict[str, Any]], condition: RestrictedCondition) -> tuple[int, int, bool]:
    state = state_of(provider(), service(condition.expression), *pods)
    verdict = criteria.evaluate(parse_critical_service(service(condition.expression)).criteria[0], state)
    return verdict.count, verdict.excluded, delete_provider(state).allowed


@given(pods=condition_pods(), condition=restricted_conditions)
def test_the_gate_counts_exactly_the_objects_plain_python_says_the_condition_keeps(
        pods: list[dict[str, Any]], condition: RestrictedCondition) -> None:
    """Counted, excluded and the decision agree with the oracle for every generated pod set and condition."""
    expected = sum(oracle_counts(p, condition) for p in pods)
    assert gate_count(pods, condition) == (expected, len(pods) - expected, expected == 0)


def test_negative_control_a_fail_open_reading_disagrees_with_the_gate() -> None:
    """The property above can fail: an oracle that lets evaluation errors exclude objects is caught."""
    def fail_open_disagrees(example: tuple[list[dict[str, Any]], RestrictedCondition]) -> bool:
        pods, condition = example
        expected = sum(oracle_counts(p, condition, fail_closed=False) for p in pods)
        return gate_count(pods, condition)[0] != expected

    pods, condition = find(st.tuples(condition_pods(), restricted_conditions), fail_open_disagrees)
    assert any(oracle_counts(p, condition) != oracle_counts(p, condition, fail_closed=False) for p in pods)


def test_evaluate_condition_gives_only_true_false_or_an_error_text() -> None:
    """A non-boolean result is an error (it counts), never a truthy value."""
    condition = compile_condition("object.status.phase", "c")
    assert evaluate_condition(condition, {"status": {"phase": "Running"}}) == \
        "the condition evaluated to string, not bool"
    assert evaluate_condition(compile_condition("object.spec.replicas > 0", "c"), {"spec": {"replicas": 1}}) is True


def test_an_object_the_evaluator_cannot_even_read_counts_as_an_error_not_as_false() -> None:
    """JSON allows integers beyond CEL's 64 bits; converting one raises (not a CEL error). The object must keep
    counting (fail closed, an error text), or a criterion over such objects would hold while they exist."""
    obj = {"metadata": {"name": "y"}, "spec": {"replicas": 2**70}}
    assert evaluate_condition(compile_condition("object.spec.replicas > 0", "c"), obj) == "overflow"
    # Only the fields an expression reads are converted: one that does not read the value is unaffected.
    assert evaluate_condition(compile_condition("object.metadata.name == 'x'", "c"), obj) is False


# --- the live service: watch caches and fresh reads -----------------------------------------------------
def stack(*pods: dict[str, Any]) -> Store:
    """Namespaces ns-a and ns-b, the provider, `pods` and the CriticalService (created last)."""
    store = Store(clock=time.time)
    for obj in ({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns-a"}},
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns-b"}}, provider(), *pods,
                service()):
        store.create(obj)
    return store


@contextlib.asynccontextmanager
async def watching(env: RunningStandIn) -> AsyncIterator[CacheState]:
    async with started_cache(env) as (cache, _transport):
        yield cache


DONE = ObjectRef(PODS, "ns-a", "done")


def assert_decides_as_the_store(cache: CacheState, store: Store) -> None:
    """The cache (outcomes evaluated on watch events) decides every DELETE as the store's own state does."""
    for ref in list(store.refs()):
        namespace = ref.name if ref.group_resource == GroupResource("", "namespaces") else ref.namespace
        request = AdmissionRequest(uid="u", group_resource=ref.group_resource, operation="DELETE", name=ref.name,
                                   namespace=namespace, old_object=store.get(ref.group_resource, ref.namespace,
                                                                             ref.name))
        assert decide(request, cache) == decide(request, store.state), ref


@pytest.mark.anyio
async def test_the_cache_evaluates_objects_as_they_arrive_and_relists_when_a_condition_changes() -> None:
    """Pods are watched whole; a status change flips the decision; a new condition re-lists the pods."""
    with running_standin(stack(pod("done", "Succeeded"))) as env:
        async with watching(env) as cache:
            assert await cache.wait_ready(5)
            reflector = cache.reflector(PODS)
            assert reflector is not None and not reflector.metadata_only
            assert delete_provider(cache).rule == Rule.CRITERIA_MET
            assert_decides_as_the_store(cache, env.store)
            await env.write(lambda: env.store.set_status(DONE, {"phase": "Running"}))
            await eventually(lambda: "ns-a/done" in delete_provider(cache).message, what="the running pod to block")
            assert_decides_as_the_store(cache, env.store)
            edited = env.store.get(GroupResource("criticalsvc.io", "criticalservices"), "", "db")
            assert edited is not None
            edited["spec"]["criteria"][0]["condition"] = "object.status.phase == 'Pending'"
            await env.write(lambda: env.store.update(edited))
            await eventually(lambda: delete_provider(cache).rule == Rule.CRITERIA_MET,
                             what="the re-listed pods to be evaluated with the new condition")
            assert cache.reflector(PODS) is not reflector


@pytest.mark.anyio
async def test_a_changed_condition_is_listed_again_while_decisions_go_on_from_the_old_cache() -> None:
    """Make before break: while the successor's LIST of pods is held, decisions on pods are still made (not
    "could not verify"); the criterion whose condition is new counts every pod, as it has no outcome of it
    yet; once the LIST arrives the new condition decides and the old reflector is gone."""
    with running_standin(stack(pod("done", "Succeeded"), pod("other", "Running", namespace="ns-b"))) as env:
        async with watching(env) as cache:
            assert await cache.wait_ready(5)
            old = cache.reflector(PODS)
            assert old is not None and delete_provider(cache).rule == Rule.CRITERIA_MET
            env.faults.add(r"/api/v1/pods$", action="hang", watch=False)  # the successor's LIST waits
            edited = env.store.get(GroupResource("criticalsvc.io", "criticalservices"), "", "db")
            assert edited is not None
            edited["spec"]["criteria"][0]["condition"] = "object.status.phase == 'Pending'"
            await env.write(lambda: env.store.update(edited))
            await eventually(lambda: env.faults.seen(r"/api/v1/pods$", watch=False) >= 2,
                             what="the successor's LIST of pods")
            held = delete_provider(cache)
            assert not held.allowed and "could not verify" not in held.message, held.message
            assert "ns-a/done" in held.message  # no outcome of the new condition yet: it counts
            assert cache.reflector(PODS) is old
            env.faults.clear()  # the held LIST fails once (503); the successor lists again and takes over
            await eventually(lambda: delete_provider(cache).rule == Rule.CRITERIA_MET,
                             what="the successor's pods to be evaluated with the new condition")
            assert cache.reflector(PODS) is not old
            assert sorted(o.key for o in cache.memory.objects(PODS)) == ["ns-a/done", "ns-b/other"]
            assert_decides_as_the_store(cache, env.store)


@pytest.mark.anyio
async def test_a_fresh_read_evaluates_the_condition_on_the_object_it_read() -> None:
    """A cache ALLOW is confirmed on whole objects read fresh: a pod that started running since denies,
    one that failed since still allows (a metadata-only read would have no status and count)."""
    store = stack(pod("done", "Succeeded"))
    stale = delete_provider(store.state)
    assert stale.allowed and stale.protected
    request = AdmissionRequest(uid="u", group_resource=DEPLOYMENTS, operation="DELETE", name="db", namespace="ns-b",
                               old_object={"metadata": {"name": "db", "namespace": "ns-b"}})
    with running_standin(store) as env:
        from kubernetes.aio import client

        api = client.ApiClient(client.Configuration(host=env.url))
        try:
            reader = LiveReader(KubeTransport(api))
            await env.write(lambda: env.store.set_status(DONE, {"phase": "Failed"}))
            assert (await reader.confirm(request, stale)).allowed
            await env.write(lambda: env.store.set_status(DONE, {"phase": "Running"}))
            confirmed = await reader.confirm(request, stale)
        finally:
            await api.close()
    assert not confirmed.allowed and "pods ns-a/done in namespace ns-a still exists" in confirmed.message
    assert "could not be evaluated" not in confirmed.message


def test_a_stored_critical_service_whose_condition_does_not_compile_still_protects() -> None:
    """One written while the webhook was absent (the CRD schema cannot compile CEL) is kept by the states,
    every object of the criterion counting, with the compile error where the objects are named."""
    store = Store(clock=lambda: 0.0)
    for obj in ({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns-a"}},
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns-b"}}, provider(),
                pod("done", "Succeeded")):
        store.create(obj)
    bad = service("objekt.status.phase == 'Running'")
    with pytest.raises(InvalidSpec):
        parse_critical_service(bad)
    store.create(bad)  # a store without webhooks: as if the gate was not installed yet
    refused = delete_provider(store.state)
    assert not refused.allowed
    assert "ns-a/done (spec.criteria[0].condition does not compile: undeclared reference to 'objekt')" \
        in refused.message


# --- the outcome index (criticalsvc/state.py) -----------------------------------------------------------
_WRITES = st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.sampled_from(["ns-a", "ns-b"]),
                             st.none() | st.sampled_from([True, False, "no such key: status"]),
                             st.sampled_from([(), ("example.com/f",)]), st.booleans()), max_size=30)


@given(writes=_WRITES)
def test_the_outcome_index_answers_as_filtering_every_object_does(
        writes: list[tuple[str, str, Any, tuple[str, ...], bool]]) -> None:
    """After any sequence of writes (outcomes flipping, finalizers changing, removals, objects without an
    outcome), the indexed answers equal a filter of all objects by their outcome, in the same order."""
    condition = compile_condition(ACTIVE, "c")
    state = MemoryState()
    for name, namespace, outcome, finalizers, remove in writes:
        if remove:
            state.remove(ObjectRef(PODS, namespace, name))
        else:
            outcomes = () if outcome is None else (ACTIVE, outcome)
            state.upsert(KubeObject(PODS, namespace, name, finalizers=finalizers, outcomes=outcomes))
    every = list(state.objects(PODS))

    def kept(objs: Any) -> list[ObjectRef]:
        return [o.ref for o in objs if o.outcome(condition) is not False]

    for namespace in (None, "ns-a", "ns-b"):
        got = state.select(PODS, namespace=namespace, selector=None, condition=condition)
        expected = kept(o for o in every if namespace is None or o.namespace == namespace)
        assert ([o.ref for o in got], len(got)) == (expected, len(expected))
    got = state.with_finalizer(PODS, "example.com/f", condition=condition)
    expected = kept(o for o in every if "example.com/f" in o.finalizers)
    assert ([o.ref for o in got], len(got)) == (expected, len(expected))


# --- the commands ---------------------------------------------------------------------------------------
EXAMPLE = "api/examples/conditions.yaml"


def test_explain_and_plan_of_the_example_honour_its_conditions(capsys: pytest.CaptureFixture[str]) -> None:
    """`explain` names the blocking and the excluded objects; `plan` waits only for what counts."""
    from criticalsvc.cli import main

    assert main(["explain", "deployment/job-broker", "-n", "broker", "--state", EXAMPLE]) == 1
    out = capsys.readouterr().out
    assert "pods batch/report-2 in namespace batch still exists" in out
    assert "excluded: the condition is false for batch/report-1, so it does not count" in out
    assert "excluded: the condition is false for batch/archiver, so it does not count" in out
    assert main(["plan", "-f", EXAMPLE, "-o", "json"]) == 0
    edges = json.loads(capsys.readouterr().out)["edges"]
    before_broker = {e["from"]["name"] for e in edges if e["to"]["name"] == "job-broker"}
    assert before_broker == {"report-2", "ingest"}


# --- evaluating only the fields a condition reads -------------------------------------------------------
_LEAF = st.none() | st.booleans() | st.integers(-2, 2) | st.sampled_from(["Running", "Succeeded", "b"])
_KEYS = st.sampled_from(["metadata", "spec", "status", "phase", "replicas", "labels", "a", "reason", "image"])
_JSON = st.recursive(_LEAF, lambda inner: st.lists(inner, max_size=2) | st.dictionaries(_KEYS, inner, max_size=4),
                     max_leaves=12)
_READING = [ACTIVE, "object.spec.replicas > 0", "has(object.status.phase) && object.metadata.labels['a'] == 'b'",
            "object.status.phase == 'Running' || size(object.status) > 1",
            "object.spec.image.exists(c, c == 'b')", "type(object.spec) == map"]


@functools.cache
def _oracle_env() -> Any:
    """A cel-python environment of the test's own (celpy raises the recursion limit on creating one,
    which hypothesis refuses inside a test: made once, the limit put back)."""
    import celpy

    limit = sys.getrecursionlimit()
    try:
        return celpy.Environment()
    finally:
        sys.setrecursionlimit(limit)


@given(obj=st.dictionaries(_KEYS, _JSON, max_size=4), expression=st.sampled_from(_READING))
def test_evaluating_only_the_fields_read_gives_what_evaluating_the_whole_object_gives(
        obj: dict[str, Any], expression: str) -> None:
    """The pruned evaluation's outcome equals cel-python's on the whole object (True, False or the same error)."""
    import celpy
    from celpy.adapter import json_to_cel

    condition = compile_condition(expression, "c")
    assert condition.paths is not None  # each of these reads fields only: the pruning is exercised
    env = _oracle_env()
    try:
        result: Any = env.program(env.compile(expression)).evaluate({"object": json_to_cel(obj)})
    except celpy.evaluation.CELEvalError as exc:
        result = exc
    if isinstance(result, celpy.evaluation.CELEvalError):
        expected: Any = "error"
    else:
        expected = bool(result) if isinstance(result, bool | celpy.celtypes.BoolType) else "not bool"
    got = evaluate_condition(condition, obj)
    assert (got if isinstance(got, bool) else ("not bool" if "not bool" in got else "error")) == expected


def test_a_condition_is_evaluated_only_on_the_objects_its_criterion_looks_at() -> None:
    """A pod outside the criterion's namespace carries no outcome (no CEL spent on it) and changes nothing."""
    state = state_of(provider(), service(), pod("run", "Running"), pod("elsewhere", "Running", namespace="ns-b"))
    here = state.get(ObjectRef(PODS, "ns-a", "run"))
    there = state.get(ObjectRef(PODS, "ns-b", "elsewhere"))
    assert here is not None and there is not None
    assert (here.outcomes, there.outcomes) == ((ACTIVE, True), ())
    assert "ns-a/run" in delete_provider(state).message and "elsewhere" not in delete_provider(state).message


@pytest.mark.parametrize("expression,unknown", [
    ("object.metadata.name.lowerAscii() == 'a'", "lowerAscii"),  # a Kubernetes CEL library function
    ("bogus(object) > 1", "bogus"),
    ("object.spec.items.exists(i, i.quantity() > 1)", "quantity"),
])
def test_a_call_the_evaluator_does_not_have_is_refused_when_compiled(expression: str, unknown: str) -> None:
    """cel-go's checker refuses an undeclared function; so does the gate, instead of letting every object
    count with "no such function" at evaluation (the criterion would silently never hold)."""
    with pytest.raises(InvalidSpec) as refused:
        compile_condition(expression, "spec.criteria[0].condition")
    assert str(refused.value) == (f"spec.criteria[0].condition: undeclared reference to '{unknown}': not a function "
                                  "of CEL's standard library as the gate evaluates it")


@pytest.mark.parametrize("expression", [
    "size(object.spec.items) > 0", "object.spec.items.size() > 0", "object.metadata.name.startsWith('a')",
    "object.spec.items.all(i, has(i.x))", "object.spec.items.map(i, i + 1).exists_one(i, i == 2)",
    "int(object.spec.replicas) > 0 && string(object.kind).matches('^Dep')",
])
def test_standard_library_calls_compile(expression: str) -> None:
    assert compile_condition(expression, "c").expression == expression
