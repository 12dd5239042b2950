"""Order inside a namespace (issue 11, the KEP-5080 idea): a namespace whose CriticalServices are confined
to it may be deleted, and its own namespace controller then empties it in a safe order.

The rule (criticalsvc/decision.py, criticalsvc/nsorder.py): a CriticalService whose provider and every
criterion's objects live in one namespace does not block deleting that namespace; while it terminates,
the provider's own DELETE is refused until its criteria hold, and the namespace controller retries. The
property runs that on the simulator (criticalsvc/sim: the namespace controller with its deletecollection
in name order that stops at the first refusal, pods first, 5 ms·2ⁿ ≤ 60 s backoff) over generated
namespaces: providers of several kinds (NetworkPolicy, ConfigMap, Service, Deployment) whose
CriticalServices form a random DAG, pods that take a while to terminate (a finalizer the test's
"kubelet" removes after a delay), and guarded ConfigMaps and Services picked by a label selector. The
gate is asked about what the gate-owned routing sends it on a live cluster (the providers', their
namespace's and CRDs' DELETEs: ProviderRoutesRule). An oracle that reads only the store's events (never
the gate's code) checks:

* order: when a provider disappears, no object its criteria count (in the oracle's own reading of the
  spec and the raw objects) exists;
* liveness: when the gate allows the namespace DELETE, the namespace is gone within `bound`;
* refusals are necessary: when the gate refuses it (a wedge of the namespace controller's own order,
  nsorder.find_wedge), the same namespace deleted past that check never empties.

Negative controls: the old rule (refuse the namespace while a confined CriticalService is unmet) never
lets it finish; a gate that does not gate the providers breaks the order; a gate without the wedge check
gets stuck on some generated namespace.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from unittest import mock

import attrs
import pytest
from hypothesis import HealthCheck, event, find, given, settings
from hypothesis import strategies as st

from criticalsvc import nsorder
from criticalsvc.admission import AdmissionRequest, parse_review, render_response
from criticalsvc.api import NAMESPACES, GroupResource, ObjectRef, parse_critical_service
from criticalsvc.decision import Decision, Rule, decide
from criticalsvc.manifests import Manifest
from criticalsvc.objects import KubeObject
from criticalsvc.sim.cluster import Cluster
from criticalsvc.sim.controllers.namespace import NamespaceController
from criticalsvc.sim.store import StatusError, Store, WatchEvent
from criticalsvc.sim.webhooks import DEFAULT_RULES, ProviderRoutesRule, RegisteredWebhook
from criticalsvc.state import ClusterState, MemoryState

NS = "app"
SLOW = "test.criticalsvc.io/slow-termination"  # stands for a pod's graceful termination
PODS = GroupResource("", "pods")
RUNNING = "object.status.phase in ['Pending', 'Running']"
# kind key -> (group/resource, apiVersion, Kind)
KINDS: dict[str, tuple[GroupResource, str, str]] = {
    "networkpolicies": (GroupResource("networking.k8s.io", "networkpolicies"), "networking.k8s.io/v1",
                        "NetworkPolicy"),
    "configmaps": (GroupResource("", "configmaps"), "v1", "ConfigMap"),
    "services": (GroupResource("", "services"), "v1", "Service"),
    "deployments": (GroupResource("apps", "deployments"), "apps/v1", "Deployment"),
}


# --- the generated namespace ---------------------------------------------------------------------------
@attrs.frozen
class Provider:
    kind: str
    name: str
    pods: str | None  # None: no pod criterion; "": every pod; else pods labelled app=<this>
    guards: tuple[str, str] | None  # (kind, role): the extras of that kind labelled role=<role>
    waits: tuple[int, ...]  # providers (lower indices: a DAG) that must be gone first


@attrs.frozen
class Pod:
    name: str
    app: str
    phase: str
    delay: float  # seconds from its deletion until the "kubelet" lets it go


@attrs.frozen
class Extra:
    kind: str
    name: str
    role: str


@attrs.frozen
class Scene:
    providers: tuple[Provider, ...]
    pods: tuple[Pod, ...]
    extras: tuple[Extra, ...]
    ordered: bool  # OrderedNamespaceDeletion (pods first), as Kubernetes >= 1.33
    seed: int

    def service(self, i: int) -> dict[str, Any]:
        p = self.providers[i]
        gr = KINDS[p.kind][0]
        criteria: list[dict[str, Any]] = []
        if p.pods is not None:
            body: dict[str, Any] = {"resource": "pods", "namespace": NS}
            if p.pods:
                body["selector"] = {"matchLabels": {"app": p.pods}}
            criteria.append({"type": "Resources", "resources": body, "condition": RUNNING})
        if p.guards is not None:
            g = KINDS[p.guards[0]][0]
            criteria.append({"type": "Resources", "resources": {
                "group": g.group, "resource": g.resource, "namespace": NS,
                "selector": {"matchLabels": {"role": p.guards[1]}}}})
        for j in p.waits:
            q = self.providers[j]
            qgr = KINDS[q.kind][0]
            criteria.append({"type": "SpecificResource", "specificResource": {
                "group": qgr.group, "resource": qgr.resource, "namespace": NS, "name": q.name}})
        return {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": f"cs-{i}"},
                "spec": {"provider": {"group": gr.group, "resource": gr.resource, "namespace": NS, "name": p.name},
                         "criteria": criteria}}

    def objects(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}]
        for p in self.providers:
            _gr, api_version, kind = KINDS[p.kind]
            out.append({"apiVersion": api_version, "kind": kind, "metadata": {"name": p.name, "namespace": NS}})
        for x in self.extras:
            _gr, api_version, kind = KINDS[x.kind]
            out.append({"apiVersion": api_version, "kind": kind,
                        "metadata": {"name": x.name, "namespace": NS, "labels": {"role": x.role}}})
        for pod in self.pods:
            out.append({"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": pod.name, "namespace": NS, "labels": {"app": pod.app}, "finalizers": [SLOW]}})
        return out + [self.service(i) for i in range(len(self.providers))]

    def depth(self) -> int:
        """The longest chain of providers waiting for each other."""
        memo: dict[int, int] = {}

        def longest(i: int) -> int:
            if i not in memo:
                memo[i] = 1 + max((longest(j) for j in self.providers[i].waits), default=0)
            return memo[i]

        return max(longest(i) for i in range(len(self.providers)))

    def max_pod_delay(self) -> float:
        return max((p.delay for p in self.pods), default=0.0)


NAMES = tuple("abcdefghijkl")


@st.composite
def scenes(draw: st.DrawFn) -> Scene:
    n_providers = draw(st.integers(1, 4))
    n_extras = draw(st.integers(0, 3))
    # Names from one shuffled pool: the name order of objects of one kind, which the namespace
    # controller's deletecollection follows, is random.
    names = draw(st.permutations(NAMES))
    providers = []
    for i in range(n_providers):
        pods = draw(st.none() | st.just("") | st.sampled_from(["web", "db"]))
        guards = draw(st.none() | st.tuples(st.sampled_from(["configmaps", "services"]),
                                            st.sampled_from(["cache", "edge"])))
        waits = tuple(sorted(draw(st.sets(st.integers(0, i - 1), max_size=2)))) if i else ()
        if pods is None and guards is None and not waits:
            pods = ""
        providers.append(Provider(draw(st.sampled_from(sorted(KINDS))), f"{names[i]}-provider", pods, guards, waits))
    extras = tuple(Extra(draw(st.sampled_from(["configmaps", "services"])), f"{names[n_providers + k]}-guarded",
                         draw(st.sampled_from(["cache", "edge"]))) for k in range(n_extras))
    pods = tuple(Pod(f"pod-{k}", draw(st.sampled_from(["web", "db"])),
                     draw(st.sampled_from(["Pending", "Running", "Running", "Succeeded"])),
                     draw(st.floats(0.0, 30.0)))
                 for k in range(draw(st.integers(0, 4))))
    # Object names must be unique per kind only, but one pool makes them unique altogether; names[] has
    # 12 entries, at most 4 + 3 are used.
    return Scene(tuple(providers), pods, extras, draw(st.booleans()), draw(st.integers(0, 2**16)))


# --- the oracle: the store's events only -----------------------------------------------------------------
def _matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


class Oracle:
    """Keeps the objects as the store's events show them, and checks every provider's disappearance."""

    def __init__(self, store: Store, scene: Scene) -> None:
        self.scene = scene
        self.live: dict[tuple[str, str, str], Mapping[str, Any]] = {}  # (resource, namespace, name) -> object
        self.violations: list[str] = []
        self.gone_at: dict[str, float] = {}
        self.clock = store.clock
        store.subscribe(self.check)

    def counted(self, i: int) -> list[str]:
        """The objects provider i's criteria count now, read from the spec the scene wrote."""
        p, out = self.scene.providers[i], []
        for (resource, _ns, name), obj in self.live.items():
            md, labels = obj["metadata"], obj["metadata"].get("labels") or {}
            if resource == "pods" and p.pods is not None and (not p.pods or labels.get("app") == p.pods) \
                    and (obj.get("status") or {}).get("phase", "") not in ("Succeeded", "Failed"):
                out.append(f"pod {name}")
            if p.guards is not None and resource == KINDS[p.guards[0]][0].resource \
                    and _matches({"role": p.guards[1]}, labels):
                out.append(f"{resource} {name}")
            for j in p.waits:
                q = self.scene.providers[j]
                if (resource, name) == (KINDS[q.kind][0].resource, q.name):
                    out.append(f"provider {resource} {name}")
            del md
        return out

    def check(self, event: WatchEvent) -> None:
        md = event.object["metadata"]
        key = (event.group_resource.resource, md.get("namespace", ""), md["name"])
        if event.type != "DELETED":
            self.live[key] = event.object
            return
        self.live.pop(key, None)
        self.gone_at[f"{key[0]}/{key[2]}"] = self.clock()
        for i, p in enumerate(self.scene.providers):
            if (KINDS[p.kind][0].resource, NS, p.name) == key:
                left = self.counted(i)
                if left:
                    self.violations.append(f"provider {key[0]} {p.name} went while its criteria counted {left}")


