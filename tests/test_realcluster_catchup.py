"""A Finalizer criterion confirmed from the cache caught up by a watch, on the real control plane (issue 30).

What the stand-in cannot show is kube-apiserver's side of criticalsvc/cache/catchup.py: its consistent
LIST (`limit=1`, no resourceVersion) answering with a version past every write made before it, and a watch
from the cache's version sending every later change and then a bookmark at or past that version, soon
enough for the webhook. So:

* **The window, made to last.** The gate's cache and live reader run in the test's process against the real
  API server, through a transport whose open watches the test holds (tests/kubefakes.py `HoldingTransport`):
  the cache stops hearing anything. A ConfigMap carrying the criterion's finalizer is created; the cache
  still allows the provider's DELETE, the confirmation refuses it, naming the ConfigMap. Then the other way:
  the finalizer removed while the cache holds the old ConfigMap; the cache refuses, the confirmation allows.
  Each confirmation's time is printed (`pytest -s`): it is the wait for the bookmark.
* **The gate as users run it**, started with `--catch-up-above 0` so that a small type takes the same path:
  `kubectl delete --dry-run=server` of the provider refused while a ConfigMap carries the finalizer, allowed
  once it does not, and every Finalizer read of that run was a catch-up, none a LIST
  (`criticalsvc_finalizer_read_seconds{method}`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubefakes import HoldingTransport, eventually

from criticalsvc.admission import AdmissionRequest, parse_review
from criticalsvc.api import GroupResource
from criticalsvc.cache import Backoff, CacheState, KubeTransport, connect
from criticalsvc.decision import Rule, decide
from criticalsvc.live import CATCH_UP_TIMEOUT, LiveReader
from tests.backends import deployment_manifest, unique
from tests.realcluster.cluster import RealCluster
from tests.realcluster.teardown import wait_for

pytestmark = pytest.mark.realcluster

CRITICAL_SERVICES = "/apis/criticalsvc.io/v1alpha1/criticalservices"
CLUSTERROLES = "/apis/rbac.authorization.k8s.io/v1/clusterroles"
CONFIGMAPS = GroupResource("", "configmaps")


def _provider_delete(namespace: str) -> AdmissionRequest:
    return parse_review({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "1", "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
        "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
        "name": "cleaner", "namespace": namespace, "operation": "DELETE", "userInfo": {"username": "alice"},
        "oldObject": {"apiVersion": "apps/v1", "kind": "Deployment",
                      "metadata": {"name": "cleaner", "namespace": namespace}}}})


@contextlib.contextmanager
def _setup(cluster: RealCluster) -> Iterator[tuple[str, str, str]]:
    """A namespace, a CriticalService whose provider is Deployment <ns>/cleaner and whose one criterion is a
    Finalizer on ConfigMaps; (namespace, finalizer, CriticalService). Everything removed after."""
    namespace, name = unique("catchup"), unique("catchup")
    finalizer = f"example.com/{name}"
    assert cluster.admin.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                       "metadata": {"name": namespace}}).status_code == 201
    # The gate reads a type a criterion names only where a ClusterRole aggregated into its reader grants it.
    assert cluster.admin.create(CLUSTERROLES, {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": f"read-{name}", "labels": {"criticalsvc.io/aggregate-to-reader": "true"}},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}]}
    ).status_code == 201
    body = {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": name},
            "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": namespace,
                                  "name": "cleaner"},
                     "criteria": [{"type": "Finalizer", "finalizer": {"group": "", "resource": "configmaps",
                                                                      "finalizerName": finalizer}}]}}

    def created() -> bool:
        answer = cluster.admin.create(CRITICAL_SERVICES, body)
        assert answer.status_code in (201, 403), answer.text
        return answer.status_code == 201

    wait_for(created, timeout=60, what=f"CriticalService {name} created")
    try:
        yield namespace, finalizer, name
    finally:  # in the order the gate allows: the carrier released, the provider, its CriticalService
        _release(cluster, namespace, check=False)
        cluster.admin.delete(f"/apis/apps/v1/namespaces/{namespace}/deployments/cleaner")
        wait_for(lambda: cluster.admin.delete(f"{CRITICAL_SERVICES}/{name}").status_code in (200, 404), timeout=30,
                 what=f"CriticalService {name} deleted")
        cluster.admin.delete(f"/api/v1/namespaces/{namespace}")
        cluster.admin.delete(f"{CLUSTERROLES}/read-{name}")


def _carrier(cluster: RealCluster, namespace: str, finalizer: str) -> None:
    assert cluster.admin.create(f"/api/v1/namespaces/{namespace}/configmaps", {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "carrier", "finalizers": [finalizer]},
        "data": {"k": "v"}}).status_code == 201


def _release(cluster: RealCluster, namespace: str, *, check: bool = True) -> None:
    answer = cluster.admin.merge_patch(f"/api/v1/namespaces/{namespace}/configmaps/carrier",
                                       {"metadata": {"finalizers": None}})
    assert answer.status_code == 200 or not check, answer.text


def test_a_carrier_written_while_the_cache_lags_is_seen_by_the_catch_up(realcluster: RealCluster) -> None:
    with _setup(realcluster) as (namespace, finalizer, _name):
        asyncio.run(_window(realcluster, namespace, finalizer))


async def _window(cluster: RealCluster, namespace: str, finalizer: str) -> None:
    api = await connect(kubeconfig=str(cluster.kubeconfig))
    transport = HoldingTransport(KubeTransport(api))
    cache = CacheState(transport, backoff=Backoff(initial=0.05, maximum=0.5))
    reads: list[tuple[str, float]] = []
    reader = LiveReader(transport, mapper=cache.mapper, mirror=cache, catch_up_above=0,
                        on_finalizer_read=lambda method, seconds: reads.append((method, seconds)))
    request = _provider_delete(namespace)
    try:
        await cache.start()
        assert await cache.wait_ready(60)
        await eventually(lambda: cache.carriers(CONFIGMAPS, finalizer) is not None and
                         decide(request, cache).rule == Rule.CRITERIA_MET, timeout=30,
                         what="the cache watches ConfigMaps and holds the CriticalService")
        timings: list[float] = []
        for _ in range(3):
            # A carrier the cache has not heard of: the cache allows, the confirmation must not.
            transport.hold()
            await asyncio.to_thread(_carrier, cluster, namespace, finalizer)
            cached = decide(request, cache)
            assert cached.allowed, cached.message
            started = time.monotonic()
            refused = await reader.decide(request)
            timings.append(time.monotonic() - started)
            assert not refused.decision.allowed, refused.decision.message
            assert f"{namespace}/carrier" in refused.decision.message, refused.decision.message
            transport.release()
            await eventually(lambda: not decide(request, cache).allowed, timeout=10, what="the cache hears of it")
            # Its finalizer removed while the cache still holds it: the cache refuses, the confirmation allows.
            transport.hold()
            await asyncio.to_thread(_release, cluster, namespace)
            assert not decide(request, cache).allowed
            started = time.monotonic()
            allowed = await reader.decide(request)
            timings.append(time.monotonic() - started)
            assert allowed.decision.allowed, allowed.decision.message
            transport.release()
            await eventually(lambda: decide(request, cache).allowed, timeout=10, what="the cache hears of it")
            answer = await asyncio.to_thread(cluster.admin.delete, f"/api/v1/namespaces/{namespace}/configmaps/carrier")
            assert answer.status_code == 200, answer.text
        assert [m for m, _s in reads] == ["watch"] * 6, reads  # never a LIST of every ConfigMap
        assert all(t < CATCH_UP_TIMEOUT for t in timings)
        print(f"\ncatch-up confirmations on the real API server, s: {', '.join(f'{t:.3f}' for t in timings)}")
    finally:
        transport.release()
        await cache.stop()
        await api.close()


def _dry_run_delete(cluster: RealCluster, namespace: str) -> Any:
    return cluster.kubectl("delete", "deployment", "cleaner", "-n", namespace, "--dry-run=server")


def test_the_gate_confirms_a_finalizer_criterion_by_catching_up(realcluster: RealCluster) -> None:
    with _setup(realcluster) as (namespace, finalizer, name), \
            realcluster.gate.restarted_with("--catch-up-above", "0") as gate:
        assert realcluster.admin.create(f"/apis/apps/v1/namespaces/{namespace}/deployments",
                                        deployment_manifest("cleaner", namespace)).status_code == 201
        _carrier(realcluster, namespace, finalizer)
        waited = realcluster.kubectl("wait", "--for=condition=Ready", f"csvc/{name}", "--timeout=60s", timeout=70)
        assert waited.returncode == 0, waited.stderr
        refused = _dry_run_delete(realcluster, namespace)
        assert refused.returncode != 0 and f"{namespace}/carrier" in refused.stderr, refused.stderr
        _release(realcluster, namespace)
        wait_for(lambda: _dry_run_delete(realcluster, namespace).returncode == 0, timeout=30,
                 what="the provider's DELETE allowed once no ConfigMap carries the finalizer")
        # Decided on the cache caught up to one consistent read (criticalsvc/caughtup.py), or by the Finalizer
        # catch-up where that could not answer: never by a LIST of every ConfigMap.
        caught = sum(gate.metric("criticalsvc_caught_up_confirmation_seconds_count", caught_up=m)
                     for m in ("watch", "already"))
        caught += sum(gate.metric("criticalsvc_finalizer_read_seconds_count", method=m) for m in ("watch", "mirror"))
        assert caught >= 1
        assert gate.metric("criticalsvc_finalizer_read_seconds_count", method="list") == 0


# --- every criterion kind, on the cache caught up to one consistent read (issue 37) -----------------------------
def test_the_caught_up_cache_confirms_every_kind_on_kube_apiserver(realcluster: RealCluster) -> None:
    """A CriticalService with a Finalizer, a SpecificResource, a Resources with a selector and one with a condition,
    all met: the provider's DELETE is confirmed on the cache caught up to one `?limit=1` read, ten times, ConfigMaps
    read only by `?limit=1` (waking a lagging cache) and the probes' watches; then a carrier the cache has not heard
    of is refused. Each
    confirmation's time and whether a type lagged are printed (`pytest -s`): what a lagging cache costs here."""
    with _setup(realcluster) as (namespace, finalizer, name):
        criteria = [
            {"type": "Finalizer", "finalizer": {"group": "", "resource": "configmaps", "finalizerName": finalizer}},
            {"type": "SpecificResource", "specificResource": {"group": "", "resource": "configmaps",
                                                              "namespace": namespace, "name": "lock"}},
            {"type": "Resources", "resources": {"group": "", "resource": "configmaps", "namespace": namespace,
                                                "selector": {"matchLabels": {"app": "web"}}}},
            {"type": "Resources", "condition": "has(object.data.busy)",
             "resources": {"group": "", "resource": "configmaps", "namespace": namespace}},
        ]
        answer = realcluster.admin.merge_patch(f"{CRITICAL_SERVICES}/{name}", {"spec": {"criteria": criteria}})
        assert answer.status_code == 200, answer.text
        asyncio.run(_every_kind(realcluster, namespace, finalizer))


