"""ReadAccess: may the gate list a type? Asked of the API server with SelfSubjectAccessReviews.

The gate reads every type a CriticalService names (its provider and its criteria), and its shipped RBAC
covers only the built-in types it routes (deploy/base/rbac.yaml); every other one needs a ClusterRole
labelled criticalsvc.io/aggregate-to-reader. A CriticalService's CREATE is when a missing grant is cheapest
to fix, so the webhook warns then (server.Webhook, `read_access`): a type not watched yet has no cache to
have met a 403, so only the API server can tell. A SelfSubjectAccessReview asks about the caller itself,
the gate's own identity (https://github.com/kubernetes/api/blob/v0.37.2/authorization/v1/types.go#L55-L59).

Answers are kept for a while (`ttl`, a denial for `denied_ttl`), so a bundle of CriticalServices costs one
review per type; a review that fails or is slow gives no answer, and no warning (a warning is advice: the
decision never depends on it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from ..api import GroupResource
from .guarded import READER_AGGREGATION_LABEL
from .transport import APIError, Sender

REVIEWS = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
TTL, DENIED_TTL = 60.0, 5.0


class ReadAccess:
    def __init__(self, transport: Sender, *, ttl: float = TTL, denied_ttl: float = DENIED_TTL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.transport = transport
        self.ttl, self.denied_ttl = ttl, denied_ttl
        self.clock = clock
        self._known: dict[GroupResource, tuple[float, bool]] = {}

    async def unlistable(self, types: Sequence[GroupResource], *, timeout: float) -> list[GroupResource]:
        """Of `types`, those the gate may not list (as far as the API server answered within `timeout`)."""
        out = []
        for gr in dict.fromkeys(types):
            known = self._known.get(gr)
            now = self.clock()
            if known is None or now - known[0] >= (self.ttl if known[1] else self.denied_ttl):
                review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                          "spec": {"resourceAttributes": {"verb": "list", "group": gr.group, "resource": gr.resource}}}
                try:
                    answer = await self.transport.send("POST", REVIEWS, review, timeout=timeout)
                except (APIError, TimeoutError):
                    continue
                status = answer.get("status") if isinstance(answer, dict) else None
                known = (now, bool((status or {}).get("allowed")))
                self._known[gr] = known
            if not known[1]:
                out.append(gr)
        return out


def grant_hint(gr: GroupResource) -> str:
    """What to add so the gate may read `gr` (short: it ends an admission warning, 256 characters at most)."""
    return f"a ClusterRole labelled {READER_AGGREGATION_LABEL}=\"true\" grants get, list, watch on {gr}"


__all__ = ["ReadAccess", "grant_hint"]