# --- running it ------------------------------------------------------------------------------------------
Decide = Callable[[AdmissionRequest, ClusterState], Decision]


def gate(store: Store, decide_fn: Decide) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def hook(review: dict[str, Any]) -> dict[str, Any]:
        request = parse_review(review)
        return dict(render_response(request.uid, decide_fn(request, store.state)))
    return hook


@attrs.frozen
class Outcome:
    admitted: bool  # the namespace DELETE
    refusal: str
    gone: bool  # the namespace left the API
    elapsed: float  # from the namespace DELETE to its disappearance, or to the end of the run
    violations: tuple[str, ...]
    denials: int  # refused DELETEs of the namespace controller


def bound(scene: Scene) -> float:
    """When the namespace must be gone: the controller's 5 s grace; the pods' termination, seen at the
    8 s requeue for content with finalizers [N2]; then per level of providers waiting for each other, one
    pass past the refusal, which comes at most 60 s (the backoff cap [N4]) after the level below left; and
    one more 8 s requeue and 60 s backoff for the last pass. design/kubernetes-semantics.md §3.3."""
    return NamespaceController.GRACE + scene.max_pod_delay() + 8 + (scene.depth() + 1) * (60 + 8)


def run(scene: Scene, decide_fn: Decide = decide, *, limit: float | None = None) -> Outcome:
    cluster = Cluster(gate=False, seed=scene.seed, ordered_namespace_deletion=scene.ordered)
    store, engine = cluster.store, cluster.engine
    # The gate-owned routing, as on a live cluster: the providers', their namespace's and CRDs' DELETEs.
    store.webhooks.append(RegisteredWebhook(gate(store, decide_fn), rules=(*DEFAULT_RULES,
                                                                           ProviderRoutesRule(store.state))))
    oracle = Oracle(store, scene)
    cluster.load([Manifest(o, f"scene: document {k}") for k, o in enumerate(scene.objects(), 1)])
    for pod in scene.pods:
        store.set_status(ObjectRef(PODS, NS, pod.name), {"phase": pod.phase})
    scheduled: set[str] = set()

    def kubelet(event: WatchEvent) -> None:  # lets a deleted pod go after its termination delay
        md = event.object["metadata"]
        if event.group_resource == PODS and event.type != "DELETED" and md.get("deletionTimestamp") \
                and md["name"] not in scheduled:
            scheduled.add(md["name"])
            delay = next(p.delay for p in scene.pods if p.name == md["name"])
            engine.schedule(delay, lambda: store.remove_finalizer(ObjectRef(PODS, NS, md["name"]), SLOW,
                                                                  user="kubelet"))

    store.subscribe(kubelet)
    start = engine.now()
    try:
        store.delete(ObjectRef(NAMESPACES, "", NS), user="kubernetes-admin")
    except StatusError as exc:
        return Outcome(False, exc.message, False, 0.0, tuple(oracle.violations), 0)
    deadline = start + (limit if limit is not None else bound(scene) + 3600)

    def gone() -> bool:
        return not store.exists(NAMESPACES, "", NS)

    engine.run(until=deadline, stop=gone)  # type: ignore[attr-defined]
    denials = sum(1 for e in cluster.timeline.events if e.outcome == "denied")
    return Outcome(True, "", gone(), (oracle.gone_at.get(f"namespaces/{NS}", engine.now())) - start,
                   tuple(oracle.violations), denials)


