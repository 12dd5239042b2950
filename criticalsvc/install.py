"""The install manifests: `deploy/` rendered in Python, with the webhook's caBundle filled in.

One source of truth. The install is the kustomize tree `deploy/` (with the CRD referenced from
`api/`); `kubectl apply -k deploy/` and `criticalsvc manifests` produce the same objects. This module
does not keep a second copy of any manifest: it builds the tree itself, implementing the one
kustomize feature the tree uses — a kustomization whose `resources` name YAML files and directories
— and refusing every other field, so a kustomize feature added to deploy/ later fails loudly here
(and in tests/test_deploy.py, which compares this renderer with `kubectl kustomize`) instead of
being silently dropped. Objects come out in kustomize's "legacy" order (Namespace and CRDs first,
webhook configurations last), which is also a safe `kubectl apply` order.

Where the tree is found: in a source checkout or an editable install it sits next to the package
(`<checkout>/deploy`, `<checkout>/api`); a wheel install carries copies of both under
`<prefix>/share/criticalsvc/` (pyproject.toml `[tool.setuptools.data-files]`), in the same relative
layout, so `../../api` in the kustomization resolves in either place.
"""

from __future__ import annotations

import base64
import binascii
import copy
import sys
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.exceptions import InvalidSignature

from . import certs
from .errors import InvalidInput, MalformedManifest

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
SUPPORTED_FIELDS = frozenset({"apiVersion", "kind", "resources"})

DEPLOYMENT_NAME = "criticalsvc"
CONTAINER_NAME = "criticalsvc"
TLS_VOLUME = "tls"

# kustomize's legacy sort (api/resid/gvk.go): these kinds first, in this order; the webhook
# configurations last; every other kind in between.
_ORDER_FIRST = (
    "Namespace", "ResourceQuota", "StorageClass", "CustomResourceDefinition", "ServiceAccount",
    "PodSecurityPolicy", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding", "ConfigMap", "Secret",
    "Endpoints", "Service", "LimitRange", "PriorityClass", "PersistentVolume", "PersistentVolumeClaim",
    "Deployment", "StatefulSet", "CronJob", "PodDisruptionBudget",
)
_ORDER_LAST = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
_KIND_RANK = {kind: i - len(_ORDER_FIRST) for i, kind in enumerate(_ORDER_FIRST)}
_KIND_RANK.update({kind: i + 1 for i, kind in enumerate(_ORDER_LAST)})


def bundle_candidates() -> list[Path]:
    """Where `deploy/` may be: next to the package (checkout, editable), then in the install prefix."""
    return [Path(__file__).resolve().parent.parent / "deploy", Path(sys.prefix) / "share" / "criticalsvc" / "deploy"]


def find_deploy_dir() -> Path:
    for candidate in bundle_candidates():
        if _kustomization_file(candidate) is not None:
            return candidate
    looked = ", ".join(str(c) for c in bundle_candidates())
    raise MalformedManifest("", f"the deploy/ manifests are not installed (looked in {looked})")


def _kustomization_file(directory: Path) -> Path | None:
    for name in KUSTOMIZATION_FILES:
        if (directory / name).is_file():
            return directory / name
    return None


# --- the kustomize subset ----------------------------------------------------------------------------

def _object_id(obj: Mapping[str, Any]) -> tuple[str, str, str, str]:
    meta = obj.get("metadata") or {}
    return (str(obj["apiVersion"]).split("/")[0] if "/" in obj["apiVersion"] else "", str(obj["kind"]),
            str(meta.get("namespace", "")), str(meta.get("name", "")))


def _load_file(path: Path) -> Iterator[dict[str, Any]]:
    try:
        docs = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
    except OSError as exc:
        raise MalformedManifest("", f"cannot read: {exc.strerror}", where=str(path)) from None
    except yaml.YAMLError as exc:
        raise MalformedManifest("", f"not valid YAML: {exc}".splitlines()[0], where=str(path)) from None
    for i, doc in enumerate(docs, start=1):
        if doc is None:
            continue
        where = f"{path}: document {i}"
        if not isinstance(doc, dict):
            raise MalformedManifest("", "a manifest must be a mapping", where=where)
        for field in ("apiVersion", "kind"):
            if not isinstance(doc.get(field), str) or not doc[field]:
                raise MalformedManifest(field, "required", where=where)
        if not isinstance(doc.get("metadata"), dict) or not doc["metadata"].get("name"):
            raise MalformedManifest("metadata.name", "required", where=where)
        yield doc


