"""`criticalsvc discover` against operators nobody here wrote, on the real control plane (design/discover.md).

cert-manager, Kyverno, Crossplane and Flux's kustomize-controller are installed as tests/realcluster/operators.py
describes (kwok runs their pods), with objects carrying each one's finalizer; `discover --kubeconfig` must
propose exactly the rows of design/discover.md's table "Operators nobody here wrote": the provider, its
criteria and the confidence. What existed before (Flux's CRDs and namespace, when another test of the session
installed them) is left as it was; everything created here is deleted.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from criticalsvc.cli import main
from tests.realcluster import operators
from tests.realcluster.cluster import RealCluster

pytestmark = pytest.mark.realcluster

DESIGN = Path(__file__).resolve().parents[1] / "design" / "discover.md"
WEBHOOKS = ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")
KINDS = {"validatingwebhookconfigurations": "ValidatingWebhookConfiguration",
         "mutatingwebhookconfigurations": "MutatingWebhookConfiguration", "apiservices": "APIService",
         "customresourcedefinitions": "CustomResourceDefinition"}
# The ClusterRole aggregation controller fills Crossplane's aggregated role, and SubjectAccessReviews see it, within
# seconds; kwok's pods start as quickly.
SETTLE = 90.0


def table() -> dict[str, tuple[frozenset[str], str]]:
    """design/discover.md's operators table: provider -> (criteria, confidence)."""
    text = DESIGN.read_text(encoding="utf-8").split("## Operators nobody here wrote", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[1].startswith("Deployment "):
            rows[cells[1]] = (frozenset(c.strip() for c in cells[2].split(";")), cells[3])
    return rows


def proposed(items: list[dict[str, Any]]) -> dict[str, tuple[frozenset[str], str]]:
    out = {}
    for cs in items:
        if cs["kind"] != "CriticalService":
            continue
        p = cs["spec"]["provider"]
        criteria = []
        for c in cs["spec"]["criteria"]:
            if c["type"] == "Finalizer":
                f = c["finalizer"]
                criteria.append(f"Finalizer {f['finalizerName']} on {f['resource']}.{f['group']}")
            else:
                s = c["specificResource"]
                criteria.append(f"{KINDS.get(s['resource'], s['resource'])} {s['name']}")
        kind = {"deployments": "Deployment", "statefulsets": "StatefulSet", "daemonsets": "DaemonSet"}[p["resource"]]
        out[f"{kind} {p['namespace']}/{p['name']}"] = (
            frozenset(criteria), cs["metadata"]["annotations"]["criticalsvc.io/discovery-confidence"])
    return out


class Created:
    """What `kubectl create` made here (not what already existed), to delete it afterwards in reverse."""

    def __init__(self, cluster: RealCluster) -> None:
        self.cluster = cluster
        self.objects: list[tuple[str, str, str]] = []  # (resource, namespace, name)

    def create(self, docs: list[dict[str, Any]]) -> None:
        done = self.cluster.kubectl("create", "-f", "-", "-o", "json", input=yaml.safe_dump_all(docs), timeout=180)
        # Existing objects are left as they are; the API server's warnings (Kubernetes 1.37 prefers finalizer names
        # with a path, which these projects' are not) are no error.
        errors = [e for e in done.stderr.splitlines() if e.strip() and "AlreadyExists" not in e
                  and "already exists" not in e and not e.startswith("Warning:")]
        assert not errors, done.stderr
        # One JSON document per object created, one after the other.
        decoder, text, at, objs = json.JSONDecoder(), done.stdout, 0, []
        while text[at:].strip():
            at += len(text[at:]) - len(text[at:].lstrip())
            obj, at = decoder.raw_decode(text, at)
            objs += obj.get("items", [obj])
        for obj in objs:
            group = obj["apiVersion"].rpartition("/")[0]
            resource = obj["kind"].lower() + (f".{group}" if group else "")
            self.objects.append((resource, obj["metadata"].get("namespace", ""), obj["metadata"]["name"]))

    def delete_all(self, finalized: list[dict[str, Any]]) -> None:
        """Webhook configurations first (cert-manager's fail closed on its own types), the finalizers taken off what
        carries them, then everything in one `kubectl delete` per namespace, namespaces and CRDs last."""
        webhooks = [o for o in self.objects if o[0].startswith(("validatingwebhook", "mutatingwebhook"))]
        self._delete(webhooks)
        for d in finalized:
            m = d["metadata"]
            resource = f"{d['kind'].lower()}.{d['apiVersion'].rpartition('/')[0]}"
            self.cluster.kubectl("patch", resource, m["name"], *(("-n", m["namespace"]) if m.get("namespace") else ()),
                                 "--type=merge", "-p", '{"metadata":{"finalizers":null}}')
        last = ("namespace", "customresourcedefinition")
        self._delete([o for o in self.objects if o not in webhooks and not o[0].startswith(last)])
        self._delete([o for o in self.objects if o[0].startswith(last)])

    def _delete(self, objects: list[tuple[str, str, str]]) -> None:
        by_namespace: dict[str, list[str]] = {}
        for resource, namespace, name in objects:
            by_namespace.setdefault(namespace, []).append(f"{resource}/{name}")
        for namespace, names in by_namespace.items():
            where = ("-n", namespace) if namespace else ()
            self.cluster.kubectl("delete", *names, *where, "--wait=false", "--ignore-not-found", timeout=120)


@pytest.fixture
def installed(realcluster: RealCluster) -> Iterator[None]:
    created = Created(realcluster)
    finalized: list[dict[str, Any]] = []
    installs = [*operators.cert_manager_documents(), *operators.kyverno_documents(),
                *operators.crossplane_documents(), *operators.flux_documents()]
    try:
        first = [d for d in installs if d["kind"] not in WEBHOOKS]
        created.create([d for d in first if d["kind"] in ("Namespace", "CustomResourceDefinition")])
        done = realcluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", *(
            f"crd/{d['metadata']['name']}" for d in first if d["kind"] == "CustomResourceDefinition"), timeout=90)
        assert done.returncode == 0, done.stderr
        created.create([d for d in first if d["kind"] not in ("Namespace", "CustomResourceDefinition")])
        # The objects carrying each finalizer, before the webhooks that would check them (no server answers them).
        users = "operator-users"
        created.create([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": users}}])
        finalized = [*operators.cert_manager_users(users), *operators.crossplane_users(),
                     *operators.flux_users(users)]
        created.create(finalized)
        created.create([d for d in installs if d["kind"] in WEBHOOKS])
        yield
    finally:
        created.delete_all(finalized)


def test_discover_proposes_the_table(realcluster: RealCluster, installed: None,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """discover's proposals for the four installs are design/discover.md's table, row for row."""
    want = table()
    assert set(want) >= {"Deployment cert-manager/cert-manager", "Deployment kyverno/kyverno-admission-controller",
                         "Deployment crossplane-system/crossplane", "Deployment flux-system/kustomize-controller"}
    deadline = time.monotonic() + SETTLE
    while True:
        assert main(["discover", "--kubeconfig", str(realcluster.kubeconfig), "-o", "json"]) == 0
        captured = capsys.readouterr()
        got = proposed(json.loads(captured.out)["items"])
        mine = {k: v for k, v in got.items() if k in want}
        if mine == want or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert mine == want, (f"discover proposed {json.dumps({k: [sorted(v[0]), v[1]] for k, v in got.items()}, indent=1)}"
                          f"\nskipped: {re.findall(r'skipped .*', captured.err)}")
