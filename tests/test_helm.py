"""The Helm chart (deploy/helm/criticalsvc): it lints, and it renders what `criticalsvc manifests` renders.

Rendered with a real `helm` built from the Helm Go module (tests/realcluster/helm-3.22, built into
the realcluster cache; the tests skip, saying why, where Go is missing). The documented differences
from `criticalsvc manifests` (deploy/helm/criticalsvc/README.md, "Same objects as criticalsvc
manifests") are the only ones allowed: Helm's standard labels, no Namespace object, and generated
certificates when none are given.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import io
import os
import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from criticalsvc import certs, cli
from tests.backends import provider_webhook
from tests.realcluster import build

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "criticalsvc"
NAMESPACE = "criticalsvc-system"
RELEASE = "criticalsvc"
# Added by the chart to every templated object's metadata.labels (never to selectors).
HELM_LABELS = ("app.kubernetes.io/instance", "app.kubernetes.io/version", "app.kubernetes.io/managed-by",
               "helm.sh/chart")
WEBHOOK_COUNT = 5

Obj = dict[str, Any]
Key = tuple[str, str, str]


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The helm binary, built on first use."""
    path = build.cached_helm()
    if path is None:
        reason = build.missing_toolchain()
        if reason is not None:
            pytest.skip(reason)
        path = build.ensure_helm()
    yield path


def run_helm(helm: Path, *args: str, home: Path, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    # Helm's own config, cache and data under the test's directory; no cluster unless one is given,
    # and no proxy between helm and a loopback API server.
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env |= {"KUBECONFIG": str(kubeconfig or os.devnull), "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_CACHE_HOME": str(home / "cache"), "HELM_DATA_HOME": str(home / "data")}
    return subprocess.run([str(helm), *args], capture_output=True, text=True, env=env, timeout=120, check=False)


def template(helm: Path, tmp_path: Path, *args: str, values: Obj | None = None,
             namespace: str = NAMESPACE) -> list[Obj]:
    """`helm template --include-crds` of the chart, parsed; fails the test with helm's message."""
    extra = []
    if values is not None:
        extra = ["--values", str(tmp_path / "values.yaml")]
        (tmp_path / "values.yaml").write_text(yaml.safe_dump(values), encoding="utf-8")
    done = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", namespace, "--include-crds", *extra,
                    *args, home=tmp_path)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc is not None]


def refusal(helm: Path, tmp_path: Path, *args: str) -> str:
    """helm's error for a render that must fail."""
    done = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args, home=tmp_path)
    assert done.returncode != 0, f"rendered although it should not:\n{done.stdout[:2000]}"
    return done.stderr


def manifests(*argv: str) -> list[Obj]:
    """`criticalsvc manifests ARGV`, parsed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["manifests", *argv]) == 0
    return [doc for doc in yaml.safe_load_all(out.getvalue()) if doc is not None]


@pytest.fixture(scope="module")
def cert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A `criticalsvc certs --out DIR` directory."""
    directory = tmp_path_factory.mktemp("certs")
    certs.write_certificates(directory)
    return directory


def tls_files(cert_dir: Path) -> list[str]:
    return ["--set-file", f"tls.caCert={cert_dir / certs.CA_CERT}",
            "--set-file", f"tls.cert={cert_dir / certs.TLS_CERT}",
            "--set-file", f"tls.key={cert_dir / certs.TLS_KEY}"]


def key(obj: Obj) -> Key:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def by_key(objects: list[Obj]) -> dict[Key, Obj]:
    keyed = {key(o): o for o in objects}
    assert len(keyed) == len(objects), "an object is rendered twice"
    return keyed


def one(objects: list[Obj], kind: str, name: str = "criticalsvc") -> Obj:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def webhooks(objects: list[Obj]) -> list[Obj]:
    found: list[Obj] = one(objects, "ValidatingWebhookConfiguration")["webhooks"]
    assert len(found) == WEBHOOK_COUNT
    return found


