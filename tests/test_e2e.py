"""End to end: the real service process (`criticalsvc serve --embedded`: the gate over TLS, the API
stand-in over HTTP, real-time controllers) driven by real clients — raw HTTP, kubectl, and the
operator commands `explain` and `graph` reading the live cluster through its kubeconfig.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from criticalsvc.api import ObjectRef
from criticalsvc.manifests import load_path
from criticalsvc.snapshot import build_state
from tests.backends import Embedded, provider_webhook

pytestmark = pytest.mark.e2e

STORY = Path("api/examples/reference-story.yaml").resolve()


def _paths() -> list[tuple[ObjectRef, str, str, dict[str, Any]]]:
    """(ref, collection URL path, item URL path, manifest) for every object of the story, in file order."""
    manifests = load_path(str(STORY))
    state = build_state(manifests)
    out = []
    for m in manifests:
        gr = state.mapper.resource_for_kind(m.api_version, m.kind)
        t = state.mapper.lookup(gr)
        assert t is not None
        base = f"/api/{t.version}" if not gr.group else f"/apis/{gr.group}/{t.version}"
        ns = m.obj["metadata"].get("namespace", "")
        collection = f"{base}/namespaces/{ns}/{gr.resource}" if t.namespaced else f"{base}/{gr.resource}"
        name = m.obj["metadata"]["name"]
        out.append((ObjectRef(gr, ns if t.namespaced else "", name), collection, f"{collection}/{name}", dict(m.obj)))
    return out


def _show(times: dict[ObjectRef, float]) -> str:
    return ", ".join(f"{ref.name}@{t:.2f}" for ref, t in sorted(times.items(), key=lambda kv: kv[1]))


def _apply(api: str, objects: list[tuple[ObjectRef, str, str, dict[str, Any]]]) -> None:
    # Namespaces and CRDs first, as `kubectl apply` run twice would end up doing.
    for _ref, collection, _item, obj in sorted(objects, key=lambda o: (o[3]["kind"] != "Namespace",
                                                                    o[3]["kind"] != "CustomResourceDefinition")):
        r = httpx.post(f"{api}{collection}", json=obj, timeout=10)
        assert r.status_code == 201, r.text
    # As a user does before relying on it (`kubectl wait --for=condition=Ready`): a CriticalService is enforced
    # once the gate has routed its provider and seen the API server route it (design/routing.md).
    for _ref, _collection, item, obj in objects:
        if obj["kind"] == "CriticalService":
            deadline = time.monotonic() + 60
            while not any(c.get("type") == "Ready" and c.get("status") == "True" for c in
                          (httpx.get(f"{api}{item}", timeout=10).json().get("status") or {}).get("conditions") or []):
                assert time.monotonic() < deadline, f"{item} not Ready within 60 s"
                time.sleep(0.1)


def test_bulk_teardown_through_the_real_gate_completes_in_the_safe_order(embedded: Embedded) -> None:
    """Deleting the whole story at once, refusals retried, ends in the design's order."""
    objects = _paths()
    _apply(embedded.api, objects)
    # Times are taken per request. `gone` is when the client first saw a 404 (an upper bound of the
    # real moment); `alive` is when it last saw the object exist (a lower bound). "X was gone before
    # event E" is therefore asserted as alive[X] <= E, which holds whatever the polling granularity.
    accepted: dict[ObjectRef, float] = {}
    alive: dict[ObjectRef, float] = {}
    gone: dict[ObjectRef, float] = {}
    denials: list[dict[str, Any]] = []
    start = time.monotonic()

    def now() -> float:
        return time.monotonic() - start

    while len(gone) < len(objects):
        assert now() < 120, f"teardown did not finish; gone: {sorted(map(str, gone))}"
        for ref, _collection, item, _obj in objects:
            if ref in gone:
                continue
            if ref not in accepted:
                sent = now()
                r = httpx.request("DELETE", f"{embedded.api}{item}", json={"propagationPolicy": "Background"},
                                  timeout=15)
                if r.status_code in (200, 202):
                    accepted[ref] = now()
                    alive[ref] = sent
                elif r.status_code == 404:
                    accepted[ref] = gone[ref] = now()
                else:
                    assert r.status_code == 403, r.text
                    alive[ref] = sent
                    denials.append(r.json())
            else:
                sent = now()
                if httpx.get(f"{embedded.api}{item}", timeout=10).status_code == 404:
                    gone[ref] = now()
                else:
                    alive[ref] = sent
        time.sleep(0.1)

    by_name = {ref.name: ref for ref, *_ in objects}
    crs = [by_name[n] for n in ("alpha", "beta", "gamma")]
    crd, deploy = by_name["coolresources.my.crd.group"], by_name["finalizer-deployment"]
    ns, cs = by_name["finalizer-namespace"], by_name["for-finalizer-deployment"]
    # Only what the gate and the API server guarantee; how fast this client loops is not asserted on
    # (a CR may be finalized before a later CR's DELETE is even sent when the machine is busy).
    timeline = f"accepted={_show(accepted)} alive={_show(alive)} gone={_show(gone)}"
    assert accepted[crd] <= min(gone[c] for c in crs), timeline               # the CRD is marked first
    assert all(alive[c] <= gone[crd] for c in crs), timeline                  # CRs finalized, then the CRD
    assert alive[crd] <= accepted[deploy] and alive[crd] <= accepted[ns], timeline  # then the provider may go
    assert alive[deploy] <= gone[ns], timeline                                # content before its namespace
    # The CriticalService goes after everything it protects: its provider and the criteria's objects,
    # and its provider's namespace if that was already being deleted when the CriticalService's turn came.
    assert accepted[cs] >= max(alive[deploy], alive[crd], *(alive[c] for c in crs)), timeline
    if accepted[ns] <= accepted[cs]:
        assert accepted[cs] >= alive[ns], timeline
    # Every refusal reached the client as the API server forwards a webhook denial: 403 with the gate's words.
    assert denials, "the gate never had to refuse anything"
    for status in denials:
        assert status["code"] == 403 and status["reason"] == "Forbidden"
        assert "denied the request" in status["message"] and "may not be deleted yet" in status["message"]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed (CI installs it)")
