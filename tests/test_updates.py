"""UPDATEs of providers (issue 11): spec.holdUpdates (the object lock) and spec.scaleToZero, through the
AdmissionReview wire format and the simulator's store; what is never held, and why, is
criticalsvc/updates.py's docstring and design/criticalservice.md, "Updates"."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import find, given
from hypothesis import strategies as st
from kubefakes import running_standin

from criticalsvc.admission import AdmissionRequest, parse_review, render_review
from criticalsvc.api import BREAK_GLASS_ANNOTATION, GroupResource, ObjectRef, parse_critical_service
from criticalsvc.decision import Decision, Rule, decide
from criticalsvc.live import LiveReader
from criticalsvc.objects import KubeObject
from criticalsvc.sim.store import StatusError, Store, gate_hook, scale_of
from criticalsvc.sim.webhooks import RegisteredWebhook, WebhookRule
from criticalsvc.state import MemoryState

CONFIGMAPS = GroupResource("", "configmaps")
DEPLOYMENTS = GroupResource("apps", "deployments")
NAMESPACES = GroupResource("", "namespaces")
LOCKED = ObjectRef(CONFIGMAPS, "app", "settings")
LOCK = ObjectRef(CONFIGMAPS, "locks", "lock-settings")
WEB = ObjectRef(DEPLOYMENTS, "app", "web")
TERMINATING = "2026-01-01T00:00:00Z"


# --- builders -------------------------------------------------------------------------------------
def service(name: str, provider: ObjectRef, target: ObjectRef, *, hold: bool = False, scale: bool = False,
            enforcement: str | None = None) -> dict[str, Any]:
    """A CriticalService protecting `provider` until `target` is gone (SpecificResource)."""
    spec: dict[str, Any] = {
        "provider": {"group": provider.group_resource.group, "resource": provider.group_resource.resource,
                     "namespace": provider.namespace, "name": provider.name},
        "criteria": [{"type": "SpecificResource", "specificResource": {
            "group": target.group_resource.group, "resource": target.group_resource.resource,
            "namespace": target.namespace, "name": target.name}}]}
    if hold:
        spec["holdUpdates"] = "WhileBlocking"
    if scale:
        spec["scaleToZero"] = "DenyWhileBlocking"
    if enforcement:
        spec["enforcement"] = enforcement
    return {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": name},
            "spec": spec}


def state_of(*services: dict[str, Any], lock_exists: bool = True, terminating: ObjectRef | None = None) -> MemoryState:
    state = MemoryState()
    for ref in (LOCKED, WEB, *([LOCK] if lock_exists else [])):
        state.upsert(KubeObject(ref.group_resource, ref.namespace, ref.name,
                                deletion_timestamp=TERMINATING if ref == terminating else None))
    for s in services:
        state.upsert_critical_service(parse_critical_service(s))
    return state


def locked_state(**kw: Any) -> MemoryState:
    return state_of(service("lock-settings", LOCKED, LOCK, hold=True, **kw.pop("cs", {})), **kw)


def configmap(data: dict[str, str] | None = None, **metadata: Any) -> dict[str, Any]:
    md = {"name": LOCKED.name, "namespace": LOCKED.namespace, "uid": "u-1", "resourceVersion": "7", **metadata}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": md, "data": data if data is not None else {"a": "1"}}


def deployment(replicas: int | None, **metadata: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"selector": {"matchLabels": {"app": "web"}}}
    if replicas is not None:
        spec["replicas"] = replicas
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": WEB.name, "namespace": WEB.namespace, "uid": "u-2", **metadata}, "spec": spec}


def update(ref: ObjectRef, old: Any, new: Any, *, sub_resource: str = "", dry_run: bool = False) -> AdmissionRequest:
    """The UPDATE as the webhook decodes it, after a round trip through the wire format."""
    request = AdmissionRequest(uid="u", group_resource=ref.group_resource, operation="UPDATE", name=ref.name,
                               namespace=ref.namespace, object=new, old_object=old, sub_resource=sub_resource,
                               kind="Scale" if sub_resource == "scale" else "", dry_run=dry_run, username="alice")
    return parse_review(render_review(request))


def decide_update(state: MemoryState, ref: ObjectRef, old: Any, new: Any, **kw: Any) -> Decision:
    return decide(update(ref, old, new, **kw), state)


# --- holdUpdates: WhileBlocking ---------------------------------------------------------------------
def test_a_lock_holds_an_update_of_the_locked_object_naming_the_lock_and_what_to_do():
    d = decide_update(locked_state(), LOCKED, configmap(), configmap({"a": "2"}))
    assert not d.allowed and d.rule is Rule.UPDATE_HELD and d.code == 403 and d.reason == "Forbidden"
    assert d.protected and d.blocking == ("lock-settings",)
    assert d.message == (
        "configmaps app/settings may not be updated yet: CriticalService lock-settings holds updates of it until: "
        "configmaps locks/lock-settings still exists (removing finalizers is never held; to override, set the "
        f"annotation {BREAK_GLASS_ANNOTATION}=<reason> in this same update)")
    assert "\n" not in d.message


@pytest.mark.parametrize("what, old, new", [
    ("a label", configmap(), configmap(labels={"team": "x"})),
    ("an annotation", configmap(), configmap(annotations={"note": "x"})),
    ("a finalizer added", configmap(finalizers=["a/b"]), configmap(finalizers=["a/b", "c/d"])),
    ("an ownerReference added", configmap(), configmap(ownerReferences=[{"uid": "o", "kind": "X", "name": "x"}])),
    ("blockOwnerDeletion set", configmap(ownerReferences=[{"uid": "o", "kind": "X", "name": "x"}]),
     configmap(ownerReferences=[{"uid": "o", "kind": "X", "name": "x", "blockOwnerDeletion": True}])),
    ("a finalizer swapped for another", configmap(finalizers=["a/b"]), configmap(finalizers=["c/d"])),
])
def test_a_lock_holds_metadata_changes_too(what: str, old: dict[str, Any], new: dict[str, Any]):
    assert decide_update(locked_state(), LOCKED, old, new).rule is Rule.UPDATE_HELD, what


@pytest.mark.parametrize("what, old, new", [
    ("the last finalizer removed", configmap(finalizers=["a/b"]), configmap(finalizers=[])),
    ("one of two finalizers removed", configmap(finalizers=["a/b", "c/d"]), configmap(finalizers=["c/d"])),
    ("finalizers re-ordered", configmap(finalizers=["a/b", "c/d"]), configmap(finalizers=["c/d", "a/b"])),
    ("status only", {**configmap(), "status": {"x": 1}}, {**configmap(), "status": {"x": 2}}),
    ("bookkeeping only", configmap(generation=1, managedFields=[{"manager": "a"}]),
     configmap(generation=2, resourceVersion="8", managedFields=[{"manager": "b"}])),
    ("the garbage collector orphaning it",
     configmap(ownerReferences=[{"uid": "o", "kind": "X", "name": "x"}, {"uid": "p", "kind": "Y", "name": "y"}]),
     configmap(ownerReferences=[{"uid": "p", "kind": "Y", "name": "y"}])),
    ("the garbage collector unblocking an owner",
     configmap(ownerReferences=[{"uid": "o", "kind": "X", "name": "x", "blockOwnerDeletion": True}]),
     configmap(ownerReferences=[{"uid": "o", "kind": "X", "name": "x", "blockOwnerDeletion": False}])),
    ("the break-glass annotation removed", configmap(annotations={BREAK_GLASS_ANNOTATION: "x"}), configmap()),
    ("nothing at all", configmap(), configmap()),
])
def test_what_a_lock_never_holds(what: str, old: dict[str, Any], new: dict[str, Any]):
    d = decide_update(locked_state(), LOCKED, old, new)
    assert d.allowed and d.rule is Rule.UPDATE_EXEMPT and not d.protected and not d.warnings, what


def test_an_update_of_an_object_being_deleted_is_never_held():
    """Its deletion already passed the gate; the finalizer controllers' updates finish it."""
    old = configmap(finalizers=["a/b"], deletionTimestamp=TERMINATING)
    d = decide_update(locked_state(), LOCKED, old, {**old, "data": {"a": "2"}})
    assert d.allowed and d.rule is Rule.ALREADY_TERMINATING


