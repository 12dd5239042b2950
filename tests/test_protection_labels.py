"""Protection carried by the protected object (criticalsvc/protectionlabels.py, labeller.py; design/routing.md).

What a user notices:

    the labels               each existing provider, its namespace and its CRD carry criticalsvc.io/protected (and
                             updates-held when updates are held); nothing in the gate's namespace or kube-system,
                             nothing already terminating
    the shipped webhooks     a DELETE of a labelled object is sent to the gate, an UPDATE only when it removes the
                             label or the object's updates are held - never the gate's own label write
    the label stays          an UPDATE removing it is refused while a CriticalService protects the object, and
                             allowed once none does
    routes by name           dropped for an object whose label is stored, kept for what is absent or unlabelled
                             (property: what the names routed before is still routed by name or by label)
    Ready                    LabelPending until the labels are stored, then Enforcing (on every API server);
                             EnforcingByRoute when the gate may not label an object, naming it
    the labeller             PATCHes the missing labels, removes the ones nothing wants, reports what it may not
"""

from __future__ import annotations

import asyncio
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubefakes import FakeAPI, eventually
from test_routing import CONFIGMAPS, DEPLOYMENTS, NAMESPACES_GR, api_server_sends, shipped
from test_webhookrouter import leading

from criticalsvc import labeller as labeller_module
from criticalsvc import protectionlabels
from criticalsvc.admission import AdmissionRequest
from criticalsvc.api import (
    CRDS,
    PROTECTED_LABEL,
    UPDATES_HELD_LABEL,
    GroupResource,
    ObjectRef,
    parse_critical_service,
)
from criticalsvc.cache.transport import APIStatusError
from criticalsvc.decision import Rule, decide
from criticalsvc.errors import StateUnavailable
from criticalsvc.labeller import Labeller
from criticalsvc.objects import KubeObject
from criticalsvc.restmapper import ResourceType, RESTMapper
from criticalsvc.routing import Route, Routing, call_of, covers, desired, routes_labels
from criticalsvc.state import MemoryState
from criticalsvc.status import compute_status

GADGETS = GroupResource("gadgets.example.com", "gadgets")
GADGET = ResourceType("gadgets.example.com", "v1", "Gadget", "gadgets", "gadget", True)
GADGET_CRD = ObjectRef(CRDS, "", "gadgets.gadgets.example.com")
LABELLED = {PROTECTED_LABEL: "true"}


def service(name: str, gr: GroupResource, *, namespace: str = "team", provider: str = "p", hold: bool = False,
            selector: dict[str, Any] | None = None) -> Any:
    ref: dict[str, Any] = {"group": gr.group, "resource": gr.resource, "namespace": namespace}
    ref.update({"selector": selector} if selector is not None else {"name": provider})
    spec: dict[str, Any] = {"provider": ref, "criteria": [
        {"type": "SpecificResource", "specificResource": {"resource": "configmaps", "namespace": "x", "name": "y"}}]}
    if hold:
        spec["holdUpdates"] = "WhileBlocking"
    return parse_critical_service({"metadata": {"name": name, "uid": f"uid-{name}"}, "spec": spec})


def state_with(*objects: KubeObject, services: tuple[Any, ...] = ()) -> MemoryState:
    mapper = RESTMapper()
    mapper.add(GADGET)
    state = MemoryState(mapper)
    for obj in objects:
        state.upsert(obj)
    for cs in services:
        state.upsert_critical_service(cs)
    return state


def obj(gr: GroupResource, namespace: str, name: str, labels: dict[str, str] | None = None,
        terminating: bool = False) -> KubeObject:
    return KubeObject(gr, namespace, name, uid=f"u-{name}", labels=labels or {},
                      deletion_timestamp="2026-12-07T00:00:00Z" if terminating else None)


def ns(name: str, labels: dict[str, str] | None = None) -> KubeObject:
    return obj(NAMESPACES_GR, "", name, labels)


