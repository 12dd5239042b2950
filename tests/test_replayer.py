"""The live replayer's safety checks (criticalsvc/replayer.py): the code that really sends the DELETE.

The replay properties in test_replay.py run the simulator's replayer; these run the leader's own
`LiveReplayer.round()` against `FakeAPI`, a Sender that keeps objects by path and answers as the API
server does where it matters here: a DELETE whose `preconditions.uid` is not the stored object's UID is
a 409 Conflict and deletes nothing, a DELETE without one deletes whatever has the name now.

What a user notices, for each way a recorded deletion must NOT be carried out (the gate's cache may lag
behind the API server, so each is set up with a cache that still says "replay it"):
  re-created     another object of the same name (another UID): no DELETE at all, it stays
  raced          re-created between the replayer's fresh read and its DELETE: the precondition keeps it
  Never          annotated criticalsvc.io/replay-deletion: Never after the refusal: not deleted
  409            a conflict on the DELETE: dropped, not retried every round
  403 (RBAC)     the gate may not delete the type: dropped with a Warning naming the grant to add
  403 (webhook)  an admission webhook refused the replay: kept and retried (the criteria may hold later)
Each drop deletes the record and posts an Event on the object saying why. `python -m tests.mutants`
is the negative control: with any one of these checks removed from replayer.py, a test here fails.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import pytest
from kubefakes import FakeAPI, state_with

from criticalsvc import replay
from criticalsvc.api import NAMESPACES, GroupResource, ObjectRef
from criticalsvc.cache.transport import APIStatusError, TransportError
from criticalsvc.objects import KubeObject
from criticalsvc.replayer import AGGREGATE_LABEL, LiveReplayer
from criticalsvc.restmapper import RESTMapper
from criticalsvc.state import MemoryState

DEPLOYMENTS = GroupResource("apps", "deployments")
PROVIDER = ObjectRef(DEPLOYMENTS, "op-system", "controller")
OBJECT = "/apis/apps/v1/namespaces/op-system/deployments/controller"
GATE_NAMESPACE = "criticalsvc"
RECORDS = f"/api/v1/namespaces/{GATE_NAMESPACE}/configmaps"
NOW = 1_000.0
UID, OTHER_UID = "11111111-1111-1111-1111-111111111111", "22222222-2222-2222-2222-222222222222"
SERVICE = {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": "op"},
           "spec": {"replayDeletion": "WhenTearingDown",
                    "provider": {"group": "apps", "resource": "deployments", "namespace": "op-system",
                                 "name": "controller"},
                    "criteria": [{"type": "Resources", "resources": {
                        "resource": "configmaps", "namespace": "data", "selector": {"matchLabels": {"app": "x"}}}}]}}
# As kube-apiserver words them (the authorizer's and the admission chain's refusals).
RBAC_FORBIDDEN = ('deployments.apps "controller" is forbidden: User "system:serviceaccount:criticalsvc:criticalsvc" '
                  'cannot delete resource "deployments" in API group "apps" in the namespace "op-system"')
WEBHOOK_FORBIDDEN = ('admission webhook "providers.criticalsvc.io" denied the request: deployments.apps '
                     'op-system/controller may not be deleted yet')


def deployment(uid: str, annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "controller", "namespace": "op-system", "uid": uid,
                         "annotations": dict(annotations or {})}}


class Source:
    def __init__(self, state: MemoryState) -> None:
        self.state = state
        self.ready = True


def cached_state(uid: str = UID) -> MemoryState:
    """The gate's cache: the provider (with `uid`) and its namespace, no ConfigMap left: the criteria hold."""
    return state_with(SERVICE, objects=[KubeObject(NAMESPACES, "", "op-system", uid="ns-uid"),
                                        KubeObject(DEPLOYMENTS, "op-system", "controller", uid=uid)])


def intent() -> replay.DeletionIntent:
    return replay.DeletionIntent(PROVIDER, UID, "alice", NOW - 10, "Foreground", ("op",), armed_at=NOW - 5)


def replayer_over(api: FakeAPI, state: MemoryState | None = None) -> tuple[LiveReplayer, list[dict[str, Any]]]:
    """A leader's replayer over `api` whose cache is `state`, with the intent recorded; and its Events."""
    record = replay.to_record(intent(), namespace=GATE_NAMESPACE)
    api.put(f"{RECORDS}/{record['metadata']['name']}", record)
    events: list[dict[str, Any]] = []
    replayer = LiveReplayer(api, Source(state or cached_state()), RESTMapper(), namespace=GATE_NAMESPACE,
                            post_event=events.append, clock=lambda: NOW)
    return replayer, events


def records(api: FakeAPI) -> list[str]:
    return [p for p in api.objects if p.startswith(RECORDS + "/")]