def without_helm_labels(objects: list[Obj]) -> dict[Key, Obj]:
    """The chart's objects with Helm's standard labels removed, after checking each templated one has them."""
    out = {}
    for k, obj in by_key(objects).items():
        obj = copy.deepcopy(obj)
        labels = obj["metadata"].get("labels") or {}
        if k[0] != "CustomResourceDefinition":  # crds/ is installed as it is, never templated
            assert {label: labels.get(label) for label in HELM_LABELS} == {
                "app.kubernetes.io/instance": RELEASE, "app.kubernetes.io/version": "0.1.0",
                "app.kubernetes.io/managed-by": "Helm", "helm.sh/chart": "criticalsvc-0.1.0"}, k
            for label in HELM_LABELS:
                del labels[label]
        out[k] = obj
    return out


def without_certificates(objects: dict[Key, Obj]) -> dict[Key, Obj]:
    """The objects with every caBundle and the serving Secret's data taken out."""
    out = copy.deepcopy(objects)
    for obj in out.values():
        if obj["kind"] == "ValidatingWebhookConfiguration":
            for webhook in obj["webhooks"]:
                del webhook["clientConfig"]["caBundle"]
        if obj["kind"] == "Secret":
            del obj["data"]
    return out


def assert_same_as_manifests(chart: list[Obj], expected: list[Obj], *, certificates: bool = True) -> None:
    """The chart renders `expected` (from `criticalsvc manifests`) but for the documented differences."""
    ours, theirs = without_helm_labels(chart), by_key(expected)
    assert theirs.pop(("Namespace", "", NAMESPACE))["kind"] == "Namespace"
    if not certificates:
        ours, theirs = without_certificates(ours), without_certificates(theirs)
    assert sorted(ours) == sorted(theirs)
    for k, obj in theirs.items():
        assert ours[k] == obj, k


# --- lint -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("flags", [[], ["--strict"], ["--strict", "--set", "certManager.enabled=true"],
                                   ["--strict", "--set", "failurePolicy=Ignore,replicas=3"]],
                         ids=["plain", "strict", "strict-cert-manager", "strict-ignore"])