# --- which objects -----------------------------------------------------------------------------------------------
def test_a_named_provider_its_namespace_and_its_crd_are_labelled() -> None:
    """A custom provider: the object, its namespace and its CRD; updates-held on the provider alone when held."""
    cs = service("a", GADGETS, hold=True)
    state = state_with(obj(GADGETS, "team", "p"), ns("team"), obj(CRDS, "", GADGET_CRD.name), services=(cs,))
    assert protectionlabels.protected_objects(cs, state) == {
        ObjectRef(GADGETS, "team", "p"): frozenset({PROTECTED_LABEL, UPDATES_HELD_LABEL}),
        ObjectRef(NAMESPACES_GR, "", "team"): frozenset({PROTECTED_LABEL}),
        GADGET_CRD: frozenset({PROTECTED_LABEL})}


def test_a_selector_labels_its_members_and_their_namespaces_but_not_the_others() -> None:
    cs = service("s", DEPLOYMENTS, namespace="", selector={"matchLabels": {"app": "db"}})
    state = state_with(obj(DEPLOYMENTS, "a", "db", {"app": "db"}), obj(DEPLOYMENTS, "b", "web", {"app": "web"}),
                       ns("a"), ns("b"), services=(cs,))
    assert set(protectionlabels.protected_objects(cs, state)) == {
        ObjectRef(DEPLOYMENTS, "a", "db"), ObjectRef(NAMESPACES_GR, "", "a")}


def test_nothing_terminating_nothing_in_the_gates_namespace_or_kube_system() -> None:
    """Their DELETEs are never gated: the shipped namespaceSelector skips them, a terminating object's DELETE passed."""
    gone = service("g", DEPLOYMENTS, provider="old")
    system = service("k", DEPLOYMENTS, namespace="kube-system")
    state = state_with(obj(DEPLOYMENTS, "team", "old", terminating=True), obj(DEPLOYMENTS, "kube-system", "p"),
                       ns("kube-system"), services=(gone, system))
    assert protectionlabels.protected_objects(gone, state) == {}
    assert protectionlabels.protected_objects(system, state) == {}


# --- the shipped webhooks, as the API server evaluates them ----------------------------------------------------------
def _sent(operation: str, old_labels: dict[str, str], new_labels: dict[str, str] | None) -> list[str]:
    old = {"metadata": {"name": "p", "namespace": "team", "labels": old_labels}}
    new = None if new_labels is None else {"metadata": {"name": "p", "namespace": "team", "labels": new_labels}}
    mapper = RESTMapper()
    return api_server_sends(shipped(), AdmissionRequest(
        uid="u", group_resource=DEPLOYMENTS, operation=operation, name="p", namespace="team", object=new,
        old_object=old), types=mapper)


def test_the_shipped_webhooks_send_a_labelled_delete_and_the_label_removing_updates_only() -> None:
    assert _sent("DELETE", LABELLED, None) == ["protected.gate.criticalsvc.io"]
    assert _sent("DELETE", {}, None) == []
    # The gate's own write adds the label: never sent (it would ask itself).
    assert _sent("UPDATE", {}, LABELLED) == []
    # A rollout of a labelled Deployment: not sent; a held one is.
    assert _sent("UPDATE", {**LABELLED, "v": "1"}, {**LABELLED, "v": "2"}) == []
    held = {**LABELLED, UPDATES_HELD_LABEL: "true"}
    assert _sent("UPDATE", held, {**held, "v": "2"}) == ["protected-updates.gate.criticalsvc.io"]
    # Removing or changing the label: sent.
    assert _sent("UPDATE", LABELLED, {}) == ["protected-updates.gate.criticalsvc.io"]
    assert _sent("UPDATE", LABELLED, {PROTECTED_LABEL: "no"}) == ["protected-updates.gate.criticalsvc.io"]
    assert routes_labels(shipped())


# --- the label stays while protected --------------------------------------------------------------------------------
def _update(old_labels: dict[str, str], new_labels: dict[str, str], *, gr: GroupResource = DEPLOYMENTS,
            namespace: str = "team", name: str = "p") -> AdmissionRequest:
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return AdmissionRequest(uid="u", group_resource=gr, operation="UPDATE", name=name, namespace=namespace,
                            object={"metadata": {**meta, "labels": new_labels}},
                            old_object={"metadata": {**meta, "labels": old_labels}})


