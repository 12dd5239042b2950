"""The answers of a live confirmation: a ClusterState answering from a memo of fresh reads (criticalsvc/live.py).

`decide` is pure and synchronous; the reads are not. So a confirmation's state is a memo of answers, keyed by the
question that asked for them: a run of `decide` on a `LiveState` that asks a question not yet answered records it in
`missing`, gets an empty placeholder and carries on; `LiveReader` (criticalsvc/live.py) reads what was missing and
runs `decide` again, until a run asks nothing new. A read that failed is memoised as `LiveReadFailed`, which the
decision turns into its "could not verify" denial. `predict_questions` runs `decide` once on the cache to list the
questions a confirmation will most likely ask, so they are read together in the first round.

Pure: what the questions mean and how their answers are read back; every read is the reader's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Hashable, Mapping
from typing import Any, Literal

from . import criteria
from .admission import AdmissionRequest
from .api import Criterion, CriticalService, GroupResource, ObjectRef, ProviderSelector
from .condition import Condition
from .decision import decide
from .errors import StateUnavailable
from .labels import LabelSelector
from .objects import KubeObject
from .restmapper import ResourceType, RESTMapper
from .state import ClusterState

# A question a decision asks of the cluster: ("services",), ("services-in", namespace, group), ("group", group),
# ("get", gr, namespace, name, conditions), ("list", gr, namespace, selector, conditions),
# ("carriers", gr, finalizer, conditions); `describe` says each in words.
Question = tuple[Hashable, ...]
FailureReason = Literal["timeout", "error"]


class LiveReadFailed(StateUnavailable):
    """A fresh read could not be made (`reason`: "timeout" or "error")."""

    def __init__(self, message: str, *, reason: FailureReason = "error") -> None:
        self.reason: FailureReason = reason
        super().__init__(message)


class LiveReadTimeout(LiveReadFailed, TimeoutError):
    """A fresh read got no answer within the budget (a TimeoutError too, for callers that count those)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="timeout")


def describe(q: Question) -> str:
    """A question in words, as a denial names the read that failed."""
    match q:
        case ("services",):
            return "the CriticalServices"
        case ("services-in", namespace, group):
            where = f"in namespace {namespace}" if namespace else "with no namespace"
            of = "" if group is None else f" of API group {group or 'core'}"
            return f"the CriticalServices whose provider is {where}{of}"
        case ("group", group):
            return f"the discovery of API group {group or 'core'}"
        case ("get", gr, namespace, name, _):
            return f"{gr} {namespace}/{name}" if namespace else f"{gr} {name}"
        case ("list", gr, namespace, selector, _):
            where = f" in namespace {namespace}" if namespace else ""
            return f"{gr}{where}" + (f" matching {selector}" if selector else "")
        case ("carriers", gr, finalizer, _):
            return f"{gr} carrying finalizer {finalizer}"
    return str(q)


