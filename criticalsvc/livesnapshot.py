"""A one-shot read of a live cluster, for operator commands (`explain`, `graph`).

It runs the same watch caches the service runs until they have synced once, then hands back their
indexed store: the command answers with exactly the facts the webhook would decide on.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from .errors import StateUnavailable
from .restmapper import ResourceType
from .state import MemoryState


def snapshot_cluster(*, kubeconfig: str | None = None, context: str | None = None,
                     timeout: float = 30.0) -> MemoryState:
    from .cache import CacheState, KubeTransport, connect, disconnect

    async def read() -> MemoryState:
        api = await connect(kubeconfig=kubeconfig, context=context)
        try:
            cache = CacheState(KubeTransport(api))
            await cache.start()
            try:
                if not await cache.wait_ready(timeout):
                    raise StateUnavailable(f"could not read the cluster within {timeout:g} s; still waiting for: "
                                           f"{', '.join(cache.unsynced())}")
                return cache.memory
            finally:
                # The answer is already read; a watch that is slow to close must not hold the command.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(cache.stop(), 2.0)
        finally:
            await disconnect(api)

    return asyncio.run(read())


def read_object(t: ResourceType, *, namespace: str, name: str, kubeconfig: str | None = None,
                context: str | None = None, timeout: float = 10.0) -> dict[str, Any] | None:
    """One object as the API server would send it as oldObject (None when it does not exist): for a
    type no CriticalService names, which the caches above do not hold - its labels still decide
    (deletion-protected), and answering for an unlabelled object would be wrong."""
    from .cache import APIStatusError, KubeTransport, connect, disconnect

    async def read() -> dict[str, Any] | None:
        api = await connect(kubeconfig=kubeconfig, context=context)
        try:
            return await KubeTransport(api).get(t.path(namespace=namespace, name=name), timeout=timeout)
        except APIStatusError as exc:
            if exc.not_found:
                return None
            raise
        finally:
            await disconnect(api)

    return asyncio.run(read())


def read_deletion_intents(*, namespace: str, kubeconfig: str | None = None, context: str | None = None,
                          timeout: float = 10.0) -> list[Any] | None:
    """The deletion intents the gate recorded (ConfigMaps in its namespace, criticalsvc/replay.py), or None
    when they cannot be read (no such namespace, or the caller may not list ConfigMaps there)."""
    from .cache import APIError, KubeTransport, connect, disconnect
    from .errors import InvalidInput
    from .replay import RECORD_LABEL, from_record

    async def read() -> list[Any] | None:
        api = await connect(kubeconfig=kubeconfig, context=context)
        try:
            page = await KubeTransport(api).get(f"/api/v1/namespaces/{namespace}/configmaps",
                                                (("labelSelector", f"{RECORD_LABEL}=true"),), timeout=timeout)
        except APIError:
            return None
        finally:
            await disconnect(api)
        intents = []
        for item in page.get("items") or []:
            with contextlib.suppress(InvalidInput):
                intents.append(from_record(item))
        return intents

    return asyncio.run(read())
