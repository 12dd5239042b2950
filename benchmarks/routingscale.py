"""Routing at scale (issue 28, deliverable 5), on the control plane `python -m benchmarks realcluster` starts:
its unprotected cells call these while they grow the CriticalServices to 1,000 (benchmarks/population.py).

* `populate`: CriticalServices created by concurrent clients (each CREATE is reviewed by the gate), then
  waited for until every one says Ready=True/Enforcing (the router wrote criticalsvc-providers and its probe
  came back from kube-apiserver).
* `time_to_enforcing`: CREATE of one more CriticalService to its Ready=Enforcing, one at a time, polled
  every 20 ms: the router's 1 s poll, its write, kube-apiserver's informer, the probe and the status write.
* `live_size`: the stored criticalsvc-providers measured (population.rendered_size).
* `broad`: a few cluster-wide selectors added (selector without namespace): their RoutedNarrowly
  condition, criticalsvc_broad_routes, and which webhook lost its matchCondition.
"""

from __future__ import annotations

import concurrent.futures
import statistics
import threading
import time
from typing import Any

from .population import rendered_size

CRITICAL_SERVICES = "/apis/criticalsvc.io/v1alpha1/criticalservices"
CONFIGURATIONS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"


def condition(cs: dict[str, Any], kind: str) -> tuple[str, str] | None:
    for c in (cs.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return c.get("status", ""), c.get("reason", "")
    return None


def enforcing(cs: dict[str, Any]) -> bool:
    return condition(cs, "Ready") == ("True", "Enforcing")


def populate(cluster: Any, services: list[dict[str, Any]], *, workers: int = 8,
             timeout: float | None = None) -> dict[str, Any]:
    """Create `services` (those not there yet) and wait until all are Enforcing; seconds for each part. The timeout
    (default 600 s, or 0.12 s per CriticalService past 5,000) covers creating them through admission too."""
    timeout = timeout if timeout is not None else max(600.0, 0.12 * len(services))
    from tests.realcluster.client import Client

    local = threading.local()
    clients: list[Any] = []

    def create(body: dict[str, Any]) -> None:
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = Client(cluster.kubeconfig)
            clients.append(client)
        deadline = time.monotonic() + 60
        while True:  # the gate refuses a CREATE it cannot check yet (fail closed): retried
            answer = client.create(CRITICAL_SERVICES, body)
            if answer.status_code in (201, 409):
                return
            assert time.monotonic() < deadline, answer.text
            time.sleep(0.2)

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(create, services))
    created = time.perf_counter() - started
    for client in clients:
        client.close()
    names = {s["metadata"]["name"] for s in services}
    while True:
        listed = cluster.admin.get(CRITICAL_SERVICES) or {"items": []}
        pending = [i["metadata"]["name"] for i in listed["items"]
                   if i["metadata"]["name"] in names and not enforcing(i)]
        if not pending:
            break
        assert time.perf_counter() - started < timeout, f"{len(pending)} not Enforcing, e.g. {pending[:3]}"
        time.sleep(0.5)
    return {"created": len(services), "createSeconds": round(created, 1),
            "allEnforcingSeconds": round(time.perf_counter() - started, 1)}


def time_to_enforcing(cluster: Any, services: list[dict[str, Any]], *, timeout: float = 60) -> dict[str, Any]:
    """Each of `services` created alone, then polled every 20 ms until Enforcing: p50/p99/max seconds."""
    took = []
    for body in services:
        path = f"{CRITICAL_SERVICES}/{body['metadata']['name']}"
        started = time.perf_counter()
        while cluster.admin.create(CRITICAL_SERVICES, body).status_code != 201:
            assert time.perf_counter() - started < timeout
            time.sleep(0.05)
        while not enforcing(cluster.admin.get(path) or {}):
            assert time.perf_counter() - started < timeout, f"{path} not Enforcing after {timeout} s"
            time.sleep(0.02)
        took.append(time.perf_counter() - started)
    ordered = sorted(took)
    return {"creates": len(took), "p50Seconds": round(statistics.median(took), 2),
            "p99Seconds": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 2),
            "maxSeconds": round(ordered[-1], 2)}


def live_size(cluster: Any) -> dict[str, Any]:
    """population.rendered_size of every shard of criticalsvc-providers as stored now."""
    from criticalsvc.webhookconfigurations import CONFIGURATION_NAMES

    bodies = []
    for name in CONFIGURATION_NAMES:
        stored = cluster.admin.get(f"{CONFIGURATIONS}/{name}")
        if stored is None:
            continue
        body = {k: v for k, v in stored.items() if k != "metadata"}
        body["metadata"] = {k: v for k, v in stored["metadata"].items() if k != "managedFields"}
        bodies.append(body)
    assert bodies, "no criticalsvc-providers configuration is stored"
    return rendered_size(bodies)


def broad(cluster: Any, services: list[dict[str, Any]]) -> dict[str, Any]:
    """After `services` (cluster-wide selectors) are Enforcing: what their status and the gate say."""
    names = {s["metadata"]["name"] for s in services}
    listed = (cluster.admin.get(CRITICAL_SERVICES) or {"items": []})["items"]
    narrowly: dict[str, int] = {}
    for item in listed:
        got = condition(item, "RoutedNarrowly")
        key = f"{(item['metadata']['name'] in names and 'clusterWide') or 'others'}:{got}"
        narrowly[key] = narrowly.get(key, 0) + 1
    return {"routedNarrowly": narrowly,
            "criticalsvc_broad_routes": sum(r.metric("criticalsvc_broad_routes") for r in cluster.gate.replicas),
            "size": live_size(cluster)}