def test_removing_the_label_is_refused_while_a_critical_service_protects_the_object() -> None:
    cs = service("a", DEPLOYMENTS)
    state = state_with(obj(DEPLOYMENTS, "team", "p", LABELLED), ns("team", LABELLED), services=(cs,))
    refused = decide(_update(LABELLED, {}), state)
    assert not refused.allowed and refused.rule == Rule.PROTECTION_LABEL
    assert "criticalsvc.io/protected may not be removed while CriticalService a protects it" in refused.message
    namespace = decide(_update(LABELLED, {}, gr=NAMESPACES_GR, namespace="", name="team"), state)
    assert not namespace.allowed and namespace.rule == Rule.PROTECTION_LABEL
    # Any other change of a labelled object is not this rule's business.
    assert decide(_update(LABELLED, {**LABELLED, "v": "2"}), state).allowed


def test_the_gate_may_label_a_provider_whose_updates_it_holds() -> None:
    """The labeller's PATCH of a held provider is not a held update (the route by name sends it to the gate until
    the label is stored); any other change of it still is."""
    cs = service("h", DEPLOYMENTS, hold=True)
    state = state_with(obj(DEPLOYMENTS, "team", "p"), ns("team", LABELLED), obj(CONFIGMAPS, "x", "y"),
                       services=(cs,))  # the criterion's ConfigMap x/y exists: it is unmet
    held = {**LABELLED, UPDATES_HELD_LABEL: "true"}
    assert decide(_update({"app": "p"}, {"app": "p", **held}), state).allowed
    refused = decide(_update({"app": "p"}, {"app": "q", **held}), state)
    assert not refused.allowed and refused.rule == Rule.UPDATE_HELD


def test_removing_the_label_is_allowed_once_nothing_protects_the_object() -> None:
    state = state_with(obj(DEPLOYMENTS, "team", "p", LABELLED), ns("team"))
    assert decide(_update(LABELLED, {}), state).allowed
    other = service("b", DEPLOYMENTS, provider="q")
    assert decide(_update(LABELLED, {}), state_with(obj(DEPLOYMENTS, "team", "p", LABELLED),
                                                    services=(other,))).allowed


def test_a_terminating_object_may_lose_its_label() -> None:
    """Writes to an object being deleted are never held (its DELETE passed; a held write would wedge it)."""
    cs = service("a", DEPLOYMENTS)
    state = state_with(obj(DEPLOYMENTS, "team", "p", LABELLED, terminating=True), services=(cs,))
    request = _update(LABELLED, {})
    request = attrs.evolve(request, old_object={"metadata": {**request.old_object["metadata"],  # type: ignore[index]
                                                              "deletionTimestamp": "2026-12-07T00:00:00Z"}})
    assert decide(request, state).allowed


# --- routes by name -------------------------------------------------------------------------------------------------
def _carried(state: MemoryState) -> Any:
    return lambda ref, labels: protectionlabels.carries(state.get(ref), labels)


def test_a_labelled_provider_needs_no_route_by_name_and_an_absent_one_keeps_it() -> None:
    cs = service("a", DEPLOYMENTS)
    lookup = state_with().mapper.lookup
    absent = state_with(ns("team", LABELLED), services=(cs,))
    assert desired([cs], lookup, _carried(absent)).routes == {Route("DELETE", DEPLOYMENTS, "team", "p")}
    unlabelled = state_with(obj(DEPLOYMENTS, "team", "p"), ns("team", LABELLED), services=(cs,))
    assert desired([cs], lookup, _carried(unlabelled)).routes == {Route("DELETE", DEPLOYMENTS, "team", "p")}
    labelled = state_with(obj(DEPLOYMENTS, "team", "p", LABELLED), ns("team", LABELLED), services=(cs,))
    assert desired([cs], lookup, _carried(labelled)).routes == frozenset()
    # Held updates: the route by name goes only once updates-held is stored too.
    held = service("h", DEPLOYMENTS, hold=True)
    assert Route("UPDATE", DEPLOYMENTS, "team", "p") in desired([held], lookup, _carried(labelled)).routes


NAMES = st.sampled_from(["p", "q"])
SPACES = st.sampled_from(["team", "shop"])