def test_other_subresources_are_never_held():
    """status (and a Namespace's finalize) are the controllers'; the router sends none, decided defensively."""
    for sub in ("status", "finalize"):
        d = decide_update(locked_state(), LOCKED, configmap(), configmap({"a": "2"}), sub_resource=sub)
        assert d.allowed and d.rule is Rule.NOT_GATED, sub


def test_once_the_lock_is_gone_updates_pass_and_are_confirmed():
    d = decide_update(locked_state(lock_exists=False), LOCKED, configmap(), configmap({"a": "2"}))
    assert d.allowed and d.rule is Rule.CRITERIA_MET and d.protected  # protected: the server re-reads live


def test_warn_enforcement_warns_instead():
    d = decide_update(locked_state(cs={"enforcement": "Warn"}), LOCKED, configmap(), configmap({"a": "2"}))
    assert d.allowed and d.rule is Rule.WARN_ONLY and d.protected
    assert d.warnings == ("(enforcement: Warn) would deny updating configmaps app/settings: CriticalService "
                          "lock-settings holds updates of it until: configmaps locks/lock-settings still exists",)


def test_break_glass_in_the_update_itself_allows_it_with_a_warning():
    new = configmap({"a": "2"}, annotations={BREAK_GLASS_ANNOTATION: "incident 42"})
    d = decide_update(locked_state(), LOCKED, configmap(), new)
    assert d.allowed and d.rule is Rule.BREAK_GLASS and d.break_glass == "incident 42"
    assert d.warnings[0].startswith("break-glass (incident 42): allowed although configmaps app/settings may not "
                                    "be updated yet")