def test_helm_lint_passes(helm: Path, tmp_path: Path, flags: list[str]) -> None:
    """`helm lint` accepts the chart, with --strict (warnings are errors) too."""
    done = run_helm(helm, "lint", str(CHART), "--namespace", NAMESPACE, *flags, home=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout


def test_helm_lint_reports_a_broken_chart(helm: Path, tmp_path: Path) -> None:
    """A template error makes `helm lint --strict` fail, so the lint test can fail."""
    broken = tmp_path / "criticalsvc"
    (tmp_path / "home").mkdir()
    shutil.copytree(CHART, broken)
    (broken / "templates" / "service.yaml").write_text("{{ .Values.nope.nothere }}\n", encoding="utf-8")
    done = run_helm(helm, "lint", "--strict", str(broken), home=tmp_path / "home")
    assert done.returncode != 0
    assert "nil pointer evaluating interface {}.nothere" in done.stdout


# --- the Kubernetes versions the chart supports (Chart.yaml kubeVersion) ----------------------------

@pytest.mark.parametrize("kube_version", ["1.30.0", "v1.37.2", "v1.31.2-eks-7f9249a"])
def test_a_supported_kubernetes_version_renders(helm: Path, tmp_path: Path, kube_version: str) -> None:
    """Kubernetes 1.30 and later render, a provider's pre-release suffix included."""
    assert template(helm, tmp_path, "--kube-version", kube_version)


@pytest.mark.parametrize("kube_version", ["1.29.15", "v1.29.0-eks-1"])
def test_an_older_kubernetes_version_is_refused(helm: Path, tmp_path: Path, kube_version: str) -> None:
    """Below 1.30 (deploy/README.md's requirement), helm refuses the chart, naming the constraint."""
    error = refusal(helm, tmp_path, "--kube-version", kube_version)
    assert "chart requires kubeVersion: >= 1.30.0-0 which is incompatible with Kubernetes v1.29" in error


# --- the same objects as `criticalsvc manifests` ----------------------------------------------------

def test_default_values_render_what_criticalsvc_manifests_renders(helm: Path, tmp_path: Path,
                                                                  cert_dir: Path) -> None:
    """Default values give the objects of `criticalsvc manifests --ca-bundle-from DIR`, certificates aside."""
    assert_same_as_manifests(template(helm, tmp_path), manifests("--ca-bundle-from", str(cert_dir)),
                             certificates=False)


def test_certificates_from_criticalsvc_certs_render_exactly_what_manifests_renders(
        helm: Path, tmp_path: Path, cert_dir: Path) -> None:
    """With tls.* from a `criticalsvc certs` directory the Secret and every caBundle are the same bytes."""
    chart = template(helm, tmp_path, *tls_files(cert_dir))
    assert_same_as_manifests(chart, manifests("--ca-bundle-from", str(cert_dir)))


def test_replicas_and_image_render_what_the_matching_manifests_options_render(
        helm: Path, tmp_path: Path, cert_dir: Path) -> None:
    """replicas and image.repository/tag do what `criticalsvc manifests --replicas --image` does."""
    chart = template(helm, tmp_path, *tls_files(cert_dir), "--set", "replicas=3",
                     "--set", "image.repository=registry.example:5000/team/criticalsvc,image.tag=1.2.3")
    expected = manifests("--ca-bundle-from", str(cert_dir), "--replicas", "3",
                         "--image", "registry.example:5000/team/criticalsvc:1.2.3")
    assert_same_as_manifests(chart, expected)
    assert one(chart, "Deployment")["spec"]["replicas"] == 3


def test_webhook_url_renders_what_manifests_webhook_url_renders(helm: Path, tmp_path: Path, cert_dir: Path) -> None:
    """webhookURL (the gate outside the cluster) does what `criticalsvc manifests --webhook-url` does."""
    url = "https://203.0.113.7:8443"
    chart = template(helm, tmp_path, *tls_files(cert_dir), "--set", f"webhookURL={url}/")
    assert_same_as_manifests(chart, manifests("--ca-bundle-from", str(cert_dir), "--webhook-url", url))
    assert {w["clientConfig"]["url"] for w in webhooks(chart)} == {f"{url}/validate"}
    assert not {"Deployment", "Service", "Secret"} & {o["kind"] for o in chart}


def test_the_image_tag_defaults_to_the_app_version(helm: Path, tmp_path: Path) -> None:
    """Without image.tag the image is the chart's appVersion, which is criticalsvc's version."""
    container = one(template(helm, tmp_path, "--set", "image.pullPolicy=Always"),
                    "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert (container["image"], container["imagePullPolicy"]) == ("criticalsvc:0.1.0", "Always")


def test_resources_replace_the_containers_resources(helm: Path, tmp_path: Path) -> None:
    """resources is the gate container's resources, as given."""
    resources = {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"cpu": "2", "memory": "1Gi"}}
    chart = template(helm, tmp_path, values={"resources": resources})
    assert one(chart, "Deployment")["spec"]["template"]["spec"]["containers"][0]["resources"] == resources


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
def test_failure_policy_is_set_on_every_webhook(helm: Path, tmp_path: Path, policy: str) -> None:
    """failurePolicy applies to all three webhooks."""
    chart = template(helm, tmp_path, "--set", f"failurePolicy={policy}")
    assert [w["failurePolicy"] for w in webhooks(chart)] == [policy] * WEBHOOK_COUNT


# --- certificates -----------------------------------------------------------------------------------

def test_generated_certificates_are_trusted_by_the_ca_bundle(helm: Path, tmp_path: Path) -> None:
    """Without tls.* the chart generates a CA in every caBundle and a serving pair it signed for the Service."""
    chart = template(helm, tmp_path)
    secret = one(chart, "Secret", "criticalsvc-tls")
    assert secret["type"] == "kubernetes.io/tls"
    data = {name: base64.b64decode(value) for name, value in secret["data"].items()}
    assert {base64.b64decode(w["clientConfig"]["caBundle"]) for w in webhooks(chart)} == {data["ca.crt"]}
    (tmp_path / "tls.crt").write_bytes(data["tls.crt"])
    (tmp_path / "tls.key").write_bytes(data["tls.key"])
    # As `criticalsvc serve` loads them (criticalsvc/serving.py): refused unless the key is the certificate's.
    ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    serving = x509.load_pem_x509_certificate(data["tls.crt"])
    serving.verify_directly_issued_by(x509.load_pem_x509_certificate(data["ca.crt"]))
    names = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"criticalsvc.{NAMESPACE}.svc" in names.get_values_for_type(x509.DNSName)
    usages = serving.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in usages


def test_cert_manager_issues_the_certificates_and_injects_the_ca(helm: Path, tmp_path: Path) -> None:
    """certManager.enabled: cert-manager's Issuers and Certificates and the inject-ca-from annotation; no caBundle."""
    chart = template(helm, tmp_path, "--set", "certManager.enabled=true")
    config = one(chart, "ValidatingWebhookConfiguration")
    assert config["metadata"]["annotations"] == {"cert-manager.io/inject-ca-from": f"{NAMESPACE}/criticalsvc-serving"}
    assert all("caBundle" not in w["clientConfig"] for w in webhooks(chart))
    assert [o for o in chart if o["kind"] == "Secret"] == []
    serving = one(chart, "Certificate", "criticalsvc-serving")
    assert serving["spec"]["secretName"] == one(chart, "Deployment")["spec"]["template"]["spec"]["volumes"][0][
        "secret"]["secretName"]
    assert f"criticalsvc.{NAMESPACE}.svc" in serving["spec"]["dnsNames"]
    assert sorted(key(o) for o in chart if o["apiVersion"].startswith("cert-manager.io/")) == [
        ("Certificate", NAMESPACE, "criticalsvc-ca"), ("Certificate", NAMESPACE, "criticalsvc-serving"),
        ("Issuer", NAMESPACE, "criticalsvc-ca"), ("Issuer", NAMESPACE, "criticalsvc-selfsigned")]


def test_cert_manager_renders_what_the_kustomize_overlay_renders(helm: Path, tmp_path: Path) -> None:
    """certManager.enabled gives the objects of `kubectl kustomize deploy/overlays/cert-manager`."""
    binaries = build.cached(build.selected_minor())
    if binaries is None:
        pytest.skip("kubectl is not built (python -m tests.realcluster build)")
    done = subprocess.run([str(binaries.kubectl), "kustomize", str(ROOT / "deploy" / "overlays" / "cert-manager")],
                          capture_output=True, text=True, env={**os.environ, "KUBECONFIG": os.devnull}, timeout=60,
                          check=True)
    overlay = [doc for doc in yaml.safe_load_all(done.stdout) if doc is not None]
    assert_same_as_manifests(template(helm, tmp_path, "--set", "certManager.enabled=true"), overlay)


def test_another_namespace_moves_every_reference_to_it(helm: Path, tmp_path: Path) -> None:
    """In another namespace, the objects, the webhooks' Service, their exclusion and the certificate follow it."""
    chart = template(helm, tmp_path, namespace="gates")
    assert {o["metadata"].get("namespace") for o in chart
            if o["kind"] not in ("CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding",
                                 "ValidatingWebhookConfiguration")} == {"gates"}
    for webhook in webhooks(chart):
        assert webhook["clientConfig"]["service"]["namespace"] == "gates"
        assert webhook["namespaceSelector"]["matchExpressions"][0]["values"] == ["gates", "kube-system"]
    for binding in (o for o in chart if o["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "criticalsvc", "namespace": "gates"}]
    cert = x509.load_pem_x509_certificate(base64.b64decode(one(chart, "Secret", "criticalsvc-tls")["data"]["tls.crt"]))
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "criticalsvc.gates.svc" in names.get_values_for_type(x509.DNSName)


# --- RBAC -------------------------------------------------------------------------------------------

def test_extra_reader_rules_are_aggregated_into_the_gates_cluster_role(helm: Path, tmp_path: Path) -> None:
    """rbac.extraReaderRules become a ClusterRole the gate's aggregated criticalsvc-reader takes in; none by default."""
    rules = [{"apiGroups": ["my.crd.group"], "resources": ["coolresources"], "verbs": ["get", "list", "watch"]}]
    chart = template(helm, tmp_path, values={"rbac": {"extraReaderRules": rules}})
    extra = one(chart, "ClusterRole", "criticalsvc-reader-extra")
    assert extra["rules"] == rules
    selector = one(chart, "ClusterRole", "criticalsvc-reader")["aggregationRule"]["clusterRoleSelectors"][0]
    assert selector["matchLabels"].items() <= extra["metadata"]["labels"].items()
    assert [o for o in template(helm, tmp_path) if o["metadata"]["name"] == "criticalsvc-reader-extra"] == []


def test_replay_rules_are_aggregated_into_the_replay_role_and_none_by_default(helm: Path, tmp_path: Path) -> None:
    """rbac.replayRules become a ClusterRole aggregated into criticalsvc-replay; without them the gate may delete
    nothing."""
    rules = [{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["delete"]}]
    chart = template(helm, tmp_path, values={"rbac": {"replayRules": rules}})
    extra = one(chart, "ClusterRole", "criticalsvc-replay-extra")
    assert extra["rules"] == rules
    replay = one(chart, "ClusterRole", "criticalsvc-replay")
    assert replay["rules"] == []
    assert replay["aggregationRule"]["clusterRoleSelectors"][0]["matchLabels"].items() <= \
        extra["metadata"]["labels"].items()
    assert [o for o in template(helm, tmp_path) if o["metadata"]["name"] == "criticalsvc-replay-extra"] == []


# --- bad values -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "message"), [
    (["--set", "failurePolicy=Maybe"], "at '/failurePolicy': value must be one of 'Fail', 'Ignore'"),
    (["--set", "replicas=-1"], "at '/replicas': minimum: got -1, want 1"),
    (["--set", "replicas=two"], "at '/replicas': got string, want integer"),
    (["--set", "image.pullPolicy=Sometimes"], "at '/image/pullPolicy': value must be one of"),
    (["--set", "image.tag=1.2 beta"], "at '/image/tag'"),
    (["--set", "resources.limits.cpu=lots"], "at '/resources/limits/cpu'"),
    (["--set", "replica=3"], "additional properties 'replica' not allowed"),
    (["--set", "rbac.extraReaderRules[0].apiGroups[0]=x,rbac.extraReaderRules[0].resources[0]=y,"
               "rbac.extraReaderRules[0].verbs[0]=delete"],
     "at '/rbac/extraReaderRules/0/verbs/0': value must be one of 'get', 'list', 'watch'"),
    (["--set", "rbac.replayRules[0].apiGroups[0]=apps,rbac.replayRules[0].resources[0]=deployments,"
               "rbac.replayRules[0].verbs[0]=update"],
     "at '/rbac/replayRules/0/verbs/0': value must be 'delete'"),
    (["--set", "tls.cert=true"], "at '/tls/cert': got boolean, want string"),
    (["--set", "webhookURL=http://gate.example:8443"], "at '/webhookURL': 'http://gate.example:8443' does not match"),
], ids=["failurePolicy", "replicas-negative", "replicas-string", "pullPolicy", "tag", "quantity", "unknown",
        "write-verb", "replay-verb", "tls-not-text", "webhook-url-http"])
def test_bad_values_are_refused_by_the_schema(helm: Path, tmp_path: Path, args: list[str], message: str) -> None:
    """values.schema.json refuses a bad value, naming where it is."""
    error = refusal(helm, tmp_path, *args)
    assert "values don't meet the specifications of the schema(s)" in error
    assert message in error


def test_some_but_not_all_tls_files_are_refused(helm: Path, tmp_path: Path, cert_dir: Path) -> None:
    """tls.cert without tls.key and tls.caCert is refused in one line saying what to set."""
    error = refusal(helm, tmp_path, "--set-file", f"tls.cert={cert_dir / certs.TLS_CERT}")
    assert "tls: set all of tls.caCert, tls.cert and tls.key" in error


def test_cert_manager_and_tls_files_together_are_refused(helm: Path, tmp_path: Path, cert_dir: Path) -> None:
    """certManager.enabled with tls.* files is refused: the chart would not know which to use."""
    error = refusal(helm, tmp_path, "--set", "certManager.enabled=true", *tls_files(cert_dir))
    assert "certManager.enabled and tls.caCert/cert/key are two sources of certificates" in error


def test_a_tls_value_that_is_not_pem_is_refused_without_quoting_it(helm: Path, tmp_path: Path, cert_dir: Path) -> None:
    """A tls.key that is not PEM is refused by name, and its content (a key, perhaps) is not echoed."""
    (tmp_path / "tls.key.der").write_text("MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg-secret", encoding="utf-8")
    args = [*tls_files(cert_dir)[:4], "--set-file", f"tls.key={tmp_path / 'tls.key.der'}"]
    error = refusal(helm, tmp_path, *args)
    assert "tls.key: not PEM text (pass the file: --set-file tls.key=DIR/tls.key)" in error
    assert "secret" not in error


def test_webhook_url_without_tls_files_is_refused(helm: Path, tmp_path: Path) -> None:
    """A gate outside the cluster needs the certificates it serves with: webhookURL without tls.* says so."""
    error = refusal(helm, tmp_path, "--set", "webhookURL=https://127.0.0.1:8443")
    assert "webhookURL: the gate outside the cluster serves its own certificate; give tls.caCert/cert/key" in error


# --- on a real control plane ------------------------------------------------------------------------

def install_or_upgrade(helm: Path, tmp_path: Path, kubeconfig: Path, *args: str) -> None:
    done = run_helm(helm, "upgrade", "--install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace",
                    *args, home=tmp_path, kubeconfig=kubeconfig)
    assert done.returncode == 0, done.stderr


@pytest.mark.realcluster
def test_helm_install_on_a_real_control_plane_keeps_certificates_and_refuses_a_protected_deletion(
        helm: Path, tmp_path: Path) -> None:
    """`helm install` works on a real API server; an upgrade keeps the generated CA; with the gate serving, a
    provider's DELETE is refused while its criteria are unmet (read through rbac.extraReaderRules)."""
    from tests.realcluster.client import Client
    from tests.realcluster.cluster import built_binaries
    from tests.realcluster.controlplane import free_port, running
    from tests.realcluster.gate import criticalsvc, outside_gate
    from tests.realcluster.teardown import Story, wait_for

    with running(built_binaries(), tmp_path / "plane") as plane:
        kubeconfig = plane.admin_kubeconfig

        def installed() -> tuple[Obj, set[str]]:
            got = plane.kubectl("get", "secret/criticalsvc-tls", "validatingwebhookconfiguration/criticalsvc",
                                "-n", NAMESPACE, "-o", "yaml")
            assert got.returncode == 0, got.stderr
            secret, config = yaml.safe_load(got.stdout)["items"]
            return secret["data"], {w["clientConfig"]["caBundle"] for w in config["webhooks"]}

        # In-cluster mode, certificates generated by the chart: an upgrade finds them and keeps them.
        install_or_upgrade(helm, tmp_path, kubeconfig)
        data, bundles = installed()
        assert bundles == {data["ca.crt"]}
        install_or_upgrade(helm, tmp_path, kubeconfig, "--set", "replicas=3")
        assert installed() == (data, bundles)

        # The gate outside the cluster (no kubelet runs pods here), reading the story's CRs by a value.
        story = Story.make("helm")
        cert_dir = tmp_path / "certs"
        criticalsvc("certs", "--out", str(cert_dir), "--san", "127.0.0.1")
        port = free_port()
        rule = {"apiGroups": [story.group], "resources": ["coolresources"], "verbs": ["get", "list", "watch"]}
        values = {"webhookURL": f"https://127.0.0.1:{port}", "rbac": {"extraReaderRules": [rule]}}
        (tmp_path / "outside.yaml").write_text(yaml.safe_dump(values), encoding="utf-8")
        install_or_upgrade(helm, tmp_path, kubeconfig, "--values", str(tmp_path / "outside.yaml"), *tls_files(cert_dir))
        gate = outside_gate(plane, tmp_path / "gate", port=port, cert_dir=cert_dir)
        admin = Client(kubeconfig)
        try:
            gate.start()
            for _ in range(2):  # twice: the CRs need their CRD first
                plane.kubectl("apply", "-f", "-", input=story.text)
                plane.kubectl("wait", "--for=condition=Established", f"crd/{story.crd_name}", "--timeout=60s")

            def denial() -> str:
                response = admin.delete(story.deployment_path, params={"dryRun": "All"})
                return str(response.json().get("message", "")) if response.status_code == 403 else ""

            wait_for(lambda: "objects still carry finalizer" in denial(), timeout=60,
                     what="the gate to refuse the provider's DELETE for its CRs' finalizer")
            response = admin.delete(story.deployment_path)
            assert response.status_code == 403
            assert 'admission webhook "providers.gate.criticalsvc.io" denied the request' in \
                provider_webhook(response.json()["message"])
            assert admin.exists(story.deployment_path)
        finally:
            admin.close()
            gate.stop()