def reasons(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["reason"], e["type"]) for e in events]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_a_due_intent_is_replayed_once_with_the_uid_precondition_and_the_recorded_propagation():
    api = FakeAPI({OBJECT: deployment(UID)})
    replayer, events = replayer_over(api)
    await replayer.round()
    assert OBJECT not in api.objects
    assert api.sent("DELETE", OBJECT) == [{"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": UID},
                                       "propagationPolicy": "Foreground"}]
    assert records(api) == [] and replayer.intents == [] and replayer.replays == 1
    assert reasons(events) == [("DeletionReplayed", "Normal")]
    assert "alice asked" in events[0]["message"] and events[0]["involvedObject"]["uid"] == UID


@pytest.mark.anyio
async def test_an_object_re_created_under_the_same_name_is_not_deleted_even_when_the_cache_lags():
    """The cache still holds the recorded UID (it would replay); the fresh read shows another object: no DELETE."""
    api = FakeAPI({OBJECT: deployment(OTHER_UID)})
    replayer, events = replayer_over(api)
    await replayer.round()
    assert api.objects[OBJECT]["metadata"]["uid"] == OTHER_UID
    assert api.sent("DELETE", OBJECT) == []  # not even one the precondition would refuse
    assert records(api) == [] and replayer.intents == []
    assert reasons(events) == [("DeletionIntentDroppedObjectRecreated", "Normal")]
    assert f"uid {OTHER_UID}" in events[0]["message"]


@pytest.mark.anyio
async def test_an_object_re_created_between_the_fresh_read_and_the_delete_is_kept_by_the_precondition():
    api = FakeAPI({OBJECT: deployment(UID)})
    api.after_get[OBJECT] = lambda: api.objects.__setitem__(OBJECT, deployment(OTHER_UID))
    replayer, events = replayer_over(api)
    await replayer.round()
    assert api.objects[OBJECT]["metadata"]["uid"] == OTHER_UID
    assert [d["preconditions"] for d in api.sent("DELETE", OBJECT)] == [{"uid": UID}]
    assert records(api) == [] and replayer.replays == 0
    assert reasons(events) == [("DeletionIntentDroppedObjectRecreated", "Normal")]
    assert "Precondition failed" in events[0]["message"]


@pytest.mark.anyio
async def test_negative_control_in_that_race_a_delete_without_the_precondition_deletes_the_new_object():
    """The race above is real in FakeAPI: a DELETE by name alone, sent at the same moment, takes the new object."""
    api = FakeAPI({OBJECT: deployment(UID)})
    api.after_get[OBJECT] = lambda: api.objects.__setitem__(OBJECT, deployment(OTHER_UID))
    assert (await api.get(OBJECT, timeout=1))["metadata"]["uid"] == UID
    await api.send("DELETE", OBJECT, {"apiVersion": "v1", "kind": "DeleteOptions"}, timeout=1)
    assert OBJECT not in api.objects


@pytest.mark.anyio
async def test_an_object_annotated_never_after_the_refusal_is_not_deleted():
    """The annotation is read fresh: the cache (metadata of the provider only) does not carry it."""
    api = FakeAPI({OBJECT: deployment(UID, {"criticalsvc.io/replay-deletion": "Never"})})
    replayer, events = replayer_over(api)
    await replayer.round()
    assert OBJECT in api.objects and api.sent("DELETE", OBJECT) == []
    assert records(api) == [] and replayer.intents == []
    assert reasons(events) == [("DeletionIntentDroppedCancelled", "Normal")]
    assert "criticalsvc.io/replay-deletion=Never" in events[0]["message"]


@pytest.mark.anyio
async def test_a_conflict_on_the_delete_drops_the_intent_instead_of_retrying_it_every_round():
    api = FakeAPI({OBJECT: deployment(UID)})
    api.faults[("DELETE", OBJECT)] = [APIStatusError(409, "Conflict", "Operation cannot be fulfilled: the object "
                                                     "has been modified")]
    replayer, events = replayer_over(api)
    await replayer.round()
    await replayer.round()
    assert OBJECT in api.objects and len(api.sent("DELETE", OBJECT)) == 1
    assert records(api) == [] and replayer.intents == []
    assert reasons(events) == [("DeletionIntentDroppedObjectRecreated", "Normal")]


@pytest.mark.anyio
async def test_a_delete_the_gate_is_not_authorized_for_is_dropped_with_a_warning_naming_the_grant():
    api = FakeAPI({OBJECT: deployment(UID)})  # the review said yes; the DELETE says no
    api.faults[("DELETE", OBJECT)] = [APIStatusError(403, "Forbidden", RBAC_FORBIDDEN)]
    replayer, events = replayer_over(api)
    await replayer.round()
    await replayer.round()
    assert OBJECT in api.objects and len(api.sent("DELETE", OBJECT)) == 1
    assert records(api) == [] and replayer.intents == []
    assert reasons(events) == [("DeletionIntentDroppedForbidden", "Warning")]
    assert f'{AGGREGATE_LABEL}="true"' in events[0]["message"] and 'allowing delete on deployments' in \
        events[0]["message"]
    assert replayer.missing_permissions([DEPLOYMENTS]) == [DEPLOYMENTS]