@st.composite
def worlds(draw: st.DrawFn) -> tuple[list[Any], MemoryState]:
    """Some named and selected providers, objects that exist or not, each labelled or not."""
    services = []
    for i in range(draw(st.integers(1, 4))):
        gr = draw(st.sampled_from([DEPLOYMENTS, GADGETS, CONFIGMAPS]))
        if draw(st.booleans()):
            services.append(service(f"s{i}", gr, namespace=draw(SPACES), provider=draw(NAMES),
                                    hold=draw(st.booleans())))
        else:
            services.append(service(f"s{i}", gr, namespace=draw(SPACES), selector={"matchLabels": {"app": "db"}}))
    objects = []
    for gr in (DEPLOYMENTS, GADGETS, CONFIGMAPS):
        for space in ("team", "shop"):
            for name in ("p", "q"):
                if draw(st.booleans()):
                    labels = {"app": "db"} if draw(st.booleans()) else {}
                    labels |= draw(st.sampled_from([{}, LABELLED, {**LABELLED, UPDATES_HELD_LABEL: "true"}]))
                    objects.append(obj(gr, space, name, labels))
    for space in ("team", "shop"):
        if draw(st.booleans()):
            objects.append(ns(space, draw(st.sampled_from([{}, LABELLED]))))
    if draw(st.booleans()):
        objects.append(obj(CRDS, "", GADGET_CRD.name, draw(st.sampled_from([{}, LABELLED]))))
    return services, state_with(*objects, services=tuple(services))


@given(worlds())
def test_every_request_the_names_routed_is_still_routed_by_name_or_by_label(
        world: tuple[list[Any], MemoryState]) -> None:
    """The oracle is the routing before labels (every name routed); with labels, each DELETE and UPDATE it routed of
    an object that exists is routed by criticalsvc-providers or carries the label the shipped webhooks select, and
    an object that does not exist yet is routed by name (its CREATE-then-DELETE is covered)."""
    services, state = world
    lookup = state.mapper.lookup
    before = desired(services, lookup).routes
    after = desired(services, lookup, _carried(state)).routes
    assert after <= before
    for route in before - after:
        assert route.name is not None  # only routes by name are ever left to a label
        gr = route.group_resource
        ref = ObjectRef(gr, route.namespace or "", route.name)
        stored = state.get(ref)
        labels = {PROTECTED_LABEL} | ({UPDATES_HELD_LABEL} if route.operation == "UPDATE" else set())
        assert _stored_with(stored, labels), (route, stored)
        call = call_of(operation=route.operation, group_resource=gr, namespace=route.namespace or "",
                       name=route.name, obj=None, old={"metadata": {"name": route.name}})
        assert covers(route, call)


def _stored_with(stored: KubeObject | None, labels: set[str]) -> bool:
    """The oracle's own reading of the labels, not protectionlabels.carries."""
    return stored is not None and all(dict(stored.labels).get(k) == "true" for k in labels)


def test_the_property_fails_when_a_route_is_dropped_for_an_unlabelled_object() -> None:
    """Negative control: dropping every route by name (as if all were carried) breaks the property."""
    cs = service("a", DEPLOYMENTS)
    state = state_with(obj(DEPLOYMENTS, "team", "p"), services=(cs,))
    dropped = desired([cs], state.mapper.lookup).routes - desired([cs], state.mapper.lookup, lambda r, ls: True).routes
    assert dropped and not any(_stored_with(state.get(ObjectRef(r.group_resource, r.namespace or "", r.name or "")),
                                            {PROTECTED_LABEL}) for r in dropped)


# --- Ready ----------------------------------------------------------------------------------------------------------
def _ready(cs: Any, state: MemoryState, routing: Routing, errors: dict[ObjectRef, str] | None = None) -> Any:
    status = compute_status(cs, state, now=0, routing=routing, lookup=state.mapper.lookup, label_errors=errors)
    return next(c for c in status["conditions"] if c["type"] == "Ready")


