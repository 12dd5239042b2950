"""Replay of refused deletions (spec.replayDeletion: WhenTearingDown), in the simulator.

What a user notices: `kubectl delete -f` run once leaves nothing behind, in the safe order; and a
replay never deletes something outside a live teardown - a plain refusal whose blockers go much later,
a teardown abandoned by a new blocker, an object deleted and re-created under the same name, a dry run.

The interference properties are checked against the scenario's own script (what the test did and when),
not against criticalsvc.replay; the negative controls run the same properties with an unsafe replayer
(no in-progress check, or no UID precondition) and must find a violation.
"""

from __future__ import annotations

import functools
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st
from strategies_sim import topologies
from test_scenarios import bound, describe, run, scaled

from criticalsvc import replay
from criticalsvc.admission import AdmissionRequest
from criticalsvc.api import CRITICAL_SERVICES, NAMESPACES, GroupResource, ObjectRef
from criticalsvc.decision import decide
from criticalsvc.manifests import Manifest, load_text
from criticalsvc.sim.cluster import Cluster
from criticalsvc.sim.replayer import ACTOR, Replayer
from criticalsvc.sim.store import StatusError

STORY = "api/examples/reference-story.yaml"
DEPLOYMENTS = GroupResource("apps", "deployments")
CONFIGMAPS = GroupResource("", "configmaps")
PROVIDER = ObjectRef(DEPLOYMENTS, "op-system", "controller")
SERVICE = ObjectRef(CRITICAL_SERVICES, "", "op")
HOLD = "example.com/hold"


def story(*, replay_on: bool) -> list[Manifest]:
    with open(STORY) as f:
        text = f.read()
    if replay_on:
        text = text.replace("spec:\n  provider:", "spec:\n  replayDeletion: WhenTearingDown\n  provider:")
    return load_text(text, STORY, bundle="manifestwork/story")


def story_teardown(client: str, *, replay_on: bool, seed: int = 0, repeat: float | None = None) -> Cluster:
    cluster = Cluster(seed=seed)
    cluster.load(story(replay_on=replay_on))
    cluster.teardown(client, repeat=repeat)
    cluster.run()
    return cluster


# --- the reference story ------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_kubectl_delete_once_leaves_nothing_behind_with_replay(seed):
    """One `kubectl delete -f` pass: the refused namespace, Deployment and CriticalService are replayed in order."""
    cluster = story_teardown("kubectl", replay_on=True, seed=seed)
    verdict = cluster.verdict()
    assert verdict.completed, verdict.summary()
    kubectl = [e for e in cluster.timeline if e.actor == "kubectl"]
    assert len(kubectl) == 8 and cluster.clients[0].runs == 1  # one pass, never re-run
    replayed = [e for e in cluster.timeline if e.actor == ACTOR and e.verb == "DELETE"]
    assert {e.ref.group_resource for e in replayed} == {NAMESPACES, DEPLOYMENTS, CRITICAL_SERVICES}
    gone = {r: m.gone[1] for r, m in cluster.marks.items() if m.gone}
    marked = {r: m.marked[1] for r, m in cluster.marks.items() if m.marked}
    crd = next(r for r in gone if r.group_resource.resource == "customresourcedefinitions")
    deployment = next(r for r in gone if r.group_resource == DEPLOYMENTS)
    service = next(r for r in gone if r.group_resource == CRITICAL_SERVICES)
    assert gone[crd] < marked[deployment]
    assert marked[service] > max(g for r, g in gone.items() if r != service)
    # Every replay names who asked for the deletion in the first place.
    assert all("kubernetes-admin asked" in e.reason for e in replayed)


def test_without_replay_kubectl_once_is_unchanged_and_leaves_the_refused_objects():
    """Replay off (the default): the same pass leaves the refused objects behind, as before, and nothing is recorded."""
    cluster = story_teardown("kubectl", replay_on=False)
    verdict = cluster.verdict()
    assert verdict.stuck
    assert {h.ref.group_resource for h in verdict.remaining} >= {DEPLOYMENTS, CRITICAL_SERVICES}
    assert cluster.replayer is not None and cluster.replayer.intents == {} and cluster.replayer.replayed == []


