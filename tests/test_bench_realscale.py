"""The real-scale benchmark's pure parts (benchmarks/realscale.py): the cluster it loads and its arithmetic.

Its figures are only worth reading if the population is what it claims: every CriticalService's provider
really protected (so the refused DELETEs it times are refusals, not allows), the victims really not, and a
smaller size a true subset of the larger one (so two sizes compare one cluster). The protection is checked
against `decide()` on the same objects (build_state), with a negative control: without the ConfigMaps and
pods the same providers may go.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from benchmarks.realscale import EMPTY, Layout, bytes_per_object, manifests, per_second
from criticalsvc.admission import AdmissionRequest
from criticalsvc.api import GroupResource
from criticalsvc.decision import decide
from criticalsvc.snapshot import build_state

SMALL = Layout(namespaces=12, configmaps=120, pods=5, services=8, victims=3)
DEPLOYMENTS = GroupResource("apps", "deployments")


def _state(layout: Layout, *, without: frozenset[str] = frozenset()) -> Any:
    return build_state(m for m in manifests(layout) if m.kind not in without)


def _created(layout: Layout, before: Layout) -> list[tuple[str, dict[str, Any]]]:
    return [*layout.namespaces_from(before), *layout.objects_from(before), *layout.pods_from(before),
            *layout.services_from(before)]


def _delete_deployment(path: str) -> AdmissionRequest:
    ns, name = path.split("/namespaces/")[1].split("/deployments/")
    return AdmissionRequest("u", DEPLOYMENTS, "DELETE", name, ns, kind="Deployment",
                            old_object={"apiVersion": "apps/v1", "kind": "Deployment",
                                        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}}})


def test_every_provider_is_protected_and_no_victim_is() -> None:
    state = _state(SMALL)
    refused = [i for i in range(SMALL.services)
               if not decide(_delete_deployment(SMALL.provider_path(i)), state).allowed]
    assert refused == list(range(SMALL.services))
    assert all(decide(_delete_deployment(SMALL.victim_path(v)), state).allowed for v in range(SMALL.victims))
    # The four kinds of CriticalService are all there.
    kinds = Counter(c["type"] for i in range(SMALL.services) for c in SMALL.critical_service(i)[1]["spec"]["criteria"])
    assert set(kinds) == {"Finalizer", "SpecificResource", "Resources"}


def test_without_what_they_protect_the_providers_may_go() -> None:
    """The negative control: it is the ConfigMaps and pods that hold the providers, not the oracle's bias."""
    state = _state(SMALL, without=frozenset({"ConfigMap", "Pod"}))
    assert all(decide(_delete_deployment(SMALL.provider_path(i)), state).allowed for i in range(SMALL.services))


@pytest.mark.parametrize("fraction", [0.1, 0.25, 0.5])
def test_a_smaller_size_is_the_first_objects_of_the_larger_in_its_own_namespaces(fraction: float) -> None:
    full = Layout(namespaces=40, configmaps=400, pods=10, services=20, victims=8)
    small = full.scaled(fraction)
    small_namespaces = {m.obj["metadata"]["name"] for m in manifests(small) if m.kind == "Namespace"}
    for m in manifests(small):
        if m.kind != "Namespace" and "namespace" in m.obj["metadata"]:
            assert m.obj["metadata"]["namespace"] in small_namespaces, m.obj
    # Growing small into full creates exactly what full has beyond small: no object twice, none missing.
    grown, first, everything = _created(full, small), _created(small, EMPTY), _created(full, EMPTY)

    def keys(items: list[tuple[str, dict[str, Any]]]) -> Counter[str]:
        return Counter(f"{path}/{body['metadata']['name']}" for path, body in items)

    assert keys(first) + keys(grown) == keys(everything)
    assert max(keys(everything).values()) == 1
    assert len(everything) == full.total


def test_configmaps_spread_evenly() -> None:
    per_namespace = Counter(path for path, _ in (SMALL.configmap(j) for j in range(SMALL.configmaps)))
    assert set(per_namespace.values()) == {10} and len(per_namespace) == SMALL.namespaces


def test_bytes_per_object_is_rss_growth_over_object_growth() -> None:
    assert bytes_per_object((100_000, 150_000), (1_000, 101_000)) == 512  # 50,000 KiB over 100,000 objects
    assert bytes_per_object((100_000, 90_000), (0, 10_240)) == -1000  # a shrink reads as one, not as nothing
    assert bytes_per_object((100_000, 150_000), (5, 5)) is None


def test_per_second_keeps_every_kind_and_the_total() -> None:
    rates = per_second(Counter({"GET leases": 30, "PUT leases": 15, "WATCH configmaps": 1}), 30.0)
    assert rates == {"total": 1.53, "GET leases": 1.0, "PUT leases": 0.5, "WATCH configmaps": 0.03}
