"""The controllers and clients run unchanged on the real-time engine (the HTTP stand-in's face)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from criticalsvc.api import CRDS, GroupResource, ObjectRef
from criticalsvc.manifests import load_path
from criticalsvc.sim.cluster import Cluster
from criticalsvc.sim.engine import RealTimeEngine

STORY = "api/examples/reference-story.yaml"
COOL = GroupResource("my.crd.group", "coolresources")


async def until(condition: Callable[[], bool], timeout: float = 3.0) -> float:
    """Poll `condition`; the seconds it took. Fails the test after `timeout`."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout, "condition not reached in time"
        await asyncio.sleep(0.005)
    return time.monotonic() - start


def test_operator_and_crd_cleanup_work_in_real_time():
    """In real time the operator finalizes a deleted CR and the CRD cleanup removes the CRD, the gate in the loop."""

    async def scenario() -> None:
        cluster = Cluster(engine=RealTimeEngine(), finalizer_delay=(0.01, 0.02))
        cluster.load(load_path(STORY))
        store = cluster.store
        store.delete(ObjectRef(COOL, "cool-apps", "alpha"))
        took = await until(lambda: not store.exists(COOL, "cool-apps", "alpha"))
        assert took >= 0.01
        store.delete(ObjectRef(CRDS, "", "coolresources.my.crd.group"))
        # The CRD cleanup finds the instances gone on its next poll (every 5 s, as kube-apiserver's).
        await until(lambda: not store.exists(CRDS, "", "coolresources.my.crd.group"), timeout=8.0)
        assert not store.exists(COOL, "cool-apps", "beta")
        actors = {e.actor for e in cluster.timeline}
        assert {"finalizer-namespace/finalizer-deployment", "crd-cleanup"} <= actors

    asyncio.run(scenario())