def test_ready_waits_for_the_labels_then_says_enforcing_on_every_api_server() -> None:
    cs = service("a", DEPLOYMENTS)
    routing = Routing(managed=True, labelled=True)
    pending = _ready(cs, state_with(obj(DEPLOYMENTS, "team", "p"), ns("team", LABELLED), services=(cs,)),
                     attrs.evolve(routing, live=frozenset({Route("DELETE", DEPLOYMENTS, "team", "p")})))
    assert (pending["status"], pending["reason"]) == ("False", "LabelPending")
    assert "apps/deployments team/p" in pending["message"] or "deployments.apps team/p" in pending["message"]
    done = _ready(cs, state_with(obj(DEPLOYMENTS, "team", "p", LABELLED), ns("team", LABELLED), services=(cs,)),
                  routing)
    assert (done["status"], done["reason"]) == ("True", "Enforcing") and "every API server" in done["message"]


def test_ready_says_enforcing_by_route_when_the_gate_may_not_label_the_provider() -> None:
    cs = service("a", DEPLOYMENTS)
    state = state_with(obj(DEPLOYMENTS, "team", "p"), ns("team", LABELLED), services=(cs,))
    ref = ObjectRef(DEPLOYMENTS, "team", "p")
    route = Route("DELETE", DEPLOYMENTS, "team", "p")
    ready = _ready(cs, state, Routing(managed=True, labelled=True, live=frozenset({route})),
                   {ref: "403 Forbidden: cannot patch deployments.apps"})
    assert (ready["status"], ready["reason"]) == ("True", "EnforcingByRoute")
    assert "cannot patch deployments.apps" in ready["message"] and "aggregate-to-labeller" in ready["message"]
    # ... and not before its route by name is seen live.
    assert _ready(cs, state, Routing(managed=True, labelled=True), {ref: "403"})["reason"] == "RoutePending"


