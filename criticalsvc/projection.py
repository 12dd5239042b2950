"""Projecting an object for a state: which criteria's conditions it must carry the outcomes of.

Below the rules (criticalsvc/criteria.py): the states' builders (criticalsvc/snapshot.py, the caches,
the simulator's store) project objects with it and need none of the rules' verdicts (the
`state-builders-below-rules` contract in .importlinter).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

import attrs

from .api import (
    Criterion,
    CriticalService,
    FinalizerCriterion,
    GroupResource,
    SpecificResourceCriterion,
)
from .objects import KubeObject, evaluate_all, project
from .state import ClusterState


def named_resource(c: Criterion) -> GroupResource:
    return c.target.group_resource if isinstance(c, SpecificResourceCriterion) else c.group_resource


def conditioned_criteria(services: Iterable[CriticalService],
                         state: ClusterState) -> dict[GroupResource, frozenset[Criterion]]:
    """The criteria of `services` that carry a condition, by the (served) group/resource they are about:
    what a state needs to evaluate as objects of that type enter it (`project_for`)."""
    found: dict[GroupResource, set[Criterion]] = {}
    for cs in services:
        for c in cs.criteria:
            if c.condition is not None:
                gr = state.resolve(named_resource(c))
                if gr is not None:
                    found.setdefault(gr, set()).add(c)
    return {gr: frozenset(conditioned) for gr, conditioned in found.items()}


def project_for(obj: Mapping[str, Any], gr: GroupResource, conditioned: Collection[Criterion]) -> KubeObject:
    """`project(obj, gr)` with the outcome of each condition of `conditioned` whose criterion the object
    is a candidate of - the only outcomes a decision can ask of it. A condition over one namespace's
    Pods is thus evaluated on those Pods, not on every Pod of the cluster the cache holds (~120 µs each)."""
    slim = project(obj, gr)
    wanted = {c.condition for c in conditioned if c.condition is not None and candidate(c, slim)}
    return attrs.evolve(slim, outcomes=evaluate_all(wanted, obj)) if wanted else slim


def candidate(criterion: Criterion, obj: KubeObject) -> bool:
    """Is `obj` (of the criterion's type) one of the objects the criterion looks at, condition aside?"""
    if isinstance(criterion, SpecificResourceCriterion):
        return (criterion.target.namespace, criterion.target.name) == (obj.namespace, obj.name)
    if isinstance(criterion, FinalizerCriterion):
        return criterion.finalizer_name in obj.finalizers
    if criterion.namespace is not None and criterion.namespace != obj.namespace:
        return False
    return criterion.selector.matches(obj.labels)
