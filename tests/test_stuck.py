"""Condition Stuck (FinalizerControllerDown): a Finalizer criterion waits on a provider that is not running.

The status and `criticalsvc explain` say so, with the way out; nothing is said without a Finalizer criterion,
and "cannot tell" is never reported as stuck.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
from kubefakes import state_with
from test_decision import cs_obj, finalizer, ns, specific

from criticalsvc.api import GroupResource, ObjectRef, parse_critical_service
from criticalsvc.explain import explain, render_text
from criticalsvc.objects import KubeObject, Workload, project
from criticalsvc.restmapper import ResourceType
from criticalsvc.state import MemoryState
from criticalsvc.status import compute_status

DEPLOYMENTS = GroupResource("apps", "deployments")
STATEFULSETS = GroupResource("apps", "statefulsets")
COOL = GroupResource("my.crd.group", "coolresources")
FINALIZER = "my.crd.group/super-important"
CS = cs_obj("ctrl", ("apps", "deployments", "ops", "ctrl"), finalizer("my.crd.group", "coolresources", FINALIZER))


def workload(replicas: Any = 1, available: Any = None, *, gr: GroupResource = DEPLOYMENTS,
             deleting: bool = False, whole: bool = True) -> KubeObject:
    md: dict[str, Any] = {"name": "ctrl", "namespace": "ops", "uid": "u1"}
    if deleting:
        md["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    obj: dict[str, Any] = {"metadata": md}
    if whole:
        obj["spec"] = {} if replicas is None else {"replicas": replicas}
        obj["status"] = {} if available is None else {"availableReplicas": available}
    return project(obj, gr)


def cool(*finalizers: str, name: str = "gamma") -> KubeObject:
    return KubeObject(COOL, "apps", name, finalizers=finalizers)


def cluster(provider: KubeObject | None, *crs: KubeObject, cs: dict[str, Any] = CS) -> MemoryState:
    state = state_with(cs, objects=[ns("ops"), *([provider] if provider else []), *crs])
    state.mapper.add(ResourceType("my.crd.group", "v1", "CoolResource", "coolresources", "coolresource",
                                  namespaced=True))
    return state


def stuck(state: MemoryState, cs: dict[str, Any] = CS, previous: Any = None, now: float = 0) -> dict[str, Any] | None:
    status = compute_status(parse_critical_service(cs), state, now=now, previous=previous)
    return next((c for c in status["conditions"] if c["type"] == "Stuck"), None)


@pytest.mark.parametrize(("case", "provider", "why"), [
    ("scaled to 0", workload(0, None), "is scaled to 0 replicas"),
    ("no replica available (status.availableReplicas absent)", workload(2, None), "has none of its 2 replica(s)"),
    ("no replica available (0)", workload(1, 0), "has none of its 1 replica(s)"),
    ("a StatefulSet with none available", workload(3, 0, gr=STATEFULSETS), "has none of its 3 replica(s)"),
    ("terminating, held by its own finalizers", workload(1, 1, deleting=True), "is itself terminating"),
])
def test_a_finalizer_waiting_on_a_provider_that_is_not_running_is_stuck_with_the_way_out(
        case: str, provider: KubeObject, why: str) -> None:
    cs = CS if provider.group_resource == DEPLOYMENTS else cs_obj(
        "ctrl", ("apps", "statefulsets", "ops", "ctrl"), finalizer("my.crd.group", "coolresources", FINALIZER))
    state = cluster(provider, cool("other/first", FINALIZER), cs=cs)
    cond = stuck(state, cs)
    assert cond is not None and (cond["status"], cond["reason"]) == ("True", "FinalizerControllerDown"), case
    assert why in cond["message"]
    # The exact patch: it tests the finalizer's index before removing it, so it removes nothing else.
    assert ("kubectl patch coolresources.my.crd.group gamma -n apps --type=json -p "
            f"'[{{\"op\":\"test\",\"path\":\"/metadata/finalizers/1\",\"value\":\"{FINALIZER}\"}},"
            "{\"op\":\"remove\",\"path\":\"/metadata/finalizers/1\"}]'") in cond["message"]
    scale = f"kubectl scale -n ops {provider.group_resource}/ctrl --replicas=<n>"
    assert (scale in cond["message"]) == (not provider.terminating)
    # explain says the same.
    text = render_text(explain(ObjectRef(provider.group_resource, "ops", "ctrl"), state))
    assert f"STUCK (FinalizerControllerDown): {cond['message']}" in text


@pytest.mark.parametrize(("case", "provider", "crs", "reason"), [
    ("an available replica", workload(2, 1), [cool(FINALIZER)], "ControllerAvailable"),
    ("nothing carries the finalizer", workload(0, 0), [cool("other/x")], "NoFinalizerPending"),
    ("no provider (yet)", None, [cool(FINALIZER)], "ProviderAbsent"),
    ("metadata only: the gate cannot tell", workload(whole=False), [cool(FINALIZER)], "AvailabilityUnknown"),
])
def test_not_stuck_when_the_controller_may_run_or_nothing_waits(case: str, provider: KubeObject | None,
                                                                 crs: list[KubeObject], reason: str) -> None:
    cond = stuck(cluster(provider, *crs))
    assert cond is not None and (cond["status"], cond["reason"]) == ("False", reason), case


def test_no_stuck_condition_without_a_finalizer_criterion():
    cs = cs_obj("ctrl", ("apps", "deployments", "ops", "ctrl"), specific("", "configmaps", "ops", "c"))
    assert stuck(cluster(workload(0), cs=cs), cs) is None


def test_stuck_does_not_flap_while_nothing_changes_and_clears_when_scaled_back_up():
    down = cluster(workload(1, 0), cool(FINALIZER))
    first = compute_status(parse_critical_service(CS), down, now=100)
    again = compute_status(parse_critical_service(CS), down, now=200, previous=first)
    (a,), (b,) = ([c for c in s["conditions"] if c["type"] == "Stuck"] for s in (first, again))
    assert a == b  # the same message, and lastTransitionTime kept
    up = cluster(workload(1, 1), cool(FINALIZER))
    after = stuck(up, previous=again, now=300)
    assert after is not None and after["status"] == "False" and after["lastTransitionTime"] != a["lastTransitionTime"]


def test_availability_is_kept_only_for_workloads_so_other_objects_do_not_grow():
    """Measured: a ConfigMap's projection is as large as before (a KubeObject), a Deployment's carries two ints."""
    md = {"name": "c", "namespace": "ops", "uid": "6f1c8e0a-0b5e-4c55-9a53-0f0e8b1e2a11"}
    configmap = project({"metadata": md, "data": {"a": "b"}}, GroupResource("", "configmaps"))
    deployment = project({"metadata": md, "spec": {"replicas": 2}, "status": {"availableReplicas": 2}}, DEPLOYMENTS)
    assert type(configmap) is KubeObject and isinstance(deployment, Workload)
    assert (deployment.replicas, deployment.available_replicas) == (2, 2)
    assert sys.getsizeof(configmap) == sys.getsizeof(KubeObject(DEPLOYMENTS, "ops", "c"))
    assert sys.getsizeof(deployment) - sys.getsizeof(configmap) == 16  # two slots


def test_a_bad_replica_count_is_unknown_never_stuck():
    """A malformed spec.replicas (a string) is no count: the gate cannot tell, so it does not say stuck."""
    cond = stuck(cluster(workload("two", 0), cool(FINALIZER)))
    assert cond is not None and cond["reason"] == "AvailabilityUnknown"
