"""The deploy/ bundle: it builds, every object is valid Kubernetes, and it is safe on day one.

The base is rendered twice — by the real `kubectl kustomize` (skipped, with the reason, when kubectl
or its built-in kustomize is missing or too old) and by criticalsvc's own renderer, which
`criticalsvc manifests` uses — and both renders must agree and pass every check. Objects are
validated against the real Kubernetes OpenAPI schemas shipped in `kubernetes-validate`, in strict
mode (unknown fields are errors).
"""

from __future__ import annotations

import base64
import copy
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from criticalsvc import __version__, cli, install
from criticalsvc.api import GroupResource
from criticalsvc.errors import MalformedManifest
from criticalsvc.labels import parse_label_selector
from criticalsvc.serving import parse_endpoint
from criticalsvc.sim.webhooks import (
    ANY_RESOURCE,
    DEFAULT_RULES,
    DELETION_PROTECTED_SELECTOR,
    LABELLED_SELECTOR,
    PROTECTED_SELECTOR,
)

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
API = ROOT / "api"
OVERLAY = Path("overlays") / "cert-manager"

# The newest Kubernetes release kubernetes-validate (>= 1.37) has schemas for.
K8S_VERSION = "1.37"
GATE_NAMESPACE = "criticalsvc-system"
OPS_PORT, WEBHOOK_PORT = 8081, 8443

Obj = dict[str, Any]


# --- rendering ----------------------------------------------------------------------------------------

def _kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.skip("kubectl is not installed")
    return path


