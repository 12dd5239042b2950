"""The teardown ideals, defined once: benchmarks/replay_real.py and benchmarks/peers.py both measure against them.

An ideal is an `Order`: which objects a deleter sends DELETEs for (`targets`), and, for each, which objects must
be gone before its DELETE is sent (`before`). `run_order` plays an order on a live API server: every round
(INTERVAL) it looks at what is left and sends, all at once, every DELETE whose `before` is gone; a refused
DELETE (the gate's 403) is re-sent the next round. Every object of the bundle is counted the same way for
every tool (`counted`: the story's workload - its namespaces, Deployment, CRD and CRs; not a tool's own
records such as a CriticalService, a ManifestWork, a Kustomization, which are reported beside it).

- `neutral`: the tool-neutral ideal. The order is the one the benchmark's own safety check demands
  (tests/realcluster/teardown.py Story.dependents: no provider before what it serves, the provider's namespace
  not before its provider), and one edge every teardown obeys anyway: a CRD goes after its instances
  (its cleanup deletes them before it removes the CRD, apiextensions-apiserver crd_finalizer.go,
  https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/apiextensions-apiserver/pkg/controller/finalizer/crd_finalizer.go).
  Its DELETE is sent once they are gone, so the cleanup finds none and never waits for its 5 s poll. A
  namespace's DELETE is sent once what its content waits for is gone (deleting it deletes its content).
- `one_pass`: the order of a deleter that sends every DELETE in one pass (kubectl delete -f, the ManifestWork
  agent, a Flux pass): the same, except that the CRD is marked at once, so its cleanup waits for the poll
  while the instances finalize. With replay the gate re-sends the refused DELETEs the moment they are
  allowed, so this is those deleters' own ideal.
- `namespaces`: the namespace deleter's order: only the namespaces and what lies outside them are sent
  (the CRD at once); the namespace controller deletes the rest.
- `flux_passes`: Flux's pass grid, 0.75 s·(2ⁿ - 1) after the first (controller-runtime's rate limiter as
  Flux configures it, https://github.com/fluxcd/pkg/blob/runtime/v0.110.3/runtime/controller/rate_limiter.go):
  `run_order(..., grid=...)` sends a DELETE only at a pass, its own ideal without replay, and the pass
  after which its Kustomization can go (the first with nothing refused) with or without.
- A stack whose CRD stays (Argo CD deletes no CRD when it deletes an Application; design/criticalservice.md
  §6): the same orders over what the deleter deletes, the CRD left out of `paths` (and so of the order).
  `run_order(..., settle=True)` is Argo CD's own order without replay: nothing is sent while anything sent
  is still there (its controller sends nothing while any object it tracks has a deletionTimestamp,
  https://github.com/argoproj/argo-cd/blob/v3.2.3/controller/appcontroller.go#L1234-L1238).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
import httpx

INTERVAL = 0.05  # a round: GET what is left (~10 objects, 20-50 ms on the test control plane), send what may go


@attrs.frozen
class Order:
    name: str
    before: Mapping[str, frozenset[str]]  # key -> keys that must be gone before the key's DELETE is sent
    targets: frozenset[str]  # the keys a DELETE is sent for; the others go with their namespace

    def ready(self, gone: Iterable[str], sent: Iterable[str]) -> set[str]:
        """The targets not yet sent whose `before` is all gone."""
        gone, sent = set(gone), set(sent)
        return {k for k in self.targets - sent - gone if self.before[k] <= gone}


def _namespace_of(path: str) -> str | None:
    _, _, rest = path.partition("/namespaces/")
    return rest.split("/", 1)[0] if rest and "/" in rest else None


def _crd_instances(paths: Mapping[str, str]) -> dict[str, frozenset[str]]:
    """CRD key -> keys of its instances among `paths` (a CRD named plural.group serves /apis/group/*/.../plural/)."""
    out = {}
    for key, _ in paths.items():
        if key.startswith("CustomResourceDefinition/"):
            plural, _, group = key.split("/", 1)[1].partition(".")
            out[key] = frozenset(k for k, p in paths.items()
                                 if p.startswith(f"/apis/{group}/") and f"/{plural}/" in p)
    return out


def _order(name: str, paths: Mapping[str, str], dependents: Mapping[str, Iterable[str]], *,
           crd_after_instances: bool, targets: Iterable[str] | None = None) -> Order:
    before = {k: set(dependents.get(k, ())) & paths.keys() for k in paths}
    if crd_after_instances:
        for crd, instances in _crd_instances(paths).items():
            before[crd] |= instances
    # A namespace's DELETE deletes its content: it waits for what the content waits for, not for the content.
    for key in paths:
        if not key.startswith("Namespace/"):
            continue
        ns = key.split("/", 1)[1]
        inside = {k for k, p in paths.items() if _namespace_of(p) == ns}
        waits = before[key] - inside
        for k in inside:
            waits |= before[k]
        before[key] = waits - inside
    return Order(name, {k: frozenset(v) for k, v in before.items()},
                 frozenset(paths if targets is None else targets))


def neutral(paths: Mapping[str, str], dependents: Mapping[str, Iterable[str]]) -> Order:
    return _order("neutral", paths, dependents, crd_after_instances=True)


def one_pass(paths: Mapping[str, str], dependents: Mapping[str, Iterable[str]]) -> Order:
    return _order("one-pass", paths, dependents, crd_after_instances=False)


def namespaces(paths: Mapping[str, str], dependents: Mapping[str, Iterable[str]]) -> Order:
    names = {k.split("/", 1)[1] for k in paths if k.startswith("Namespace/")}
    targets = {k for k, p in paths.items() if _namespace_of(p) not in names}
    return _order("namespaces", paths, dependents, crd_after_instances=False, targets=targets)


def flux_passes(until: float = 3600.0) -> tuple[float, ...]:
    """Seconds after the first pass at which Flux's kustomize-controller re-runs a refused deletion's pass."""
    out, n = [], 0
    while (t := 0.75 * (2 ** n - 1)) <= until:
        out.append(t)
        n += 1
    return tuple(out)


def counted(paths: Mapping[str, str]) -> dict[str, str]:
    """The objects every tool's teardown is timed on: the story's workload, not a tool's own records."""
    return {k: p for k, p in paths.items() if not k.startswith("CriticalService/")}


@attrs.define
class Timeline:
    """What `run_order` did, in seconds after it started (time.time() at `started`)."""

    started: float
    sent: dict[str, float] = attrs.Factory(dict)  # key -> when its (accepted) DELETE was sent
    gone: dict[str, float] = attrs.Factory(dict)  # key -> when it was first seen gone
    refusals: int = 0
    passes: list[float] = attrs.Factory(list)  # with a grid: the passes that sent something

    def makespan(self, keys: Iterable[str]) -> float:
        return max(self.gone[k] for k in keys)


def run_order(client: Any, paths: Mapping[str, str], order: Order, *, stopping: threading.Event,
              timeout: float = 300.0, propagation: str = "Background", grid: tuple[float, ...] = (),
              settle: bool = False, on_first_delete: Any = None) -> Timeline:
    """Play `order` on `paths` until every path is gone (or `stopping`, or `timeout`). With `grid`, DELETEs are
    sent only in the first round at or after each of its times; with `settle`, only in a round where every
    object already sent is gone."""
    started = time.time()
    line = Timeline(started)
    options = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
    next_pass = 0
    while not stopping.is_set() and time.time() - started < timeout:
        for key, path in paths.items():
            if key not in line.gone:
                try:
                    if not client.exists(path):
                        line.gone[key] = time.time() - started
                except httpx.HTTPError:
                    continue
        if len(line.gone) == len(paths):
            break
        now = time.time() - started
        due = not grid or (next_pass < len(grid) and now >= grid[next_pass])
        if settle and not set(line.sent) <= set(line.gone):
            due = False
        if due:
            sent_any = False
            for key in sorted(order.ready(line.gone, line.sent)):
                at = time.time()
                try:
                    status = client.delete(paths[key], body=options).status_code
                except httpx.HTTPError:
                    continue
                if on_first_delete is not None and not line.sent and not line.refusals:
                    on_first_delete(at)
                sent_any = True
                if status < 300 or status == 404:  # 404: gone, or a CR whose CRD is gone
                    line.sent[key] = at - started
                else:
                    line.refusals += 1
            if grid:
                if sent_any:
                    line.passes.append(now)
                while next_pass < len(grid) and grid[next_pass] <= now:
                    next_pass += 1
        stopping.wait(INTERVAL)
    return line
