"""`criticalsvc discover` on snapshots: what it proposes, with what evidence, and what it leaves out."""

from __future__ import annotations

import json

import pytest
import yaml

from criticalsvc.api import parse_critical_service
from criticalsvc.cli import main
from criticalsvc.discover.inventory import from_objects
from criticalsvc.discover.propose import access_questions, propose
from criticalsvc.discover.rbac import review
from criticalsvc.discover.render import render_yaml
from tests.discover_cluster import (
    apiservice,
    cluster_role,
    cluster_role_binding,
    crd,
    custom,
    deployment,
    namespace,
    rule,
    webhook_configuration,
    workload_with_service,
)


def cluster() -> list[dict]:
    """A cluster running a webhook server, an aggregated API, a conversion webhook and two finalizer controllers,
    with the distractors a real one has: a url webhook, built-in finalizers, a superuser, the gate itself."""
    objs: list[dict] = [namespace(n) for n in ("cert-manager", "kube-system", "crossplane-system",
                                               "finalizer-namespace", "cool-apps", "criticalsvc-system", "elsewhere")]
    objs += workload_with_service("cert-manager", "cert-manager-webhook", sa="cert-manager-webhook")
    objs.append(deployment("cert-manager", "cert-manager", sa="cert-manager",
                           labels={"app.kubernetes.io/name": "cert-manager"}))
    objs.append(webhook_configuration("cert-manager-webhook", "cert-manager", "cert-manager-webhook", rules=[
        {"operations": ["CREATE", "UPDATE"], "apiGroups": ["cert-manager.io"], "apiVersions": ["v1"],
         "resources": ["certificates", "issuers"]}]))
    objs.append(webhook_configuration("cert-manager-webhook", "cert-manager", "cert-manager-webhook", mutating=True))
    objs += workload_with_service("kube-system", "metrics-server")
    objs.append(apiservice("v1beta1.metrics.k8s.io", "kube-system", "metrics-server"))
    objs.append(apiservice("v1.apps", None, None))  # local: served by kube-apiserver itself
    objs += workload_with_service("crossplane-system", "crossplane", "crossplane-webhooks", sa="crossplane", pods=False)
    objs.append(crd("apiextensions.crossplane.io", "compositions", "Composition",
                    conversion=("crossplane-system", "crossplane-webhooks")))
    objs.append(crd("my.crd.group", "coolresources", "CoolResource"))
    objs.append(crd("acme.cert-manager.io", "challenges", "Challenge"))
    objs.append(deployment("finalizer-namespace", "finalizer-deployment", sa="finalizer-sa"))
    objs += [custom("my.crd.group/v1", "CoolResource", "cool-apps", n, finalizers=["my.crd.group/super-important"])
             for n in ("alpha", "beta", "gamma")]
    objs.append(custom("acme.cert-manager.io/v1", "Challenge", "elsewhere", "c1",
                       finalizers=["finalizer.acme.cert-manager.io"]))
    objs.append(custom("v1", "PersistentVolumeClaim", "elsewhere", "data", finalizers=["kubernetes.io/pvc-protection"]))
    objs.append(custom("v1", "ConfigMap", "elsewhere", "orphaned", finalizers=["example.com/gone"]))
    objs.append(webhook_configuration("outside", "", "", url="https://hooks.example.com/validate"))
    # The gate's own install, serving its own webhook.
    objs += workload_with_service("criticalsvc-system", "criticalsvc", labels={"app.kubernetes.io/name": "criticalsvc"},
                                  sa="criticalsvc")
    objs.append(webhook_configuration("gate-admission", "criticalsvc-system", "criticalsvc"))
    objs.append(webhook_configuration("criticalsvc-providers", "", "", url="https://127.0.0.1:8443/validate"))
    # A superuser that may update anything, whose name matches nothing.
    objs.append(deployment("elsewhere", "argocd-application-controller", sa="argocd"))
    objs += [cluster_role("cluster-admin", [rule(["*"], ["*"], ["*"])]),
             cluster_role("cool", [rule(["my.crd.group"], ["coolresources"])]),
             cluster_role("cert-manager-controller", [rule(["acme.cert-manager.io", "cert-manager.io"], ["*"])]),
             cluster_role_binding("cool", "cool", ("finalizer-namespace", "finalizer-sa")),
             cluster_role_binding("cert-manager", "cert-manager-controller", ("cert-manager", "cert-manager")),
             cluster_role_binding("argocd", "cluster-admin", ("elsewhere", "argocd"))]
    return objs


