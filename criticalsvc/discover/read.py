"""The live reads of `discover` and the diagnosis: the only module here doing I/O.

What it reads, and how cheaply (a 100,000-object cluster is mostly objects nobody names):

    discovery                      every served, listable type (two requests with aggregated discovery)
    whole objects, paginated       the few types whose spec or status matters (inventory.WHOLE)
    metadata only, paginated       everything else (Accept: ...;as=PartialObjectMetadataList): names, labels,
                                   ownerReferences, finalizers, deletionTimestamp - no object bodies
    SubjectAccessReviews           one per (ServiceAccount, finalizer type) the inference asks about

A type that cannot be listed (403, an aggregated API whose server is down) is reported, never fatal: its
finalizers are then unknown, and the answer says so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, Protocol

import attrs
import structlog

from ..api import (
    CRDS,
    CriticalService,
    FinalizerCriterion,
    GroupResource,
    ObjectRef,
    ResourcesCriterion,
    SpecificResourceCriterion,
)
from ..cache import APIError, KubeTransport, connect, disconnect, discover
from ..cache.transport import ACCEPT_JSON, ACCEPT_METADATA_LIST, Transport, list_items
from ..restmapper import ResourceType
from .coverage import Served, served_by, served_of
from .inventory import (
    APISERVICES,
    CLUSTERROLEBINDINGS,
    CLUSTERROLES,
    ENDPOINTSLICES,
    MUTATING,
    OWNED,
    PODS,
    REPLICASETS,
    ROLEBINDINGS,
    ROLES,
    SERVICES,
    VALIDATING,
    WHOLE,
    WORKLOAD_TYPES,
    Inventory,
    InventoryBuilder,
)
from .propose import access_questions, propose
from .rbac import AccessAnswer, AccessQuestion, review

PAGE = 2000  # objects per LIST page: metadata pages are ~1 KiB an object, whole ones of WHOLE types are few
CONCURRENCY = 8  # as discovery does (criticalsvc/cache/discovery.py): no burst priority-and-fairness would queue
TIMEOUT = 30.0
SUBJECT_ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
log = structlog.get_logger("criticalsvc.discover")


class Client(Transport, Protocol):
    """What the reads need: the caches' GET (criticalsvc/cache/transport.py) and a POST for the reviews."""

    async def send(self, verb: str, path: str, payload: Any = None, *, timeout: float) -> Any:
        ...


@attrs.frozen
class LiveRead:
    inventory: Inventory
    unreadable: tuple[str, ...]  # "<type>: <error>" for every type that could not be listed


async def _list(transport: Transport, t: ResourceType, builder: InventoryBuilder, namespace: str | None) -> None:
    accept = ACCEPT_JSON if t.group_resource in WHOLE else ACCEPT_METADATA_LIST
    token = ""
    while True:
        params = [("limit", str(PAGE))] + ([("continue", token)] if token else [])
        # The types that trace a server or a controller are read everywhere: they live in other namespaces.
        where = None if t.group_resource in WHOLE or t.group_resource in OWNED else namespace
        page = await transport.get(t.path(namespace=where), params, timeout=TIMEOUT, accept=accept)
        builder.add_all(t.group_resource, list_items(page) or [])
        token = str((page.get("metadata") or {}).get("continue") or "")
        if not token:
            return


async def read_inventory(transport: Transport, *, namespace: str | None = None,
                         only: Sequence[GroupResource] | None = None) -> LiveRead:
    """Every object's inventory facts (`namespace`: of the other namespaced types, only that namespace's objects -
    what a diagnosis of it needs; `only`: only those types)."""
    result = await discover(transport)
    builder = InventoryBuilder()
    groups = None if only is None else {gr.group for gr in only}
    unreadable = [f"group {g}: its discovery failed" for g in sorted(result.failed_groups)
                  if groups is None or g in groups]
    limit = asyncio.Semaphore(CONCURRENCY)
    # `only` may name a type by its Kind, as criteria may (`resource: CustomResourceDefinition`).
    types = [t for t in result.types
             if only is None or t.group_resource in only or GroupResource(t.group, t.kind) in only]

    async def one(t: ResourceType) -> None:
        async with limit:
            try:
                await _list(transport, t, builder, namespace)
            except APIError as exc:
                unreadable.append(f"{t.group_resource}: {exc}")

    await asyncio.gather(*(one(t) for t in types))
    return LiveRead(builder.build(), tuple(sorted(unreadable)))


async def review_access(transport: Client, questions: Sequence[AccessQuestion]) -> dict[AccessQuestion, AccessAnswer]:
    """The API server's answer to each question (a SubjectAccessReview; AccessAnswer(None) when it failed)."""
    limit = asyncio.Semaphore(CONCURRENCY)
    out: dict[AccessQuestion, AccessAnswer] = {}

    async def one(q: AccessQuestion) -> None:
        attributes = {"verb": q.verb, "group": q.group_resource.group, "resource": q.group_resource.resource}
        if q.namespace:
            attributes["namespace"] = q.namespace
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                  "spec": {"user": q.user, "resourceAttributes": attributes,
                           # The groups the API server puts a ServiceAccount's token in
                           # (https://github.com/kubernetes/apiserver/blob/v0.37.2/pkg/authentication/serviceaccount/util.go).
                           "groups": ["system:serviceaccounts", f"system:serviceaccounts:{q.account[0]}",
                                      "system:authenticated"]}}
        async with limit:
            try:
                answer = await transport.send("POST", SUBJECT_ACCESS_REVIEWS, review, timeout=TIMEOUT)
            except APIError as exc:
                out[q] = AccessAnswer(None, str(exc))
                return
        status = answer.get("status") if isinstance(answer, dict) else None
        status = status if isinstance(status, dict) else {}
        out[q] = AccessAnswer(bool(status.get("allowed")), str(status.get("reason") or ""))

    await asyncio.gather(*(one(q) for q in questions))
    return out


