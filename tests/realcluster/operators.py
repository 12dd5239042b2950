"""Real projects' installs for `criticalsvc discover` on the real control plane (tests/test_realcluster_discover.py).

Each `*_documents()` returns the objects a user's install creates, and the objects carrying a finalizer the way
that project's controller sets it (kwok runs the pods, but no code: nothing in them serves a webhook or
processes a finalizer, so what those controllers would write is written here, as they write it):

- cert-manager v1.21.2: its Helm chart, rendered by `helm template` (crds.enabled) from the published Go module
  github.com/cert-manager/cert-manager (deploy/charts/cert-manager); plus an ACME Challenge carrying
  `finalizer.acme.cert-manager.io`, the finalizer its challenges controller adds
  (https://github.com/cert-manager/cert-manager/blob/v1.21.2/pkg/controller/acmechallenges/sync.go).
- Kyverno v1.19.1: its release manifest config/install-latest-testing.yaml (the chart rendered by Kyverno's
  release tooling) from the published Go module github.com/kyverno/kyverno; its admission controller writes
  its webhook configurations at run time, pointing at Service kyverno-svc
  (https://github.com/kyverno/kyverno/blob/v1.19.1/pkg/config/config.go names them): the two resource
  webhook configurations are written here with that clientConfig, their rules narrowed to Kyverno's own policy
  types and failurePolicy Ignore, so that the shared cluster's other tests never call a server that kwok does
  not run (discover reads only their clientConfig).
- Crossplane v2.3.4: not on the Go module proxy (403), so written from the release: the chart's two Deployments,
  their ServiceAccounts, the Service crossplane-webhooks and the ClusterRoles and bindings
  (https://github.com/crossplane/crossplane/tree/v2.3.4/cluster/charts/crossplane/templates, the rules
  kept as written where discover's inference reads them: what each account may update), the
  ValidatingWebhookConfiguration crossplane-no-usages its init container applies pointed at that Service
  (https://github.com/crossplane/crossplane/blob/v2.3.4/cluster/webhookconfigurations/usage.yaml), the XRD CRD
  (schema left open: the full one is 400 lines of no interest here), and an XRD carrying
  `defined.apiextensions.crossplane.io`
  (https://github.com/crossplane/crossplane/blob/v2.3.4/internal/controller/apiextensions/definition/reconciler.go#L64).
- Flux kustomize-controller v1.9.6: the module the harness builds (tests/realcluster/flux.py): its CRDs,
  config/rbac and config/manager Deployment (run as ServiceAccount kustomize-controller, as `flux install` runs
  it), and a Kustomization carrying `finalizers.fluxcd.io`.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from . import build, flux

JSON = dict[str, Any]
CERT_MANAGER = ("github.com/cert-manager/cert-manager", "v1.21.2", "h1:UWgoYM+KLNtRlqmoWOKjKBOBUPVHeepQ6/ac3ERJW68=")
IMAGE = "xpkg.crossplane.io/crossplane/crossplane:v2.3.4"
KYVERNO = ("github.com/kyverno/kyverno", "v1.19.1", "h1:/MkgFii3/VlQfKR1JpC9tVwNNVNQTt2S4U6qCsafsTU=")


def _module(spec: tuple[str, str, str]) -> Path:
    """The module's files in the Go module cache, its download checked against the sum.golang.org hash."""
    path, version, digest = spec
    info = build.module_download(build.HERE / build.HELM_MODULE, path, version)
    if info.get("Sum") != digest:
        raise RuntimeError(f"{path}@{version}: hash {info.get('Sum')}, not {digest}")
    return Path(info["Dir"])


def _docs(text: str) -> list[JSON]:
    return [d for d in yaml.safe_load_all(text) if isinstance(d, dict) and d.get("kind")]