def test_a_dry_run_is_decided_the_same():
    for old, new in ((configmap(), configmap({"a": "2"})), (configmap(finalizers=["a/b"]), configmap())):
        assert decide_update(locked_state(), LOCKED, old, new, dry_run=True) == \
            decide_update(locked_state(), LOCKED, old, new)


def test_without_hold_updates_nothing_is_held():
    state = state_of(service("plain", LOCKED, LOCK))
    d = decide_update(state, LOCKED, configmap(), configmap({"a": "2"}))
    assert d.allowed and d.rule is Rule.UNPROTECTED and not d.protected


def test_an_unprotected_object_is_not_held():
    d = decide_update(locked_state(), ObjectRef(CONFIGMAPS, "app", "other"), configmap(), configmap({"a": "2"}))
    assert d.allowed and d.rule is Rule.UNPROTECTED


# --- scaleToZero: DenyWhileBlocking -----------------------------------------------------------------
def scale_state(**kw: Any) -> MemoryState:
    return state_of(service("web", WEB, LOCK, scale=True, **kw.pop("cs", {})), **kw)


def test_scaling_to_zero_through_the_object_is_denied():
    d = decide_update(scale_state(), WEB, deployment(3), deployment(0))
    assert not d.allowed and d.rule is Rule.SCALE_TO_ZERO and d.protected and d.blocking == ("web",)
    assert d.message == (
        "deployments.apps app/web may not be scaled to 0 replicas yet: CriticalService web forbids scaling it to 0 "
        "replicas until: configmaps locks/lock-settings still exists (removing finalizers is never held; to override, "
        f"set the annotation {BREAK_GLASS_ANNOTATION}=<reason> in this same update)")