@pytest.mark.parametrize("client", ["manifestwork", "namespace"])
def test_retrying_clients_finish_no_later_with_replay(client):
    """A retrying client finishes too with replay on, and no later than without it."""
    on = story_teardown(client, replay_on=True).verdict()
    off = story_teardown(client, replay_on=False).verdict()
    assert on.completed and off.completed
    assert on.elapsed <= off.elapsed


# --- recording ------------------------------------------------------------------------------------------
def _blocked_state(*, replay_on: bool = True, terminating: bool = True) -> Cluster:
    cluster = Cluster(seed=0)
    cluster.load(load_text(_guarded_stack(configmaps=1, replay_on=replay_on), "test", bundle="manifestwork/b"))
    if terminating:
        cluster.store.delete(ObjectRef(CONFIGMAPS, "data", "cm-0"))
    return cluster


def _delete_request(cluster: Cluster, *, dry_run: bool = False, annotations: dict[str, str] | None = None,
                    ) -> AdmissionRequest:
    obj = cluster.store.get(DEPLOYMENTS, "op-system", "controller")
    assert obj is not None
    old = {"metadata": {**obj["metadata"], "annotations": annotations or {}}}
    return AdmissionRequest("u1", DEPLOYMENTS, "DELETE", "controller", "op-system", old_object=old, dry_run=dry_run,
                            username="alice", propagation_policy="Foreground")


def test_a_refused_delete_is_recorded_with_who_when_which_uid_and_propagation():
    cluster = _blocked_state()
    request = _delete_request(cluster)
    decision = decide(request, cluster.store.state)
    assert not decision.allowed
    intent = replay.intent_for(request, decision, cluster.store.state, now=5.0)
    assert intent is not None
    assert (intent.target, intent.user, intent.requested_at, intent.propagation_policy) == \
        (PROVIDER, "alice", 5.0, "Foreground")
    assert intent.uid == cluster.store.get(DEPLOYMENTS, "op-system", "controller")["metadata"]["uid"]


@pytest.mark.parametrize("case", ["dry-run", "replay-off", "annotated-never", "allowed"])
def test_nothing_is_recorded_for(case):
    cluster = _blocked_state(replay_on=case != "replay-off")
    never = {"criticalsvc.io/replay-deletion": "Never"} if case == "annotated-never" else None
    request = _delete_request(cluster, dry_run=case == "dry-run", annotations=never)
    if case == "allowed":
        cluster.store.remove_finalizer(ObjectRef(CONFIGMAPS, "data", "cm-0"), HOLD)
    decision = decide(request, cluster.store.state)
    assert replay.intent_for(request, decision, cluster.store.state, now=0.0) is None


def test_a_waiting_intent_is_armed_when_its_blockers_start_terminating_and_dropped_if_they_never_do():
    cluster = _blocked_state(terminating=False)
    request = _delete_request(cluster)
    intent = replay.intent_for(request, decide(request, cluster.store.state), cluster.store.state, now=0.0)
    assert intent is not None
    [waiting] = replay.plan([intent], cluster.store.state, now=1.0)
    assert isinstance(waiting, replay.Wait) and waiting.intent.phase == replay.Phase.WAITING
    assert "configmaps data/cm-0" in waiting.why
    [late] = replay.plan([intent], cluster.store.state, now=replay.ARM_WINDOW + 1)
    assert isinstance(late, replay.Drop) and late.reason == replay.DropReason.NOT_STARTED
    cluster.store.delete(ObjectRef(CONFIGMAPS, "data", "cm-0"))
    [armed] = replay.plan([intent], cluster.store.state, now=2.0)
    assert isinstance(armed, replay.Wait) and armed.intent.phase == replay.Phase.ARMED
    cluster.store.remove_finalizer(ObjectRef(CONFIGMAPS, "data", "cm-0"), HOLD)
    [ready] = replay.plan([armed.intent], cluster.store.state, now=3.0)
    assert isinstance(ready, replay.Replay)
    [expired] = replay.plan([armed.intent], cluster.store.state, now=replay.TIME_TO_LIVE + 1)
    assert isinstance(expired, replay.Drop) and expired.reason == replay.DropReason.EXPIRED


# --- generated teardowns --------------------------------------------------------------------------------
@settings(max_examples=scaled(120), suppress_health_check=[HealthCheck.too_slow])
@given(topologies(replay=True))
def test_with_replay_every_teardown_finishes_safely_even_with_single_pass_clients(topo):
    """Any topology and clients - kubectl one pass included: safe at every event, and it finishes (in bound)."""
    cluster, verdict, oracle = run(topo)
    assert oracle.violations == []
    assert verdict.completed, describe(cluster, verdict) + f"\nclients: {topo.clients}, starts: {topo.starts}"
    assert verdict.elapsed <= bound(topo)


