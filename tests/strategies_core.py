"""Hypothesis strategies for the pure core: small random clusters and the CriticalServices guarding them.

The world is deliberately tiny (three namespaces, a handful of names, two finalizers, three label keys)
so that random criteria actually hit random objects: most generated examples have a protected
provider, and both outcomes (allowed, denied) are common. Everything is generated as raw JSON
manifests, the form a snapshot has, so the oracle in the tests reads the same input the gate reads
and shares no parsing with it.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import attrs
from hypothesis import strategies as st

NAMESPACES = ("ns-a", "ns-b", "ns-c")
PROVIDER_NAMESPACES = NAMESPACES[:2]
PROVIDER_NAMES = ("p0", "p1")
OBJECT_NAMES = ("p0", "p1", "x")
SERVICE_NAMES = ("cs0", "cs1", "cs2", "cs3")
CANDIDATE = "candidate"
FINALIZERS = ("example.com/a", "example.com/b")
# The label every namespace carries (Kubernetes >= 1.21), so selectors can aim at namespaces.
NS_NAME_LABEL = "kubernetes.io/metadata.name"
LABEL_VALUES: dict[str, tuple[str, ...]] = {"app": ("web", "db"), "tier": ("front", "back"), NS_NAME_LABEL: NAMESPACES}
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
CRD_NAME = "coolresources.my.crd.group"


@attrs.frozen
class Type:
    """A resource type of the generated world and every way a CriticalService may spell it."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    builtin: bool = True  # False: known only through its CRD (or guessed from its instances)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def spellings(self) -> tuple[str, ...]:
        return (self.plural, self.kind, self.kind.lower(), *self.short_names)


TYPES: dict[str, Type] = {
    "pods": Type("", "v1", "Pod", "pods", True, ("po",)),
    "configmaps": Type("", "v1", "ConfigMap", "configmaps", True, ("cm",)),
    "deployments": Type("apps", "v1", "Deployment", "deployments", True, ("deploy",)),
    "statefulsets": Type("apps", "v1", "StatefulSet", "statefulsets", True, ("sts",)),
    "namespaces": Type("", "v1", "Namespace", "namespaces", False, ("ns",)),
    "criticalservices": Type("criticalsvc.io", "v1alpha1", "CriticalService", "criticalservices", False, ("csvc",)),
    "coolresources": Type("my.crd.group", "v1", "CoolResource", "coolresources", True, ("cool",), builtin=False),
    # Never served: no CRD and no instances, so every criterion naming it holds.
    "gizmos": Type("example.com", "v1", "Gizmo", "gizmos", True, (), builtin=False),
}
OBJECT_TYPES = ("pods", "configmaps", "deployments", "statefulsets", "namespaces", "coolresources")
PROVIDER_TYPES = ("deployments", "statefulsets")
# What criteria name, weighted (by repetition) towards the types that providers and objects have, so that
# criteria usually cover something and cycles through providers and namespaces are common.
CRITERION_TYPES = ("pods", "configmaps", "deployments", "deployments", "statefulsets", "namespaces", "namespaces",
                   "criticalservices", "coolresources", "coolresources", "gizmos")


@attrs.frozen
class World:
    """A snapshot: plain objects, whether the CoolResource CRD is in it, and CriticalService manifests."""

    crd_present: bool
    objects: tuple[dict[str, Any], ...]
    services: tuple[dict[str, Any], ...]

    def manifests(self) -> list[dict[str, Any]]:
        crd = [crd_manifest()] if self.crd_present else []
        return [*crd, *self.objects, *self.services]


def crd_manifest() -> dict[str, Any]:
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": CRD_NAME},
            "spec": {"group": "my.crd.group", "scope": "Namespaced",
                     "names": {"plural": "coolresources", "singular": "coolresource", "kind": "CoolResource",
                               "shortNames": ["cool"]},
                     "versions": [{"name": "v1", "served": True, "storage": True}]}}


@functools.cache
def pick(values: tuple[Any, ...]) -> st.SearchStrategy[Any]:
    """st.sampled_from, built once per tuple: building strategies inside draws dominated the runtime."""
    return st.sampled_from(values)


@functools.cache
def label_sets(keys: tuple[str, ...] = ("app", "tier")) -> st.SearchStrategy[dict[str, str]]:
    return st.fixed_dictionaries({}, optional={k: pick(LABEL_VALUES[k]) for k in keys})


_FINALIZER_LISTS = st.lists(pick(FINALIZERS), unique=True, max_size=2)
_MATCH_LABELS = label_sets(tuple(LABEL_VALUES))
_VALUE_LISTS = {k: st.lists(pick(v), min_size=1, max_size=2, unique=True) for k, v in LABEL_VALUES.items()}