def discover(objs: list[dict]):
    inv = from_objects(objs)
    return propose(inv, {q: review(q, inv) for q in access_questions(inv)})


def by_provider(d) -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {}
    for p in d.proposals:
        out[f"{p.kind} {p.provider.namespace}/{p.provider.name}"] = [(str(dep.criterion), dep.confidence.value)
                                                                     for dep in p.dependencies]
    return out


def test_each_thing_served_becomes_a_criterion_of_its_workload():
    """Webhook configurations, a conversion webhook, an APIService and two finalizers are each traced to the
    workload serving them, one CriticalService per workload, and nothing else is proposed."""
    assert by_provider(discover(cluster())) == {
        "Deployment cert-manager/cert-manager": [
            ("no challenges.acme.cert-manager.io carries finalizer finalizer.acme.cert-manager.io", "high")],
        "Deployment cert-manager/cert-manager-webhook": [
            ("mutatingwebhookconfigurations.admissionregistration.k8s.io cert-manager-webhook is gone", "high"),
            ("validatingwebhookconfigurations.admissionregistration.k8s.io cert-manager-webhook is gone", "high")],
        "Deployment crossplane-system/crossplane": [
            ("customresourcedefinitions.apiextensions.k8s.io compositions.apiextensions.crossplane.io is gone",
             "high")],
        "Deployment finalizer-namespace/finalizer-deployment": [
            ("no coolresources.my.crd.group carries finalizer my.crd.group/super-important", "medium")],
        "Deployment kube-system/metrics-server": [
            ("apiservices.apiregistration.k8s.io v1beta1.metrics.k8s.io is gone", "high")],
    }


def test_skips_say_why():
    """The url webhook, the built-in finalizer, the gate's own webhook and a finalizer nobody may process are
    skipped, each with its reason."""
    skipped = {s.subject: s.reason for s in discover(cluster()).skipped}
    assert "outside the cluster" in skipped["ValidatingWebhookConfiguration outside webhook outside.example.io"]
    assert "Kubernetes itself" in skipped["finalizer kubernetes.io/pvc-protection on persistentvolumeclaims"]
    own = skipped["ValidatingWebhookConfiguration gate-admission (webhooks gate-admission.example.io)"]
    assert "the gate's own install" in own  # by the workload serving it
    assert skipped["ValidatingWebhookConfiguration criticalsvc-providers"] == "the gate's own install"  # by name
    assert "no workload's ServiceAccount may update it" in skipped["finalizer example.com/gone on configmaps"]


def test_evidence_traces_the_chain():
    """A webhook's evidence names the Service, EndpointSlice pod and owner chain; the finalizer's names the
    SubjectAccessReview grant; a Fail webhook says what it would block."""
    d = discover(cluster())
    webhook = next(p for p in d.proposals if p.provider.name == "cert-manager-webhook")
    validating = webhook.dependencies[1]
    assert "Service cert-manager/cert-manager-webhook -> the endpoints of its EndpointSlices (1, 1 ready)" in \
        validating.evidence
    assert "<- ReplicaSet cert-manager-webhook-5d9f8c7b6 <- Deployment cert-manager-webhook" in validating.evidence
    assert "failurePolicy Fail: with no server the API server refuses every CREATE/UPDATE of certificates,issuers" \
        in validating.consequence
    crossplane = next(p for p in d.proposals if p.provider.name == "crossplane")
    assert "matches the pod template of Deployment crossplane (no pod of it runs now)" in \
        crossplane.dependencies[0].evidence
    cool = next(p for p in d.proposals if p.provider.name == "finalizer-deployment").dependencies[0]
    assert "found on 3 coolresources.my.crd.group (first: cool-apps/alpha, cool-apps/beta, cool-apps/gamma)" in \
        cool.evidence
    assert "system:serviceaccount:finalizer-namespace:finalizer-sa may update coolresources.my.crd.group in " \
           "namespace cool-apps (ClusterRoleBinding cool grants ClusterRole cool)" in cool.evidence


def test_a_superuser_is_no_evidence():
    """An account that may update every type is not proposed for a finalizer its name does not match."""
    d = discover(cluster())
    assert not any(p.provider.name == "argocd-application-controller" for p in d.proposals)