def test_scaling_to_zero_through_the_scale_subresource_is_denied():
    """`kubectl scale --replicas=0`: the objects are Scales, and ScaleSpec.replicas is omitempty: 0 is `{}`."""
    old, new = scale_of(deployment(3)), scale_of(deployment(0))
    assert new["spec"] == {}
    d = decide_update(scale_state(), WEB, old, new, sub_resource="scale")
    assert not d.allowed and d.rule is Rule.SCALE_TO_ZERO
    assert d.message.startswith("deployments.apps app/web may not be scaled to 0 replicas yet: CriticalService web")
    assert "set spec.replicas to 0 on the object itself with the annotation" in d.message


@pytest.mark.parametrize("old, new", [(3, 1), (0, 2), (0, 0), (1, 1)])
def test_other_scalings_pass_without_a_confirmation(old: int, new: int):
    for sub, before, after in (("", deployment(old), deployment(new)),
                               ("scale", scale_of(deployment(old)), scale_of(deployment(new)))):
        d = decide_update(scale_state(), WEB, before, after, sub_resource=sub)
        assert d.allowed and d.rule is Rule.UNPROTECTED and not d.protected, (sub, old, new)


def test_a_workload_without_replicas_has_the_default_one_and_scaling_it_to_zero_is_denied():
    assert decide_update(scale_state(), WEB, deployment(None), deployment(0)).rule is Rule.SCALE_TO_ZERO


@pytest.mark.parametrize("old_spec", [{"replicas": "3"}, {"replicas": True}, None, "garbled"],
                         ids=["string", "bool", "null-spec", "spec-not-an-object"])
def test_a_scale_to_zero_from_a_replica_count_that_cannot_be_read_is_denied(old_spec: Any):
    """An old object whose replicas the gate cannot read might have run any number: fail closed, as for 3 -> 0."""
    old = {**deployment(3), "spec": old_spec}
    d = decide_update(scale_state(), WEB, old, deployment(0))
    assert not d.allowed and d.rule is Rule.SCALE_TO_ZERO, d


def test_scale_to_zero_is_allowed_once_the_criteria_hold_or_the_workload_terminates():
    met = decide_update(scale_state(lock_exists=False), WEB, deployment(2), deployment(0))
    assert met.allowed and met.rule is Rule.CRITERIA_MET and met.protected
    going = decide_update(scale_state(terminating=WEB), WEB, scale_of(deployment(2)), scale_of(deployment(0)),
                          sub_resource="scale")
    assert going.allowed and going.rule is Rule.ALREADY_TERMINATING


def test_scale_to_zero_warn_and_break_glass():
    warned = decide_update(scale_state(cs={"enforcement": "Warn"}), WEB, deployment(2), deployment(0))
    assert warned.allowed and warned.rule is Rule.WARN_ONLY
    assert warned.warnings[0].startswith("(enforcement: Warn) would deny scaling deployments.apps app/web to 0 "
                                         "replicas: CriticalService web forbids")
    glass = decide_update(scale_state(), WEB, deployment(2),
                          deployment(0, annotations={BREAK_GLASS_ANNOTATION: "drain"}))
    assert glass.allowed and glass.rule is Rule.BREAK_GLASS
    assert decide_update(scale_state(), WEB, deployment(2), deployment(0), dry_run=True).rule is Rule.SCALE_TO_ZERO


def test_scale_to_zero_alone_does_not_hold_other_updates():
    d = decide_update(scale_state(), WEB, deployment(2), deployment(2, labels={"x": "y"}))
    assert d.allowed and d.rule is Rule.UNPROTECTED


def test_a_lock_on_a_workload_holds_any_scaling():
    state = state_of(service("web", WEB, LOCK, hold=True))
    d = decide_update(state, WEB, scale_of(deployment(3)), scale_of(deployment(1)), sub_resource="scale")
    assert not d.allowed and d.rule is Rule.UPDATE_HELD
    same = decide_update(state, WEB, scale_of(deployment(3)), scale_of(deployment(3)), sub_resource="scale")
    assert same.allowed and same.rule is Rule.UPDATE_EXEMPT