def describe(scene: Scene) -> str:
    return "\n".join(str(o) for o in scene.objects())


# --- the property ----------------------------------------------------------------------------------------
@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(scenes())
def test_a_confined_namespace_empties_in_order_within_the_bound(scene):
    """Allowed: the namespace is gone within the bound, every provider after what its criteria counted.
    Refused: only for a wedge of the namespace controller's own order, which the same namespace deleted
    past the check then shows by never emptying."""
    out = run(scene)
    assert out.violations == (), describe(scene)
    if out.admitted:
        event("allowed")
        event(f"refused DELETEs of the namespace controller: {'0' if not out.denials else '1+'}")
        assert out.gone, f"namespace not gone after {out.elapsed:.0f} s\n{describe(scene)}"
        assert out.elapsed <= bound(scene), (out.elapsed, bound(scene))
        return
    event("refused: wedge")
    assert "the namespace controller could never empty it:" in out.refusal, out.refusal
    with mock.patch.object(nsorder, "find_wedge", return_value=None):
        past = run(scene, limit=bound(scene) + 7200)
    assert past.admitted and not past.gone and past.violations == (), describe(scene)


# --- negative controls ------------------------------------------------------------------------------------
_SEARCH = settings(max_examples=500, database=None, derandomize=True,
                   suppress_health_check=list(HealthCheck))


