"""The configurations the explorer checks: a fixed catalogue of objects, and every set of CriticalServices
over it up to a bound.

**The catalogue** (6 objects in 2 namespaces), chosen so that every edge of the rules has material:

    Namespace a, Namespace b
    Deployment a/d                      a built-in provider type the shipped webhook routes
    ConfigMap b/c        app=x          a built-in type the gate routes itself; optionally labelled
                                        criticalsvc.io/deletion-protected: Always (rule 5)
    CRD widgets.ex.com                  a custom type; CRD cleanup deletes its instances without admission
    Widget b/w           app=x          its instance; carries the finalizer ex.com/cleanup when a Finalizer
                                        criterion names it (the simulator then runs that criterion's
                                        provider as the controller that removes it)

**Providers** (named and selected, built-in and custom, cluster-scoped too) and **criteria** (Finalizer,
SpecificResource, Resources; on objects, CRDs, namespaces, selectors) are the menus PROVIDERS and
CRITERIA. A CriticalService is a provider and 1..`criteria` distinct criteria; a configuration is a
multiset of up to `services` CriticalServices, created in a canonical order through the real gate.

**Symmetry reduction, and why it is sound.** CriticalServices are a multiset, named cs0, cs1, ... in the
canonical order: the rules read a CriticalService's spec, never its name, except to sort messages and
the order in which a one-pass kubectl reaches them, and that order is a choice point of its own
(criticalsvc/verify/interleavings.py). A configuration whose CREATEs are not all admitted is not run: the
cycle check refuses exactly a CREATE that closes a cycle through it (graph.check_no_cycle), and the
service graph only gains edges as services are added, so the admitted services of any order form an
acyclic set, itself a configuration of the enumeration, admitted in every order.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import yaml

from ..errors import InvalidInput

GROUP, PLURAL, KIND = "ex.com", "widgets", "Widget"
CRD_NAME = f"{PLURAL}.{GROUP}"
FINALIZER = f"{GROUP}/cleanup"
PROTECTED = {"criticalsvc.io/deletion-protected": "Always"}
ROOT = "stack"  # the ClusterRole that owns everything in a garbage-collected teardown

# The catalogue, in the order a bundle file lists it (namespaces, the CRD, then its content).
OBJECTS: dict[str, dict[str, Any]] = {
    "ns-a": {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}},
    "ns-b": {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "b"}},
    "crd": {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": {"name": CRD_NAME},
            "spec": {"group": GROUP, "scope": "Namespaced",
                     "names": {"plural": PLURAL, "singular": KIND.lower(), "kind": KIND},
                     "versions": [{"name": "v1", "served": True, "storage": True}]}},
    "deploy": {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": "a"}},
    "cm": {"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": "c", "namespace": "b", "labels": {"app": "x"}}},
    "widget": {"apiVersion": f"{GROUP}/v1", "kind": KIND,
               "metadata": {"name": "w", "namespace": "b", "labels": {"app": "x"}}},
}

_X = {"matchLabels": {"app": "x"}}
PROVIDERS: dict[str, dict[str, Any]] = {
    "deploy": {"group": "apps", "resource": "deployments", "namespace": "a", "name": "d"},
    "cm": {"resource": "configmaps", "namespace": "b", "name": "c"},
    "widget": {"group": GROUP, "resource": PLURAL, "namespace": "b", "name": "w"},
    "cm-selector": {"resource": "configmaps", "selector": _X},
    "widget-selector": {"group": GROUP, "resource": PLURAL, "namespace": "b", "selector": _X},
    "ns-a": {"resource": "namespaces", "name": "a"},
    "crd": {"group": "apiextensions.k8s.io", "resource": "customresourcedefinitions", "name": CRD_NAME},
}


def _specific(group: str, resource: str, name: str, namespace: str | None = None) -> dict[str, Any]:
    ref = {"group": group, "resource": resource, "name": name, **({"namespace": namespace} if namespace else {})}
    return {"type": "SpecificResource", "specificResource": ref}


CRITERIA: dict[str, dict[str, Any]] = {
    "finalizer": {"type": "Finalizer", "finalizer": {"group": GROUP, "resource": PLURAL, "finalizerName": FINALIZER}},
    "deploy": _specific("apps", "deployments", "d", "a"),
    "cm": _specific("", "configmaps", "c", "b"),
    "widget": _specific(GROUP, PLURAL, "w", "b"),
    "crd": _specific("apiextensions.k8s.io", "customresourcedefinitions", CRD_NAME),
    "ns-b": _specific("", "namespaces", "b"),
    "cm-in-b": {"type": "Resources", "resources": {"resource": "configmaps", "namespace": "b", "selector": _X}},
    "widgets": {"type": "Resources", "resources": {"group": GROUP, "resource": PLURAL}},
    "deploys-in-a": {"type": "Resources", "resources": {"group": "apps", "resource": "deployments", "namespace": "a"}},
}


class BadBound(InvalidInput):
    """A bound that names something the catalogue does not have, or a size out of range."""

    def __init__(self, problem: str) -> None:
        super().__init__("--bound", problem)


# Bound.enforcement's values, as describe() says them.
ENFORCEMENT = {"providers": "the first configuration of one CriticalService for each provider",
               "all": "every configuration",
               "off": "no configuration"}


@attrs.frozen
class Bound:
    """How far the explorer goes (`criticalsvc verify --bound`, e.g. `services=2,criteria=1,depth=3`)."""

    services: int = 1  # CriticalServices per configuration, at most
    criteria: int = 1  # criteria per CriticalService, at most
    providers: tuple[str, ...] = tuple(PROVIDERS)
    criteria_menu: tuple[str, ...] = tuple(CRITERIA)
    protected_label: bool = False  # also every configuration with ConfigMap b/c labelled deletion-protected
    protected_only: bool = False  # only those (`protected=only`: the other half of a run done before)
    depth: int = 2  # choice points explored exhaustively per run (criticalsvc/verify/interleavings.py)
    # Which admitted configurations also have every interleaving of the leader's labelling and routing explored, with
    # an API server lagging on webhook configurations (criticalsvc/verify/enforcement.py): `providers`, the first
    # of one CriticalService for each provider (what the leader labels and routes depends on the providers alone; the
    # criteria only decide what the gate refuses); `all` (pairs too: slow); or `off`.
    enforcement: str = "providers"

    def describe(self) -> str:
        return (f"up to {self.services} CriticalService(s) with up to {self.criteria} criteria each, over "
                f"{len(OBJECTS)} objects in 2 namespaces; providers {', '.join(self.providers)}; criteria "
                f"{', '.join(self.criteria_menu)}; deletion-protected label "
                f"{'on only' if self.protected_only else 'both ways' if self.protected_label else 'off'}"
                f"; interleavings exhaustive over the first {self.depth} choice points of every run"
                f"; the leader's steps with a lagging API server explored for {ENFORCEMENT[self.enforcement]}")


# The bound CI runs (tests/test_verify.py, within ~45 s on 2 cores) and the one `nox -s explore` runs.
BOUNDS: dict[str, Bound] = {
    "ci": Bound(services=1, criteria=1, depth=1),
    # Pairs, where cycles live, over the providers and criteria that reach across objects, types and namespaces.
    "ci-pairs": Bound(services=2, criteria=1, providers=("deploy", "widget", "cm-selector", "ns-a"),
                      criteria_menu=("crd", "deploy", "cm", "ns-b", "widgets"), depth=0, enforcement="off"),
    # Triples, where cycles of three and two services sharing a namespace live: 219 configurations, 159 of them refused
    # at CREATE (151 inferred from a refused pair), 720 teardowns, about 6.5 s of CPU.
    "ci-triples": Bound(services=3, criteria=1, providers=("deploy", "widget", "cm-selector"),
                        criteria_menu=("crd", "deploy", "cm"), depth=0, enforcement="off"),
    # 4,158 configurations, 90,120 interleavings: 36 min on a loaded 2-core machine (design/criticalservice.md §7).
    "large": Bound(services=2, criteria=1, protected_label=True, depth=1),
}
_INTS = ("services", "criteria", "depth")
_MAX = {"services": 4, "criteria": 3, "depth": 64}


def parse_bound(text: str) -> Bound:
    """A named bound (`ci`, `ci-pairs`, `ci-triples`, `large`) or `key=value,...` over one (`large,depth=3`):
    services, criteria, depth (integers), protected (yes/no/only), providers and criteria_menu (`+`-separated keys),
    enforcement (providers/all/off)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise BadBound("empty; expected ci, large or key=value,... (e.g. services=2,depth=3)")
    bound = Bound()
    if "=" not in parts[0]:
        if parts[0] not in BOUNDS:
            raise BadBound(f"unknown bound {parts[0]!r}; expected one of {', '.join(BOUNDS)} or key=value")
        bound, parts = BOUNDS[parts[0]], parts[1:]
    values: dict[str, Any] = {}
    for part in parts:
        key, eq, value = part.partition("=")
        if not eq:
            raise BadBound(f"{part!r} is not key=value")
        if key in _INTS:
            if not value.isdigit() or (not 1 <= int(value) <= _MAX[key] and not (key == "depth" and value == "0")):
                raise BadBound(f"{key}={value!r}: expected an integer from {0 if key == 'depth' else 1} "
                               f"to {_MAX[key]}")
            values[key] = int(value)
        elif key == "enforcement":
            if value not in ENFORCEMENT:
                raise BadBound(f"enforcement={value!r}: expected providers, all or off")
            values["enforcement"] = value
        elif key == "protected":
            if value not in ("yes", "no", "only"):
                raise BadBound(f"protected={value!r}: expected yes, no or only")
            values["protected_label"] = value != "no"
            values["protected_only"] = value == "only"
        elif key in ("providers", "criteria_menu"):
            menu = PROVIDERS if key == "providers" else CRITERIA
            keys = tuple(k for k in value.split("+") if k)
            unknown = [k for k in keys if k not in menu]
            if unknown or not keys:
                raise BadBound(f"{key}: unknown {', '.join(unknown) or '(none given)'}; expected "
                               f"+-separated keys of {', '.join(menu)}")
            values[key] = keys
        else:
            raise BadBound(f"unknown key {key!r}; expected services, criteria, depth, protected, providers, "
                           "criteria_menu, enforcement")
    return attrs.evolve(bound, **values)