# --- the labeller ---------------------------------------------------------------------------------------------------
class Source:
    def __init__(self, state: MemoryState) -> None:
        self.state = state
        self.ready = True


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_the_labeller_patches_what_lacks_its_labels_and_removes_what_nothing_wants(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(labeller_module, "IDLE", 0.01)
    cs = service("a", GADGETS, hold=True)
    state = state_with(obj(GADGETS, "team", "p"), ns("team", LABELLED), obj(CRDS, "", GADGET_CRD.name),
                       obj(GADGETS, "team", "old", LABELLED), services=(cs,))
    api = FakeAPI()
    labeller = Labeller(api, Source(state), state.mapper)  # type: ignore[arg-type]
    state.mapper.add(GADGET)
    async with leading(labeller):
        await eventually(lambda: len(api.sent("PATCH", "/apis/gadgets.example.com/v1/namespaces/team/gadgets/old")),
                         what="the stale label removed")
    patches = {path: body for verb, path, body in api.requests if verb == "PATCH"}
    assert patches["/apis/gadgets.example.com/v1/namespaces/team/gadgets/p"] == {
        "metadata": {"labels": {PROTECTED_LABEL: "true", UPDATES_HELD_LABEL: "true"}}}
    assert patches["/apis/apiextensions.k8s.io/v1/customresourcedefinitions/gadgets.gadgets.example.com"] == {
        "metadata": {"labels": {PROTECTED_LABEL: "true"}}}
    assert patches["/apis/gadgets.example.com/v1/namespaces/team/gadgets/old"] == {
        "metadata": {"labels": {PROTECTED_LABEL: None}}}
    assert "/api/v1/namespaces/team" not in patches  # already labelled: nothing sent


@pytest.mark.anyio
async def test_a_label_the_gate_may_not_write_is_an_error_shown_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(labeller_module, "IDLE", 0.01)
    monkeypatch.setattr(labeller_module, "RESEND", 0.0)
    monkeypatch.setattr(labeller_module, "RETRY_FAILED", 0.0)
    cs = service("a", DEPLOYMENTS)
    state = state_with(obj(DEPLOYMENTS, "team", "p"), ns("team", LABELLED), services=(cs,))
    api = FakeAPI()
    path = "/apis/apps/v1/namespaces/team/deployments/p"
    api.faults[("PATCH", path)] = [APIStatusError(403, "Forbidden", "cannot patch deployments.apps")] * 1000
    events: list[dict[str, Any]] = []
    labeller = Labeller(api, Source(state), state.mapper, post_event=events.append)  # type: ignore[arg-type]
    async with leading(labeller):
        await eventually(lambda: len(api.sent("PATCH", path)) >= 3, what="three tries")
    assert "cannot patch deployments.apps" in labeller.errors[ObjectRef(DEPLOYMENTS, "team", "p")]
    assert len(events) == 1 and events[0]["reason"] == "ProtectionLabelFailed"


class _Unreadable(MemoryState):
    """A state one type of which cannot be read now (a 403, a cache still syncing), as GuardedState answers."""

    def __init__(self, unreadable: GroupResource, mapper: RESTMapper) -> None:
        super().__init__(mapper)
        self.unreadable = unreadable

    def get(self, ref: ObjectRef) -> KubeObject | None:
        if ref.group_resource == self.unreadable:
            raise StateUnavailable(f"the gate may not list {self.unreadable}")
        return super().get(ref)

    def select(self, gr: GroupResource, **kw: Any) -> Any:
        if gr == self.unreadable:
            raise StateUnavailable(f"the gate may not list {gr}")
        return super().select(gr, **kw)


@pytest.mark.anyio
async def test_a_type_the_gate_cannot_read_stalls_neither_labels_nor_routes_of_the_others() -> None:
    """One CriticalService's provider type unreadable (seen on the real control plane: a widget type nobody granted):
    the other provider is labelled, and the unreadable one keeps its route by name."""
    mapper = RESTMapper()
    mapper.add(GADGET)
    state = _Unreadable(GADGETS, mapper)
    blind, seen = service("blind", GADGETS), service("seen", DEPLOYMENTS, provider="q")
    for o in (obj(DEPLOYMENTS, "team", "q"), ns("team", LABELLED)):
        state.upsert(o)
    for cs in (blind, seen):
        state.upsert_critical_service(cs)
    api = FakeAPI()
    labeller = Labeller(api, Source(state), mapper)  # type: ignore[arg-type]
    labeller._types.add(GADGETS)  # it labelled that type before it became unreadable
    await labeller.round()
    assert api.sent("PATCH", "/apis/apps/v1/namespaces/team/deployments/q")
    routes = desired([blind, seen], mapper.lookup, protectionlabels.carried_in(state)).routes
    assert Route("DELETE", GADGETS, "team", "p") in routes


class _EventedSource(Source):
    """A cache whose waiters wake at the next change and which counts its changes, as CacheManager does; a change
    made while no one waits is counted but wakes no one (the waiter registers later)."""

    def __init__(self, state: MemoryState) -> None:
        super().__init__(state)
        self.changes = 0
        self._waiters: list[asyncio.Future[None]] = []

    def change(self) -> None:
        self.changes += 1
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def wait_event(self, timeout: float) -> bool:
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, timeout)
            return True
        except TimeoutError:
            return False
        finally:
            self._waiters.remove(waiter)


