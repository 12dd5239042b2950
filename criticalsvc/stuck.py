"""Is a teardown stuck behind a finalizer nobody will remove? (pure; status and `explain` report it)

A Finalizer criterion says: the provider removes this finalizer, so the provider stays until no object
carries it. If the provider is not running, nothing removes the finalizer and the criterion never holds:
the gate keeps a provider that no longer provides anything, and the teardown waits forever. The gate cannot
see a controller's liveness, but for the provider types it knows it can see the next best thing:

    the provider is terminating                gone but held (its own finalizers): its pods are going
    a Deployment/StatefulSet with spec.replicas 0          scaled away
    a Deployment/StatefulSet with no available replica     status.availableReplicas 0 or absent

For any other provider type, or a workload the gate holds only metadata of, the answer is "cannot tell"
(never a guess of "stuck"). The way out is in the message: scale the provider back up, or remove the
finalizer by hand (a JSON patch that tests the finalizer's index before removing it, so it cannot remove
another one if the list changed meanwhile).

A teardown is stuck too when a criterion waits for an object its deleter will never delete: a CRD under an
Argo CD Application's deletion, or one from a chart's crds/ under `helm uninstall` (criticalsvc/deleters.py,
from the evidence of the deleter's last refused request). `left_behind` says so, with the way out: delete
the CRD by hand, or let it stay with a criterion on its instances instead.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence

import attrs

from . import deleters
from .api import NAMESPACES, CriticalService, FinalizerCriterion, ObjectRef
from .criteria import Verdict
from .errors import StateUnavailable
from .objects import KubeObject, Workload
from .state import ClusterState


class StuckReason(enum.StrEnum):
    FINALIZER_CONTROLLER_DOWN = "FinalizerControllerDown"  # True
    CONTROLLER_AVAILABLE = "ControllerAvailable"  # False
    NO_FINALIZER_PENDING = "NoFinalizerPending"  # False
    CANNOT_TELL = "AvailabilityUnknown"  # False: the gate cannot see whether the controller runs
    PROVIDER_ABSENT = "ProviderAbsent"  # False: not created yet (creation order is free) or gone
    DELETER_NEVER_DELETES = "DeleterNeverDeletes"  # True: a criterion waits for what its deleter never deletes


@attrs.frozen
class Stuck:
    stuck: bool
    reason: StuckReason
    message: str


def finalizer_controller(cs: CriticalService, provider: KubeObject | None, unmet: Sequence[Verdict],
                         state: ClusterState) -> Stuck | None:
    """Whether `cs`'s unmet Finalizer criteria wait on a provider that is not running; None when `cs` has no
    Finalizer criterion or no named provider (nothing to say). `unmet`: the verdicts of its unmet criteria."""
    if not isinstance(cs.provider, ObjectRef) or not any(isinstance(c, FinalizerCriterion) for c in cs.criteria):
        return None
    waiting = [v for v in unmet if isinstance(v.criterion, FinalizerCriterion)]
    if not waiting:
        return Stuck(False, StuckReason.NO_FINALIZER_PENDING, "no object carries a finalizer this CriticalService "
                     "waits for")
    first = waiting[0]
    assert isinstance(first.criterion, FinalizerCriterion)
    finalizer = first.criterion.finalizer_name
    if provider is None:
        return Stuck(False, StuckReason.PROVIDER_ABSENT, f"{cs.provider} does not exist; whether something else "
                     f"removes finalizer {finalizer} cannot be told")
    why = _down(provider)
    if why is None:
        if isinstance(provider, Workload) and provider.replicas is not None and provider.available_replicas:
            return Stuck(False, StuckReason.CONTROLLER_AVAILABLE, f"{cs.provider} has {provider.available_replicas} "
                         f"available replica(s) to remove finalizer {finalizer}")
        return Stuck(False, StuckReason.CANNOT_TELL, f"the gate cannot tell whether {cs.provider} runs (it reads "
                     "availability of Deployments and StatefulSets only)")
    return Stuck(True, StuckReason.FINALIZER_CONTROLLER_DOWN,
                 f"{first.describe()}, waiting for finalizer {finalizer}, but {cs.provider} {why}, so nothing "
                 f"removes it and the teardown cannot finish. Way out: {_way_out(cs.provider, provider, first, state)}")


def left_behind(cs: CriticalService, unmet: Sequence[Verdict], state: ClusterState,
                deleter: deleters.Deleter | None) -> Stuck | None:
    """Stuck (DeleterNeverDeletes) when one of `unmet` waits for an object that `deleter` (who was last refused
    deleting `cs`'s provider or its namespace) never deletes and nobody is deleting; None otherwise."""
    left = deleters.left_behind(deleter, unmet, state, cs.name)
    if left is None:
        return None
    return Stuck(True, StuckReason.DELETER_NEVER_DELETES,
                 f"{left.target} still exists and nobody is deleting it; the teardown of {cs.provider} by "
                 f"{left.deleter} ({left.deleter.evidence}) waits for it and cannot finish on its own. {left.why}. "
                 f"Way out: {left.way_out}")


def _down(provider: KubeObject) -> str | None:
    """Why the provider cannot be removing finalizers now, or None when it may be (or the gate cannot tell)."""
    if provider.terminating:
        return "is itself terminating (deleted, held by its own finalizers)"
    if isinstance(provider, Workload):
        if provider.replicas == 0:
            return "is scaled to 0 replicas"
        if provider.replicas is not None and provider.available_replicas == 0:
            return f"has none of its {provider.replicas} replica(s) available"
    return None


def _way_out(ref: ObjectRef, provider: KubeObject, verdict: Verdict, state: ClusterState) -> str:
    criterion = verdict.criterion
    assert isinstance(criterion, FinalizerCriterion)
    steps = []
    if not provider.terminating:
        ns = f" -n {ref.namespace}" if ref.namespace else ""
        steps.append(f"scale the provider back up (kubectl scale{ns} {ref.group_resource}/{ref.name} "
                     "--replicas=<n>), or")
    example: KubeObject | None = None
    if verdict.examples:
        try:
            example = state.get(verdict.examples[0])
        except StateUnavailable:
            example = None  # the generic advice is still right
    if example is None or criterion.finalizer_name not in example.finalizers:
        steps.append(f"remove finalizer {criterion.finalizer_name} by hand from every "
                     f"{criterion.group_resource} that carries it")
    else:
        i = example.finalizers.index(criterion.finalizer_name)
        patch = json.dumps([{"op": "test", "path": f"/metadata/finalizers/{i}", "value": criterion.finalizer_name},
                            {"op": "remove", "path": f"/metadata/finalizers/{i}"}], separators=(",", ":"))
        where = f" -n {example.namespace}" if example.namespace and example.group_resource != NAMESPACES else ""
        more = f" (and so on for the other {verdict.count - 1})" if verdict.count > 1 else ""
        steps.append(f"remove the finalizer by hand, knowing its cleanup will not run: kubectl patch "
                     f"{example.group_resource} {example.name}{where} --type=json -p '{patch}'{more}")
    return " ".join(steps)
