"""Kind <-> resource resolution (the REST mapper).

The CRD and the design let a `resource` be written as a Kind (`CustomResourceDefinition`) or a plural
(`customresourcedefinitions`); Kubernetes APIs need the plural. Resolution follows what kubectl
accepts: the plural, the singular, a short name, or the Kind (case-insensitively), within the group.

Sources of truth: a table of well-known built-in kinds, plus CustomResourceDefinitions seen in the
state (`learn_crd`), plus, in the live service, discovery (issue: the webhook service). An unknown
name resolves to None: the type is not served, so no instance of it can exist.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from .api import GroupResource


def group_version_path(group: str, version: str) -> str:
    """The REST path of a group version: /api/v1 for the core group, /apis/<group>/<version> otherwise."""
    return f"/api/{version}" if not group else f"/apis/{group}/{version}"


@attrs.frozen
class ResourceType:
    """One served resource type, as discovery would describe it."""

    group: str
    version: str
    kind: str
    plural: str
    singular: str
    namespaced: bool
    short_names: tuple[str, ...] = ()

    @property
    def group_resource(self) -> GroupResource:
        return GroupResource(self.group, self.plural)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, *, namespace: str | None = None, name: str = "") -> str:
        """The REST path of this type's collection, across all namespaces or within `namespace` (ignored
        for a cluster-scoped type), or of the object `name` in it: /apis/apps/v1/namespaces/app/deployments,
        /api/v1/namespaces/app (the Namespace "app")."""
        path = group_version_path(self.group, self.version)
        if namespace and self.namespaced:
            path += f"/namespaces/{namespace}"
        path += f"/{self.plural}"
        return f"{path}/{name}" if name else path


def _t(group: str, version: str, kind: str, plural: str, namespaced: bool, *short: str) -> ResourceType:
    return ResourceType(group, version, kind, plural, kind.lower(), namespaced, tuple(short))


# Built-in kinds a CriticalService or a teardown bundle is likely to name (kubectl api-resources, 1.32).
WELL_KNOWN: tuple[ResourceType, ...] = (
    _t("", "v1", "Namespace", "namespaces", False, "ns"),
    _t("", "v1", "Pod", "pods", True, "po"),
    _t("", "v1", "Service", "services", True, "svc"),
    _t("", "v1", "ConfigMap", "configmaps", True, "cm"),
    _t("", "v1", "Secret", "secrets", True),
    _t("", "v1", "ServiceAccount", "serviceaccounts", True, "sa"),
    _t("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims", True, "pvc"),
    _t("", "v1", "PersistentVolume", "persistentvolumes", False, "pv"),
    _t("", "v1", "Endpoints", "endpoints", True, "ep"),
    _t("", "v1", "Event", "events", True, "ev"),
    _t("", "v1", "Node", "nodes", False, "no"),
    _t("", "v1", "ResourceQuota", "resourcequotas", True, "quota"),
    _t("", "v1", "LimitRange", "limitranges", True, "limits"),
    _t("apps", "v1", "Deployment", "deployments", True, "deploy"),
    _t("apps", "v1", "StatefulSet", "statefulsets", True, "sts"),
    _t("apps", "v1", "DaemonSet", "daemonsets", True, "ds"),
    _t("apps", "v1", "ReplicaSet", "replicasets", True, "rs"),
    _t("batch", "v1", "Job", "jobs", True),
    _t("batch", "v1", "CronJob", "cronjobs", True, "cj"),
    _t("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets", True, "pdb"),
    _t("networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies", True, "netpol"),
    _t("networking.k8s.io", "v1", "Ingress", "ingresses", True, "ing"),
    _t("rbac.authorization.k8s.io", "v1", "Role", "roles", True),
    _t("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings", True),
    _t("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", False),
    _t("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", False),
    _t("coordination.k8s.io", "v1", "Lease", "leases", True),
    _t("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions", False, "crd", "crds"),
    _t("admissionregistration.k8s.io", "v1", "ValidatingWebhookConfiguration",
       "validatingwebhookconfigurations", False),
    _t("admissionregistration.k8s.io", "v1", "MutatingWebhookConfiguration", "mutatingwebhookconfigurations", False),
    _t("criticalsvc.io", "v1alpha1", "CriticalService", "criticalservices", False, "csvc"),
    _t("work.open-cluster-management.io", "v1", "ManifestWork", "manifestworks", True, "mw"),
)


def guess_resource(kind: str) -> str:
    """apimachinery's UnsafeGuessKindToResource: the plural kubectl assumes for an unknown Kind."""
    singular = kind.lower()
    if not singular:
        return singular
    if singular.endswith(("s", "x", "z", "ch", "sh")):
        return singular + "es"
    if singular.endswith("y") and len(singular) > 1 and singular[-2] not in "aeiou":
        return singular[:-1] + "ies"
    return singular + "s"


