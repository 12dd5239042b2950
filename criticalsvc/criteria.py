"""Evaluating a criterion against a cluster state.

A verdict says whether the criterion holds and, when it does not, how many objects block it and the
first few of them (in (namespace, name) order, so a message is stable across retries and replicas). A criterion naming a
type that is not served is met: no instance of an unserved type can exist (the live service's
discovery learns the type the moment its CRD appears).

A criterion with a condition (criticalsvc/condition.py) counts only the objects whose stored outcome
is not False: True, an evaluation error and "not evaluated" all block (fail closed). The state answers
that from an index of outcomes (criticalsvc/state.py), so a conditioned criterion costs what an
unconditioned one does and no CEL runs while deciding. The verdict also says how many objects the
condition excluded and which named objects it failed on; `excluded_objects` names the excluded ones
(for `explain`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from itertools import islice

import attrs

from .api import (
    Criterion,
    FinalizerCriterion,
    GroupResource,
    ObjectRef,
    ResourcesCriterion,
    SpecificResourceCriterion,
)
from .condition import Condition
from .objects import KubeObject

# What a state needs to project objects lives below the rules (snapshot and the caches build states with it);
# these names stay importable from here for the rules' callers.
from .projection import candidate
from .projection import conditioned_criteria as conditioned_criteria
from .projection import named_resource as named_resource
from .projection import project_for as project_for
from .state import ClusterState

# How many blocking objects a message names; the count is always exact.
EXAMPLES = 3


@attrs.frozen
class Verdict:
    criterion: Criterion
    satisfied: bool
    count: int = 0
    examples: tuple[ObjectRef, ...] = ()
    # The resolved group/resource, or None when the named type is not served.
    group_resource: GroupResource | None = None
    # With a condition: how many objects it excluded, and which of the named blocking objects
    # (`examples`) it could not be evaluated on, with the error's text (they count: fail closed).
    excluded: int = 0
    errors: tuple[tuple[ObjectRef, str], ...] = ()

    def describe(self) -> str:
        """One clause for a person at a terminal; only meaningful when not satisfied."""
        clause = self._describe_objects()
        if self.errors:
            failed = ", ".join(f"{ref.key} ({error})" for ref, error in self.errors)
            clause += f" (its condition could not be evaluated on {failed}: such objects count)"
        return clause

    def _describe_objects(self) -> str:
        c = self.criterion
        gr = self.group_resource or named_resource(c)
        first = ", ".join(e.key for e in self.examples)
        more = f"{self.count} objects; first: {first}" if self.count > 1 else ""
        if isinstance(c, FinalizerCriterion):
            if self.count == 1:
                return f"{gr} {first} still carries finalizer {c.finalizer_name}"
            return f"{gr} objects still carry finalizer {c.finalizer_name} ({more})"
        if isinstance(c, SpecificResourceCriterion):
            return f"{gr} {c.target.key} still exists"
        where = f" in namespace {c.namespace}" if c.namespace else ""
        sel = f" matching {c.selector}" if not c.selector.is_empty else ""
        if self.count == 1:
            return f"{gr} {first}{where}{sel} still exists"
        return f"{gr}{where}{sel} still exist ({more})"


def evaluate(criterion: Criterion, state: ClusterState) -> Verdict:
    """Does `criterion` hold in `state`? May raise StateUnavailable."""
    gr = state.resolve(named_resource(criterion))
    if gr is None:
        return Verdict(criterion, True)
    if isinstance(criterion, SpecificResourceCriterion):
        obj = state.get(ObjectRef(gr, criterion.target.namespace, criterion.target.name))
        if obj is not None and criterion.condition is not None and obj.outcome(criterion.condition) is False:
            return Verdict(criterion, True, group_resource=gr, excluded=1)
        if obj is None:
            return Verdict(criterion, True, group_resource=gr)
        return Verdict(criterion, False, 1, (obj.ref,), gr, errors=_errors((obj,), criterion.condition))
    blocking = _candidates(criterion, gr, state, criterion.condition)
    excluded = len(_candidates(criterion, gr, state, None)) - len(blocking) if criterion.condition else 0
    if not blocking:
        return Verdict(criterion, True, group_resource=gr, excluded=excluded)
    # A ClusterState answers in (namespace, name) order, so the first few are a prefix: O(EXAMPLES)
    # however many objects block (a sort here cost a protected DELETE ~1 ms at 10,000 blocking CRs).
    first = tuple(islice(blocking, EXAMPLES))
    return Verdict(criterion, False, len(blocking), tuple(o.ref for o in first), gr, excluded,
                   _errors(first, criterion.condition))


def blocking_objects(criterion: Criterion, state: ClusterState) -> Collection[KubeObject]:
    """Every object that keeps `criterion` from holding (all of them, not the first few; a condition's
    error counts as blocking, as in `evaluate`)."""
    gr = state.resolve(named_resource(criterion))
    if gr is None:
        return ()
    if isinstance(criterion, SpecificResourceCriterion):
        obj = state.get(ObjectRef(gr, criterion.target.namespace, criterion.target.name))
        if obj is None or (criterion.condition is not None and obj.outcome(criterion.condition) is False):
            return ()
        return (obj,)
    return _candidates(criterion, gr, state, criterion.condition)


def _candidates(criterion: FinalizerCriterion | ResourcesCriterion, gr: GroupResource, state: ClusterState,
                condition: Condition | None) -> Collection[KubeObject]:
    if isinstance(criterion, FinalizerCriterion):
        return state.with_finalizer(gr, criterion.finalizer_name, condition=condition)
    return state.select(gr, namespace=criterion.namespace, selector=criterion.selector, condition=condition)


def _errors(objects: Iterable[KubeObject], condition: Condition | None) -> tuple[tuple[ObjectRef, str], ...]:
    """The named blocking objects the condition could not be evaluated on, with the error."""
    if condition is None:
        return ()
    out = []
    for obj in objects:
        outcome = obj.outcome(condition)
        if outcome is not True:
            out.append((obj.ref, outcome if isinstance(outcome, str) else "not evaluated yet"))
    return tuple(out)


def excluded_objects(criterion: Criterion, state: ClusterState, *, limit: int = EXAMPLES) -> tuple[ObjectRef, ...]:
    """The first `limit` objects the criterion's condition leaves out (walks the candidates: for
    `explain`, not for decisions)."""
    condition = criterion.condition
    gr = state.resolve(named_resource(criterion))
    if condition is None or gr is None:
        return ()
    if isinstance(criterion, SpecificResourceCriterion):
        obj = state.get(ObjectRef(gr, criterion.target.namespace, criterion.target.name))
        candidates: Iterable[KubeObject] = () if obj is None else (obj,)
    else:
        candidates = _candidates(criterion, gr, state, None)
    return tuple(islice((o.ref for o in candidates if o.outcome(condition) is False), limit))


def counts(criterion: Criterion, obj: KubeObject) -> bool:
    """Does the criterion's condition (if any) let `obj` count? Only a False outcome leaves it out."""
    return criterion.condition is None or obj.outcome(criterion.condition) is not False


def covers(criterion: Criterion, obj: KubeObject, state: ClusterState) -> bool:
    """Is `obj` one of the objects that must be gone for `criterion` to hold?"""
    gr = state.resolve(named_resource(criterion))
    if gr is None or gr != obj.group_resource or not counts(criterion, obj):
        return False
    return candidate(criterion, obj)


def criterion_namespace(criterion: Criterion) -> str | None:
    """The namespace a criterion's objects are confined to, if any."""
    if isinstance(criterion, SpecificResourceCriterion):
        return criterion.target.namespace or None
    if isinstance(criterion, ResourcesCriterion):
        return criterion.namespace
    return None