# --- the property: held iff an independent oracle says so -------------------------------------------
FINALIZERS = ("a.io/x", "b.io/y", "c.io/z")
OWNERS = ({"uid": "o1", "kind": "X", "name": "x"}, {"uid": "o2", "kind": "Y", "name": "y"})


@st.composite
def objects(draw: st.DrawFn) -> dict[str, Any]:
    md: dict[str, Any] = {"name": LOCKED.name, "namespace": LOCKED.namespace,
                          "resourceVersion": str(draw(st.integers(1, 3))),
                          "finalizers": draw(st.lists(st.sampled_from(FINALIZERS), unique=True, max_size=3)),
                          "labels": draw(st.dictionaries(st.sampled_from(("app", "tier")), st.sampled_from("ab"),
                                                         max_size=2))}
    owners = draw(st.lists(st.sampled_from(range(len(OWNERS))), unique=True, max_size=2))
    md["ownerReferences"] = [{**OWNERS[i], "blockOwnerDeletion": draw(st.booleans())} for i in owners]
    if draw(st.booleans()):
        md["generation"] = draw(st.integers(1, 3))
    if draw(st.booleans()):
        md["annotations"] = {BREAK_GLASS_ANNOTATION: "why"}
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": md,
                           "data": {"k": draw(st.sampled_from("12"))}}
    if draw(st.booleans()):
        obj["status"] = {"s": draw(st.integers(0, 1))}
    return obj


@st.composite
def updates_of(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any], bool]:
    """(old, new, terminating); new is often old with one exempt change, so both sides are well covered."""
    old = draw(objects())
    if draw(st.booleans()):
        new = copy.deepcopy(old)
        md = new["metadata"]
        change = draw(st.sampled_from(("finalizers", "status", "resourceVersion", "owners", "unblock")))
        if change == "finalizers":
            md["finalizers"] = [f for f in md["finalizers"] if draw(st.booleans())]
        elif change == "status":
            new["status"] = {"s": 9}
        elif change == "resourceVersion":
            md["resourceVersion"] = "99"
        elif change == "owners":
            md["ownerReferences"] = [r for r in md["ownerReferences"] if draw(st.booleans())]
        else:
            md["ownerReferences"] = [{**r, "blockOwnerDeletion": False} for r in md["ownerReferences"]]
    else:
        new = draw(objects())
    return old, new, draw(st.booleans())


def oracle(old: dict[str, Any], new: dict[str, Any], *, holds: bool, unmet: bool, terminating: bool) -> bool:
    """Held iff the lock applies and the update changes something other than the exempt parts, written
    independently of criticalsvc/updates.py: field by field, over this generator's fields."""
    if not holds or not unmet or terminating:
        return False
    o, n = old["metadata"], new["metadata"]
    if old["data"] != new["data"] or o["labels"] != n["labels"]:
        return True
    if not set(n["finalizers"]) <= set(o["finalizers"]):
        return True
    old_owners = {r["uid"]: r for r in o["ownerReferences"]}
    for r in n["ownerReferences"]:
        before = old_owners.get(r["uid"])
        if before is None or (r["blockOwnerDeletion"] and not before["blockOwnerDeletion"]):
            return True
    # status, resourceVersion, generation and the break-glass annotation are never a reason to hold;
    # the break-glass annotation on the new object lets a held update through (tested below).
    return False


def hold_everything(old: dict[str, Any], new: dict[str, Any], *, holds: bool, unmet: bool,
                    terminating: bool) -> bool:
    """The naive lock: every update while blocking. The negative control."""
    return holds and unmet and not terminating


