"""A cluster state from manifests: `kubectl get ... -o yaml` output, a bundle, or a test fixture.

CRDs are read first so that the objects they serve map to the right resource (and so a criterion
naming a Kind resolves); CriticalServices are parsed and indexed, and a broken one is an error that
names its file and document, because an offline answer built on a silently skipped CriticalService
would be wrong. CriticalServices are read before the other objects too, so that every object is
projected with the outcomes of the conditions of the criteria it is a candidate of (criticalsvc/condition.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .api import API_VERSION, CRDS, KIND, Criterion, CriticalService, GroupResource, parse_critical_service
from .errors import InvalidInput, MalformedManifest
from .manifests import Manifest
from .objects import KubeObject
from .projection import conditioned_criteria, project_for
from .restmapper import ResourceType, RESTMapper, guess_resource
from .state import MemoryState


def is_critical_service(obj: Mapping[str, Any]) -> bool:
    group = API_VERSION.split("/")[0]
    return obj.get("kind") == KIND and str(obj.get("apiVersion", "")).startswith(group + "/")


def build_state(manifests: Iterable[Manifest], *, mapper: RESTMapper | None = None,
                on_invalid: Callable[[Manifest, InvalidInput], None] | None = None,
                check_crds: bool = False) -> MemoryState:
    """The state the manifests describe. An invalid document raises, unless `on_invalid` is given: then
    each one is passed to it and left out, so a caller can report every problem at once; `check_crds`
    also reports a CRD the mapper cannot learn (no group, plural or kind), which is otherwise skipped."""
    manifests = list(manifests)
    state = MemoryState(mapper)
    for m in manifests:
        if state.mapper.resource_for_kind(m.api_version, m.kind) == CRDS and \
                state.mapper.learn_crd(m.obj) is None and check_crds and on_invalid is not None:
            on_invalid(m, MalformedManifest("spec", "a CustomResourceDefinition needs spec.group, spec.names.plural "
                                            "and spec.names.kind", where=m.where))
    for m in manifests:
        # An instance proves its type is served even when the snapshot omits the CRD (`kubectl get
        # coolresources -A -o yaml`); unregistered, its criteria would read as met and ALLOW a protected delete.
        group, _, version = m.api_version.rpartition("/")
        if state.mapper.for_kind(group, m.kind) is None:
            metadata = m.obj.get("metadata")
            namespaced = isinstance(metadata, Mapping) and bool(metadata.get("namespace"))
            state.mapper.add(ResourceType(group, version, m.kind, guess_resource(m.kind), m.kind.lower(), namespaced))
    services: list[CriticalService] = []
    for m in manifests:
        if is_critical_service(m.obj):
            try:
                services.append(parse_critical_service(m.obj))
            except InvalidInput:
                continue  # reported with its file and document below
    conditioned = conditioned_criteria(services, state)
    for m in manifests:
        try:
            add_manifest(state, m, conditioned=conditioned)
        except InvalidInput as exc:
            if on_invalid is None:
                raise
            on_invalid(m, exc)
    return state


def add_manifest(state: MemoryState, m: Manifest, *,
                 conditioned: Mapping[GroupResource, frozenset[Criterion]] | None = None) -> KubeObject:
    gr = state.mapper.resource_for_kind(m.api_version, m.kind)
    try:
        obj = project_for(m.obj, gr, (conditioned or {}).get(gr, frozenset()))
        if is_critical_service(m.obj):
            state.upsert_critical_service(parse_critical_service(m.obj))
    except InvalidInput as exc:
        raise exc.located(m.where) from None
    t = state.mapper.lookup(gr)
    if t is not None and not t.namespaced and obj.namespace:
        raise MalformedManifest("metadata.namespace", f"{m.kind} is cluster-scoped", where=m.where)
    state.upsert(obj)
    return obj