def test_kubectl_delete_prints_the_gate_denial(embedded: Embedded, tmp_path: Path) -> None:
    """`kubectl delete -f` prints the gate's Forbidden lines, deletes the rest, exits 1."""
    env = {**os.environ, "HOME": str(tmp_path)}
    kubectl = ["kubectl", "--kubeconfig", str(embedded.kubeconfig), "--cache-dir", str(tmp_path / "cache")]
    _apply(embedded.api, _paths())
    out = subprocess.run([*kubectl, "delete", "-f", str(STORY), "--wait=false"], capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.returncode == 1, out
    assert (f'Error from server (Forbidden): error when deleting "{STORY}": admission webhook '
            '"providers.gate.criticalsvc.io" denied the request: deployments.apps '
            "finalizer-namespace/finalizer-deployment may not be deleted yet") in provider_webhook(out.stderr)
    assert 'customresourcedefinition.apiextensions.k8s.io "coolresources.my.crd.group" deleted' in out.stdout
    # A server-side dry run is reviewed like a real delete: same denial, nothing changes.
    dry = subprocess.run([*kubectl, "delete", "deployment", "finalizer-deployment", "-n", "finalizer-namespace",
                          "--dry-run=server"], capture_output=True, text=True, env=env, timeout=60)
    assert dry.returncode == 1 and "may not be deleted yet" in dry.stderr


def test_explain_and_graph_read_the_live_cluster(embedded: Embedded) -> None:
    """`explain` and `graph` with --kubeconfig answer from the live (stand-in) cluster."""
    _apply(embedded.api, _paths())
    base = [sys.executable, "-m", "criticalsvc"]
    out = subprocess.run([*base, "explain", "deployment/finalizer-deployment", "-n", "finalizer-namespace",
                          "--kubeconfig", str(embedded.kubeconfig)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stderr
    assert "DENIED" in out.stdout and out.stdout.count("[UNMET]") == 2
    graph = subprocess.run([*base, "graph", "-o", "json", "--kubeconfig", str(embedded.kubeconfig)],
                           capture_output=True, text=True, timeout=60)
    assert graph.returncode == 0, graph.stderr
    assert json.loads(graph.stdout)["nodes"] == ["for-finalizer-deployment"]


def test_sigterm_after_reviews_exits_promptly_and_cleanly(embedded: Embedded) -> None:
    """After the API server has called the gate (keep-alive connections open), SIGTERM ends it in < 10 s, code 0."""
    _apply(embedded.api, _paths())
    r = httpx.request("DELETE", f"{embedded.api}/apis/apps/v1/namespaces/finalizer-namespace/deployments/"
                      "finalizer-deployment", json={"propagationPolicy": "Background"}, timeout=15)
    assert r.status_code == 403, r.text  # the review went through the gate: its connection is now idle
    code, seconds = embedded.stop(within=10.0)
    assert code == 0, f"exit code {code} after {seconds:.1f} s:\n{embedded.output()}"
    assert seconds < 10.0