def held(old: dict[str, Any], new: dict[str, Any], *, holds: bool, unmet: bool, terminating: bool) -> bool:
    state = state_of(service("lock-settings", LOCKED, LOCK, hold=holds), lock_exists=unmet)
    if terminating:
        old = {**old, "metadata": {**old["metadata"], "deletionTimestamp": TERMINATING}}
        new = {**new, "metadata": {**new["metadata"], "deletionTimestamp": TERMINATING}}
    d = decide_update(state, LOCKED, old, new)
    glass = BREAK_GLASS_ANNOTATION in (new["metadata"].get("annotations") or {})
    if glass and d.rule is Rule.BREAK_GLASS:
        return True  # would have been held; the annotation let it through
    assert d.allowed or d.rule is Rule.UPDATE_HELD
    return not d.allowed


@given(updates_of(), st.booleans(), st.booleans())
def test_an_update_is_held_iff_the_oracle_says_so(update: tuple[dict[str, Any], dict[str, Any], bool],
                                                  holds: bool, unmet: bool):
    old, new, terminating = update
    expected = oracle(old, new, holds=holds, unmet=unmet, terminating=terminating)
    assert held(old, new, holds=holds, unmet=unmet, terminating=terminating) is expected


def test_the_property_tells_a_lock_that_holds_everything_apart():
    """Negative control: the naive oracle (hold every update while blocking) disagrees with the gate, and
    hypothesis finds the update it would wedge a teardown with - one that removes a finalizer."""

    def wedged(u: tuple[dict[str, Any], dict[str, Any], bool]) -> bool:
        old, new, _ = u
        removes = set(new["metadata"]["finalizers"]) < set(old["metadata"]["finalizers"])
        return removes and hold_everything(old, new, holds=True, unmet=True, terminating=False) != \
            held(old, new, holds=True, unmet=True, terminating=False)

    old, new, _ = find(updates_of(), wedged)
    assert not held(old, new, holds=True, unmet=True, terminating=False)
    assert hold_everything(old, new, holds=True, unmet=True, terminating=False)
    assert old["metadata"]["finalizers"] and not new["metadata"]["finalizers"]  # minimal: the last one removed


# --- the simulator: UPDATEs reach the webhook; a teardown through a lock completes ---------------------
UPDATE_RULES = (WebhookRule(frozenset({"UPDATE"}), frozenset({CONFIGMAPS, DEPLOYMENTS,
                                                              GroupResource("apps", "deployments/scale")})),
                WebhookRule(frozenset({"DELETE", "CREATE", "UPDATE"}),
                            frozenset({GroupResource("criticalsvc.io", "criticalservices")})))


def simulated() -> Store:
    store = Store(clock=lambda: 1_800_000_000.0)
    store.webhooks.append(RegisteredWebhook(gate_hook(store), rules=UPDATE_RULES))
    for ns in ("app", "locks"):
        store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    store.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": LOCKED.name, "namespace": LOCKED.namespace, "finalizers": ["example.com/cleanup"]}, "data": {"a": "1"}})
    store.create({"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": LOCK.name, "namespace": LOCK.namespace}})
    store.create({**deployment(3), "metadata": {"name": WEB.name, "namespace": WEB.namespace}})
    store.create(service("lock-settings", LOCKED, LOCK, hold=True))
    store.create(service("web", WEB, LOCK, scale=True))
    return store


def test_the_simulator_reviews_updates_and_a_teardown_through_a_lock_completes():
    store = simulated()
    current = store.get(CONFIGMAPS, "app", "settings")
    assert current is not None
    with pytest.raises(StatusError) as refused:
        store.update({**current, "data": {"a": "2"}})
    assert refused.value.code == 403 and "CriticalService lock-settings holds updates of it" in refused.value.message
    # The teardown: the locked object is deleted (the lock holds no DELETE here), its finalizer
    # controller removes the finalizer with a PATCH of metadata.finalizers - never held - and it is gone.
    store.delete(LOCKED)
    assert store.remove_finalizer(LOCKED, "example.com/cleanup") is not None
    assert store.get(CONFIGMAPS, "app", "settings") is None