def cert_manager_documents() -> list[JSON]:
    chart = _module(CERT_MANAGER) / "deploy" / "charts" / "cert-manager"
    helm = build.ensure_helm()
    done = subprocess.run([str(helm), "template", "cert-manager", str(chart), "--namespace", "cert-manager",
                           "--no-hooks", "--set", "crds.enabled=true"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"helm template cert-manager: {done.stderr}")
    docs = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "cert-manager"}}, *_docs(done.stdout)]
    for d in docs:  # helm template leaves the release namespace out of namespaced objects that omit it
        if d["kind"] not in _CLUSTER_SCOPED:
            d.setdefault("metadata", {}).setdefault("namespace", "cert-manager")
    return docs


def cert_manager_users(namespace: str) -> list[JSON]:
    return [{"apiVersion": "acme.cert-manager.io/v1", "kind": "Challenge",
             "metadata": {"name": "example-challenge", "namespace": namespace,
                          "finalizers": ["acme.cert-manager.io/finalizer"]},
             "spec": {"authorizationURL": "https://acme.example.com/authz/1", "dnsName": "example.com",
                      "issuerRef": {"name": "letsencrypt"}, "key": "k", "token": "t", "type": "HTTP-01",
                      "url": "https://acme.example.com/chall/1", "solver": {"http01": {"ingress": {}}}}}]


def kyverno_documents() -> list[JSON]:
    release = _module(KYVERNO) / "config" / "install-latest-testing.yaml"
    docs = _docs(release.read_text(encoding="utf-8"))
    for kind, name, path in (("ValidatingWebhookConfiguration", "kyverno-resource-validating-webhook-cfg",
                              "/validate/ignore"),
                             ("MutatingWebhookConfiguration", "kyverno-resource-mutating-webhook-cfg",
                              "/mutate/ignore")):
        docs.append({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind, "metadata": {"name": name},
                     "webhooks": [{"name": f"{kind[:8].lower()}.kyverno.svc-ignore",
                                   "clientConfig": {"service": {"namespace": "kyverno", "name": "kyverno-svc",
                                                                "path": path, "port": 443}},
                                   "failurePolicy": "Ignore", "sideEffects": "NoneOnDryRun", "timeoutSeconds": 1,
                                   "admissionReviewVersions": ["v1"],
                                   "rules": [{"operations": ["CREATE", "UPDATE"], "resources": ["*"],
                                              "apiGroups": ["policies.kyverno.io"], "apiVersions": ["*"]}]}]})
    return docs


