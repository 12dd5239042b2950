"""The live service's cluster state: watch-fed caches over the official kubernetes client.

    transport.py   GET / watch-stream over `kubernetes.aio` (auth, TLS), errors as APIError
    discovery.py   the API server's discovery documents -> the RESTMapper
    reflector.py   list-then-watch of one group/resource into a sink (410 -> relist, backoff)
    served.py      ServedTypes: the discovery loop plus established CRDs, kept in the RESTMapper
    watchset.py    WatchSet: one reflector per needed resource, its events applied to a MemoryState
    guarded.py     GuardedState: that MemoryState as a ClusterState, refusing what has not synced
    manager.py     CacheState: the three composed, with readiness, for the server and the CLI

Fresh reads for confirming an ALLOW live next door, in criticalsvc.live (they share the transport).
"""

from ..backoff import Backoff
from .discovery import DiscoveryResult, discover, discover_group
from .manager import ALWAYS_WATCHED, CacheState
from .reflector import Reflector
from .transport import APIError, APIStatusError, KubeTransport, Transport, TransportError, connect, disconnect

__all__ = [
    "ALWAYS_WATCHED",
    "APIError",
    "APIStatusError",
    "Backoff",
    "CacheState",
    "DiscoveryResult",
    "KubeTransport",
    "Reflector",
    "Transport",
    "TransportError",
    "connect",
    "disconnect",
    "discover",
    "discover_group",
]