def build(directory: Path) -> list[dict[str, Any]]:
    """The objects of a kustomization (resources only), in kustomize's legacy order."""
    objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for obj, where in _build(directory.resolve(), ()):
        key = _object_id(obj)
        if key in objects:
            raise MalformedManifest("", f"{key[1]} {key[2] + '/' if key[2] else ''}{key[3]} is defined twice",
                                    where=where)
        objects[key] = obj
    return sort_objects(objects.values())


def _build(directory: Path, visiting: tuple[Path, ...]) -> Iterator[tuple[dict[str, Any], str]]:
    kfile = _kustomization_file(directory)
    if kfile is None:
        raise MalformedManifest("", "no kustomization.yaml", where=str(directory))
    if directory in visiting:
        raise MalformedManifest("resources", "cycle: the kustomization includes itself", where=str(kfile))
    try:
        spec = yaml.safe_load(kfile.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise MalformedManifest("", f"unreadable kustomization: {exc}".splitlines()[0], where=str(kfile)) from None
    if not isinstance(spec, dict):
        raise MalformedManifest("", "a kustomization must be a mapping", where=str(kfile))
    unsupported = sorted(set(spec) - SUPPORTED_FIELDS)
    if unsupported:
        raise MalformedManifest(unsupported[0], "not supported by criticalsvc's renderer (only `resources`); "
                                                "use kubectl kustomize for this tree", where=str(kfile))
    resources = spec.get("resources") or []
    if not isinstance(resources, list) or not all(isinstance(r, str) for r in resources):
        raise MalformedManifest("resources", "must be a list of paths", where=str(kfile))
    for i, entry in enumerate(resources):
        if "://" in entry or entry.startswith(("github.com/", "git@")):
            raise MalformedManifest(f"resources[{i}]", f"remote resource {entry!r} is not supported", where=str(kfile))
        target = (directory / entry).resolve()
        if target.is_dir():
            yield from _build(target, (*visiting, directory))
        elif target.is_file():
            for obj in _load_file(target):
                yield obj, str(target)
        else:
            raise MalformedManifest(f"resources[{i}]", f"{entry!r} does not exist", where=str(kfile))


def sort_objects(objects: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    def key(obj: Mapping[str, Any]) -> tuple[int, str, str, str]:
        group, kind, namespace, name = _object_id(obj)
        return _KIND_RANK.get(kind, 0), f"{group}/{obj['apiVersion']}/{kind}", namespace, name

    return sorted(objects, key=key)


def dump(objects: Sequence[Mapping[str, Any]]) -> str:
    """A YAML stream, `---` between documents, for `kubectl apply -f -`."""
    text: str = yaml.safe_dump_all([dict(o) for o in objects], sort_keys=False, default_flow_style=False)
    return text


# --- the caBundle and the serving Secret --------------------------------------------------------------

def ca_pem_from_base64(value: str, *, flag: str = "--ca-bundle") -> bytes:
    """Decode a caBundle value and check it holds at least one PEM certificate."""
    try:
        pem = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput(flag, "not valid base64") from None
    _load_certificates(pem, flag)
    return pem


def _load_certificates(pem: bytes, where: str) -> list[x509.Certificate]:
    try:
        found = x509.load_pem_x509_certificates(pem)
    except ValueError:
        found = []
    if not found:
        raise InvalidInput(where, "holds no PEM certificate")
    return found


def read_cert_dir(directory: Path, *, with_serving: bool = True) -> tuple[bytes, certs.KeyPair | None]:
    """ca.crt from a `criticalsvc certs` directory, and its tls.crt/tls.key pair when present.

    The pair must be issued by that CA: a serving certificate the caBundle does not cover would make
    every webhook call fail TLS verification, i.e. fail closed for every gated DELETE.
    """
    flag = "--ca-bundle-from"
    if not directory.is_dir():
        raise InvalidInput(flag, "no such directory", where=str(directory))
    ca_path = directory / certs.CA_CERT
    if not ca_path.is_file():
        raise InvalidInput(flag, f"no {certs.CA_CERT} (create it with `criticalsvc certs --out {directory}`)",
                           where=str(directory))
    try:
        ca_pem = ca_path.read_bytes()
    except OSError as exc:
        raise InvalidInput(flag, f"cannot read: {exc.strerror}", where=str(ca_path)) from None
    cas = _load_certificates(ca_pem, str(ca_path))
    cert_path, key_path = directory / certs.TLS_CERT, directory / certs.TLS_KEY
    if not with_serving or not (cert_path.exists() or key_path.exists()):
        return ca_pem, None
    serving = certs.load_key_pair(cert_path, key_path)
    if not any(_issued_by(serving.cert, ca) for ca in cas):
        raise InvalidInput(flag, f"{certs.TLS_CERT} was not issued by {certs.CA_CERT}", where=str(directory))
    return ca_pem, serving


def _issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


# --- the install ------------------------------------------------------------------------------------

def _find(objects: Sequence[MutableMapping[str, Any]], kind: str, name: str) -> MutableMapping[str, Any]:
    for obj in objects:
        if obj["kind"] == kind and obj["metadata"]["name"] == name:
            return obj
    raise MalformedManifest("", f"the install has no {kind} {name!r}")


# What runs the gate inside the cluster: left out when the gate runs elsewhere (`--webhook-url`).
IN_CLUSTER_KINDS = frozenset({"Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy"})


def render_install(*, ca_pem: bytes, serving: certs.KeyPair | None = None, image: str | None = None,
                   replicas: int | None = None, webhook_url: str | None = None,
                   deploy_dir: Path | None = None) -> list[dict[str, Any]]:
    """The install's objects with every webhook's caBundle set, optionally the serving Secret added.

    With `webhook_url` (https://host:port) the gate runs outside the cluster: every webhook calls
    that URL (plus its own path) instead of the in-cluster Service, and the objects that would run
    the gate in the cluster (Deployment, Service, PodDisruptionBudget, NetworkPolicy, serving Secret) are left out.
    The ServiceAccount and its RBAC stay: the gate outside authenticates with that account's token.
    """
    objects = copy.deepcopy(build(deploy_dir or find_deploy_dir()))
    bundle = base64.b64encode(ca_pem).decode("ascii")
    configs = [o for o in objects if o["kind"] == "ValidatingWebhookConfiguration"]
    webhooks = [w for c in configs for w in c.get("webhooks") or []]
    if not webhooks:
        raise MalformedManifest("", "the install has no ValidatingWebhookConfiguration webhooks")
    for webhook in webhooks:
        client_config = webhook.setdefault("clientConfig", {})
        client_config["caBundle"] = bundle
        if webhook_url is not None:
            path = (client_config.pop("service", None) or {}).get("path", "/validate")
            client_config["url"] = _webhook_url(webhook_url) + path
    if webhook_url is not None:
        if image is not None or replicas is not None:
            raise InvalidInput("--webhook-url",
                               "runs the gate outside the cluster: --image and --replicas do not apply")
        return sort_objects(o for o in objects if o["kind"] not in IN_CLUSTER_KINDS)

    deployment = _find(objects, "Deployment", DEPLOYMENT_NAME)
    pod = deployment["spec"]["template"]["spec"]
    if replicas is not None:
        if replicas < 1:
            raise InvalidInput("--replicas", f"must be at least 1, not {replicas}")
        deployment["spec"]["replicas"] = replicas
    if image is not None:
        if not image or any(c.isspace() for c in image):
            raise InvalidInput("--image", f"{image!r} is not an image reference")
        container = next((c for c in pod["containers"] if c["name"] == CONTAINER_NAME), None)
        if container is None:
            raise MalformedManifest("", f"the Deployment has no container {CONTAINER_NAME!r}")
        container["image"] = image
    if serving is not None:
        volume = next((v for v in pod.get("volumes") or [] if v["name"] == TLS_VOLUME), None)
        if volume is None or "secret" not in volume:
            raise MalformedManifest("", f"the Deployment has no Secret volume {TLS_VOLUME!r}")
        objects.append(certs.tls_secret(
            name=volume["secret"]["secretName"], namespace=deployment["metadata"]["namespace"], ca_pem=ca_pem,
            cert_pem=certs.cert_pem(serving.cert), key_pem=certs.key_pem(serving.key)))
    return sort_objects(objects)


def _webhook_url(value: str) -> str:
    """`https://host:port` without a trailing slash; the API server calls webhooks only over HTTPS."""
    parsed = urllib.parse.urlsplit(value)
    if parsed.scheme != "https" or not parsed.hostname or parsed.query or parsed.fragment or parsed.username:
        raise InvalidInput("--webhook-url", f"{value!r}: expected https://HOST[:PORT], the gate's address")
    return value.rstrip("/")
