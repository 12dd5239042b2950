"""ReadAccess: which named types the gate may not list, asked once per type and kept for a while."""

from __future__ import annotations

import asyncio
from typing import Any

from criticalsvc.api import GroupResource
from criticalsvc.cache.access import REVIEWS, ReadAccess
from criticalsvc.cache.transport import TransportError

COOL, PODS = GroupResource("my.crd.group", "coolresources"), GroupResource("", "pods")


class Sender:
    def __init__(self, allowed: set[GroupResource], *, failing: bool = False) -> None:
        self.allowed, self.failing, self.reviews = allowed, failing, []

    async def get(self, path: str, params: Any = (), *, timeout: float, accept: str = "") -> Any:
        raise AssertionError("no GET expected")

    async def send(self, verb: str, path: str, payload: Any = None, *, timeout: float, **kw: Any) -> Any:
        assert (verb, path) == ("POST", REVIEWS)
        self.reviews.append(payload["spec"]["resourceAttributes"])
        if self.failing:
            raise TransportError("connection refused")
        attributes = payload["spec"]["resourceAttributes"]
        return {"status": {"allowed": GroupResource(attributes["group"], attributes["resource"]) in self.allowed}}


def test_the_types_the_api_server_denies_listing_are_named_and_answers_are_kept() -> None:
    now = [0.0]
    sender = Sender({PODS})
    access = ReadAccess(sender, ttl=60, denied_ttl=5, clock=lambda: now[0])
    assert asyncio.run(access.unlistable([PODS, COOL, COOL], timeout=1)) == [COOL]
    assert sender.reviews == [{"verb": "list", "group": "", "resource": "pods"},
                              {"verb": "list", "group": "my.crd.group", "resource": "coolresources"}]
    now[0] = 10  # the denial is asked again (a grant may have come), the permission is not
    sender.allowed.add(COOL)
    assert asyncio.run(access.unlistable([PODS, COOL], timeout=1)) == []
    assert len(sender.reviews) == 3


def test_no_answer_means_no_warning() -> None:
    access = ReadAccess(Sender(set(), failing=True))
    assert asyncio.run(access.unlistable([COOL], timeout=1)) == []