def crossplane_documents() -> list[JSON]:
    ns = "crossplane-system"
    labels = {"app": "crossplane", "release": "crossplane"}
    rbac_labels = {"app": "crossplane-rbac-manager", "release": "crossplane"}

    def deployment(name: str, sa: str, pod_labels: dict[str, str]) -> JSON:
        args = ["core", "start"] if name == "crossplane" else ["rbac", "start"]
        return {"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": name, "namespace": ns, "labels": dict(pod_labels)},
                "spec": {"replicas": 1, "selector": {"matchLabels": dict(pod_labels)},
                         "template": {"metadata": {"labels": dict(pod_labels)},
                                      "spec": {"serviceAccountName": sa, "containers": [
                                          {"name": name, "image": IMAGE, "args": args}]}}}}

    def binding(name: str, role: str, sa: str) -> JSON:
        return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]}

    schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "crossplane", "namespace": ns}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "rbac-manager", "namespace": ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "crossplane"},
         "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {
             "rbac.crossplane.io/aggregate-to-crossplane": "true"}}]}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "crossplane:system:aggregate-to-crossplane",
                      "labels": {"rbac.crossplane.io/aggregate-to-crossplane": "true",
                                 "crossplane.io/scope": "system"}},
         "rules": [{"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions",
                                                                          "customresourcedefinitions/status"],
                    "verbs": ["*"]},
                   {"apiGroups": [""], "resources": ["serviceaccounts", "services"], "verbs": ["*"]},
                   {"apiGroups": ["apiextensions.crossplane.io", "ops.crossplane.io", "pkg.crossplane.io",
                                  "protection.crossplane.io"], "resources": ["*"], "verbs": ["*"]},
                   {"apiGroups": ["extensions", "apps"], "resources": ["deployments"],
                    "verbs": ["get", "list", "create", "update", "patch", "delete"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "crossplane-rbac-manager"},
         "rules": [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
                   {"apiGroups": [""], "resources": ["namespaces/finalizers"], "verbs": ["update"]},
                   {"apiGroups": ["apiextensions.crossplane.io"], "resources": ["compositeresourcedefinitions"],
                    "verbs": ["get", "list", "watch"]},
                   {"apiGroups": ["apiextensions.crossplane.io"],
                    "resources": ["compositeresourcedefinitions/finalizers"], "verbs": ["update"]}]},
        binding("crossplane", "crossplane", "crossplane"),
        binding("crossplane-rbac-manager", "crossplane-rbac-manager", "rbac-manager"),
        deployment("crossplane", "crossplane", labels),
        deployment("crossplane-rbac-manager", "rbac-manager", rbac_labels),
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "crossplane-webhooks", "namespace": ns,
                                                              "labels": dict(labels)},
         "spec": {"selector": dict(labels), "ports": [{"protocol": "TCP", "port": 9443, "targetPort": 9443}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
         "metadata": {"name": "crossplane-no-usages"},
         "webhooks": [{"name": "nousages.protection.crossplane.io", "admissionReviewVersions": ["v1"],
                       "clientConfig": {"service": {"name": "crossplane-webhooks", "namespace": ns,
                                                    "path": "/validate-no-usages", "port": 9443}},
                       "failurePolicy": "Fail", "sideEffects": "None",
                       "objectSelector": {"matchLabels": {"crossplane.io/in-use": "true"}},
                       "rules": [{"apiGroups": ["*"], "apiVersions": ["*"], "operations": ["DELETE"],
                                  "resources": ["*"]}]}]},
        {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
         "metadata": {"name": "compositeresourcedefinitions.apiextensions.crossplane.io"},
         "spec": {"group": "apiextensions.crossplane.io", "scope": "Cluster",
                  "names": {"plural": "compositeresourcedefinitions", "singular": "compositeresourcedefinition",
                            "kind": "CompositeResourceDefinition", "shortNames": ["xrd", "xrds"]},
                  "versions": [{"name": "v2", "served": True, "storage": True, "schema": schema}]}},
    ]


def crossplane_users() -> list[JSON]:
    return [{"apiVersion": "apiextensions.crossplane.io/v2", "kind": "CompositeResourceDefinition",
             "metadata": {"name": "xbuckets.example.org", "finalizers": ["defined.apiextensions.crossplane.io"]},
             "spec": {"group": "example.org", "names": {"kind": "XBucket", "plural": "xbuckets"}}}]


def flux_documents() -> list[JSON]:
    ns = flux.FLUX_NAMESPACE
    manager = flux.kustomize_controller_dir() / "config" / "manager" / "deployment.yaml"
    deployment = next(d for d in _docs(manager.read_text(encoding="utf-8")) if d["kind"] == "Deployment")
    deployment["metadata"]["namespace"] = ns
    # As `flux install` runs it (and the harness's flux.py): as its own ServiceAccount, which config/rbac binds; the
    # module's config/manager leaves the namespace's default one.
    deployment["spec"]["template"]["spec"]["serviceAccountName"] = flux.SERVICE_ACCOUNT
    docs = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": flux.SERVICE_ACCOUNT, "namespace": ns}}]
    docs += [d for text in flux.crd_texts() for d in _docs(text)]
    return [*docs, *flux.rbac_documents(ns), deployment]


def flux_users(namespace: str) -> list[JSON]:
    return [{"apiVersion": f"{flux.GROUP}/v1", "kind": "Kustomization",
             "metadata": {"name": "apps", "namespace": namespace, "finalizers": [flux.FINALIZER]},
             "spec": {"interval": "10m", "path": "./", "prune": True,
                      "sourceRef": {"kind": "GitRepository", "name": "apps"}}}]


_CLUSTER_SCOPED = frozenset({"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                             "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration", "APIService",
                             "PriorityClass"})