def test_the_simulator_reviews_the_scale_subresource_with_scales():
    store = simulated()
    seen: list[dict[str, Any]] = []
    hook = store.webhooks[0].hook
    store.webhooks[0].hook = lambda review: seen.append(review) or hook(review)  # type: ignore[func-returns-value]
    current = store.get(DEPLOYMENTS, "app", "web")
    assert current is not None
    with pytest.raises(StatusError) as refused:
        store.update({**current, "spec": {**current["spec"], "replicas": 0}}, subresource="scale")
    assert refused.value.code == 403 and "may not be scaled to 0 replicas yet" in refused.value.message
    request = seen[-1]["request"]
    assert (request["subResource"], request["kind"]["kind"], request["object"]["kind"]) == ("scale", "Scale", "Scale")
    assert request["object"]["spec"] == {} and request["oldObject"]["spec"] == {"replicas": 3}
    store.update({**current, "spec": {**current["spec"], "replicas": 1}}, subresource="scale")
    assert store.get(DEPLOYMENTS, "app", "web")["spec"]["replicas"] == 1  # type: ignore[index]
    store.delete(ObjectRef(CONFIGMAPS, "locks", "lock-settings"))
    store.update({**current, "spec": {**current["spec"], "replicas": 0}, "metadata": {
        **current["metadata"], "resourceVersion": None}}, subresource="scale")
    assert store.get(DEPLOYMENTS, "app", "web")["spec"]["replicas"] == 0  # type: ignore[index]


# --- the live confirmation: a protected ALLOW of an UPDATE is decided again on fresh reads ---------------
@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_the_live_confirmation_decides_an_update_and_a_scale_again_on_fresh_reads() -> None:
    """A cache that missed the lock allows; the fresh read (the lock exists) holds the edit and the Scale to
    zero, whose objects are Scales; once the lock is gone in the cluster, the fresh read allows too."""
    from kubernetes.aio import client

    from criticalsvc.cache import KubeTransport

    store = simulated()
    store.webhooks.clear()
    edit = update(LOCKED, configmap(), configmap({"a": "2"}))
    to_zero = update(WEB, scale_of(deployment(3)), scale_of(deployment(0)), sub_resource="scale")
    with running_standin(store) as env:
        api = client.ApiClient(client.Configuration(host=env.url))
        try:
            reader = LiveReader(KubeTransport(api))
            for request, stale, rule in ((edit, locked_state(lock_exists=False), Rule.UPDATE_HELD),
                                         (to_zero, scale_state(lock_exists=False), Rule.SCALE_TO_ZERO)):
                cached = decide(request, stale)
                assert cached.allowed and cached.rule is Rule.CRITERIA_MET
                assert reader.needs_confirmation(request, cached)
                confirmed = await reader.confirm(request, cached)
                assert not confirmed.allowed and confirmed.rule is rule, confirmed
            await env.write(lambda: store.delete(LOCK))
            for request in (edit, to_zero):
                confirmed = await reader.confirm(request, decide(request, store.state))
                assert confirmed.allowed and confirmed.rule is Rule.CRITERIA_MET
        finally:
            await api.close()


# --- the examples do what their headers say -----------------------------------------------------------
def example_state(name: str) -> MemoryState:
    from criticalsvc.manifests import load_path
    from criticalsvc.snapshot import build_state

    return build_state(load_path(f"api/examples/{name}"))


def test_the_object_lock_example_holds_an_edit_and_not_a_finalizer_removal():
    state = example_state("object-lock.yaml")
    ref = ObjectRef(CONFIGMAPS, "payments", "payments-config")
    old = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": ref.name, "namespace": ref.namespace,
                                                                 "finalizers": ["example.com/x"]}, "data": {"a": "1"}}
    d = decide_update(state, ref, old, {**old, "data": {"a": "2"}})
    assert not d.allowed and d.message == (
        "configmaps payments/payments-config may not be updated yet: CriticalService lock-payments-config holds "
        "updates of it until: locks.locking.example.com payments/payments-config still exists (removing finalizers "
        f"is never held; to override, set the annotation {BREAK_GLASS_ANNOTATION}=<reason> in this same update)")
    unfinalized = {**old, "metadata": {**old["metadata"], "finalizers": []}}
    assert decide_update(state, ref, old, unfinalized).rule is Rule.UPDATE_EXEMPT
    deleted = decide(AdmissionRequest(uid="u", group_resource=CONFIGMAPS, operation="DELETE", name=ref.name,
                                      namespace=ref.namespace, old_object=old), state)
    assert not deleted.allowed and deleted.rule is Rule.BLOCKED