def test_proposals_parse_and_the_grant_covers_their_types():
    """Every proposed CriticalService parses with the project's own parser, and the read grant names exactly the
    criteria types the shipped reader role lacks."""
    docs = [doc for doc in yaml.safe_load_all(render_yaml(discover(cluster()))) if doc]
    services = [parse_critical_service(doc) for doc in docs if doc["kind"] == "CriticalService"]
    assert len(services) == 5
    (grant,) = [doc for doc in docs if doc["kind"] == "ClusterRole"]
    assert grant["metadata"]["labels"]["criticalsvc.io/aggregate-to-reader"] == "true"
    assert {(r["apiGroups"][0], res) for r in grant["rules"] for res in r["resources"]} == {
        ("acme.cert-manager.io", "challenges"), ("my.crd.group", "coolresources"),
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"),
        ("admissionregistration.k8s.io", "validatingwebhookconfigurations"),
        ("apiregistration.k8s.io", "apiservices")}


def test_a_name_match_picks_among_accounts_that_may():
    """Flux's controllers may all update every Flux type (two as cluster-admin): the one whose name is the type's
    group processes its finalizer - HIGH when its account is not a superuser, MEDIUM when it is."""
    flux = [namespace("flux-system")]
    controllers = ("source-controller", "kustomize-controller", "helm-controller", "notification-controller")
    for c in controllers:
        flux.append(deployment("flux-system", c, sa=c, labels={"app": c, "app.kubernetes.io/part-of": "flux"}))
    flux += [crd("kustomize.toolkit.fluxcd.io", "kustomizations", "Kustomization"),
             crd("source.toolkit.fluxcd.io", "gitrepositories", "GitRepository"),
             custom("kustomize.toolkit.fluxcd.io/v1", "Kustomization", "apps", "a",
                    finalizers=["finalizers.fluxcd.io"]),
             custom("source.toolkit.fluxcd.io/v1", "GitRepository", "apps", "r",
                    finalizers=["finalizers.fluxcd.io"]),
             cluster_role("cluster-admin", [rule(["*"], ["*"], ["*"])]),
             cluster_role("crd-controller-flux-system", [rule(
                 ["source.toolkit.fluxcd.io", "kustomize.toolkit.fluxcd.io", "helm.toolkit.fluxcd.io"], ["*"], ["*"])]),
             cluster_role_binding("crd-controller-flux-system", "crd-controller-flux-system",
                                  *(("flux-system", c) for c in controllers)),
             cluster_role_binding("cluster-reconciler-flux-system", "cluster-admin",
                                  ("flux-system", "kustomize-controller"), ("flux-system", "helm-controller"))]
    assert by_provider(discover(flux)) == {
        "Deployment flux-system/kustomize-controller": [
            ("no kustomizations.kustomize.toolkit.fluxcd.io carries finalizer finalizers.fluxcd.io", "medium")],
        "Deployment flux-system/source-controller": [
            ("no gitrepositories.source.toolkit.fluxcd.io carries finalizer finalizers.fluxcd.io", "high")],
    }


def test_without_rbac_in_the_snapshot_names_alone_give_low_confidence():
    """A snapshot with no RBAC objects cannot answer access questions: a unique name match is proposed LOW,
    saying access was not checked."""
    objs = [deployment("cert-manager", "cert-manager", sa="cert-manager"),
            crd("acme.cert-manager.io", "challenges", "Challenge"),
            custom("acme.cert-manager.io/v1", "Challenge", "x", "c", finalizers=["finalizer.acme.cert-manager.io"])]
    (p,) = discover(objs).proposals
    assert p.confidence.value == "low" and "access not checked" in p.dependencies[0].evidence


@pytest.mark.parametrize("output", ["yaml", "json"])
def test_cli_on_a_snapshot(tmp_path, capsys, output):
    """`criticalsvc discover --state` prints the proposals (YAML with a comment per CriticalService, or a JSON
    List) and the skipped things (YAML comments, or stderr for JSON); exit 0."""
    snapshot = tmp_path / "cluster.yaml"
    snapshot.write_text(yaml.safe_dump_all(cluster()))
    assert main(["discover", "--state", str(snapshot), "-o", output, "--enforcement", "Warn"]) == 0
    captured = capsys.readouterr()
    if output == "json":
        items = json.loads(captured.out)["items"]
        assert "skipped finalizer example.com/gone on configmaps" in captured.err
    else:
        items = [d for d in yaml.safe_load_all(captured.out) if d]
        assert "# Deployment kube-system/metrics-server (confidence: high)" in captured.out
        assert "#   if it went first: with no server, discovery of v1beta1.metrics.k8s.io fails" in captured.out
        assert "# - finalizer example.com/gone on configmaps:" in captured.out
    services = [parse_critical_service(i) for i in items if i["kind"] == "CriticalService"]
    assert len(services) == 5 and all(s.enforcement.value == "Warn" for s in services)


