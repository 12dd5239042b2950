"""The gate's own install delivered by Flux: measured in the same Kustomization as the app it protects, and the
supported way (deploy/README.md, "With Flux"): a Kustomization of its own that Flux never deletes from.

On a control plane of this module's own (no kwok: the story's Deployment needs no running pod, and the gate's
install is taken apart here, which the session's shared control plane must never see), with Flux's
kustomize-controller (the real binary, tests/realcluster/flux.py) and the gate outside the cluster
(`criticalsvc manifests --webhook-url`, as tests/realcluster/gate.py runs it; its serving Deployment would be
one more object of the same Kustomization).

Why the same Kustomization cannot work: Flux deletes a Kustomization's inventory in the reverse of its apply
order, and its apply order puts ValidatingWebhookConfigurations last
(https://github.com/fluxcd/pkg/blob/ssa/v0.76.2/ssa/sort.go#L36-L66), so its finalize deletes the gate's
registration first and everything else in the same pass, unordered by anything but kind
(https://github.com/fluxcd/pkg/blob/ssa/v0.76.2/ssa/manager_delete.go#L100-L120). And `dependsOn` orders only
the apply: a Kustomization being deleted runs `finalize` before looking at its source or its dependencies
(https://github.com/fluxcd/kustomize-controller/blob/v1.9.6/internal/controller/kustomization_controller.go#L174-L177).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml

from tests.realcluster import build, flux
from tests.realcluster.client import Client
from tests.realcluster.cluster import built_binaries
from tests.realcluster.controlplane import ControlPlane, free_port
from tests.realcluster.flux import FLUX_NAMESPACE, ArtifactServer, FluxKustomization, KustomizeController
from tests.realcluster.gate import GATE_NAMESPACE, InstalledGate, criticalsvc, outside_gate
from tests.realcluster.teardown import (
    FinalizerController,
    Observer,
    RepeatingDeleter,
    Story,
    story_finalizer_controller,
    wait_for,
)

pytestmark = pytest.mark.realcluster

TIMEOUT = 120
DEPLOY_README = Path(__file__).resolve().parents[1] / "deploy" / "README.md"
WEBHOOK = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/criticalsvc"


@attrs.define
class Plane:
    """This module's control plane, its admin client, Flux, and the gate's install text and serving state."""

    plane: ControlPlane
    admin: Client
    controller: KustomizeController
    server: ArtifactServer
    directory: Path
    install: str
    cert_dir: Path
    port: int
    gate: InstalledGate | None = None

    def kubectl(self, *args: str, input: str | None = None) -> Any:
        return self.plane.kubectl(*args, input=input)

    def start_gate(self) -> None:
        """Once Flux has applied the gate's ServiceAccount: its token, and `criticalsvc serve` (once)."""
        if self.gate is not None:
            return
        wait_for(lambda: self.admin.exists(f"/api/v1/namespaces/{GATE_NAMESPACE}/serviceaccounts/criticalsvc"),
                 timeout=TIMEOUT, what="Flux to apply the gate's ServiceAccount")
        self.gate = outside_gate(self.plane, self.directory / "gate", port=self.port, cert_dir=self.cert_dir)
        self.gate.start()

    def logs(self) -> str:
        return "\n".join([self.plane.logs(), self.controller.logs(), self.gate.logs() if self.gate else ""])


@pytest.fixture(scope="module")
def flux_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    binaries = built_binaries()
    if build.cached_flux() is None and build.missing_toolchain() is not None:
        pytest.skip(build.missing_toolchain() or "")
    directory = tmp_path_factory.mktemp("flux-gate")
    plane = ControlPlane(binaries, directory / "plane", workloads=False)
    admin: Client | None = None
    state: Plane | None = None
    try:
        plane.start()
        admin = Client(plane.admin_kubeconfig)
        cert_dir = directory / "certs"
        criticalsvc("certs", "--out", str(cert_dir), "--san", "127.0.0.1")
        port = free_port()
        install = criticalsvc("manifests", "--ca-bundle-from", str(cert_dir), "--webhook-url", f"https://127.0.0.1:{port}")
        with flux.running(plane, directory / "flux") as (controller, server):
            state = Plane(plane, admin, controller, server, directory, install, cert_dir, port)
            yield state
    finally:
        if state is not None and state.gate is not None:
            state.gate.stop()
        if admin is not None:
            admin.close()
        plane.stop()