def kustomize(directory: Path) -> list[Obj]:
    """`kubectl kustomize DIR`, parsed; skips when kubectl's kustomize cannot build modern trees."""
    kubectl = _kubectl()
    # An empty kubeconfig: kustomize needs no cluster, and a dispatching kubectl must not go looking.
    env = {**os.environ, "KUBECONFIG": os.devnull}
    done = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, env=env,
                          timeout=60, check=False)
    if done.returncode != 0:
        version = subprocess.run([kubectl, "version", "--client"], capture_output=True, text=True, env=env,
                                 timeout=60, check=False).stdout
        if "Kustomize Version" not in version:
            # kubectl < 1.24 (e.g. Debian bookworm's 1.20, kustomize v2.0.3) cannot read directories in
            # `resources` or `patches`; that is the tool's age, not a broken bundle.
            found = re.search(r'GitVersion:"(v[^"]+)"|Client Version: (v\d\S*)', version)
            release = next((g for g in found.groups() if g), "?") if found else "?"
            pytest.skip(f"kubectl {release}: its built-in kustomize is too old for this tree (kubectl >= 1.24 needed)")
        pytest.fail(f"kubectl kustomize {directory} failed:\n{done.stderr}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc is not None]


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of deploy/ and api/ (same layout), so tests can break it without touching the repository."""
    root = tmp_path_factory.mktemp("tree")
    shutil.copytree(DEPLOY, root / "deploy")
    shutil.copytree(API, root / "api", ignore=shutil.ignore_patterns("examples"))
    return root


@pytest.fixture(scope="module")
def kubectl_base() -> list[Obj]:
    return kustomize(DEPLOY)


@pytest.fixture(scope="module")
def python_base() -> list[Obj]:
    return install.build(DEPLOY)


@pytest.fixture(scope="module", params=["kubectl", "criticalsvc"])
def base(request: pytest.FixtureRequest) -> list[Obj]:
    """The rendered base, from each renderer."""
    name = "kubectl_base" if request.param == "kubectl" else "python_base"
    objects: list[Obj] = request.getfixturevalue(name)
    return objects


@pytest.fixture(scope="module")
def overlay() -> list[Obj]:
    return kustomize(DEPLOY / OVERLAY)


def one(objects: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def every(objects: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind]


def schema_errors(objects: list[Obj]) -> list[str]:
    """One line per object that is not valid against the Kubernetes schemas (or has no schema)."""
    errors = []
    for obj in objects:
        where = f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}"
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{where}: {'.'.join(map(str, exc.path))}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            errors.append(f"{where}: {exc.message}")
    return errors


# --- schemas --------------------------------------------------------------------------------------------

def test_every_object_validates_against_the_kubernetes_schemas(base: list[Obj]) -> None:
    """Every object of the base, the CRD included, is valid Kubernetes 1.37 in strict mode."""
    assert len(base) >= 10
    assert schema_errors(base) == []


@pytest.mark.parametrize(("edit", "expected"), [
    (lambda d: d["spec"].__setitem__("replicas", "two"), "spec.replicas: 'two' is not of type"),
    (lambda d: d["spec"]["template"]["spec"]["containers"][0]["securityContext"]
     .__setitem__("readOnlyRootFileSystem", True), "'readOnlyRootFileSystem' was unexpected"),
], ids=["replicas-two", "misspelt-field"])
def test_a_broken_manifest_fails_validation(tree: Path, tmp_path: Path, edit: Callable[[Obj], None],
                                            expected: str) -> None:
    """A deliberately broken Deployment in a copy of the bundle is reported, naming the field."""
    broken = tmp_path / "tree"
    shutil.copytree(tree, broken)
    path = broken / "deploy" / "base" / "deployment.yaml"
    docs = list(yaml.safe_load_all(path.read_text()))
    edit(one(docs, "Deployment"))
    path.write_text(yaml.safe_dump_all(docs))
    errors = schema_errors(install.build(broken / "deploy"))
    assert len(errors) == 1 and expected in errors[0], errors
    assert schema_errors(kustomize(broken / "deploy")) == errors


def structural_problems(schema: Any, path: str = "openAPIV3Schema", *, root: bool = True) -> list[str]:
    """Violations of the CRD structural-schema rules (the subset that can be checked statically).

    Every node specifies a type (unless it is int-or-string or preserves unknown fields); `items` is
    one schema; `properties` and `additionalProperties` never meet; no `$ref`/`definitions`; the root
    is an object; at the root `metadata` may only restrict `name` and `generateName`.
    """
    if not isinstance(schema, dict):
        return [f"{path}: not a schema object"]
    problems = []
    if root and schema.get("type") != "object":
        problems.append(f"{path}.type: must be object at the root")
    if "type" not in schema and not (schema.get("x-kubernetes-int-or-string")
                                     or schema.get("x-kubernetes-preserve-unknown-fields")):
        problems.append(f"{path}.type: required")
    for keyword in ("$ref", "definitions", "dependencies", "id"):
        if keyword in schema:
            problems.append(f"{path}.{keyword}: not allowed")
    if "properties" in schema and "additionalProperties" in schema:
        problems.append(f"{path}: properties and additionalProperties are mutually exclusive")
    if isinstance(schema.get("items"), list):
        problems.append(f"{path}.items: must be a single schema")
    elif "items" in schema:
        problems += structural_problems(schema["items"], f"{path}.items", root=False)
    if isinstance(schema.get("additionalProperties"), dict):
        problems += structural_problems(schema["additionalProperties"], f"{path}.additionalProperties", root=False)
    for name, sub in (schema.get("properties") or {}).items():
        problems += structural_problems(sub, f"{path}.properties.{name}", root=False)
    if root:
        metadata = (schema.get("properties") or {}).get("metadata") or {}
        extra = set(metadata.get("properties") or {}) - {"name", "generateName"}
        if extra:
            problems.append(f"{path}.properties.metadata: may only restrict name and generateName, not {sorted(extra)}")
    return problems


def test_the_crd_is_structural(base: list[Obj]) -> None:
    """Every served version of the CriticalService CRD has a structural openAPIV3Schema with an object root."""
    crd = one(base, "CustomResourceDefinition", "criticalservices.criticalsvc.io")
    for version in crd["spec"]["versions"]:
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        assert schema is not None, f"version {version['name']}: openAPIV3Schema missing"
        assert structural_problems(schema) == [], version["name"]


def test_the_structural_check_catches_a_non_structural_schema() -> None:
    """The structural check reports a missing type, a list `items` and a non-object root."""
    schema = {"type": "array", "items": [{"type": "string"}],
              "properties": {"spec": {"properties": {"x": {"description": "no type"}}}}}
    problems = structural_problems(schema)
    assert "openAPIV3Schema.type: must be object at the root" in problems
    assert "openAPIV3Schema.items: must be a single schema" in problems
    assert "openAPIV3Schema.properties.spec.type: required" in problems
    assert "openAPIV3Schema.properties.spec.properties.x.type: required" in problems


def test_the_crd_comes_from_api_and_is_not_copied() -> None:
    """deploy/ references ../api for the CRD and holds no CustomResourceDefinition of its own."""
    base_kustomization = yaml.safe_load((DEPLOY / "base" / "kustomization.yaml").read_text())
    assert "../../api" in base_kustomization["resources"]
    # The Helm chart's crds/ entry is a symbolic link to api/'s file (its templates are not YAML).
    chart = DEPLOY / "helm" / "criticalsvc"
    crd = chart / "crds" / "criticalservices.criticalsvc.io.yaml"
    assert crd.is_symlink() and crd.resolve() == (API / crd.name).resolve()
    for path in DEPLOY.rglob("*.yaml"):
        if chart in path.parents:
            continue
        kinds = [d.get("kind") for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
        assert "CustomResourceDefinition" not in kinds, path


def test_criticalsvc_renders_what_kubectl_kustomize_renders(kubectl_base: list[Obj], python_base: list[Obj]) -> None:
    """`criticalsvc manifests`' renderer and kubectl kustomize give the same objects in the same order."""
    assert python_base == kubectl_base


def test_the_renderer_refuses_kustomize_features_it_does_not_implement(tree: Path, tmp_path: Path) -> None:
    """A kustomization field other than `resources` stops the renderer with one line naming it."""
    copy_ = tmp_path / "tree"
    shutil.copytree(tree, copy_)
    kfile = copy_ / "deploy" / "base" / "kustomization.yaml"
    kfile.write_text(kfile.read_text() + "namePrefix: x-\n")
    with pytest.raises(MalformedManifest, match=r"kustomization.yaml: namePrefix: not supported"):
        install.build(copy_ / "deploy")


# --- pod security ---------------------------------------------------------------------------------------

def pod_spec(objects: list[Obj]) -> Obj:
    spec: Obj = one(objects, "Deployment", "criticalsvc")["spec"]["template"]["spec"]
    return spec


def containers(objects: list[Obj]) -> list[Obj]:
    spec = pod_spec(objects)
    return [*spec.get("initContainers", []), *spec["containers"]]


def test_the_pod_runs_as_non_root_with_a_read_only_root_filesystem(base: list[Obj]) -> None:
    """Every container runs as uid 65532, non-root, with a read-only root filesystem."""
    pod = pod_spec(base)["securityContext"]
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] == 65532
    for container in containers(base):
        sc = container["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 65532, container["name"]
        assert sc["readOnlyRootFilesystem"] is True, container["name"]


def test_the_pod_cannot_gain_privileges(base: list[Obj]) -> None:
    """No privilege escalation, every capability dropped, the runtime's default seccomp profile."""
    assert pod_spec(base)["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in containers(base):
        sc = container["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert not sc.get("privileged", False)
    spec = pod_spec(base)
    assert not any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
    assert all("hostPath" not in v for v in spec.get("volumes", []))


def test_the_namespace_enforces_the_restricted_pod_security_standard(base: list[Obj]) -> None:
    """The gate's namespace enforces Pod Security "restricted", which the pod above meets."""
    namespace = one(base, "Namespace", GATE_NAMESPACE)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_containers_have_requests_and_limits(base: list[Obj]) -> None:
    """Every container requests and limits CPU and memory."""
    for container in containers(base):
        resources = container["resources"]
        assert set(resources["requests"]) >= {"cpu", "memory"} and set(resources["limits"]) >= {"cpu", "memory"}


# --- availability ----------------------------------------------------------------------------------------

def test_the_gate_is_highly_available(base: list[Obj]) -> None:
    """At least 2 replicas, spread by hostname, and a PDB keeping one available selects the pods."""
    deployment = one(base, "Deployment", "criticalsvc")
    assert deployment["spec"]["replicas"] >= 2
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    pdb = one(base, "PodDisruptionBudget")
    assert pdb["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    terms = pod_spec(base)["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert any(t["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
               and t["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= pod_labels.items() for t in terms)
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def _port_number(container: Obj, port: int | str) -> int:
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container["ports"] if p["name"] == port]
    return int(number)


def test_probes_use_the_ops_port(base: list[Obj]) -> None:
    """Readiness asks /readyz (cache sync) and liveness /healthz, both over plain HTTP on port 8081."""
    (container,) = pod_spec(base)["containers"]
    ready, live = container["readinessProbe"]["httpGet"], container["livenessProbe"]["httpGet"]
    assert ready["path"] == "/readyz" and live["path"] == "/healthz"
    assert _port_number(container, ready["port"]) == OPS_PORT == _port_number(container, live["port"])
    assert ready.get("scheme", "HTTP") == "HTTP" == live.get("scheme", "HTTP")


def test_the_deployment_args_are_accepted_by_criticalsvc_serve(base: list[Obj]) -> None:
    """The container's args parse with `criticalsvc serve`'s own parser: ports 8443/8081, cert files on the mount."""
    (container,) = pod_spec(base)["containers"]
    args = cli.build_parser().parse_args(container["args"])
    assert args.command == "serve"
    assert parse_endpoint(args.listen, flag="--listen").port == WEBHOOK_PORT
    assert parse_endpoint(args.ops_listen, flag="--ops-listen").port == OPS_PORT
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "tls"]
    assert mount["readOnly"] is True and "subPath" not in mount
    assert {Path(args.tls_cert).parent, Path(args.tls_key).parent} == {Path(mount["mountPath"])}
    (volume,) = [v for v in pod_spec(base)["volumes"] if v["name"] == "tls"]
    assert volume["secret"]["secretName"] == "criticalsvc-tls"


def test_the_service_and_network_policy_reach_the_webhook_port(base: list[Obj]) -> None:
    """The Service maps 443 to the container's 8443, and the NetworkPolicy admits 8443 and 8081."""
    (container,) = pod_spec(base)["containers"]
    service = one(base, "Service", "criticalsvc")
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == 443]
    assert _port_number(container, port["targetPort"]) == WEBHOOK_PORT
    pod_labels = one(base, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    policy = one(base, "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    allowed = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    assert allowed == {WEBHOOK_PORT, OPS_PORT}


def test_the_image_tag_is_the_package_version(base: list[Obj]) -> None:
    """The Deployment's image is tagged with this package's version, so the two are released together."""
    (container,) = pod_spec(base)["containers"]
    assert container["image"].rsplit(":", 1)[1] == __version__


# --- RBAC -------------------------------------------------------------------------------------------------

WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}
# The only writes the gate makes: (group, resource) -> where the grant may live.
ALLOWED_WRITES = {
    ("", "events"): "ClusterRole",
    ("events.k8s.io", "events"): "ClusterRole",
    ("criticalsvc.io", "criticalservices/status"): "ClusterRole",
    ("coordination.k8s.io", "leases"): "Role",
    ("", "configmaps"): "Role",  # deletion intents, in the gate's own namespace
    # its own webhook configuration criticalsvc-providers (criticalsvc/routing.py)
    ("admissionregistration.k8s.io", "validatingwebhookconfigurations"): "ClusterRole",
}


def rules(objects: list[Obj]) -> Iterator[tuple[Obj, Obj]]:
    for role in [*every(objects, "ClusterRole"), *every(objects, "Role")]:
        for rule in role.get("rules") or []:
            yield role, rule


def test_rbac_writes_only_events_status_leases_and_intents(base: list[Obj]) -> None:
    """No role grants a write verb except on events, criticalservices/status, (namespaced) leases and
    (namespaced) ConfigMaps for deletion intents, and `patch` (of the gate's labels) on the built-in provider
    types; replays delete only what the operator aggregates in."""
    writes = set()
    for role, rule in rules(base):
        if (role["metadata"].get("labels") or {}).get("criticalsvc.io/aggregate-to-labeller") == "true":
            # The labeller's grants (criticalsvc/protectionlabels.py): a merge patch of its labels, nothing else.
            assert rule["verbs"] == ["patch"] and role["kind"] == "ClusterRole", rule
            continue
        verbs = set(rule["verbs"]) & WRITE_VERBS
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                if verbs:
                    assert ALLOWED_WRITES.get((group, resource)) == role["kind"], (role["metadata"]["name"], rule)
                    writes.add((group, resource))
    assert writes == set(ALLOWED_WRITES)


def test_rbac_has_no_wildcards_and_no_secrets(base: list[Obj]) -> None:
    """No wildcard verb, group or resource, no escalate/bind/impersonate, and no access to Secrets."""
    for role, rule in rules(base):
        for field in ("verbs", "apiGroups", "resources", "resourceNames", "nonResourceURLs"):
            assert "*" not in rule.get(field, []), (role["metadata"]["name"], rule)
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])
        assert "secrets" not in rule.get("resources", [])


def test_the_replay_role_grants_nothing_until_the_operator_aggregates_it(base: list[Obj]) -> None:
    """criticalsvc-replay is bound to the gate, aggregates by its own label, and no shipped role carries that label."""
    replay = one(base, "ClusterRole", "criticalsvc-replay")
    (selector,) = replay["aggregationRule"]["clusterRoleSelectors"]
    assert selector["matchLabels"] == {"criticalsvc.io/aggregate-to-replay": "true"}
    assert replay["rules"] == []
    assert not [r for r in every(base, "ClusterRole")
                if "criticalsvc.io/aggregate-to-replay" in (r["metadata"].get("labels") or {})]
    binding = one(base, "ClusterRoleBinding", "criticalsvc-replay")
    assert binding["roleRef"]["name"] == "criticalsvc-replay"


def test_the_namespaced_roles_live_in_the_gate_namespace(base: list[Obj]) -> None:
    """Leader election and deletion intents are granted in criticalsvc-system only, get/update of Leases limited
    to the gate's own Lease."""
    for role in every(base, "Role"):
        assert role["metadata"]["namespace"] == GATE_NAMESPACE
    role = one(base, "Role", "criticalsvc-leader-election")
    for rule in role["rules"]:
        if set(rule["verbs"]) & {"get", "update"}:
            assert rule["resourceNames"] == ["criticalsvc-status"]


def test_the_webhook_router_writes_only_its_own_configuration(base: list[Obj]) -> None:
    """get on the shipped configuration and the owned ones, update/patch on the owned ones only, create
    unrestricted (RBAC cannot limit it by name), no delete and no list/watch."""
    from criticalsvc.routing import SHIPPED_CONFIGURATION
    from criticalsvc.webhookconfigurations import CONFIGURATION_NAMES

    grants: dict[str, set[str] | None] = {}
    for _role, rule in rules(base):
        if "validatingwebhookconfigurations" not in rule.get("resources", []):
            continue
        for verb in rule["verbs"]:
            names = rule.get("resourceNames")
            grants[verb] = set(names) if names is not None else None
    owned = set(CONFIGURATION_NAMES)  # every shard the router may write
    assert grants == {"get": {SHIPPED_CONFIGURATION, *owned}, "update": owned, "patch": owned, "create": None}


def test_the_reader_role_aggregates_and_covers_what_the_gate_watches(base: list[Obj]) -> None:
    """The bound reader ClusterRole aggregates by label, and the built-in part reads every gated resource."""
    reader = one(base, "ClusterRole", "criticalsvc-reader")
    (selector,) = reader["aggregationRule"]["clusterRoleSelectors"]
    members = [r for r in every(base, "ClusterRole")
               if selector["matchLabels"].items() <= (r["metadata"].get("labels") or {}).items()]
    readable = {(g, res) for m in members for rule in m["rules"] if {"get", "list", "watch"} <= set(rule["verbs"])
                for g in rule["apiGroups"] for res in rule["resources"]}
    # The labelled-objects rule (any type) needs no read: the gate reads the label from oldObject.
    gated = {(gr.group, gr.resource) for r in DEFAULT_RULES for gr in r.group_resources if gr != ANY_RESOURCE}
    assert gated <= readable


def test_every_role_is_bound_to_the_gate_service_account(base: list[Obj]) -> None:
    """Each role is bound, only to the ServiceAccount the Deployment runs as."""
    account = one(base, "ServiceAccount")
    assert pod_spec(base)["serviceAccountName"] == account["metadata"]["name"]
    bound = set()
    for binding in [*every(base, "ClusterRoleBinding"), *every(base, "RoleBinding")]:
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                        "namespace": account["metadata"]["namespace"]}]
        bound.add((binding["roleRef"]["kind"], binding["roleRef"]["name"]))
    aggregated_parts = {r["metadata"]["name"] for r in every(base, "ClusterRole")
                        if {"criticalsvc.io/aggregate-to-reader", "criticalsvc.io/aggregate-to-labeller"}
                        & set(r["metadata"].get("labels") or {})}
    roles = {(r["kind"], r["metadata"]["name"]) for r in [*every(base, "ClusterRole"), *every(base, "Role")]
             if r["metadata"]["name"] not in aggregated_parts}
    assert bound == roles


# --- the webhook configuration ------------------------------------------------------------------------------

def webhooks(objects: list[Obj]) -> list[Obj]:
    result: list[Obj] = one(objects, "ValidatingWebhookConfiguration")["webhooks"]
    return result


def test_the_shipped_configuration_routes_no_provider_namespace_or_workload(base: list[Obj]) -> None:
    """Providers, their namespaces and their CRDs are routed by the gate's own criticalsvc-providers, narrowed to
    those objects (design/routing.md); the shipped rules name only CriticalServices, CRDs (narrowed to the
    CriticalService CRD by a matchCondition) and, for objects carrying one of the gate's labels, everything: each
    webhook whose rules name everything selects only objects that carry criticalsvc.io/deletion-protected=Always
    or criticalsvc.io/protected, so an unlabelled object's DELETE or UPDATE never reaches the gate."""
    everything = [w for w in webhooks(base) if any("*" in rule["resources"] for rule in w["rules"])]
    assert {w["name"] for w in everything} == {"labelled.gate.criticalsvc.io", "protected.gate.criticalsvc.io",
                                               "protected-updates.gate.criticalsvc.io"}
    for w in everything:
        required = {(e["key"], e["operator"]) for e in w["objectSelector"]["matchExpressions"]
                    if e["operator"] in ("In", "Exists")}
        assert required & {("criticalsvc.io/deletion-protected", "In"), ("criticalsvc.io/protected", "Exists")}, w
    named = {(g, r) for w in webhooks(base) if w not in everything for rule in w["rules"]
             for g in rule["apiGroups"] for r in rule["resources"]}
    assert named == {("criticalsvc.io", "criticalservices"), ("apiextensions.k8s.io", "customresourcedefinitions")}
    (crds,) = [w for w in webhooks(base) if w["name"] == "crds.gate.criticalsvc.io"]
    (condition,) = crds["matchConditions"]
    assert "'criticalservices.criticalsvc.io'" in condition["expression"]


def test_the_webhooks_never_gate_their_own_namespace_or_kube_system(base: list[Obj]) -> None:
    """Every webhook excludes the gate's namespace and kube-system by the immutable name label."""
    gate_namespace = one(base, "Deployment")["metadata"]["namespace"]
    for webhook in webhooks(base):
        expressions = webhook["namespaceSelector"]["matchExpressions"]
        excluded = {v for e in expressions if e["key"] == "kubernetes.io/metadata.name" and e["operator"] == "NotIn"
                    for v in e["values"]}
        assert {gate_namespace, "kube-system"} <= excluded, webhook["name"]
        assert "matchLabels" not in webhook["namespaceSelector"]


def test_the_webhooks_are_side_effect_free_on_dry_run_short_and_fail_closed(base: list[Obj]) -> None:
    """sideEffects NoneOnDryRun (intents and Events are recorded, never for a dry run), v1 reviews, Equivalent
    matching, a timeout of at most 5 s, failurePolicy written out."""
    for webhook in webhooks(base):
        assert webhook["sideEffects"] == "NoneOnDryRun"
        assert webhook["admissionReviewVersions"] == ["v1"]
        assert webhook["matchPolicy"] == "Equivalent"
        assert 1 <= webhook["timeoutSeconds"] <= 5
        assert webhook.get("failurePolicy") == "Fail", "failurePolicy must be written out (Fail: fail closed)"


def test_the_webhooks_call_the_gate_service(base: list[Obj]) -> None:
    """Every webhook calls POST /validate on port 443 of the Service the Deployment backs."""
    service = one(base, "Service", "criticalsvc")
    for webhook in webhooks(base):
        assert webhook["clientConfig"]["service"] == {
            "namespace": service["metadata"]["namespace"], "name": service["metadata"]["name"],
            "path": "/validate", "port": 443}
        base64.b64decode(webhook["clientConfig"]["caBundle"], validate=True)


def test_the_webhook_rules_are_exactly_the_gated_operations(base: list[Obj]) -> None:
    """The registered (operation, resource, objectSelector) triples equal the ones the simulated API server
    gates, and no more; only the labelled-objects webhook uses wildcards."""
    registered = set()
    for webhook in webhooks(base):
        selector = parse_label_selector(webhook.get("objectSelector"), "objectSelector")
        for rule in webhook["rules"]:
            assert "*" not in rule["operations"]
            if selector in (DELETION_PROTECTED_SELECTOR, PROTECTED_SELECTOR, LABELLED_SELECTOR):
                (operation,) = rule["operations"]
                assert rule == {"apiGroups": ["*"], "apiVersions": ["*"], "operations": [operation],
                                "resources": ["*"], "scope": "*"}, (webhook["name"], rule)
                registered |= {(operation, ANY_RESOURCE, selector)}
                continue
            assert "*" not in rule["resources"] and "*" not in rule["apiGroups"]
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    gr = GroupResource(group, resource)
                    scope = "Namespaced" if group == "apps" else "Cluster"
                    assert rule["scope"] == scope, (webhook["name"], rule)
                    registered |= {(op, gr, selector) for op in rule["operations"]}
    expected = {(op, gr, r.object_selector) for r in DEFAULT_RULES for op in r.operations for gr in r.group_resources}
    assert registered == expected


def test_each_delete_is_reviewed_by_one_webhook_unless_it_also_reviews_writes(base: list[Obj]) -> None:
    """The labelled-objects webhook selects criticalsvc.io/deletion-protected In [Always] and matches every
    top-level resource (never "*/*": no subresources); every DELETE-only webhook selects NotIn [Always],
    so the API server (which calls matching webhooks in parallel) never asks two of them about one
    object. The CriticalServices webhook has no objectSelector: its CREATE/UPDATE must never be skipped."""
    label = {"key": "criticalsvc.io/deletion-protected", "values": ["Always"]}
    by_name = {w["name"]: w for w in webhooks(base)}
    labelled = by_name["labelled.gate.criticalsvc.io"]
    assert labelled["objectSelector"] == {"matchExpressions": [{**label, "operator": "In"}]}
    assert all("*/*" not in r["resources"] for w in webhooks(base) for r in w["rules"])
    protected = {"key": "criticalsvc.io/protected", "operator": "Exists"}
    for webhook in webhooks(base):
        operations = {op for rule in webhook["rules"] for op in rule["operations"]}
        if webhook is labelled:
            continue
        if webhook["name"] == "protected.gate.criticalsvc.io":
            assert webhook["objectSelector"] == {"matchExpressions": [protected, {**label, "operator": "NotIn"}]}
        elif operations == {"DELETE"}:
            assert webhook["objectSelector"] == {"matchExpressions": [{**label, "operator": "NotIn"}]}, webhook["name"]
        elif operations == {"UPDATE"}:  # the label-removing UPDATEs: no DELETE, so no second reviewer
            assert webhook["objectSelector"] == {"matchExpressions": [protected]}, webhook["name"]
        else:
            assert "objectSelector" not in webhook, webhook["name"]


def test_webhook_names_are_unique_and_qualified(base: list[Obj]) -> None:
    """Webhook names are distinct fully qualified names under criticalsvc.io."""
    names = [w["name"] for w in webhooks(base)]
    assert len(set(names)) == len(names) == 5
    assert all(n.endswith(".criticalsvc.io") and n.count(".") >= 2 for n in names)


# --- the cert-manager overlay ------------------------------------------------------------------------------

def test_the_cert_manager_overlay_injects_the_ca_into_the_webhooks(overlay: list[Obj]) -> None:
    """The overlay annotates the configuration for cert-manager's CA injector and leaves caBundle to it."""
    config = one(overlay, "ValidatingWebhookConfiguration")
    annotation = config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    namespace, name = annotation.split("/")
    certificate = one(overlay, "Certificate", name)
    assert certificate["metadata"]["namespace"] == namespace
    assert all("caBundle" not in w["clientConfig"] for w in config["webhooks"])
    assert len(config["webhooks"]) == 5


def test_the_cert_manager_certificate_fills_the_secret_the_pods_mount(overlay: list[Obj]) -> None:
    """The serving Certificate writes the mounted Secret, for the Service's DNS names, from a CA Issuer chain."""
    annotations = one(overlay, "ValidatingWebhookConfiguration")["metadata"]["annotations"]
    certificate = one(overlay, "Certificate", annotations["cert-manager.io/inject-ca-from"].split("/")[1])["spec"]
    (volume,) = [v for v in pod_spec(overlay)["volumes"] if v["name"] == "tls"]
    assert certificate["secretName"] == volume["secret"]["secretName"]
    assert "criticalsvc.criticalsvc-system.svc" in certificate["dnsNames"]
    assert "server auth" in certificate["usages"]
    issuer = one(overlay, "Issuer", certificate["issuerRef"]["name"])
    (ca_certificate,) = [c for c in every(overlay, "Certificate")
                         if c["spec"]["secretName"] == issuer["spec"]["ca"]["secretName"]]
    assert ca_certificate["spec"]["isCA"] is True
    assert "selfSigned" in one(overlay, "Issuer", ca_certificate["spec"]["issuerRef"]["name"])["spec"]


def test_the_cert_manager_overlay_keeps_the_base_valid(overlay: list[Obj], kubectl_base: list[Obj]) -> None:
    """Apart from cert-manager's kinds and the webhook annotation, the overlay is the validated base."""
    builtin = [o for o in overlay if not o["apiVersion"].startswith("cert-manager.io/")]
    assert schema_errors(builtin) == []
    assert {(o["kind"], o["metadata"]["name"]) for o in builtin} == {(o["kind"], o["metadata"]["name"])
                                                                     for o in kubectl_base}
    assert {o["kind"] for o in overlay if o not in builtin} == {"Issuer", "Certificate"}


# --- `criticalsvc manifests` -------------------------------------------------------------------------------

def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def ca_b64() -> str:
    from criticalsvc import certs

    return certs.ca_bundle(certs.make_ca().cert)


def test_manifests_renders_the_base_with_the_ca_bundle_and_overrides(
        capsys: pytest.CaptureFixture[str], ca_b64: str, python_base: list[Obj]) -> None:
    """`manifests --ca-bundle B64 --image I --replicas 3` is the base with exactly those three changes."""
    code, out, _ = run_cli(capsys, "manifests", "--ca-bundle", ca_b64, "--image", "registry.example/gate:1",
                           "--replicas", "3")
    assert code == 0
    rendered = [d for d in yaml.safe_load_all(out) if d is not None]
    expected = copy.deepcopy(python_base)
    for webhook in webhooks(expected):
        webhook["clientConfig"]["caBundle"] = ca_b64
    deployment = one(expected, "Deployment")
    deployment["spec"]["replicas"] = 3
    deployment["spec"]["template"]["spec"]["containers"][0]["image"] = "registry.example/gate:1"
    assert rendered == expected
    assert schema_errors(rendered) == []


@pytest.mark.parametrize(("argv", "message"), [
    (["--ca-bundle-from", "/nonexistent/certs"], "/nonexistent/certs: --ca-bundle-from: no such directory"),
    (["--ca-bundle", "not base64!"], "--ca-bundle: not valid base64"),
    (["--ca-bundle", base64.b64encode(b"hello").decode()], "--ca-bundle: holds no PEM certificate"),
    (["--ca-bundle", "{ca}", "--replicas", "0"], "--replicas: must be at least 1, not 0"),
    (["--ca-bundle", "{ca}", "--image", ""], "--image: '' is not an image reference"),
    ([], "one of the arguments --ca-bundle-from --ca-bundle is required"),
], ids=["missing-dir", "bad-base64", "not-a-certificate", "zero-replicas", "empty-image", "no-ca"])
def test_manifests_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], ca_b64: str,
                                                   argv: list[str], message: str) -> None:
    """Bad input to `manifests` exits 2 with one line on stderr naming the problem, and prints no manifests."""
    argv = [ca_b64 if a == "{ca}" else a for a in argv]
    try:
        code, out, err = run_cli(capsys, "manifests", *argv)
    except SystemExit as exc:  # argparse's own errors
        code, (out, err) = int(exc.code or 0), capsys.readouterr()
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and message in err, err


# --- the Dockerfile -------------------------------------------------------------------------------------------

def dockerfile_instructions() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instruction, _, rest = line.partition(" ")
            found.setdefault(instruction.upper(), []).append(rest.strip())
    return found


def test_the_dockerfile_pins_its_base_and_runs_as_the_deployments_user(base: list[Obj]) -> None:
    """The image is built on a patch-pinned Python base, runs as uid 65532 and starts what the Deployment expects."""
    import json

    instructions = dockerfile_instructions()
    (image,) = instructions["FROM"]
    assert re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?(@sha256:[0-9a-f]{64})?", image), image
    (user,) = instructions["USER"]
    uid = pod_spec(base)["securityContext"]["runAsUser"]
    assert user.split(":")[0] == str(uid) != "0"
    assert json.loads(instructions["ENTRYPOINT"][-1]) == ["criticalsvc"]
    (container,) = pod_spec(base)["containers"]
    assert json.loads(instructions["CMD"][-1]) == container["args"]
    assert any("--no-cache-dir" in run for run in instructions["RUN"])
