"""`criticalsvc discover` against operators nobody here wrote, on the real control plane (design/discover.md).

cert-manager, Kyverno, Crossplane and Flux's kustomize-controller are installed as tests/realcluster/operators.py
describes (kwok runs their pods), with objects carrying each one's finalizer; `discover --kubeconfig` must
propose exactly the rows of design/discover.md's table "Operators nobody here wrote": the provider, its
criteria and the confidence. What existed before (Flux's CRDs and namespace, when another test of the session
installed them) is left as it was; everything created here is deleted.

Then cert-manager's teardown, with discover's proposal applied and without (design/discover.md, "The teardown").
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from criticalsvc.cli import main
from tests.backends import unique
from tests.realcluster import operators
from tests.realcluster.client import Client
from tests.realcluster.cluster import RealCluster
from tests.realcluster.teardown import RepeatingDeleter, wait_for

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


# --- the teardown, with discover's proposal applied and without (issue 36, item 2) --------------------------------
CERT_MANAGER = "/apis/apps/v1/namespaces/cert-manager/deployments/cert-manager"
CHALLENGES = "/apis/acme.cert-manager.io/v1/challenges"
CHALLENGE_FINALIZER = "acme.cert-manager.io/finalizer"
TEARDOWN_TIMEOUT = 30.0


def _path(doc: dict[str, Any]) -> str:
    from criticalsvc.restmapper import guess_resource

    api = f"/apis/{doc['apiVersion']}" if "/" in doc["apiVersion"] else f"/api/{doc['apiVersion']}"
    m = doc["metadata"]
    where = f"/namespaces/{m['namespace']}" if m.get("namespace") else ""
    return f"{api}{where}/{guess_resource(doc['kind'])}/{m['name']}"


class ChallengeController(threading.Thread):
    """cert-manager's challenges controller as far as the teardown needs it: while its Deployment exists, it removes
    its finalizer from Challenges being deleted (kwok's pods run no code; tests/realcluster/teardown.py's
    FinalizerController plays the reference story's controller the same way)."""

    def __init__(self, client: Client) -> None:
        super().__init__(daemon=True, name="challenge-controller")
        self.client, self.stopping, self.released = client, threading.Event(), 0

    def run(self) -> None:
        while not self.stopping.wait(0.2):
            try:
                if not self.client.exists(CERT_MANAGER):
                    continue
                for ch in (self.client.get(CHALLENGES) or {}).get("items", []):
                    m = ch["metadata"]
                    if m.get("deletionTimestamp") and CHALLENGE_FINALIZER in (m.get("finalizers") or []):
                        i = m["finalizers"].index(CHALLENGE_FINALIZER)
                        path = f"/apis/acme.cert-manager.io/v1/namespaces/{m['namespace']}/challenges/{m['name']}"
                        done = self.client.json_patch(path, [
                            {"op": "test", "path": f"/metadata/finalizers/{i}", "value": CHALLENGE_FINALIZER},
                            {"op": "remove", "path": f"/metadata/finalizers/{i}"}])
                        self.released += done.status_code == 200
            except Exception:  # the API server's answer is awaited again on the next round
                continue

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)