@st.composite
def objects(draw: st.DrawFn) -> dict[str, Any]:
    t = TYPES[draw(pick(OBJECT_TYPES))]
    metadata: dict[str, Any] = {}
    if t.namespaced:
        metadata["namespace"] = draw(pick(NAMESPACES))
        metadata["name"] = draw(pick(OBJECT_NAMES))
        metadata["labels"] = draw(label_sets())
    else:
        metadata["name"] = draw(pick(NAMESPACES))
        metadata["labels"] = {**draw(label_sets()), NS_NAME_LABEL: metadata["name"]}
    finalizers = draw(_FINALIZER_LISTS)
    if finalizers:
        metadata["finalizers"] = finalizers
    return {"apiVersion": t.api_version, "kind": t.kind, "metadata": metadata}


@st.composite
def selectors(draw: st.DrawFn) -> dict[str, Any] | None:
    form = draw(pick(("absent", "empty", "matchLabels", "matchExpressions", "both")))
    if form == "absent":
        return None
    selector: dict[str, Any] = {}
    if form in ("matchLabels", "both"):
        selector["matchLabels"] = draw(_MATCH_LABELS)
    if form in ("matchExpressions", "both"):
        expressions = []
        for _ in range(draw(st.integers(1, 2))):
            key = draw(pick(tuple(LABEL_VALUES)))
            operator = draw(pick(OPERATORS))
            expression: dict[str, Any] = {"key": key, "operator": operator}
            if operator in ("In", "NotIn"):
                expression["values"] = draw(_VALUE_LISTS[key])
            expressions.append(expression)
        selector["matchExpressions"] = expressions
    return selector


def _spelled(draw: st.DrawFn, type_key: str) -> tuple[Type, dict[str, str]]:
    t = TYPES[type_key]
    return t, {"group": t.group, "resource": draw(pick(t.spellings))}