async def _every_kind(cluster: RealCluster, namespace: str, finalizer: str) -> None:
    from criticalsvc.caughtup import CaughtUpReader

    api = await connect(kubeconfig=str(cluster.kubeconfig))
    transport = HoldingTransport(KubeTransport(api))
    cache = CacheState(transport, backoff=Backoff(initial=0.05, maximum=0.5))
    reader = LiveReader(transport, mapper=cache.mapper, mirror=cache, catch_up_above=0,
                        caught_up=CaughtUpReader(transport, cache))
    request = _provider_delete(namespace)
    configmaps = "/api/v1/configmaps"
    try:
        await cache.start()
        assert await cache.wait_ready(60)
        await eventually(lambda: cache.exact_version(CONFIGMAPS) is not None and
                         decide(request, cache).rule == Rule.CRITERIA_MET and
                         len(next(iter(cache.protecting(request.ref, {}))).criteria) == 4, timeout=30,
                         what="the cache watches ConfigMaps and holds the four criteria")
        since = len(transport.calls)
        timings: list[tuple[float, int]] = []
        for _ in range(10):
            started = time.monotonic()
            confirmation = await reader.decide(request)
            assert confirmation.decision.allowed, confirmation.decision.message
            assert confirmation.caught_up is not None  # decided on the caught-up cache, not by fresh reads
            timings.append((time.monotonic() - started, confirmation.caught_up.watches))
        print("\ncaught-up confirmations on the real API server (s, probe watches): "
              + ", ".join(f"{t:.3f}/{w}" for t, w in timings))
        assert all(t < CATCH_UP_TIMEOUT for t, _w in timings)
        reads = [(path, params) for kind, path, params in transport.calls[since:]
                 if kind == "get" and "configmaps" in path]
        # ConfigMaps are read only with ?limit=1, which wakes kube-apiserver's cache of them when it lags
        # (criticalsvc/caughtup.py): never a GET or a LIST of their objects.
        assert all(params == {"limit": "1"} for _path, params in reads), reads
        # The window: a carrier the cache has not heard of is refused once the probe has seen it.
        transport.hold(configmaps)
        await asyncio.to_thread(_carrier, cluster, namespace, finalizer)
        assert decide(request, cache).allowed
        probes_before = len(transport.calls)

        async def release_at_probe() -> None:
            await eventually(lambda: any(kind == "stream" and path == configmaps and params.get("timeoutSeconds") == "3"
                                         for kind, path, params in transport.calls[probes_before:]), timeout=10,
                             what="a probe of ConfigMaps")
            transport.release()

        release = asyncio.create_task(release_at_probe())
        started = time.monotonic()
        refused = await reader.decide(request)
        window = time.monotonic() - started
        release.cancel()
        assert not refused.decision.allowed and f"{namespace}/carrier" in refused.decision.message, \
            refused.decision.message
        assert refused.caught_up is not None
        print(f"the window refused in {window:.3f} s")
    finally:
        transport.release()
        await cache.stop()
        await api.close()
