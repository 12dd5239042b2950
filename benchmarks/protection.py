"""What the labels cost the leader at N CriticalServices, in process (issue 34, deliverable 3).

`python -m benchmarks protection [--services 10000] [--json]`: N CriticalServices of the measured mix
(benchmarks/population.py) over an in-memory cache that holds their providers, one Deployment or ConfigMap
each (every selected one with one member), all labelled but one new CriticalService's. Printed, each the
median of REPEAT runs in this one process:

* `round_cold_s`, `round_warm_s`: the labeller's round (criticalsvc/labeller.py) as the leader runs it after a
  burst of cache events: the first, and one after an unrelated Deployment was written (each selector's members
  kept while its type there is not written); `wanted_s`: the same computation with nothing kept;
* `status_s`: Ready of the new CriticalService (compute_status), what the status writer does per CriticalService;
* `routes_*`: criticalsvc-providers rendered for the N, with every provider absent (every name routed, the
  measured mix as routingscale creates it) and with every provider present and labelled (only selectors and
  `scale` left): its size in KB, its webhooks, how many routes are broad (0: split over webhooks, never broad),
  and the CPU seconds of `desired` + `render`.

The realcluster time to Enforcing is `python -m benchmarks realcluster` (routingscale.time_to_enforcing).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

from criticalsvc import protectionlabels, routing
from criticalsvc import webhookconfigurations as configs
from criticalsvc.api import (
    LABEL_VALUE,
    PROTECTED_LABEL,
    UPDATES_HELD_LABEL,
    GroupResource,
    ObjectRef,
    parse_critical_service,
)
from criticalsvc.labeller import Labeller
from criticalsvc.objects import KubeObject
from criticalsvc.restmapper import RESTMapper
from criticalsvc.state import MemoryState
from criticalsvc.status import compute_status

from .population import namespaces, population

REPEAT = 5
NAMESPACES = GroupResource("", "namespaces")
SHIPPED: dict[str, Any] = {
    "metadata": {"name": routing.SHIPPED_CONFIGURATION, "uid": "00000000-0000-4000-8000-000000000001"},
    "webhooks": [{"name": routing.TEMPLATE_WEBHOOK, "clientConfig": {"service": {
        "namespace": "criticalsvc-system", "name": "criticalsvc", "path": "/validate"}}},
        {"name": routing.LABELS_WEBHOOK}, {"name": routing.LABELLED_UPDATES_WEBHOOK}]}


class _Source:
    def __init__(self, state: MemoryState) -> None:
        self.state, self.ready = state, True


class _NoWrites:
    async def send(self, *args: Any, **kwargs: Any) -> Any:
        return {}


def _median(f: Any) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(REPEAT):
        started = time.process_time()
        out = f()
        times.append(time.process_time() - started)
    return statistics.median(times), out


def _world(count: int, *, labelled: bool) -> tuple[list[Any], MemoryState]:
    services = [parse_critical_service(body) for body in population(count)]
    state = MemoryState(RESTMapper())
    for ns in namespaces(count):
        state.upsert(KubeObject(NAMESPACES, "", ns, labels={PROTECTED_LABEL: LABEL_VALUE} if labelled else {}))
    labels = {PROTECTED_LABEL: LABEL_VALUE, UPDATES_HELD_LABEL: LABEL_VALUE} if labelled else {}
    for cs in services:
        provider = cs.provider
        if isinstance(provider, ObjectRef):
            name, selected = provider.name, {}
        else:  # one member, labelled as its selector asks (matchLabels: one In requirement per key)
            name, selected = f"member-{cs.name}", {r.key: min(r.values) for r in provider.selector.requirements}
        state.upsert(KubeObject(provider.group_resource, provider.namespace or "", name, uid=f"u-{cs.name}",
                                labels={**labels, **selected}))
        state.upsert_critical_service(cs)
    return services, state


def measure(count: int) -> dict[str, Any]:
    services, state = _world(count, labelled=True)
    new = services[0]
    out: dict[str, Any] = {"services": count}
    wanted_s, want = _median(lambda: protectionlabels.wanted(services, state))
    add_s, adds = _median(lambda: protectionlabels.to_add(want, state))
    out |= {"wanted_s": round(wanted_s, 4), "to_add_s": round(add_s, 4), "protected_objects": len(want),
            "missing": len(adds)}
    # The labeller's own round as the leader runs it: the first (every selector scanned), then one after a new
    # provider was written (the selectors over untouched types and namespaces reused).
    labeller = Labeller(_NoWrites(), _Source(state), state.mapper)  # type: ignore[arg-type]
    started = time.process_time()
    asyncio.run(labeller.round())
    out["round_cold_s"] = round(time.process_time() - started, 4)
    rounds = []
    for i in range(REPEAT):
        state.upsert(KubeObject(GroupResource("apps", "deployments"), "elsewhere", f"new-{i}"))
        started = time.process_time()
        asyncio.run(labeller.round())
        rounds.append(time.process_time() - started)
    out["round_warm_s"] = round(statistics.median(rounds), 4)
    routed = routing.Routing(managed=True, labelled=True)
    status_s, status = _median(lambda: compute_status(new, state, now=0, routing=routed,
                                                      lookup=state.mapper.lookup))
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    out |= {"status_s": round(status_s, 5), "ready": ready["reason"]}
    absent = MemoryState(RESTMapper())
    for label, world, carried in (("absent", absent, None), ("labelled", state, True)):
        def render(world: MemoryState = world, carried: bool | None = carried) -> list[configs.Rendered]:
            check = (lambda ref, keys: protectionlabels.carries(world.get(ref), keys)) if carried else None
            return configs.render_all(routing.desired(services, world.mapper.lookup, check), SHIPPED,
                                      probe_namespace="criticalsvc-system")
        seconds, rendered = _median(render)
        sizes = [len(json.dumps(r.configuration)) for r in rendered]
        out[f"routes_{label}"] = {"kb": sum(sizes) // 1024, "largest_kb": max(sizes) // 1024,
                                  "configurations": len(rendered),
                                  "webhooks": sum(len(r.configuration["webhooks"]) for r in rendered),
                                  "broad": sum(len(r.broad) for r in rendered), "cpu_s": round(seconds, 3)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks protection", description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, nargs="*", default=[10, 1_000, 10_000])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = [measure(n) for n in args.services]
    for row in rows:
        print(f"{row['services']:>6} CriticalServices: labeller round cold {row['round_cold_s'] * 1000:.0f} ms, "
              f"warm {row['round_warm_s'] * 1000:.0f} ms; uncached {row['wanted_s'] * 1000:.0f} ms "
              f"(+{row['to_add_s'] * 1000:.0f} ms to_add, {row['protected_objects']} objects, {row['missing']} "
              f"missing), Ready {row['status_s'] * 1000:.1f} ms ({row['ready']}); routes absent "
              f"{row['routes_absent']}, labelled {row['routes_labelled']}")
    if args.json:
        print(json.dumps({"rows": rows}))
    return 0