@st.composite
def criteria(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(pick(("Finalizer", "SpecificResource", "Resources")))
    t, body = _spelled(draw, draw(pick(CRITERION_TYPES)))
    if kind == "Finalizer":
        return {"type": kind, "finalizer": {**body, "finalizerName": draw(pick(FINALIZERS))}}
    if kind == "SpecificResource":
        if t.plural == "namespaces":
            name = draw(pick(NAMESPACES))
        elif t.plural == "criticalservices":
            name = draw(pick((*SERVICE_NAMES, CANDIDATE)))
        else:
            name = draw(pick(OBJECT_NAMES))
        namespace = draw(pick(NAMESPACES)) if t.namespaced else ""
        return {"type": kind, "specificResource": {**body, "namespace": namespace, "name": name}}
    resources: dict[str, Any] = dict(body)
    namespace = draw(pick((None, *NAMESPACES)))
    if namespace is not None:
        resources["namespace"] = namespace
    selector = draw(selectors())
    if selector is not None:
        resources["selector"] = selector
    return {"type": kind, "resources": resources}


@st.composite
def providers(draw: st.DrawFn) -> dict[str, str]:
    _, body = _spelled(draw, draw(pick(PROVIDER_TYPES)))
    return {**body, "namespace": draw(pick(PROVIDER_NAMESPACES)), "name": draw(pick(PROVIDER_NAMES))}


@st.composite
def critical_services(draw: st.DrawFn, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"provider": draw(providers()), "criteria": draw(st.lists(criteria(), min_size=1,
                                                                                        max_size=3))}
    enforcement = draw(pick((None, None, "Enforce", "Warn")))
    if enforcement is not None:
        spec["enforcement"] = enforcement
    return {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService",
            "metadata": {"name": name, "labels": draw(label_sets(("tier",)))}, "spec": spec}


def _object_key(obj: dict[str, Any]) -> tuple[str, str, str]:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def provider_object(service: dict[str, Any]) -> dict[str, Any]:
    p = service["spec"]["provider"]
    t = next(TYPES[k] for k in PROVIDER_TYPES if p["resource"] in TYPES[k].spellings)
    return {"apiVersion": t.api_version, "kind": t.kind, "metadata": {"name": p["name"], "namespace": p["namespace"]}}


@st.composite
def worlds(draw: st.DrawFn, *, min_services: int = 0) -> World:
    """A snapshot with up to four CriticalServices, most of whose providers exist."""
    names = draw(st.lists(pick(SERVICE_NAMES), unique=True, min_size=min_services,
                          max_size=len(SERVICE_NAMES)))
    services = tuple(draw(critical_services(n)) for n in names)
    objs = draw(st.lists(objects(), min_size=2, max_size=14, unique_by=_object_key))
    # Most providers exist (a namespace DELETE only waits for providers that are there).
    keys = {_object_key(o) for o in objs}
    for s in services:
        provider = provider_object(s)
        if _object_key(provider) not in keys and draw(st.integers(0, 3)) > 0:
            keys.add(_object_key(provider))
            provider["metadata"]["labels"] = draw(label_sets())
            provider["metadata"]["finalizers"] = draw(_FINALIZER_LISTS)
            objs.append(provider)
    return World(crd_present=draw(st.booleans()), objects=tuple(objs), services=services)


@attrs.frozen
class Target:
    """The object a DELETE is for, as the API server names it (plural resource)."""

    group: str
    resource: str
    namespace: str
    name: str
    collection_item: bool  # an item of a deletecollection: request.name is ""


@st.composite
def provider_deletes(draw: st.DrawFn) -> tuple[World, Target]:
    """A world and the DELETE of a provider; usually one that some CriticalService protects."""
    world = draw(worlds())
    pool = [(t, ns, n) for t in PROVIDER_TYPES for ns in PROVIDER_NAMESPACES for n in PROVIDER_NAMES]
    protected = [(next(k for k in PROVIDER_TYPES if s["spec"]["provider"]["resource"] in TYPES[k].spellings),
                  s["spec"]["provider"]["namespace"], s["spec"]["provider"]["name"]) for s in world.services]
    type_key, namespace, name = draw(pick(tuple(protected)) if protected and draw(st.integers(0, 3)) > 0
                                     else pick(tuple(pool)))
    t = TYPES[type_key]
    return world, Target(t.group, t.plural, namespace, name, draw(st.booleans()))


@st.composite
def namespace_deletes(draw: st.DrawFn) -> tuple[World, Target]:
    """A world and the DELETE of a namespace, usually one that providers live in."""
    world = draw(worlds())
    name = draw(pick(PROVIDER_NAMESPACES if draw(st.integers(0, 3)) > 0 else NAMESPACES))
    return world, Target("", "namespaces", name, name, draw(st.booleans()))


@st.composite
def aimed_criteria(draw: st.DrawFn, at: dict[str, Any]) -> dict[str, Any]:
    """A criterion covering part of `at`'s teardown: its provider, its provider's namespace, or `at` itself."""
    p = at["spec"]["provider"]
    aim = draw(pick(("provider", "provider-by-selector", "namespace", "service")))
    if aim == "provider":
        return {"type": "SpecificResource", "specificResource": dict(p)}
    if aim == "provider-by-selector":
        return {"type": "Resources", "resources": {"group": p["group"], "resource": p["resource"],
                                                   "namespace": p["namespace"]}}
    if aim == "namespace":
        _, body = _spelled(draw, "namespaces")
        return {"type": "SpecificResource", "specificResource": {**body, "name": p["namespace"]}}
    _, body = _spelled(draw, "criticalservices")
    return {"type": "SpecificResource", "specificResource": {**body, "name": at["metadata"]["name"]}}


@st.composite
def service_creates(draw: st.DrawFn) -> tuple[World, dict[str, Any]]:
    """A world and a new CriticalService (named `candidate`) to CREATE in it.

    Random criteria rarely line up into cycles, so some criteria are aimed: the candidate at an existing
    service, an existing service at the candidate, one existing service at another. Whether a cycle
    closes still depends on everything else drawn (which objects exist, their labels, the spellings).
    """
    world = draw(worlds(min_services=1))
    services = [copy.deepcopy(s) for s in world.services]
    candidate = draw(critical_services(CANDIDATE))
    everyone = [*services, candidate]
    for _ in range(draw(st.integers(0, 3))):
        waiter = everyone[draw(st.integers(0, len(everyone) - 1))]
        awaited = everyone[draw(st.integers(0, len(everyone) - 1))]
        waiter["spec"]["criteria"].append(draw(aimed_criteria(awaited)))
    return attrs.evolve(world, services=tuple(services)), candidate


# --- conditions (criticalsvc/condition.py) ----------------------------------------------------------------
# Pods of one namespace with every shape a condition meets: a phase or no status at all, replicas as a
# number, as a string (a wrong type) or missing. The conditions are of two restricted forms a test can
# evaluate in plain Python: `object.status.phase in [...]` and `object.spec.replicas > N`.
PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")


@attrs.frozen
class RestrictedCondition:
    """A condition of a form plain Python can evaluate: its CEL text and its fields."""

    form: str  # "phase-in" | "replicas-gt"
    phases: tuple[str, ...] = ()
    bound: int = 0

    @property
    def expression(self) -> str:
        if self.form == "phase-in":
            return "object.status.phase in [" + ", ".join(f"'{p}'" for p in self.phases) + "]"
        return f"object.spec.replicas > {self.bound}"


restricted_conditions = st.one_of(
    st.builds(RestrictedCondition, form=st.just("phase-in"),
              phases=st.lists(st.sampled_from(PHASES), max_size=3, unique=True).map(tuple)),
    st.builds(RestrictedCondition, form=st.just("replicas-gt"), bound=st.integers(-2, 3)),
)


@st.composite
def condition_pods(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Up to six pods in namespace ns-a, each with or without a phase and a replicas field of any type."""
    pods = []
    for i in range(draw(st.integers(0, 6))):
        pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"pod-{i}", "namespace": "ns-a"},
                               "spec": {}}
        phase = draw(st.none() | st.sampled_from(PHASES))
        if phase is not None:
            pod["status"] = {"phase": phase}
        replicas = draw(st.none() | st.integers(-3, 4) | st.just("2"))
        if replicas is not None:
            pod["spec"]["replicas"] = replicas
        pods.append(pod)
    return pods