def _old_rule(request: AdmissionRequest, state: ClusterState) -> Decision:
    """The rule before issue 11: a namespace is refused while any CriticalService whose provider exists
    there is unmet, confined or not."""
    if request.operation == "DELETE" and request.group_resource == NAMESPACES:
        for cs in state.hosted_in(request.name):
            if state.get(cs.provider) is not None and decide(_provider_delete(cs), state).rule is Rule.BLOCKED:
                return Decision(False, Rule.BLOCKED, f"CriticalService {cs.name} is unmet", 403, "Forbidden")
    return decide(request, state)


def _provider_delete(cs: Any) -> AdmissionRequest:
    p = cs.provider
    return AdmissionRequest(uid="u", group_resource=p.group_resource, operation="DELETE", name=p.name,
                            namespace=p.namespace, old_object={"metadata": {"name": p.name, "namespace": p.namespace}})


def _ungated_providers(request: AdmissionRequest, state: ClusterState) -> Decision:
    """A gate that lets every provider's DELETE through (its namespace rule is the new one)."""
    if request.operation == "DELETE" and request.group_resource != NAMESPACES and state.protecting(
            ObjectRef(state.resolve(request.group_resource) or request.group_resource, request.namespace,
                      request.name or str(((request.old_object or {}).get("metadata") or {}).get("name")))):
        return Decision(True, Rule.UNPROTECTED)
    return decide(request, state)


def test_the_old_rule_never_lets_the_namespace_finish():
    """Negative control: refusing the namespace while a confined CriticalService is unmet (the old rule)
    leaves it in place for good - nobody else deletes what the criteria count - where the new rule
    empties it."""
    scene = find(scenes(), lambda s: not run(s, _old_rule, limit=600).gone, settings=_SEARCH)
    old = run(scene, _old_rule, limit=bound(scene) + 7200)
    assert not old.admitted and not old.gone
    new = run(scene)
    assert new.admitted and new.gone and new.violations == ()


def test_a_gate_that_does_not_gate_the_provider_breaks_the_order():
    """Negative control: allowing the providers' own DELETEs lets the namespace controller delete a
    provider while objects its criteria count still exist, and the oracle sees it."""
    scene = find(scenes(), lambda s: bool(run(s, _ungated_providers).violations), settings=_SEARCH)
    assert run(scene).violations == ()


def test_without_the_wedge_check_a_generated_namespace_gets_stuck():
    """Negative control: without nsorder.find_wedge, the generator finds a namespace the controller's
    name-ordered deletecollection can never empty (a provider sorts before an object it waits for)."""
    @contextlib.contextmanager
    def unchecked() -> Iterator[None]:
        with mock.patch.object(nsorder, "find_wedge", return_value=None):
            yield

    def stuck(s: Scene) -> bool:
        with unchecked():
            return not run(s, limit=bound(s) + 3600).gone

    scene = find(scenes(), stuck, settings=_SEARCH)
    out = run(scene)
    assert not out.admitted and "could never empty it:" in out.refusal, out