def story_controller(plane: Plane, story: Story) -> contextlib.AbstractContextManager[FinalizerController]:
    """The stand-in for the story's provider: removes its finalizer from deleting CRs while the Deployment exists."""
    return story_finalizer_controller(plane.admin, story)


def documented() -> dict[str, dict[str, Any]]:
    """The Kustomizations of deploy/README.md's "With Flux" (its first yaml block), by name: what a user copies."""
    section = DEPLOY_README.read_text(encoding="utf-8").split("## With Flux", 1)[1]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    return {d["metadata"]["name"]: d for d in yaml.safe_load_all(block) if d}


def _protected(plane: Plane, story: Story) -> bool:
    return plane.admin.delete(story.deployment_path, params={"dryRun": "All"}).status_code == 403


def test_the_gate_in_its_own_kustomization_keeps_app_teardowns_gated(flux_plane: Plane) -> None:
    """The supported way, as deploy/README.md ("With Flux") writes it: the gate's install in a Kustomization of
    its own with deletionPolicy: Orphan, the app's Kustomization `dependsOn` it. Both Kustomizations deleted at
    once (as a parent's prune or `kubectl delete kustomizations --all` does): the app still goes in the safe
    order, the gate's install stays in place."""
    suffix = f"own-{uuid.uuid4().hex[:4]}"
    story = Story.make(suffix)
    specs = documented()
    assert specs["criticalsvc"]["spec"]["deletionPolicy"] == "Orphan", specs
    assert specs["shop"]["spec"]["dependsOn"] == [{"name": "criticalsvc"}], specs
    gate = FluxKustomization(flux_plane.admin, flux_plane.server, FLUX_NAMESPACE, "criticalsvc")
    app = FluxKustomization(flux_plane.admin, flux_plane.server, FLUX_NAMESPACE, "shop")
    assert flux_plane.kubectl("apply", "-f", "-", input=story.reader_role()).returncode == 0
    gate.create_source()
    gate_revision = gate.publish({"criticalsvc.yaml": flux_plane.install})
    gate.create_from(specs["criticalsvc"]["spec"])
    flux_plane.start_gate()
    wait_for(lambda: gate.ready(gate_revision), timeout=TIMEOUT, interval=0.5, what=f"the gate's Kustomization Ready: "
             f"{gate.get()}")
    app.create_source()
    revision = app.publish({"story.yaml": story.text})
    app.create_from(specs["shop"]["spec"])
    paths = story.paths()
    with story_controller(flux_plane, story):
        wait_for(lambda: app.ready(revision), timeout=TIMEOUT, interval=0.5, what=f"the app Ready: {app.get()}")
        wait_for(lambda: _protected(flux_plane, story), timeout=TIMEOUT, what="the gate to protect the provider")
        observer = Observer(flux_plane.admin, paths, interval=0.0)
        observer.start()
        started = time.monotonic()
        try:
            for kustomization in (gate, app):
                assert flux_plane.admin.delete(kustomization.path).status_code == 200
            wait_for(lambda: not any(flux_plane.admin.exists(p) for p in [*paths.values(), gate.path, app.path]),
                     timeout=TIMEOUT, interval=0.5, what=f"the app and both Kustomizations gone: {app.get()}")
            wait_for(lambda: set(paths) <= set(observer.first_gone), timeout=30, what="the observer")
        finally:
            observer.stop()
            if flux_plane.admin.exists(app.path):
                flux_plane.admin.merge_patch(app.path, {"metadata": {"finalizers": None}})
            left = {k: p for k, p in paths.items() if flux_plane.admin.exists(p)}
            if left:
                RepeatingDeleter(flux_plane.admin, left).run(timeout=120)
    took = time.monotonic() - started
    print(f"Flux, the gate in its own Kustomization (Orphan), both deleted at once: the app gone in {took:.1f} s, "
          f"order {observer.order()}")
    assert observer.order_violations(story.dependents()) == [], observer.order()
    registration = flux_plane.admin.get(WEBHOOK)
    assert registration is not None, "deleting the gate's Kustomization took the gate's registration away"
    # Orphaned, the objects keep the owner labels of a Kustomization that is gone: adopting them again is one
    # more `flux create kustomization criticalsvc` (or the same Kustomization re-applied).
    assert (registration["metadata"].get("labels") or {}).get(f"{flux.GROUP}/name") == "criticalsvc"