@pytest.mark.anyio
async def test_a_delete_an_admission_webhook_refuses_is_kept_and_replayed_next_round():
    """A 403 from admission is not about permissions: the criteria may hold by the next round."""
    api = FakeAPI({OBJECT: deployment(UID)})
    api.faults[("DELETE", OBJECT)] = [APIStatusError(403, "Forbidden", WEBHOOK_FORBIDDEN)]
    replayer, events = replayer_over(api)
    await replayer.round()
    assert OBJECT in api.objects and len(records(api)) == 1 and [i.uid for i in replayer.intents] == [UID]
    assert events == [] and replayer.missing_permissions([DEPLOYMENTS]) == []
    await replayer.round()
    assert OBJECT not in api.objects and records(api) == []
    assert reasons(events) == [("DeletionReplayed", "Normal")]


@pytest.mark.anyio
async def test_an_unreachable_api_server_keeps_the_intent_for_the_next_round():
    api = FakeAPI({OBJECT: deployment(UID)})
    api.faults[("GET", OBJECT)] = [TransportError("GET: connection refused")]
    api.faults[("DELETE", OBJECT)] = [TransportError("DELETE: timed out")]
    replayer, events = replayer_over(api)
    await replayer.round()  # the fresh read fails
    await replayer.round()  # the DELETE fails
    assert OBJECT in api.objects and len(records(api)) == 1 and events == []
    await replayer.round()
    assert OBJECT not in api.objects and reasons(events) == [("DeletionReplayed", "Normal")]


@pytest.mark.anyio
async def test_an_object_gone_before_the_replay_is_dropped_without_an_event():
    api = FakeAPI({})
    replayer, events = replayer_over(api)  # the cache has not seen it go yet
    await replayer.round()
    assert api.sent("DELETE", OBJECT) == [] and records(api) == [] and events == []


def test_the_facts_status_reads_change_with_the_intents_and_the_permission_checks() -> None:
    """`facts` is what the status writer compares to skip an idle pass: it must change when an intent or a
    permission check does, and only then."""
    replayer, _events = replayer_over(FakeAPI())
    quiet = replayer.facts
    assert replayer.facts == quiet
    replayer.intents = [intent()]
    with_intent = replayer.facts
    assert with_intent != quiet
    replayer.intents = [attrs.evolve(intent(), armed_at=None)]
    assert replayer.facts != with_intent  # the same intent, now waiting: status says another phase
    replayer._access[DEPLOYMENTS] = (NOW, True, "")
    allowed = replayer.facts
    replayer._access[DEPLOYMENTS] = (NOW + 60, True, "")
    assert replayer.facts == allowed  # checked again, same answer: nothing to show
    replayer._access[DEPLOYMENTS] = (NOW + 120, False, "forbidden")
    assert replayer.facts != allowed


@pytest.mark.anyio
async def test_the_intents_due_in_a_round_are_replayed_together_not_one_after_the_other():
    """A provider and its namespace, both due: the namespace's DELETE is sent while the provider's is still in flight
    (a deleter's DELETEs of what may go, at once), not after it has been answered, recorded and announced."""
    import asyncio

    namespace_path = "/api/v1/namespaces/op-system"

    class SlowProviderDelete(FakeAPI):
        """The provider's DELETE is answered only once the namespace's has arrived (at most 2 s)."""

        def __init__(self, objects: Mapping[str, Mapping[str, Any]]) -> None:
            super().__init__(objects)
            self.namespace_sent = asyncio.Event()

        async def send(self, verb: str, path: str, payload: Mapping[str, Any] | None = None, **kw: Any) -> Any:
            if verb == "DELETE" and path == namespace_path:
                self.namespace_sent.set()
            elif verb == "DELETE" and path == OBJECT:
                await asyncio.wait_for(self.namespace_sent.wait(), timeout=2)
            return await super().send(verb, path, payload, **kw)

    api = SlowProviderDelete({OBJECT: deployment(UID), namespace_path: {
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "op-system", "uid": "ns-uid"}}})
    replayer, events = replayer_over(api)
    namespace = replay.DeletionIntent(ObjectRef(NAMESPACES, "", "op-system"), "ns-uid", "alice", NOW - 10, None,
                                      ("op",), armed_at=NOW - 5)
    record = replay.to_record(namespace, namespace=GATE_NAMESPACE)
    api.put(f"{RECORDS}/{record['metadata']['name']}", record)
    await replayer.round()
    assert OBJECT not in api.objects and namespace_path not in api.objects
    assert replayer.replays == 2 and records(api) == [] and replayer.intents == []
    assert reasons(events) == [("DeletionReplayed", "Normal")] * 2
