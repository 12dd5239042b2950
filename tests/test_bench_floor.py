"""The realcluster benchmark's floor is only a floor if the API server does the same work to call it:
the no-op's configuration must carry the gate's very webhooks, only pointed elsewhere."""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from benchmarks.realcluster import Noop, floor_configuration


def _gate_configuration(tmp_path: Path) -> dict[str, object]:
    run = lambda *a: subprocess.run([sys.executable, "-m", "criticalsvc", *a], check=True,  # noqa: E731
                                    capture_output=True, text=True).stdout
    run("certs", "--out", str(tmp_path), "--san", "127.0.0.1")
    docs = yaml.safe_load_all(run("manifests", "--ca-bundle-from", str(tmp_path),
                                  "--webhook-url", "https://127.0.0.1:8443"))
    [config] = [d for d in docs if d and d["kind"] == "ValidatingWebhookConfiguration"]
    return config  # type: ignore[no-any-return]


def test_the_floor_has_the_gates_webhooks_pointed_at_the_noop(tmp_path: Path) -> None:
    gate = _gate_configuration(tmp_path)
    noop = Noop(process=None, url="https://127.0.0.1:9999", ca_bundle=base64.b64encode(b"noop CA").decode(),
                ca_file=tmp_path / "noop-ca.crt")
    floor = floor_configuration(gate, noop)
    assert floor["metadata"]["name"] != gate["metadata"]["name"]  # type: ignore[index]
    gate_hooks, floor_hooks = gate["webhooks"], floor["webhooks"]
    assert len(floor_hooks) == len(gate_hooks) > 0  # type: ignore[arg-type]
    for g, f in zip(gate_hooks, floor_hooks, strict=True):  # type: ignore[call-overload]
        assert f["clientConfig"] == {"url": "https://127.0.0.1:9999/validate", "caBundle": noop.ca_bundle}
        assert f["name"] != g["name"] and f["name"].endswith(".floor.criticalsvc.io")
        same = {k: v for k, v in g.items() if k not in ("name", "clientConfig")}
        assert {k: v for k, v in f.items() if k not in ("name", "clientConfig")} == same
    assert gate["webhooks"][0]["clientConfig"]["url"] == "https://127.0.0.1:8443/validate"  # type: ignore[index]


@pytest.mark.realcluster  # builds benchmarks/noopwebhook with the Go toolchain the control plane is built with
@pytest.mark.parametrize("deny", [False, True])
def test_the_noop_allows_or_with_deny_refuses_every_review(tmp_path: Path, deny: bool) -> None:
    """The floor of an ALLOW and of a refusal: the no-op answers each review with its uid, allowed or (-deny) not,
    with a 403 status and a message, as a refusing webhook must for the API server to show it."""
    import httpx

    from benchmarks.realcluster import noop_webhook

    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u-1"}}
    with noop_webhook(tmp_path / "noop", deny=deny) as noop:
        answer = httpx.post(f"{noop.url}/validate", json=review, verify=noop.tls(), timeout=5).json()
        assert noop.calls() == 1
    response = answer["response"]
    assert response["uid"] == "u-1" and response["allowed"] is not deny
    assert response.get("status") == ({"code": 403, "message": "denied by the no-op webhook"} if deny else None)