@pytest.mark.anyio
async def test_a_critical_service_created_during_a_round_is_labelled_at_once_not_after_idle(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """CREATE -> Enforcing (issue 34): a CriticalService whose event arrives while the labeller is busy writing is
    labelled by the next round at once, not after IDLE (here a minute) - its event came before the wait began."""
    monkeypatch.setattr(labeller_module, "IDLE", 60.0)
    first, second = service("a", DEPLOYMENTS), service("b", DEPLOYMENTS, provider="q")
    state = state_with(obj(DEPLOYMENTS, "team", "p"), obj(DEPLOYMENTS, "team", "q"), ns("team", LABELLED),
                       services=(first,))
    source = _EventedSource(state)

    class CreatingAPI(FakeAPI):
        async def send(self, verb: str, path: str, payload: Any = None, **kw: Any) -> Any:
            if path.endswith("/deployments/p") and second.name not in {c.name for c in state.critical_services()}:
                state.upsert_critical_service(second)  # created while the first round writes
                source.change()
            return await super().send(verb, path, payload, **kw)

    api = CreatingAPI()
    labeller = Labeller(api, source, state.mapper)  # type: ignore[arg-type]
    async with leading(labeller):
        await eventually(lambda: api.sent("PATCH", "/apis/apps/v1/namespaces/team/deployments/q"), timeout=10,
                         what="the second provider labelled")


@pytest.mark.anyio
async def test_what_appears_after_its_critical_service_is_labelled_at_the_next_round() -> None:
    """The labeller keeps what each CriticalService protects between rounds (at 10,000 working it out again was a fifth
    of the leader's CPU), until what that reads is written: a named provider, a selector's new member and a
    namespace, each created after its CriticalService, are labelled by the round that follows."""
    named, selected = service("a", GADGETS, namespace="team"), service("b", GADGETS, namespace="crew",
                                                                       selector={"matchLabels": {"app": "db"}})
    state = state_with(obj(CRDS, "", GADGET_CRD.name, LABELLED), services=(named, selected))
    api = FakeAPI()
    labeller = Labeller(api, Source(state), state.mapper)  # type: ignore[arg-type]

    async def patched_after_round() -> set[str]:
        before = len(api.requests)
        await labeller.round()
        return {path for verb, path, _body in api.requests[before:] if verb == "PATCH"}

    assert await patched_after_round() == set()
    state.upsert(obj(GADGETS, "team", "p"))
    assert await patched_after_round() == {"/apis/gadgets.example.com/v1/namespaces/team/gadgets/p"}
    state.upsert(KubeObject(GADGETS, "crew", "m", uid="u-m", labels={"app": "db"}))
    assert await patched_after_round() == {"/apis/gadgets.example.com/v1/namespaces/crew/gadgets/m"}
    state.upsert(ns("team"))
    assert await patched_after_round() == {"/api/v1/namespaces/team"}


@pytest.mark.anyio
async def test_a_label_taken_off_while_nothing_else_changed_is_put_back() -> None:
    """While nothing any CriticalService protects changed, a round keeps the last one's union of what they protect and
    of what lacks its labels (at 10,000 rebuilding them was most of a round, once per cache event: a CriticalService's
    status written is one). A label taken off by hand is a write of that type: the next round puts it back."""
    named = service("a", GADGETS, namespace="team")
    state = state_with(obj(CRDS, "", GADGET_CRD.name, LABELLED), ns("team", LABELLED),
                       obj(GADGETS, "team", "p", LABELLED), services=(named,))
    api = FakeAPI()
    now = [0.0]
    labeller = Labeller(api, Source(state), state.mapper, clock=lambda: now[0])  # type: ignore[arg-type]

    async def patched_after_round() -> set[str]:
        before = len(api.requests)
        await labeller.round()
        return {path for verb, path, _body in api.requests[before:] if verb == "PATCH"}

    assert await patched_after_round() == set()
    assert await patched_after_round() == set()
    state.upsert(obj(GADGETS, "team", "p"))  # kubectl label gadget p criticalsvc.io/protected-
    now[0] += labeller_module.RESEND
    assert await patched_after_round() == {"/apis/gadgets.example.com/v1/namespaces/team/gadgets/p"}


@pytest.mark.anyio
async def test_a_round_after_a_write_it_does_not_read_walks_no_critical_service() -> None:
    """A labeller round follows every cache event; at 10,000 CriticalServices each walk over them was 20-60 ms of the
    leader's loop. A round after a write where it reads nothing (another namespace) walks none; one after a write
    where its provider lives (a new member, a label taken off) walks them and labels what lacks its label."""
    selected = service("b", GADGETS, namespace="crew", selector={"matchLabels": {"app": "db"}})
    state = state_with(obj(CRDS, "", GADGET_CRD.name, LABELLED), ns("crew", LABELLED), services=(selected,))
    api = FakeAPI()
    labeller = Labeller(api, Source(state), state.mapper)  # type: ignore[arg-type]
    walks = [0]
    listed = state.critical_services

    def counted() -> Any:
        walks[0] += 1
        return listed()

    state.critical_services = counted  # type: ignore[method-assign]
    await labeller.round()
    await labeller.round()
    before = walks[0]
    state.upsert(KubeObject(GADGETS, "elsewhere", "m", uid="u-e", labels={"app": "db"}))
    assert await labeller.round() == 0 and walks[0] == before
    state.upsert(KubeObject(GADGETS, "crew", "m", uid="u-m", labels={"app": "db"}))
    assert await labeller.round() == 1 and walks[0] == before + 1