def test_the_gate_in_the_apps_kustomization_is_unregistered_first(flux_plane: Plane) -> None:
    """Measured: the gate's install and the app in ONE Kustomization, deleted. Flux deletes the gate's
    ValidatingWebhookConfiguration first, and in the same pass the app's provider Deployment while the CRs it
    must finalize are still there: the gate refuses nothing. The provider's controller is not played here
    (Flux sends the Deployment's DELETE milliseconds after the CRs'; a real controller rarely wins that race),
    so the CRs keep their finalizer: the stuck teardown the gate exists to prevent."""
    suffix = f"one-{uuid.uuid4().hex[:4]}"
    story = Story.make(suffix)
    together = FluxKustomization(flux_plane.admin, flux_plane.server, FLUX_NAMESPACE, f"together-{suffix}")
    assert flux_plane.kubectl("apply", "-f", "-", input=story.reader_role()).returncode == 0
    together.create_source()
    revision = together.publish({"criticalsvc.yaml": flux_plane.install, "story.yaml": story.text})
    together.create(prune=True, deletion_policy="MirrorPrune")
    flux_plane.start_gate()
    paths = story.paths()
    key = "ValidatingWebhookConfiguration/criticalsvc"
    deployment = f"Deployment/{story.name('finalizer-deployment')}"
    crs = [k for k in paths if k.startswith("CoolResource/")]
    # Watched: the registration, the provider and what it must finalize (the CRs go only when released below,
    # so every watch ends by itself; a watch of an object that never goes would hold up the observer's stop).
    watched = {k: paths[k] for k in (deployment, *crs, f"CriticalService/{story.critical_service}")}
    observer = Observer(flux_plane.admin, {**watched, key: WEBHOOK}, interval=0.0)
    try:
        wait_for(lambda: together.ready(revision), timeout=TIMEOUT, interval=0.5, what=f"Ready: {together.get()}")
        wait_for(lambda: _protected(flux_plane, story), timeout=TIMEOUT, what="the gate to protect the provider")
        observer.start()
        assert flux_plane.admin.delete(together.path).status_code == 200
        wait_for(lambda: not flux_plane.admin.exists(together.path), timeout=TIMEOUT, interval=0.5,
                 what=f"the Kustomization gone: {together.get()}")
        wait_for(lambda: {key, deployment} <= set(observer.first_gone), timeout=30, what="the observer")
        left = sorted(k for k, p in paths.items() if flux_plane.admin.exists(p))
        violations = observer.order_violations({deployment: crs})
        print(f"Flux, the gate in the app's Kustomization: the Kustomization gone; order {observer.order()}; "
              f"left (stuck) {left}")
        assert observer.order()[0] == key, observer.order()
        assert violations and all(v.startswith(f"{deployment} deleted") for v in violations), violations
        assert set(crs) <= set(left), left
        # One pass, nothing refused: Flux records a Warning Event for every refused pass, and there is none.
        warnings = [e["message"] for e in together.events() if e["type"] == "Warning"]
        assert warnings == [], warnings
    finally:
        for item in (flux_plane.admin.get(f"/apis/{story.group}/v1/coolresources") or {}).get("items", []):
            meta = item["metadata"]
            flux_plane.admin.merge_patch(f"/apis/{story.group}/v1/namespaces/{meta['namespace']}/coolresources/"
                                         f"{meta['name']}", {"metadata": {"finalizers": None}})
        with contextlib.suppress(AssertionError):
            wait_for(lambda: set(watched) <= set(observer.first_gone), timeout=30, what="the released CRs gone")
        observer.stop()
        if flux_plane.admin.exists(together.path):
            flux_plane.admin.merge_patch(together.path, {"metadata": {"finalizers": None}})