# --- interference: what a replay must never delete --------------------------------------------------------
def _guarded_stack(*, configmaps: int, replay_on: bool = True) -> str:
    """A provider guarded by ConfigMaps in namespace `data` (criterion: none labelled app=x exists); each
    carries a finalizer, so a deleted one stays terminating until the test removes it."""
    docs = ["apiVersion: v1\nkind: Namespace\nmetadata: {name: op-system}",
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: data}",
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: controller, namespace: op-system}"]
    docs += [f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: cm-{i}, namespace: data, labels: {{app: x}}, "
             f"finalizers: [{HOLD}]}}" for i in range(configmaps)]
    replay_line = "  replayDeletion: WhenTearingDown\n" if replay_on else ""
    docs.append("apiVersion: criticalsvc.io/v1alpha1\nkind: CriticalService\nmetadata: {name: op}\nspec:\n"
                f"{replay_line}  provider: {{group: apps, resource: deployments, namespace: op-system, "
                "name: controller}\n"
                "  criteria:\n  - type: Resources\n    resources: {resource: configmaps, namespace: data, "
                "selector: {matchLabels: {app: x}}}")
    return "\n---\n".join(docs)


@attrs.frozen
class Interference:
    """A scripted teardown of the guarded stack, and what a safe replayer may and may not do in it.

    live       the ConfigMaps are deleted at 0; the provider's DELETE (refused) at `refused_at`; the
               ConfigMaps' finalizers go at `release_at`: the provider must be replayed away
    late       the provider is refused at `refused_at`, the ConfigMaps deleted and released only at
               `release_at`, more than ARM_WINDOW later: a plain refusal, never replayed
    abandon    a live teardown, then a new ConfigMap appears at `event_at` (GitOps re-synced it) and is
               removed again at `release_at`: abandoned, never replayed
    recreate   a live teardown, then at `event_at` someone deletes the provider (break-glass) and
               re-creates it at once: the new Deployment is never replayed away
    dry-run    a live teardown where the provider's DELETE is only ever a dry run: never deleted
    """

    kind: str
    configmaps: int
    refused_at: float
    event_at: float
    release_at: float
    propagation: str

    @property
    def replay_forbidden(self) -> bool:
        return self.kind != "live"


@st.composite
def interferences(draw: st.DrawFn) -> Interference:
    kind = draw(st.sampled_from(["live", "late", "abandon", "recreate", "dry-run"]))
    refused_at = draw(st.sampled_from([0.0, 0.5, 5.0, 30.0]))
    event_at = refused_at + draw(st.sampled_from([0.1, 1.0, 10.0]))
    if kind == "late":
        release_at = refused_at + replay.ARM_WINDOW + draw(st.sampled_from([1.0, 60.0, 600.0]))
    else:
        release_at = event_at + draw(st.sampled_from([0.5, 5.0, 200.0]))
    return Interference(kind, draw(st.integers(1, 3)), refused_at, event_at, release_at,
                        draw(st.sampled_from(["Background", "Foreground", "Orphan"])))


