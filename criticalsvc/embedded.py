"""`serve --embedded`: the simulated control plane behind the HTTP API stand-in, in real time.

On a machine with no cluster, this starts what a cluster would give the gate: an API server (the
stand-in over the simulator's store, with the CriticalService CRD installed), its controllers
running in real time (namespace controller, CRD cleanup, garbage collector, and each provider's
finalizer controller), certificates generated into a temporary directory, and the webhook
registered from deploy/base/webhook.yaml exactly as the bundle registers it (rules, failurePolicy,
namespaceSelector, objectSelector, timeout), pointed at the gate's own HTTPS port. The configuration is
stored as an API object (as `criticalsvc manifests --webhook-url` renders it: clientConfig.url and the
CA in caBundle) and the stand-in registers webhooks from every stored ValidatingWebhookConfiguration
(sim/webhook_client.py `follow_configurations`), so the gate's own configuration for provider types,
criticalsvc-providers, is written by the same router code as on a live cluster and takes effect the
same way. A kubeconfig for the stand-in is written so that `kubectl --kubeconfig PATH apply/delete -f ...`
works against it. It is written atomically (a temporary file renamed over PATH), and `serve --embedded` writes it only
once the gate is registered and ready: a script may wait for the file (`until [ -s PATH ]; do sleep 0.2; done`)
and use it at once.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import copy
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import yaml

from . import certs
from .errors import MalformedManifest

GATE_NAMESPACE = "criticalsvc-system"


@attrs.define
class TLSMaterial:
    directory: Path
    ca_pem: bytes
    cert: Path
    key: Path


def make_tls(directory: Path) -> TLSMaterial:
    """A throwaway CA and a serving certificate for localhost/127.0.0.1/::1."""
    ca = certs.make_ca("criticalsvc-embedded-ca")
    serving = certs.make_serving_cert(ca, ["localhost", "criticalsvc.criticalsvc-system.svc"],
                                      ["127.0.0.1", "::1"])
    ca_pem = certs.cert_pem(ca.cert)
    certs.write_pem(directory / "ca.crt", ca_pem)
    certs.write_pem(directory / "tls.crt", certs.cert_pem(serving.cert))
    certs.write_pem(directory / "tls.key", certs.key_pem(serving.key), private=True)
    return TLSMaterial(directory, ca_pem, directory / "tls.crt", directory / "tls.key")


def _webhook_configuration() -> dict[str, Any]:
    from .install import find_deploy_dir

    path = find_deploy_dir() / "base" / "webhook.yaml"
    for doc in yaml.safe_load_all(path.read_text()):
        if isinstance(doc, dict) and doc.get("kind") == "ValidatingWebhookConfiguration":
            return doc
    raise MalformedManifest("", "no ValidatingWebhookConfiguration in it", where=str(path))


def _url_configuration(config: dict[str, Any], gate_url: str, ca_pem: bytes) -> dict[str, Any]:
    """The shipped configuration with every webhook calling `gate_url` and trusting `ca_pem`, as
    `criticalsvc manifests --webhook-url URL --ca-bundle-from DIR` renders it (install.render_install)."""
    bundle = base64.b64encode(ca_pem).decode()
    out = copy.deepcopy(config)
    for webhook in out.get("webhooks") or []:
        path = (webhook.get("clientConfig", {}).get("service") or {}).get("path", "/validate")
        webhook["clientConfig"] = {"url": f"{gate_url}{path}", "caBundle": bundle}
    return out


def _crd_manifest() -> dict[str, Any] | None:
    from .sim.apiserver.standin import DEFAULT_CRD_PATH

    for candidate in (DEFAULT_CRD_PATH, Path(sys.prefix) / "share/criticalsvc/api" / DEFAULT_CRD_PATH.name):
        if candidate.is_file():
            for doc in yaml.safe_load_all(candidate.read_text()):
                if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                    return doc
    return None


@attrs.define
class EmbeddedCluster:
    url: str
    kubeconfig: Path
    store: Any
    standin: Any
    _stop: Callable[[], Awaitable[None]] = attrs.field(alias="stop")

    async def stop(self) -> None:
        """Stop the API server, then hang up its webhook connections (idempotent; see embedded_cluster)."""
        await self._stop()

    def register_gate(self, gate_url: str, ca_pem: bytes) -> concurrent.futures.Future[None]:
        """Register the bundle's webhooks, calling the gate at `gate_url` (https://host:port).

        The bundle's ValidatingWebhookConfiguration is stored as an install stores it (caBundle filled
        in), and every stored configuration is followed: one created later through the API (`kubectl
        apply`, or the gate's own) is called too, with any Service resolved to the gate.
        Returns a future that is done once the webhooks are registered in the store (`await
        asyncio.wrap_future(...)`): a DELETE after that goes through the gate."""
        from .sim.webhook_client import follow_configurations

        def submit() -> None:
            follow_configurations(self.store, resolve_service=lambda _ns, _name, _port, path: f"{gate_url}{path}")
            self.store.create(_url_configuration(_webhook_configuration(), gate_url, ca_pem))

        registered: concurrent.futures.Future[None] = self.standin.submit(submit)
        return registered

    def write_kubeconfig(self) -> Path:
        """Write the kubeconfig for the stand-in to `self.kubeconfig`, atomically (see write_kubeconfig)."""
        return write_kubeconfig(self.kubeconfig, self.url)


def write_kubeconfig(path: Path, server: str) -> Path:
    """A kubeconfig for `server` at `path` (mode 0600), never half-written: a file beside it, renamed over.

    A reader polling for the file (`until [ -s PATH ]`) sees either nothing or the whole file."""
    from .atomicfile import write_atomically
    from .sim.kubeconfig import kubeconfig

    return write_atomically(path, yaml.safe_dump(kubeconfig(server), sort_keys=False).encode())


@contextlib.asynccontextmanager
async def embedded_cluster(*, host: str, port: int, kubeconfig_out: Path,
                           write_kubeconfig_now: bool = True) -> AsyncIterator[EmbeddedCluster]:
    """Start the stand-in with real-time controllers; yields once it accepts connections.

    The kubeconfig is written then, unless `write_kubeconfig_now` is False: then the caller calls
    `cluster.write_kubeconfig()` when the cluster is ready for kubectl (`serve --embedded`: once the
    gate is registered and ready)."""
    from .sim.apiserver.server import serve
    from .sim.apiserver.standin import StandIn, StandInEngine
    from .sim.controllers.manager import start_controllers
    from .sim.store import Store

    store = Store(clock=time.time)
    crd = _crd_manifest()
    if crd is not None:
        store.create(crd)
    store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": GATE_NAMESPACE}})
    standin = StandIn(store, engine=StandInEngine(), start_controllers=start_controllers)
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()

    def on_ready(url: str) -> None:
        if not ready.done():
            ready.set_result(url)

    task: asyncio.Future[None] = asyncio.ensure_future(
        serve(standin, host=host, port=port, shutdown_trigger=stop.wait, on_ready=on_ready))
    stopping: asyncio.Future[None] | None = None

    async def shutdown() -> None:
        stop.set()  # ends the watches, finishes in-flight requests (2 s graceful), then closes
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(task, 10)
        # The webhook clients keep idle keep-alive TLS connections to the gate, and nothing reads them
        # (httpx notices a closed connection only when it next sends), so the gate's graceful shutdown
        # would wait on them: 10 s of draining, then up to 30 s for an SSL close_notify answer that
        # never comes (asyncio's ssl_shutdown_timeout). A real API server exiting closes them; so here.
        for webhook in list(store.webhooks):
            close = getattr(webhook, "close", None)  # ConfiguredWebhook (register_webhooks) has one
            if close is not None:
                with contextlib.suppress(Exception):
                    close()

    def stop_once() -> Awaitable[None]:
        nonlocal stopping
        if stopping is None:
            stopping = asyncio.ensure_future(shutdown())
        return asyncio.shield(stopping)

    try:
        waiting: list[asyncio.Future[Any]] = [task, ready]
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()  # raises why it could not start
            raise RuntimeError("the API-server stand-in stopped before it was ready")
        url = ready.result()
        cluster = EmbeddedCluster(url, kubeconfig_out, store, standin, stop=stop_once)
        if write_kubeconfig_now:
            cluster.write_kubeconfig()
        yield cluster
    finally:
        await stop_once()