def read_cluster(*, kubeconfig: str | None = None, context: str | None = None, namespace: str | None = None,
                 questions_for: Callable[[Inventory], Sequence[AccessQuestion]] | None = None,
                 ) -> tuple[LiveRead, dict[AccessQuestion, AccessAnswer]]:
    """Read the cluster, then (given `questions_for`) answer the access questions its inventory raises."""

    async def run() -> tuple[LiveRead, dict[AccessQuestion, AccessAnswer]]:
        api = await connect(kubeconfig=kubeconfig, context=context)
        try:
            transport = KubeTransport(api)
            read = await read_inventory(transport, namespace=namespace)
            answers = await review_access(transport, questions_for(read.inventory)) \
                if questions_for is not None else {}
            return read, answers
        finally:
            await disconnect(api)

    return asyncio.run(run())


# What the Covered condition reads: the exact findings only (no finalizer scan of every type, no reviews), so the
# gate needs list rights on these few types, not on everything (api/examples/rbac/coverage-reader.yaml).
COVERAGE_TYPES = (VALIDATING, MUTATING, CRDS, APISERVICES, SERVICES, ENDPOINTSLICES, PODS, REPLICASETS,
                  *WORKLOAD_TYPES)


# What lets it judge finalizers too, optionally (api/examples/rbac/coverage-finalizers-reader.yaml): the RBAC objects,
# from which it answers "may this ServiceAccount update that type?" as the RBAC authorizer would (rbac.review), where
# `discover` asks the API server (a SubjectAccessReview, which the gate is not granted to create).
RBAC_TYPES = (CLUSTERROLES, CLUSTERROLEBINDINGS, ROLES, ROLEBINDINGS)


def criteria_types(services: Iterable[CriticalService]) -> frozenset[GroupResource]:
    """The types the CriticalServices' criteria name: the gate reads them already (its reader role must grant them),
    so the Covered check may look for finalizers on them without any further grant."""
    out = set()
    for cs in services:
        for c in cs.criteria:
            if isinstance(c, SpecificResourceCriterion):
                out.add(c.target.group_resource)
            elif isinstance(c, FinalizerCriterion | ResourcesCriterion):
                out.add(c.group_resource)
    return frozenset(out)


class CoverageWatch:
    """Re-reads what each workload serves every `every` seconds, for the status's Covered condition (leader only).

    Webhook configurations, CRD conversions and APIServices are read everywhere (COVERAGE_TYPES). Finalizers are
    judged on the types `finalizer_types()` returns (the criteria's types: what the gate reads anyway), and only
    when the RBAC objects can be read: a finalizer's controller is inferred from who may update the type, and only a
    high-confidence inference counts. A finalizer on a type no criterion names is not seen: that would take a list
    of every type (secrets included), which a deletion gate should not hold; `discover` finds those.

    A read that fails keeps the last answer; an exact type it may not list makes it say nothing (`served` None)
    rather than call a provider covered on half the facts; an unreadable finalizer type or RBAC only leaves those
    finalizers unjudged (`finalizers_judged` says whether any were)."""

    def __init__(self, transport: Transport, *, every: float, gate_namespace: str,
                 finalizer_types: Callable[[], Collection[GroupResource]] = frozenset) -> None:
        self.transport = transport
        self.every = every
        self.gate_namespace = gate_namespace
        self.finalizer_types = finalizer_types
        self.changes = 0
        self.finalizers_judged = False
        self._served: dict[ObjectRef, tuple[Served, ...]] | None = None

    def served(self, cs: CriticalService) -> tuple[Served, ...] | None:
        return None if self._served is None else served_of(cs, self._served)

    async def read_once(self) -> None:
        judged = frozenset(self.finalizer_types())  # some (CRDs) are among COVERAGE_TYPES: read once
        only = (*COVERAGE_TYPES, *(RBAC_TYPES if judged else ()),
                *sorted(judged - set(COVERAGE_TYPES) - set(RBAC_TYPES)))
        read = await read_inventory(self.transport, only=only)
        failed = {u.partition(": ")[0] for u in read.unreadable}
        exact = {str(gr) for gr in COVERAGE_TYPES} | {f"group {gr.group}" for gr in COVERAGE_TYPES}
        rbac = {str(gr) for gr in RBAC_TYPES} | {f"group {gr.group}" for gr in RBAC_TYPES}
        served = None
        self.finalizers_judged = bool(judged) and not failed & rbac
        if not failed & exact:
            inv = read.inventory
            answers = {q: review(q, inv) for q in access_questions(inv, gate_namespace=self.gate_namespace)} \
                if self.finalizers_judged else {}
            served = served_by(propose(inv, answers, gate_namespace=self.gate_namespace))
        if served != self._served:
            self._served = served
            self.changes += 1

    async def run(self, leading: Callable[[], bool]) -> None:
        while True:
            if leading():
                try:
                    await self.read_once()
                except APIError as exc:
                    log.warning("coverage read failed", error=str(exc))
            await asyncio.sleep(self.every)