@pytest.mark.parametrize("flag", ["-n", "--namespace"])
def test_cli_namespace_restricts_the_proposals_to_its_workloads(tmp_path, capsys, flag):
    """`discover -n cert-manager` proposes for cert-manager's two workloads only - the finalizer one too, though its
    Challenge lives in another namespace - with the grant their criteria need and no other."""
    snapshot = tmp_path / "cluster.yaml"
    snapshot.write_text(yaml.safe_dump_all(cluster()))
    assert main(["discover", "--state", str(snapshot), flag, "cert-manager", "-o", "json"]) == 0
    items = json.loads(capsys.readouterr().out)["items"]
    providers = sorted(i["spec"]["provider"]["name"] for i in items if i["kind"] == "CriticalService")
    assert providers == ["cert-manager", "cert-manager-webhook"]
    (grant,) = [i for i in items if i["kind"] == "ClusterRole"]
    assert sorted(g for r in grant["rules"] for g in r["apiGroups"]) == ["acme.cert-manager.io",
                                                                          "admissionregistration.k8s.io"]
    assert main(["discover", "--state", str(snapshot), "-n", "nowhere", "-o", "json"]) == 0
    assert [i for i in json.loads(capsys.readouterr().out)["items"] if i["kind"] == "CriticalService"] == []


def test_the_reference_story_proposes_its_own_criticalservice_shape():
    """On the design's reference story (with its RBAC added), discover proposes the Finalizer criterion the
    story's own CriticalService has."""
    from criticalsvc.manifests import load_path

    objs = [m.obj for m in load_path("api/examples/reference-story.yaml")]
    objs += [cluster_role("cool", [rule(["my.crd.group"], ["coolresources"])]),
             cluster_role_binding("cool", "cool", ("finalizer-namespace", "default"))]
    story = next(parse_critical_service(o) for o in objs if o["kind"] == "CriticalService")
    (p,) = discover([o for o in objs if o["kind"] != "CriticalService"]).proposals
    assert p.provider == story.provider
    assert p.dependencies[0].criterion in story.criteria


def test_the_core_controller_wins_over_its_siblings():
    """Crossplane's core and its RBAC manager may both update XRDs and both names say crossplane: the workload
    whose whole name is the project's (crossplane) is proposed, the sibling named in the evidence."""
    objs = [deployment("crossplane-system", "crossplane", sa="crossplane"),
            deployment("crossplane-system", "crossplane-rbac-manager", sa="rbac-manager"),
            crd("apiextensions.crossplane.io", "compositeresourcedefinitions", "CompositeResourceDefinition",
                scope="Cluster"),
            custom("apiextensions.crossplane.io/v2", "CompositeResourceDefinition", "", "xbuckets.example.org",
                   finalizers=["defined.apiextensions.crossplane.io"]),
            cluster_role("crossplane", [rule(["apiextensions.crossplane.io"], ["*"], ["*"])]),
            cluster_role("rbac-manager", [rule(["apiextensions.crossplane.io"], ["compositeresourcedefinitions"],
                                               ["get", "list", "watch", "update"])]),
            cluster_role_binding("crossplane", "crossplane", ("crossplane-system", "crossplane")),
            cluster_role_binding("rbac-manager", "rbac-manager", ("crossplane-system", "rbac-manager"))]
    (p,) = discover(objs).proposals
    assert p.provider.name == "crossplane" and p.confidence.value == "high"
    assert "may update it too: deployments.apps crossplane-system/crossplane-rbac-manager" in \
        p.dependencies[0].evidence


def test_cli_without_a_cluster_says_what_to_pass(monkeypatch, tmp_path, capsys):
    """Without --state and without any kubeconfig, discover exits 2 with one line saying what to pass."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["discover"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("criticalsvc discover: --kubeconfig: no cluster configuration")
    assert "--state" in err


def test_unanswered_reviews_are_said_so():
    """When the SubjectAccessReviews cannot be answered (a server without them) and no name matches, the finalizer
    is skipped saying the reviews failed, not that nobody may update it."""
    from criticalsvc.discover.rbac import AccessAnswer

    inv = from_objects([deployment("ops", "cool-operator"), crd("my.crd.group", "coolresources", "CoolResource"),
                        custom("my.crd.group/v1", "CoolResource", "a", "x", finalizers=["my.crd.group/done"])])
    failed = {q: AccessAnswer(None, "404 NotFound: subjectaccessreviews") for q in access_questions(inv)}
    (s,) = propose(inv, failed).skipped
    assert "could not be asked (404 NotFound: subjectaccessreviews), and no workload's name matches it" in s.reason