# --- unit tests of the rule -------------------------------------------------------------------------------
def _state(*services: dict[str, Any], objects: tuple[KubeObject, ...] = ()) -> MemoryState:
    state = MemoryState()
    for o in (KubeObject(NAMESPACES, "", NS), *objects):
        state.upsert(o)
    for s in services:
        state.upsert_critical_service(parse_critical_service(s))
    return state


def _delete_ns(state: ClusterState) -> Decision:
    return decide(AdmissionRequest(uid="u", group_resource=NAMESPACES, operation="DELETE", name=NS, namespace=NS,
                                   old_object={"metadata": {"name": NS}}), state)


def _create(state: ClusterState, obj: dict[str, Any]) -> Decision:
    """The CREATE's decision, without the not-routed warning of a provider type the shipped configuration
    does not route (the gate-owned routing takes it away)."""
    d = decide(AdmissionRequest(uid="u", group_resource=GroupResource("criticalsvc.io", "criticalservices"),
                                   operation="CREATE", name=obj["metadata"]["name"], namespace="", object=obj), state)
    return attrs.evolve(d, warnings=tuple(w for w in d.warnings if not w.startswith("spec.provider: the webhook")))


NETPOL = KINDS["networkpolicies"][0]
CONFIGMAPS = KINDS["configmaps"][0]


def _kep5080(*extra: dict[str, Any]) -> dict[str, Any]:
    """NetworkPolicy app/deny-egress outlives the pods it guards."""
    return {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": "np"},
            "spec": {"provider": {"group": "networking.k8s.io", "resource": "networkpolicies", "namespace": NS,
                                  "name": "deny-egress"},
                     "criteria": [{"type": "Resources", "resources": {"resource": "pods", "namespace": NS},
                                   "condition": RUNNING}, *extra]}}


def test_a_confined_criticalservice_does_not_block_its_namespace_and_still_blocks_its_provider():
    state = _state(_kep5080(), objects=(KubeObject(NETPOL, NS, "deny-egress"), KubeObject(PODS, NS, "web-0")))
    d = _delete_ns(state)
    assert d.allowed and d.rule is Rule.CRITERIA_MET and d.protected and d.blocking == ()
    p = decide(_provider_delete(parse_critical_service(_kep5080())), state)
    assert not p.allowed and "app/web-0" in p.message


def test_a_finalizer_criterion_is_never_confined_so_the_namespace_stays_refused():
    fin = {"type": "Finalizer", "finalizer": {"group": "", "resource": "configmaps", "finalizerName": "x.io/f"}}
    state = _state(_kep5080(fin), objects=(KubeObject(NETPOL, NS, "deny-egress"), KubeObject(PODS, NS, "web-0")))
    d = _delete_ns(state)
    assert not d.allowed and d.blocking == ("np",) and "lives in this namespace" in d.message


def test_a_criterion_elsewhere_keeps_the_namespace_refused_and_the_create_says_which():
    other = {"type": "Resources", "resources": {"resource": "pods", "namespace": "other"}}
    state = _state(objects=(KubeObject(NETPOL, NS, "deny-egress"), KubeObject(PODS, NS, "web-0")))
    w = _create(state, _kep5080(other))
    assert w.allowed and w.warnings == (
        "spec.criteria[0]: its objects live in the provider's namespace app, but spec.criteria[1]'s do not, so "
        "deleting app is refused until these are gone too: delete them first",)
    state.upsert_critical_service(parse_critical_service(_kep5080(other)))
    assert not _delete_ns(state).allowed


def test_a_confined_criticalservice_is_created_without_a_warning():
    state = _state(objects=(KubeObject(NETPOL, NS, "deny-egress"), KubeObject(PODS, NS, "web-0")))
    d = _create(state, _kep5080())
    assert d.allowed and d.warnings == ()


def test_a_criterion_on_a_cluster_scoped_type_in_the_namespace_matches_nothing_and_counts_as_confined():
    """A namespace on a cluster-scoped type's criterion selects none of its objects (they have no
    namespace): it holds forever, so it can hold nothing up and does not stop the namespace going."""
    crb = {"type": "Resources", "resources": {"group": "rbac.authorization.k8s.io", "resource": "clusterroles",
                                              "namespace": NS}}
    cr = KubeObject(GroupResource("rbac.authorization.k8s.io", "clusterroles"), "", "view")
    state = _state(_kep5080(crb), objects=(KubeObject(NETPOL, NS, "deny-egress"), cr))
    assert nsorder.confined(parse_critical_service(_kep5080(crb)))
    assert _delete_ns(state).allowed


