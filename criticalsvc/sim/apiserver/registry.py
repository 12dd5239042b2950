"""What the stand-in serves: the store's resource types, plus the types, subresources and verbs the
real API server registers beside them (its REST storage, k8s.io/kubernetes pkg/controlplane and
pkg/registry), and the CRD that describes a custom resource.

Discovery, OpenAPI, printing and the write strategies all ask this module, so they agree on what
exists. Functions taking a Store must be called holding it (StandIn.read / StandIn.write).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from ...api import CRDS, CRITICAL_SERVICES, NAMESPACES, GroupResource
from ...restmapper import WELL_KNOWN, ResourceType
from ..store import Store

# Types served on top of the store's mapper: events.k8s.io/v1 Events are a plain collection here
# (the real API server stores them with core Events).
EXTRA_TYPES = (ResourceType("events.k8s.io", "v1", "Event", "events", "event", True, ("ev",)),)
VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
# Built-in resources without a status subresource (kubectl api-resources, 1.32).
NO_STATUS = frozenset({
    GroupResource("", "events"), GroupResource("events.k8s.io", "events"), GroupResource("", "configmaps"),
    GroupResource("", "secrets"), GroupResource("", "serviceaccounts"), GroupResource("", "endpoints"),
    GroupResource("", "limitranges"), GroupResource("coordination.k8s.io", "leases"),
    *(GroupResource("rbac.authorization.k8s.io", r) for r in ("roles", "rolebindings", "clusterroles",
                                                              "clusterrolebindings")),
    GroupResource("admissionregistration.k8s.io", "validatingwebhookconfigurations"),
    GroupResource("admissionregistration.k8s.io", "mutatingwebhookconfigurations"),
})
# Discovery categories of built-in types (`kubectl get all` lists the `all` category).
BUILTIN_CATEGORIES: dict[GroupResource, tuple[str, ...]] = {
    **{GroupResource(g, r): ("all",) for g, r in (
        ("", "pods"), ("", "replicationcontrollers"), ("", "services"), ("apps", "daemonsets"),
        ("apps", "deployments"), ("apps", "replicasets"), ("apps", "statefulsets"),
        ("autoscaling", "horizontalpodautoscalers"), ("batch", "cronjobs"), ("batch", "jobs"))},
    **{GroupResource(g, r): ("api-extensions",) for g, r in (
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"),
        ("admissionregistration.k8s.io", "validatingwebhookconfigurations"),
        ("apiextensions.k8s.io", "customresourcedefinitions"))},
}
# Workloads with a `scale` subresource (autoscaling/v1 Scale; `kubectl scale`).
SCALABLE = frozenset({GroupResource("apps", "deployments"), GroupResource("apps", "replicasets"),
                      GroupResource("apps", "statefulsets")})
SCALE_KIND = {"group": "autoscaling", "version": "v1", "kind": "Scale"}
SCALE_TYPE = ResourceType("autoscaling", "v1", "Scale", "scale", "scale", True)
SUBRESOURCE_VERBS = {"status": ["get", "patch", "update"], "finalize": ["update"], "scale": ["get", "patch", "update"]}
# Create-only review APIs without storage: `kubectl auth can-i` (and --list), `kubectl auth whoami`.
REVIEWS: dict[GroupResource, ResourceType] = {t.group_resource: t for t in (
    ResourceType("authorization.k8s.io", "v1", "SelfSubjectAccessReview", "selfsubjectaccessreviews",
                 "selfsubjectaccessreview", False),
    ResourceType("authorization.k8s.io", "v1", "SelfSubjectRulesReview", "selfsubjectrulesreviews",
                 "selfsubjectrulesreview", False),
    ResourceType("authentication.k8s.io", "v1", "SelfSubjectReview", "selfsubjectreviews", "selfsubjectreview",
                 False),
)}
# Kinds compiled into kubectl and the API server (strategic merge patch works on these only).
NOT_BUILTIN_GROUPS = frozenset({"criticalsvc.io", "work.open-cluster-management.io"})
BUILTIN = frozenset({t.group_resource for t in (*WELL_KNOWN, *EXTRA_TYPES) if t.group not in NOT_BUILTIN_GROUPS})
BUILTIN_GROUPS = frozenset(t.group for t in (*WELL_KNOWN, *REVIEWS.values()) if t.group not in NOT_BUILTIN_GROUPS)


class Served(NamedTuple):
    """A resource type as discovery shows it."""

    type: ResourceType
    status: bool
    categories: tuple[str, ...]
    verbs: tuple[str, ...] = VERBS


def subresources(t: ResourceType, status: bool) -> list[str]:
    """The subresources of `t` (`status` when it has one), in discovery order."""
    subs = ["status"] if status else []
    if t.group_resource == NAMESPACES:
        subs.append("finalize")
    if t.group_resource in SCALABLE:
        subs.append("scale")
    return subs


def stored_crd(store: Store, t: ResourceType) -> dict[str, Any] | None:
    """The CustomResourceDefinition that serves `t`, if one is stored."""
    return store.get(CRDS, "", f"{t.plural}.{t.group}") if t.group else None


def describing_crd(store: Store, t: ResourceType, crd_path: Path | None) -> dict[str, Any] | None:
    """The CRD that describes `t`: the stored one, else for CriticalServices the manifest at `crd_path`
    (the gate's own type is known before its CRD is applied)."""
    crd = stored_crd(store, t)
    if crd is None and t.group_resource == CRITICAL_SERVICES:
        crd = load_crd(crd_path)
    return crd


def has_status(store: Store, t: ResourceType) -> bool:
    """Whether `t` has a status subresource (a CRD's version declares it; most built-ins have one)."""
    crd = stored_crd(store, t)
    if crd is None:
        return t.group_resource not in NO_STATUS
    for v in (crd.get("spec") or {}).get("versions") or []:
        if isinstance(v, Mapping) and v.get("name") == t.version:
            return isinstance((v.get("subresources") or {}).get("status"), Mapping)
    return False


def categories(store: Store, t: ResourceType, crd_path: Path | None) -> list[str]:
    """The discovery categories of `t` (`kubectl get all`)."""
    crd = describing_crd(store, t, crd_path)
    if crd is None:
        return list(BUILTIN_CATEGORIES.get(t.group_resource, ()))
    names = (crd.get("spec") or {}).get("names") or {}
    found = names.get("categories") if isinstance(names, Mapping) else None
    return [str(c) for c in found] if isinstance(found, list) else []


def served_types(store: Store) -> list[ResourceType]:
    """The store's types, in (group, plural) order."""
    return sorted(store.mapper.types(), key=lambda t: (t.group, t.plural))


def served_groups(store: Store, crd_path: Path | None) -> dict[str, dict[str, list[Served]]]:
    """Everything served, by group and version: the input of the discovery documents."""
    groups: dict[str, dict[str, list[Served]]] = {}
    for t in served_types(store):
        served = Served(t, has_status(store, t), tuple(categories(store, t, crd_path)))
        groups.setdefault(t.group, {}).setdefault(t.version, []).append(served)
    for t in REVIEWS.values():  # create-only APIs with no storage (kubectl auth can-i / whoami)
        groups.setdefault(t.group, {}).setdefault(t.version, []).append(Served(t, False, (), ("create",)))
    for versions in groups.values():
        for entries in versions.values():
            entries.sort(key=lambda served: served.type.plural)
    return groups


def load_crd(path: Path | None) -> dict[str, Any] | None:
    """The CriticalService CRD manifest (for its schema), if the file is there and readable."""
    if path is None:
        return None
    try:
        stat = path.stat()
    except OSError:
        return None
    return _parse_crd(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)
def _parse_crd(path: str, _mtime_ns: int, _size: int) -> dict[str, Any] | None:
    # Discovery asks for this on every request; parsing the YAML costs ~45 ms, so it is parsed once per
    # version of the file (the mtime/size key re-reads it after an edit).
    try:
        docs = list(yaml.safe_load_all(Path(path).read_text()))
    except (OSError, yaml.YAMLError):
        return None
    return next((d for d in docs if isinstance(d, dict) and d.get("kind") == "CustomResourceDefinition"), None)