def _cert_manager_teardown(realcluster: RealCluster, capsys: pytest.CaptureFixture[str], *,
                           protect: bool) -> dict[str, Any]:
    """cert-manager's install, then a Challenge, deleted in that order by deleters that re-send refused DELETEs (as
    Flux's or Argo CD's prune does), with discover's CriticalService for cert-manager applied or not: the users'
    deletion starts once the install's DELETE of the Deployment is answered (gone, or refused)."""
    # Its webhook configurations are left out: no kwok pod serves them, and failing closed on cert-manager's types
    # they would refuse the controller's own finalizer removal (an UPDATE of the Challenge).
    install = [d for d in operators.cert_manager_documents() if d["kind"] not in WEBHOOKS]
    users = unique("acme-users")
    challenge = operators.cert_manager_users(users)
    created = Created(realcluster)
    controller = ChallengeController(realcluster.admin)
    try:
        created.create([d for d in install if d["kind"] in ("Namespace", "CustomResourceDefinition")])
        done = realcluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", *(
            f"crd/{d['metadata']['name']}" for d in install if d["kind"] == "CustomResourceDefinition"), timeout=90)
        assert done.returncode == 0, done.stderr
        created.create([d for d in install if d["kind"] not in ("Namespace", "CustomResourceDefinition")])
        created.create([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": users}}, *challenge])
        extra: list[dict[str, Any]] = []
        if protect:
            assert main(["discover", "--kubeconfig", str(realcluster.kubeconfig), "-o", "json"]) == 0
            items = json.loads(capsys.readouterr().out)["items"]
            extra = [i for i in items if i["kind"] == "ClusterRole"] + [
                i for i in items if i["kind"] == "CriticalService" and
                i["spec"]["provider"] == {"group": "apps", "resource": "deployments", "namespace": "cert-manager",
                                          "name": "cert-manager"}]
            assert len(extra) == 2, items
            created.create(extra)
            wait_for(lambda: realcluster.admin.delete(CERT_MANAGER, params={"dryRun": "All"}).status_code == 403,
                     timeout=60, what="the gate to protect Deployment cert-manager/cert-manager")
        controller.start()
        # The install's file first, its users' after: the order that wedges a teardown when the controller goes first.
        # The CRDs stay, as the chart's default `crds.keep: true` has `helm uninstall` leave them
        # (annotation helm.sh/resource-policy: keep): their instances are not deleted with them.
        install_paths = {f"{d['kind']} {d['metadata']['name']}": _path(d)
                         for d in [*install, *(e for e in extra if e["kind"] == "CriticalService")]
                         if d["kind"] != "CustomResourceDefinition"}
        user_paths = {f"{d['kind']} {d['metadata']['name']}": _path(d) for d in challenge}
        first = RepeatingDeleter(realcluster.admin, install_paths)
        outcome: dict[str, bool] = {}
        started = time.monotonic()
        worker = threading.Thread(target=lambda: outcome.update(install=first.run(timeout=TEARDOWN_TIMEOUT)))
        worker.start()
        wait_for(lambda: not realcluster.admin.exists(CERT_MANAGER) or any(
            a.key == "Deployment cert-manager" and a.status == 403 for a in list(first.attempts)),
            timeout=TEARDOWN_TIMEOUT, what="the Deployment's DELETE to be answered")
        then = RepeatingDeleter(realcluster.admin, user_paths)
        users_done = then.run(timeout=TEARDOWN_TIMEOUT)
        worker.join(TEARDOWN_TIMEOUT + 10)
        paths = {**install_paths, **user_paths}
        return {"completed": users_done and outcome.get("install", False),
                "seconds": round(time.monotonic() - started, 1), "refused": len(first.refused()),
                "released": controller.released,
                "left": sorted(k for k, p in paths.items() if realcluster.admin.exists(p))}
    finally:
        controller.stop()
        created.delete_all(challenge)
        crds = [_path(d) for d in install if d["kind"] == "CustomResourceDefinition"]
        wait_for(lambda: not any(realcluster.admin.exists(p) for p in crds), timeout=90,
                 what="cert-manager's CRDs to go (the next install creates them again)")


def test_cert_manager_teardown_with_and_without_the_proposal(realcluster: RealCluster,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Without a CriticalService the controller's Deployment goes first and the Challenge is left stuck on its
    finalizer; with the one discover proposes, the Deployment waits until the Challenge is gone and everything goes."""
    without = _cert_manager_teardown(realcluster, capsys, protect=False)
    assert not without["completed"] and "Challenge example-challenge" in without["left"], without
    with_proposal = _cert_manager_teardown(realcluster, capsys, protect=True)
    assert with_proposal["completed"] and with_proposal["refused"] > 0 and with_proposal["released"] == 1, \
        with_proposal
    print(f"cert-manager teardown without the proposal: {without}; with it: {with_proposal}")
