"""Does a CriticalService cover everything its provider serves? (pure; the gate's status reports it)

What a provider serves is what `discover` would propose for it (criticalsvc/discover/propose.py): each
dependency is a criterion that would protect one thing. A CriticalService written by hand before its provider
started serving a new webhook configuration, or a new finalizer, is stale: a teardown would let the provider go
while that thing still needs it. `uncovered` names the things no criterion of the CriticalService covers.

A criterion covers a served thing when it waits for at least as much:
    SpecificResource X          covers "X is gone"
    Resources over X's type     covers "X is gone" when it has no selector and its namespace (if any) is X's
    Finalizer F on type T       covers "no T carries F"
Types compare after resolving Kinds and short names (`resolve`), as the criteria's own evaluation does.

Only findings of high confidence count: a guessed finalizer controller must not turn a status condition False.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import attrs

from ..api import (
    Criterion,
    CriticalService,
    FinalizerCriterion,
    GroupResource,
    ObjectRef,
    ResourcesCriterion,
    SpecificResourceCriterion,
)
from ..restmapper import guess_resource
from .finalizers import Confidence
from .propose import Discovery

Resolve = Callable[[GroupResource], GroupResource | None]


@attrs.frozen
class Served:
    """One thing a provider serves, as the criterion that would cover it, and the evidence (one line)."""

    criterion: Criterion
    evidence: str


def served_by(discovery: Discovery) -> dict[ObjectRef, tuple[Served, ...]]:
    """Per workload, what it serves (high-confidence findings only)."""
    return {p.provider: tuple(Served(d.criterion, d.evidence) for d in p.dependencies
                              if d.confidence == Confidence.HIGH) for p in discovery.proposals}


def _same(a: GroupResource, b: GroupResource, resolve: Resolve) -> bool:
    return a == b or _canonical(a, resolve) == _canonical(b, resolve)


def _canonical(gr: GroupResource, resolve: Resolve) -> GroupResource:
    """The plural resource: as the state resolves it, else (a type it does not know) a Kind's plural guessed as
    kubectl does, so `APIService` still compares equal to `apiservices`."""
    resolved = resolve(gr)
    if resolved is not None:
        return resolved
    return GroupResource(gr.group, guess_resource(gr.resource)) if gr.resource[:1].isupper() else gr


def covers(c: Criterion, need: Criterion, resolve: Resolve) -> bool:
    if isinstance(need, FinalizerCriterion):
        return isinstance(c, FinalizerCriterion) and c.finalizer_name == need.finalizer_name and \
            _same(c.group_resource, need.group_resource, resolve)
    assert isinstance(need, SpecificResourceCriterion)
    target = need.target
    if isinstance(c, SpecificResourceCriterion):
        return c.target.name == target.name and c.target.namespace == target.namespace and \
            _same(c.target.group_resource, target.group_resource, resolve)
    if isinstance(c, ResourcesCriterion):
        return c.selector.is_empty and c.condition is None and c.namespace in (None, target.namespace or None) and \
            _same(c.group_resource, target.group_resource, resolve)
    return False


def uncovered(cs: CriticalService, served: Sequence[Served], resolve: Resolve) -> list[Served]:
    """What `cs`'s provider serves that none of its criteria covers."""
    return [s for s in served if not any(covers(c, s.criterion, resolve) for c in cs.criteria)]


def describe(need: Criterion) -> str:
    if isinstance(need, FinalizerCriterion):
        return f"finalizer {need.finalizer_name} on {need.group_resource}"
    assert isinstance(need, SpecificResourceCriterion)
    return str(need.target)


def served_of(cs: CriticalService, served: Mapping[ObjectRef, tuple[Served, ...]]) -> tuple[Served, ...] | None:
    """What cs's named provider serves; None for a provider selector (a set: not judged)."""
    if not isinstance(cs.provider, ObjectRef):
        return None
    return served.get(cs.provider, ())