@attrs.frozen(order=True)
class Service:
    """One CriticalService of a configuration: a provider key and criterion keys (sorted, distinct)."""

    provider: str
    criteria: tuple[str, ...]

    def label(self) -> str:
        return f"{self.provider}<-[{','.join(self.criteria)}]"


@attrs.frozen
class Configuration:
    services: tuple[Service, ...]  # in CREATE order; named cs0, cs1, ...
    objects: tuple[str, ...] = tuple(OBJECTS)  # catalogue keys present (minimization drops some)
    protected: bool = False  # ConfigMap b/c labelled deletion-protected: Always

    def label(self) -> str:
        extra = [] if self.objects == tuple(OBJECTS) else [f"objects={'+'.join(self.objects)}"]
        return "; ".join([*(f"cs{i}: {s.label()}" for i, s in enumerate(self.services)),
                          *(["cm protected"] if self.protected else []), *extra]) or "no CriticalService"

    @property
    def finalizer(self) -> bool:
        return any("finalizer" in s.criteria for s in self.services)


def configurations(bound: Bound) -> Iterator[Configuration]:
    """Every configuration within `bound`, each multiset of CriticalServices once (module docstring)."""
    services = [Service(p, cs) for p in bound.providers
                for k in range(1, bound.criteria + 1) for cs in itertools.combinations(bound.criteria_menu, k)]
    for protected in (True,) if bound.protected_only else (False, True) if bound.protected_label else (False,):
        for n in range(1, bound.services + 1):
            for chosen in itertools.combinations_with_replacement(services, n):
                yield Configuration(tuple(chosen), protected=protected)