class RESTMapper:
    """Resolves resource names and Kinds within a group; learns CRDs as they appear."""

    def __init__(self, types: Iterable[ResourceType] = WELL_KNOWN) -> None:
        self._by_gr: dict[GroupResource, ResourceType] = {}
        self._by_name: dict[tuple[str, str], ResourceType] = {}
        self._by_kind: dict[tuple[str, str], ResourceType] = {}
        # Counts every add and remove: equal at two moments, every name resolves as it did (what a caller that keeps
        # something resolved may check instead of resolving again: the status writer's keys).
        self.generation = 0
        for t in types:
            self.add(t)

    def add(self, t: ResourceType) -> None:
        self.generation += 1
        self._by_gr[t.group_resource] = t
        self._by_kind[(t.group, t.kind)] = t
        for name in (t.plural, t.singular, t.kind.lower(), *t.short_names):
            self._by_name[(t.group, name.lower())] = t

    def remove(self, gr: GroupResource) -> None:
        t = self._by_gr.pop(gr, None)
        if t is None:
            return
        self.generation += 1
        self._by_kind.pop((t.group, t.kind), None)
        for key in [k for k, v in self._by_name.items() if v is t]:
            del self._by_name[key]

    def resolve(self, gr: GroupResource) -> GroupResource | None:
        """The canonical (plural) group/resource for a plural, singular, short name or Kind."""
        if gr in self._by_gr:
            return gr
        t = self._by_name.get((gr.group, gr.resource.lower()))
        return t.group_resource if t else None

    def resolve_name(self, text: str) -> GroupResource | None:
        """What kubectl accepts on its command line: `deploy`, `deployments.apps`, `Deployment`, `crd`.

        A name without a group is looked up in every group, preferring the core group and then the
        built-in groups, as kubectl's priority RESTMapper does.
        """
        name, _, group = text.partition(".")
        if group:
            hit = self.resolve(GroupResource(group, name))
            if hit is not None:
                return hit
        candidates = [t for (g, n), t in self._by_name.items() if n == text.lower()]
        if not candidates:
            return None
        builtin_groups = {t.group for t in WELL_KNOWN if t.group != "criticalsvc.io"}
        candidates.sort(key=lambda t: (t.group != "", t.group not in builtin_groups, t.group))
        return candidates[0].group_resource

    def lookup(self, gr: GroupResource) -> ResourceType | None:
        resolved = self.resolve(gr)
        return self._by_gr.get(resolved) if resolved else None

    def for_kind(self, group: str, kind: str) -> ResourceType | None:
        return self._by_kind.get((group, kind))

    def resource_for_kind(self, api_version: str, kind: str) -> GroupResource:
        """The group/resource an object of `apiVersion`/`kind` is stored under (guessing if unknown)."""
        group = api_version.rpartition("/")[0] if "/" in api_version else ""
        t = self._by_kind.get((group, kind))
        return t.group_resource if t else GroupResource(group, guess_resource(kind))

    def types(self) -> list[ResourceType]:
        return list(self._by_gr.values())

    def learn_crd(self, crd: Mapping[str, Any]) -> ResourceType | None:
        """Register the type a CustomResourceDefinition object serves; None if it is malformed."""
        t = resource_type_from_crd(crd)
        if t is not None:
            self.add(t)
        return t


def resource_type_from_crd(crd: Mapping[str, Any]) -> ResourceType | None:
    spec = crd.get("spec")
    if not isinstance(spec, Mapping):
        return None
    names: Mapping[str, Any] = spec["names"] if isinstance(spec.get("names"), Mapping) else {}
    group, plural, kind = spec.get("group"), names.get("plural"), names.get("kind")
    if not (isinstance(group, str) and isinstance(plural, str) and isinstance(kind, str)):
        return None
    versions: list[Any] = spec["versions"] if isinstance(spec.get("versions"), list) else []
    served = [v.get("name") for v in versions if isinstance(v, Mapping) and v.get("served", True)]
    storage = [v.get("name") for v in versions if isinstance(v, Mapping) and v.get("storage")]
    version = (storage or served or ["v1"])[0]
    short: list[Any] = names["shortNames"] if isinstance(names.get("shortNames"), list) else []
    return ResourceType(
        group=group,
        version=str(version),
        kind=kind,
        plural=plural,
        singular=str(names.get("singular") or kind.lower()),
        namespaced=spec.get("scope", "Namespaced") == "Namespaced",
        short_names=tuple(str(s) for s in short),
    )