class LiveState:
    """A ClusterState answering from a memo of fresh reads; unanswered questions land in `missing`.

    One LiveState (one memo) serves one confirmation; `LiveReader` fills the memo and re-runs the
    decision. Used on its own, a question it cannot answer yet returns an empty placeholder, so
    check `missing` before trusting any result.
    """

    def __init__(self, memo: Mapping[Question, Any] | None = None, *, mapper: RESTMapper | None = None) -> None:
        self.memo: Mapping[Question, Any] = memo if memo is not None else {}
        self.hint = mapper
        self.missing: set[Question] = set()
        self.failure: LiveReadFailed | None = None
        # The CriticalServices this run has read so far: the criteria a decision evaluates are theirs.
        self._seen: dict[str, CriticalService] = {}

    def _answer(self, q: Question, placeholder: Any) -> Any:
        if q not in self.memo:
            self.missing.add(q)
            return placeholder
        value = self.memo[q]
        if isinstance(value, LiveReadFailed):
            self.failure = value
            raise value
        return value

    def resource_type(self, gr: GroupResource) -> ResourceType | None:
        """The served type for a name: the hint mapper when it knows it, else fresh group discovery."""
        if self.hint is not None:
            t = self.hint.lookup(gr)
            if t is not None:
                return t
        group: RESTMapper | None = self._answer(("group", gr.group), None)
        return group.lookup(gr) if group is not None else None

    # --- ClusterState ---------------------------------------------------------------------------------
    def resolve(self, gr: GroupResource) -> GroupResource | None:
        t = self.resource_type(gr)
        return t.group_resource if t is not None else None

    def get(self, ref: ObjectRef) -> KubeObject | None:
        gr = self.resolve(ref.group_resource)
        if gr is None:
            return None  # not served: no such object can exist
        found: KubeObject | None = self._answer(("get", gr, ref.namespace, ref.name, self._conditions_on(gr)), None)
        return found

    def _conditions_on(self, gr: GroupResource) -> frozenset[Criterion]:
        """The criteria with conditions on gr: part of the question, so a read evaluates them. Any type,
        CriticalServices included: a criterion may name them, with a condition (tests/test_cache_live_agree.py).
        Those of the CriticalServices read so far, which are the ones whose criteria the decision evaluates; an
        object read without a condition's outcome counts for it (`_counts`: only False leaves it out)."""
        return criteria.conditioned_criteria(list(self._seen.values()), self).get(gr, frozenset())

    def _saw(self, services: Collection[CriticalService]) -> Collection[CriticalService]:
        for cs in services:
            self._seen.setdefault(cs.name, cs)
        return services

    def with_finalizer(self, gr: GroupResource, finalizer: str, *,
                       condition: Condition | None = None) -> Collection[KubeObject]:
        objects: list[KubeObject] = self._answer(("carriers", gr, finalizer, self._conditions_on(gr)), [])
        return _in_order([o for o in objects if finalizer in o.finalizers and _counts(o, condition)])

    def select(self, gr: GroupResource, *, namespace: str | None, selector: LabelSelector | None,
               condition: Condition | None = None) -> Collection[KubeObject]:
        text = str(selector) if selector is not None else ""
        objects: list[KubeObject] = self._answer(("list", gr, namespace, text, self._conditions_on(gr)), [])
        # Filtered here too: the answer must not depend on the server honouring labelSelector.
        return _in_order([o for o in objects if (namespace is None or o.namespace == namespace)
                          and (selector is None or selector.matches(o.labels)) and _counts(o, condition)])

    def critical_services(self) -> Collection[CriticalService]:
        services: list[CriticalService] = self._answer(("services",), [])
        return self._saw(services)

    def _services_for(self, namespace: str, group: str | None = None) -> Collection[CriticalService]:
        """Every CriticalService whose provider is in `namespace` ("": none) or names no namespace, of API group
        `group` (None: any): a superset of what `protecting` and `hosted_in` return for an object there. Two
        narrow reads, or the whole list when this confirmation asks for it anyway."""
        if ("services",) in self.memo:
            return self.critical_services()
        services: list[CriticalService] = list(self._answer(("services-in", "", group), []))
        if namespace:
            services += self._answer(("services-in", namespace, group), [])
        return self._saw(services)

    def protecting(self, provider: ObjectRef, labels: Mapping[str, str] | None = None) -> Collection[CriticalService]:
        target = self.resolve(provider.group_resource) or provider.group_resource
        out: list[CriticalService] = []
        for cs in self._services_for(provider.namespace, provider.group_resource.group):
            p = cs.provider
            if p.group_resource.group != provider.group_resource.group:
                continue
            if isinstance(p, ProviderSelector):
                if labels is None:  # a fresh GET of the object: its labels now decide
                    stored = self.get(provider)
                    labels = stored.labels if stored is not None else {}
                if not p.matches(provider.namespace, labels):
                    continue
            elif (p.namespace, p.name) != (provider.namespace, provider.name):
                continue
            if (self.resolve(p.group_resource) or p.group_resource) == target:
                out.append(cs)
        return out

    def hosted_in(self, namespace: str) -> Collection[CriticalService]:
        # A selector without a namespace may select objects in any: the decision LISTs them there.
        # (not one over a cluster-scoped type, such as namespaces: it selects nothing inside a namespace).
        return [cs for cs in self._services_for(namespace) if cs.provider.namespace == namespace or (
            cs.provider.namespace is None
            and getattr(self.resource_type(cs.provider.group_resource), "namespaced", True))]


class _Predicting(LiveState):
    """A LiveState that answers each question from the cache and notes it as missing: one run of `decide` on it
    lists the questions a run on fresh reads will most likely ask, so they can be read at once, in one round
    trip, rather than one round after the other (the CriticalServices, then their criteria's objects)."""

    def __init__(self, cache: ClusterState, *, mapper: RESTMapper | None) -> None:
        super().__init__({}, mapper=mapper)
        self.cache = cache

    def _answer(self, q: Question, placeholder: Any) -> Any:
        self.missing.add(q)
        match q:
            case ("services",):
                return list(self.cache.critical_services())
            case ("services-in", str(namespace), group):
                return [cs for cs in self.cache.critical_services()
                        if provided_in(cs, namespace, group if isinstance(group, str) else None)]
            case ("get", GroupResource() as gr, str(namespace), str(name), _):
                return self.cache.get(ObjectRef(gr, namespace, name))
            case ("list", GroupResource() as gr, namespace, _selector, _):
                # Every object of the namespace: LiveState.select filters by the selector itself.
                return list(self.cache.select(gr, namespace=namespace if isinstance(namespace, str) else None,
                                              selector=None))
            case ("carriers", GroupResource() as gr, str(finalizer), _):
                return list(self.cache.with_finalizer(gr, finalizer))
        return placeholder


def provided_in(cs: CriticalService, namespace: str | None, group: str | None) -> bool:
    """Whether `cs` answers the read of the CriticalServices whose provider is in `namespace` ("": names none; None:
    any) and of API group `group` (None: any), as the API server's field selector on the CRD's selectable fields."""
    return namespace in (None, cs.provider.namespace or "") and group in (None, cs.provider.group_resource.group)


def predict_questions(request: AdmissionRequest, cache: ClusterState, *, mapper: RESTMapper | None) -> set[Question]:
    """The questions `decide(request, <fresh reads>)` will ask if the cluster is as the cache says (only a guess:
    the rounds that follow ask whatever was not foreseen, and the decision is made on fresh reads alone)."""
    predicting = _Predicting(cache, mapper=mapper)
    with contextlib.suppress(StateUnavailable):  # a cache that cannot answer foresees less, nothing else
        decide(request, predicting)
    return predicting.missing


def _counts(obj: KubeObject, condition: Condition | None) -> bool:
    return condition is None or obj.outcome(condition) is not False


def _in_order(objects: list[KubeObject]) -> list[KubeObject]:
    # A real LIST is already in (namespace, name) order (etcd key order); the ClusterState contract
    # must not depend on the server (or a stand-in) honouring that.
    objects.sort(key=lambda o: (o.namespace, o.name))
    return objects


__all__ = ["FailureReason", "LiveReadFailed", "LiveReadTimeout", "LiveState", "Question", "describe",
           "predict_questions", "provided_in"]