def service_name(i: int) -> str:
    return f"cs{i}"


_OWNER = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "name": ROOT}


def critical_service(config: Configuration, i: int, *, replay: bool, owned: bool = False) -> dict[str, Any]:
    s = config.services[i]
    spec: dict[str, Any] = {"provider": PROVIDERS[s.provider], "criteria": [CRITERIA[c] for c in s.criteria]}
    if replay:
        spec["replayDeletion"] = "WhenTearingDown"
    md: dict[str, Any] = {"name": service_name(i), **({"ownerReferences": [dict(_OWNER)]} if owned else {})}
    return {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": md, "spec": spec}


def objects(config: Configuration, *, owned: bool = False) -> list[dict[str, Any]]:
    """The catalogue objects of `config` as manifests; `owned`: each owned by the ClusterRole ROOT (listed
    first), so that deleting ROOT leaves the rest to the garbage collector."""
    out: list[dict[str, Any]] = []
    if owned:
        out.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": ROOT}})
    for key in config.objects:
        obj = copy.deepcopy(OBJECTS[key])
        md = obj["metadata"]
        if key == "widget" and config.finalizer:
            md["finalizers"] = [FINALIZER]
        if key == "cm" and config.protected:
            md["labels"] = {**md.get("labels", {}), **PROTECTED}
        if owned:
            md["ownerReferences"] = [dict(_OWNER)]
        out.append(obj)
    return out


def bundle_yaml(docs: list[Mapping[str, Any]], *, header: str) -> str:
    """A bundle file `criticalsvc simulate -f` loads, with `header` as its leading comment."""
    comment = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines())
    return comment + str(yaml.safe_dump_all([dict(d) for d in docs], sort_keys=False, default_flow_style=None))