def play(script: Interference, replayer: Any = Replayer) -> tuple[Cluster, list[str]]:
    """Run `script`; return the cluster and every violation of what a safe replayer may do."""
    cluster = Cluster(seed=0, replayer=replayer)
    cluster.load(load_text(_guarded_stack(configmaps=script.configmaps), "test", bundle="manifestwork/b"))
    store, engine = cluster.store, cluster.engine
    cms = [ObjectRef(CONFIGMAPS, "data", f"cm-{i}") for i in range(script.configmaps)]
    original_uid = store.get(DEPLOYMENTS, "op-system", "controller")["metadata"]["uid"]

    def delete_configmaps() -> None:
        for ref in cms:
            store.delete(ref)

    def refuse() -> None:
        try:
            store.delete(PROVIDER, user="alice", propagation=script.propagation, dry_run=script.kind == "dry-run")
        except StatusError:
            return
        if script.kind != "dry-run":
            raise AssertionError("the gate let the provider go while its ConfigMaps exist")

    def release() -> None:
        for ref in cms:
            store.remove_finalizer(ref, HOLD)
        if store.exists(CONFIGMAPS, "data", "late-comer"):
            store.delete(ObjectRef(CONFIGMAPS, "data", "late-comer"))
        if script.kind == "late":
            for ref in cms:
                if store.exists(CONFIGMAPS, "data", ref.name):
                    store.delete(ref)

    def interfere() -> None:
        if script.kind == "abandon":
            store.create({"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": "late-comer", "namespace": "data", "labels": {"app": "x"}}})
        elif script.kind == "recreate":
            obj = store.get(DEPLOYMENTS, "op-system", "controller")
            obj["metadata"].setdefault("annotations", {})["criticalsvc.io/break-glass"] = "recreating it"
            store.update(obj)
            store.delete(PROVIDER, user="bob")
            store.create({"apiVersion": "apps/v1", "kind": "Deployment",
                          "metadata": {"name": "controller", "namespace": "op-system"}})

    if script.kind != "late":
        engine.schedule(0.0, delete_configmaps)
    engine.schedule(script.refused_at, refuse)
    engine.schedule(script.event_at, interfere)
    engine.schedule(script.release_at, release)
    engine.run(until=engine.now() + script.release_at + 3 * replay.ARM_WINDOW)

    violations: list[str] = []
    provider = store.get(DEPLOYMENTS, "op-system", "controller")
    replayed = [e for e in cluster.timeline if e.actor == ACTOR and e.verb == "DELETE" and e.outcome != "denied"]
    if script.replay_forbidden and replayed:
        violations.append(f"{script.kind}: replayed {[(round(e.time, 2), str(e.ref)) for e in replayed]}")
    if script.kind == "recreate" and provider is None:
        violations.append("recreate: the re-created provider was deleted")
    if script.kind == "live":
        if provider is not None:
            violations.append("live: the provider was left behind")
        assert cluster.replayer is not None
        if [i.propagation_policy for i in cluster.replayer.replayed] != [script.propagation]:
            violations.append(f"live: replayed with {[i.propagation_policy for i in cluster.replayer.replayed]}")
    kept = provider is not None and provider["metadata"]["uid"] == original_uid
    if script.kind in ("late", "abandon", "dry-run") and not kept:
        violations.append(f"{script.kind}: the provider was deleted")
    return cluster, violations


@settings(max_examples=scaled(150), suppress_health_check=[HealthCheck.too_slow])
@given(interferences())
def test_a_replay_never_deletes_outside_a_live_teardown(script):
    """Late blockers, abandoned teardowns, re-created objects and dry runs: no replay; a live teardown: replayed."""
    _cluster, violations = play(script)
    assert violations == []


def _find_violation(replayer: Any) -> Interference:
    return find(interferences(), lambda s: bool(play(s, replayer)[1]),
                settings=settings(max_examples=300, database=None, derandomize=True))


def test_negative_control_a_replay_without_the_in_progress_check_is_caught():
    """The same property catches a replayer that replays whatever the gate would allow, teardown or not."""
    script = _find_violation(functools.partial(Replayer, check_teardown=False))
    assert script.kind in ("late", "abandon")


def test_negative_control_a_replay_without_the_uid_precondition_is_caught():
    """The same property catches a replayer that follows the name instead of the object's UID."""
    script = _find_violation(functools.partial(Replayer, check_uid=False))
    assert script.kind == "recreate"


# --- teardown time ----------------------------------------------------------------------------------------
def test_replayed_teardowns_finish_within_the_bound_of_the_critical_path():
    """The benchmark's simulator table (virtual time, so exact): with replay the one-pass kubectl and the retrying
    client finish within 1.2x the ideal (`helm uninstall` too); without it kubectl and helm leave objects behind and
    slow retries cost more."""
    from benchmarks import replay as bench

    rows = {(r["deleter"], r["replay"]): r for r in bench.sim_table(2, bench.SLOW_FINALIZER)}
    for deleter in ("kubectl", "manifestwork", "helm"):
        assert rows[deleter, True]["ratioMax"] <= bench.GOAL, rows[deleter, True]
    assert rows["kubectl", False]["completed"] == rows["helm", False]["completed"] == 0
    assert rows["manifestwork", False]["ratioMean"] > rows["manifestwork", True]["ratioMean"]
    assert rows["gc-background", False]["ratioMean"] > 2 * rows["gc-background", True]["ratioMean"]
