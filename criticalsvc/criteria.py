"""Evaluating a criterion against a cluster state.

A verdict says whether the criterion holds and, when it does not, how many objects block it and the
first few of them (in (namespace, name) order, so a message is stable across retries and replicas). A criterion naming a
type that is not served is met: no instance of an unserved type can exist (the live service's
discovery learns the type the moment its CRD appears).

A criterion with a condition (criticalsvc/condition.py) counts only the objects whose stored outcome
is not False: True, an evaluation error and "not evaluated" all block (fail closed). The verdict also
says how many objects the condition excluded and on which it failed, for `explain` and the status.
Counting them walks the criterion's candidates once (a few hundred nanoseconds each, no CEL: the
outcomes were computed when the objects entered the state).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from itertools import islice

import attrs

from .api import (
    Criterion,
    CriticalService,
    FinalizerCriterion,
    GroupResource,
    ObjectRef,
    ResourcesCriterion,
    SpecificResourceCriterion,
)
from .condition import Condition
from .objects import KubeObject
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
    # With a condition: how many objects it excluded and the first few of them, and the first few
    # objects it could not be evaluated on (they are among the blocking ones) with the error's text.
    excluded: int = 0
    excluded_examples: tuple[ObjectRef, ...] = ()
    errors: tuple[tuple[ObjectRef, str], ...] = ()

    def describe(self) -> str:
        """One clause for a person at a terminal; only meaningful when not satisfied."""
        clause = self._describe_objects()
        if self.errors:
            failed = ", ".join(f"{ref.key} ({error})" for ref, error in self.errors)
            clause += f" (its condition could not be evaluated on {failed}: such objects count)"
        return clause

    def describe_excluded(self) -> str:
        """Which objects the condition left out, and why; "" when it left out none."""
        if not self.excluded or self.criterion.condition is None:
            return ""
        first = ", ".join(e.key for e in self.excluded_examples)
        if self.excluded == 1:
            return f"the condition is false for {first}, so it does not count"
        return f"the condition is false for {self.excluded} objects (first: {first}), so they do not count"

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


def named_resource(c: Criterion) -> GroupResource:
    return c.target.group_resource if isinstance(c, SpecificResourceCriterion) else c.group_resource


def evaluate(criterion: Criterion, state: ClusterState) -> Verdict:
    """Does `criterion` hold in `state`? May raise StateUnavailable."""
    gr = state.resolve(named_resource(criterion))
    if gr is None:
        return Verdict(criterion, True)
    if isinstance(criterion, SpecificResourceCriterion):
        obj = state.get(ObjectRef(gr, criterion.target.namespace, criterion.target.name))
        if criterion.condition is not None:
            return _conditioned(criterion, criterion.condition, () if obj is None else (obj,), gr)
        if obj is None:
            return Verdict(criterion, True, group_resource=gr)
        return Verdict(criterion, False, 1, (obj.ref,), gr)
    if isinstance(criterion, FinalizerCriterion):
        blocking: Collection[KubeObject] = state.with_finalizer(gr, criterion.finalizer_name)
    else:
        blocking = state.select(gr, namespace=criterion.namespace, selector=criterion.selector)
    if criterion.condition is not None:
        return _conditioned(criterion, criterion.condition, blocking, gr)
    if not blocking:
        return Verdict(criterion, True, group_resource=gr)
    # A ClusterState answers in (namespace, name) order, so the first few are a prefix: O(EXAMPLES)
    # however many objects block (a sort here cost a protected DELETE ~1 ms at 10,000 blocking CRs).
    first = tuple(o.ref for o in islice(blocking, EXAMPLES))
    return Verdict(criterion, False, len(blocking), first, gr)


def _conditioned(criterion: Criterion, condition: Condition, candidates: Collection[KubeObject],
                 gr: GroupResource) -> Verdict:
    count = excluded = 0
    first: list[ObjectRef] = []
    left_out: list[ObjectRef] = []
    errors: list[tuple[ObjectRef, str]] = []
    for obj in candidates:
        outcome = obj.outcome(condition)
        if outcome is False:
            excluded += 1
            if len(left_out) < EXAMPLES:
                left_out.append(obj.ref)
            continue
        count += 1
        if len(first) < EXAMPLES:
            first.append(obj.ref)
        if outcome is not True and len(errors) < EXAMPLES:
            errors.append((obj.ref, outcome if isinstance(outcome, str) else "not evaluated yet"))
    return Verdict(criterion, count == 0, count, tuple(first), gr, excluded, tuple(left_out), tuple(errors))


def counts(criterion: Criterion, obj: KubeObject) -> bool:
    """Does the criterion's condition (if any) let `obj` count? Only a False outcome leaves it out."""
    return criterion.condition is None or obj.outcome(criterion.condition) is not False


def conditions_by_resource(services: Iterable[CriticalService],
                           state: ClusterState) -> dict[GroupResource, frozenset[Condition]]:
    """The conditions that criteria of `services` put on each (served) group/resource: what a state
    evaluates when an object of that type enters it."""
    found: dict[GroupResource, set[Condition]] = {}
    for cs in services:
        for c in cs.criteria:
            if c.condition is not None:
                gr = state.resolve(named_resource(c))
                if gr is not None:
                    found.setdefault(gr, set()).add(c.condition)
    return {gr: frozenset(conditions) for gr, conditions in found.items()}


def covers(criterion: Criterion, obj: KubeObject, state: ClusterState) -> bool:
    """Is `obj` one of the objects that must be gone for `criterion` to hold?"""
    gr = state.resolve(named_resource(criterion))
    if gr is None or gr != obj.group_resource or not counts(criterion, obj):
        return False
    if isinstance(criterion, SpecificResourceCriterion):
        return (criterion.target.namespace, criterion.target.name) == (obj.namespace, obj.name)
    if isinstance(criterion, FinalizerCriterion):
        return criterion.finalizer_name in obj.finalizers
    if criterion.namespace is not None and criterion.namespace != obj.namespace:
        return False
    return criterion.selector.matches(obj.labels)


def criterion_namespace(criterion: Criterion) -> str | None:
    """The namespace a criterion's objects are confined to, if any."""
    if isinstance(criterion, SpecificResourceCriterion):
        return criterion.target.namespace or None
    if isinstance(criterion, ResourcesCriterion):
        return criterion.namespace
    return None