def test_the_scale_to_zero_example_refuses_kubectl_scale_to_zero_only():
    state = example_state("scale-to-zero.yaml")
    ref = ObjectRef(DEPLOYMENTS, "ledger", "ledger")
    two = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "ledger", "namespace": "ledger"},
           "spec": {"replicas": 2}}
    d = decide_update(state, ref, scale_of(two), scale_of({**two, "spec": {"replicas": 0}}), sub_resource="scale")
    assert not d.allowed and d.message.startswith(
        "deployments.apps ledger/ledger may not be scaled to 0 replicas yet: CriticalService for-ledger forbids "
        "scaling it to 0 replicas until: pods shop/checkout-7d9f in namespace shop matching app=checkout still exists "
        "(to override, set spec.replicas to 0 on the object itself with the annotation")
    assert decide_update(state, ref, scale_of(two), scale_of({**two, "spec": {"replicas": 1}}),
                         sub_resource="scale").allowed


# --- the webhook: metrics and logs name the operation and the subresource ----------------------------
@pytest.mark.anyio
async def test_the_webhook_counts_and_logs_a_held_scale_and_confirms_an_allowed_update() -> None:
    import io
    import logging

    import httpx
    import orjson
    import structlog

    from criticalsvc.logs import configure_logging
    from criticalsvc.server import StaticStateSource, Webhook

    buffer = io.BytesIO()
    configure_logging("info", stream=buffer)
    confirmed: list[AdmissionRequest] = []

    async def confirm(request: AdmissionRequest, decision: Decision) -> Decision:
        confirmed.append(request)
        raise TimeoutError("no answer")

    try:
        state = scale_state()
        webhook = Webhook(StaticStateSource(state), confirm=confirm)
        to_zero = update(WEB, scale_of(deployment(3)), scale_of(deployment(0)), sub_resource="scale")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=webhook.webhook_app()),
                                     base_url="http://gate") as client:
            async def post(request: AdmissionRequest) -> dict[str, Any]:
                answer = await client.post("/validate", content=orjson.dumps(render_review(request)),
                                           headers={"content-type": "application/json"})
                return dict(answer.json()["response"])

            refused = await post(to_zero)
            assert not refused["allowed"] and refused["auditAnnotations"]["rule"] == "scale-to-zero"
            assert not confirmed  # a denial is never confirmed
            state.remove(LOCK)  # the cache now says the criteria hold: the ALLOW goes to the confirmation
            unverified = await post(to_zero)
            assert [r.sub_resource for r in confirmed] == ["scale"]
            assert not unverified["allowed"] and "does not allow this update yet" in unverified["status"]["message"]
            text = (await client.get("/metrics")).text
        assert ('criticalsvc_decisions_total{operation="UPDATE",resource="deployments.apps/scale",result="denied",'
                'rule="scale-to-zero"} 1.0') in text
        [line] = [orjson.loads(x) for x in buffer.getvalue().splitlines()
                  if orjson.loads(x).get("rule") == "scale-to-zero"]
        assert (line["operation"], line["resource"], line["subresource"]) == ("UPDATE", "deployments.apps/scale",
                                                                              "scale")
    finally:
        structlog.reset_defaults()
        root = logging.getLogger()
        root.handlers = [h for h in root.handlers if type(h).__name__ != "_ForwardToStructlog"]
        root.setLevel(logging.WARNING)