def _cm_service(name: str, provider: str, target: str) -> dict[str, Any]:
    return {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": name},
            "spec": {"provider": {"resource": "configmaps", "namespace": NS, "name": provider},
                     "criteria": [{"type": "SpecificResource", "specificResource": {
                         "resource": "configmaps", "namespace": NS, "name": target}}]}}


def test_a_provider_that_sorts_before_what_it_waits_for_is_a_wedge_refused_at_the_namespace():
    """ConfigMap a waits for ConfigMap b: the namespace controller's deletecollection of configmaps stops
    at the refused a and never reaches b. The namespace DELETE is refused, naming why; the CREATE warns."""
    objects = (KubeObject(CONFIGMAPS, NS, "a"), KubeObject(CONFIGMAPS, NS, "b"))
    w = _create(_state(objects=objects), _cm_service("cm", "a", "b"))
    assert w.allowed and len(w.warnings) == 1 and w.warnings[0].startswith("deleting namespace app would be refused")
    d = _delete_ns(_state(_cm_service("cm", "a", "b"), objects=objects))
    assert not d.allowed and d.blocking == ("cm",)
    assert "configmaps app/a may go only once configmaps app/b is gone (cm.spec.criteria[0])" in d.message
    assert "the namespace controller tries configmaps app/b only after configmaps app/a is allowed" in d.message
    # The other way round (b waits for a) the controller reaches a first: no wedge.
    assert _delete_ns(_state(_cm_service("cm", "b", "a"), objects=objects)).allowed


def test_two_criticalservices_waiting_on_the_same_step_of_a_wedge_are_both_named():
    """Both wait for b through the same edge of the order: the refusal names each (found by
    test_properties' oracle, which counts every service whose own criteria lead back to its provider)."""
    objects = (KubeObject(CONFIGMAPS, NS, "a"), KubeObject(CONFIGMAPS, NS, "b"))
    d = _delete_ns(_state(_cm_service("cm", "a", "b"), _cm_service("cm2", "a", "b"), objects=objects))
    assert not d.allowed and d.blocking == ("cm", "cm2")
    # Two cycles through a: one waits for a itself, the other for b (tried only after a): both are named,
    # not only those on the cycle the message describes.
    d = _delete_ns(_state(_cm_service("cm", "a", "a"), _cm_service("cm2", "a", "b"), objects=objects))
    assert not d.allowed and d.blocking == ("cm", "cm2")


def test_a_pod_provider_waiting_for_a_configmap_is_a_wedge_under_pods_first():
    svc = {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": "p"},
           "spec": {"provider": {"resource": "pods", "namespace": NS, "name": "web-0"},
                    "criteria": [{"type": "Resources", "resources": {"resource": "configmaps", "namespace": NS}}]}}
    state = _state(svc, objects=(KubeObject(PODS, NS, "web-0"), KubeObject(CONFIGMAPS, NS, "settings")))
    d = _delete_ns(state)
    assert not d.allowed and "is tried only once no pod remains" in d.message


def test_a_confined_cycle_is_refused_at_creation():
    """Two confined CriticalServices waiting for each other's provider: the second CREATE closes a cycle."""
    objects = (KubeObject(CONFIGMAPS, NS, "a"), KubeObject(CONFIGMAPS, NS, "b"))
    state = _state(_cm_service("first", "b", "a"), objects=objects)
    d = _create(state, _cm_service("second", "a", "b"))
    assert not d.allowed and d.rule is Rule.CYCLE and "second -> first -> second" in d.message


@pytest.mark.parametrize("ordered", [True, False])
def test_the_kep5080_example_in_the_simulator(ordered):
    """The worked example: a NetworkPolicy and a ConfigMap outlive the pods; the namespace empties."""
    scene = Scene((Provider("networkpolicies", "deny-egress", "", None, ()),
                   Provider("configmaps", "settings", "web", None, (0,))),
                  (Pod("web-0", "web", "Running", 20.0), Pod("web-1", "web", "Pending", 3.0)), (), ordered, 0)
    out = run(scene)
    assert out.admitted and out.gone and out.violations == (), out
    assert out.elapsed <= bound(scene)
