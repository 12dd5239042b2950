"""Cluster snapshots for the discover and stuck-diagnosis tests, built from the shapes the API server returns.

`workload_with_service` builds what a Deployment serving a Service looks like once running: the Deployment, its
ReplicaSet (name + pod-template-hash), a Pod controlled by it, the Service and its EndpointSlice.
"""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]


def meta(name: str, namespace: str = "", **extra: Any) -> Obj:
    m: Obj = {"name": name, "uid": f"uid-{namespace}-{name}"}
    if namespace:
        m["namespace"] = namespace
    m.update(extra)
    return m


def namespace(name: str, **extra: Any) -> Obj:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta(name), "status": {"phase": "Active"}, **extra}


def deployment(ns: str, name: str, *, labels: dict[str, str] | None = None, sa: str = "default", replicas: int = 1,
               available: int | None = None, kind: str = "Deployment") -> Obj:
    labels = labels or {"app": name}
    spec: Obj = {"selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {"serviceAccountName": sa, "containers": []}}}
    status: Obj = {}
    if kind != "DaemonSet":
        spec["replicas"] = replicas
        status["availableReplicas"] = replicas if available is None else available
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": meta(name, ns, labels=dict(labels)), "spec": spec,
            "status": status}


def workload_with_service(ns: str, name: str, service: str | None = None, *, labels: dict[str, str] | None = None,
                          sa: str = "default", ready: bool = True, pods: bool = True) -> list[Obj]:
    labels = labels or {"app": name}
    service = service or name
    rs = f"{name}-5d9f8c7b6"
    pod = f"{rs}-x2k4p"
    out = [deployment(ns, name, labels=labels, sa=sa),
           {"apiVersion": "v1", "kind": "Service", "metadata": meta(service, ns),
            "spec": {"selector": dict(labels), "ports": [{"port": 443, "targetPort": 10250}]}}]
    if pods:
        out += [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": meta(
                rs, ns, labels=dict(labels),
                ownerReferences=[{"apiVersion": "apps/v1", "kind": "Deployment", "name": name, "uid": "u",
                                  "controller": True}])},
            {"apiVersion": "v1", "kind": "Pod", "metadata": meta(pod, ns, labels=dict(labels), ownerReferences=[
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs, "uid": "u", "controller": True}]),
             "spec": {"serviceAccountName": sa}},
            {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
             "metadata": meta(f"{service}-abcde", ns, labels={"kubernetes.io/service-name": service}),
             "addressType": "IPv4",
             "endpoints": [{"addresses": ["10.0.0.7"], "conditions": {"ready": ready},
                            "targetRef": {"kind": "Pod", "namespace": ns, "name": pod}}]},
        ]
    return out


def webhook_configuration(name: str, ns: str, service: str, *, mutating: bool = False, failure: str = "Fail",
                          rules: list[Obj] | None = None, url: str | None = None) -> Obj:
    cc: Obj = {"url": url} if url else {"service": {"namespace": ns, "name": service, "path": "/validate"}}
    kind = "MutatingWebhookConfiguration" if mutating else "ValidatingWebhookConfiguration"
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind, "metadata": meta(name),
            "webhooks": [{"name": f"{name}.example.io", "clientConfig": cc, "failurePolicy": failure,
                          "sideEffects": "None", "admissionReviewVersions": ["v1"],
                          "rules": rules or [{"operations": ["CREATE", "UPDATE"], "apiGroups": ["*"],
                                              "apiVersions": ["*"], "resources": ["*"]}]}]}


def crd(group: str, plural: str, kind: str, *, conversion: tuple[str, str] | None = None,
        scope: str = "Namespaced") -> Obj:
    spec: Obj = {"group": group, "scope": scope, "names": {"plural": plural, "kind": kind, "singular": kind.lower()},
                 "versions": [{"name": "v1", "served": True, "storage": True}]}
    if conversion:
        spec["conversion"] = {"strategy": "Webhook", "webhook": {"conversionReviewVersions": ["v1"], "clientConfig": {
            "service": {"namespace": conversion[0], "name": conversion[1], "path": "/convert"}}}}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": meta(f"{plural}.{group}"), "spec": spec}


def apiservice(name: str, ns: str | None, service: str | None, *, available: str = "True", reason: str = "Passed",
               message: str = "all checks passed") -> Obj:
    group_version = name.split(".", 1)
    spec: Obj = {"group": group_version[1], "version": group_version[0], "groupPriorityMinimum": 100,
                 "versionPriority": 100}
    if service:
        spec["service"] = {"namespace": ns, "name": service, "port": 443}
    return {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": meta(name), "spec": spec,
            "status": {"conditions": [{"type": "Available", "status": available, "reason": reason,
                                       "message": message}]}}


def custom(api_version: str, kind: str, ns: str, name: str, *, finalizers: list[str] | None = None,
           deleting: str | None = None) -> Obj:
    m = meta(name, ns, finalizers=finalizers or [])
    if deleting:
        m["deletionTimestamp"] = deleting
    return {"apiVersion": api_version, "kind": kind, "metadata": m}


def cluster_role(name: str, rules: list[Obj]) -> Obj:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": meta(name), "rules": rules}


def cluster_role_binding(name: str, role: str, *accounts: tuple[str, str]) -> Obj:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": meta(name),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "namespace": ns, "name": sa} for ns, sa in accounts]}


def rule(groups: list[str], resources: list[str], verbs: list[str] | None = None) -> Obj:
    return {"apiGroups": groups, "resources": resources, "verbs": verbs or ["get", "list", "watch", "update", "patch"]}
