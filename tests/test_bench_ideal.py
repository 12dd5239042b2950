"""benchmarks/ideal.py: the tool-neutral ideal and each deleter's own order, played step by step on the reference
story's keys (pure: no cluster, no clock)."""

from __future__ import annotations

from benchmarks import ideal
from tests.realcluster.teardown import Story

STORY = Story.make("t")
PATHS, DEPENDENTS = STORY.paths(), STORY.dependents()
CRS = {k for k in PATHS if k.startswith("CoolResource/")}
CRD = f"CustomResourceDefinition/{STORY.crd_name}"
DEPLOYMENT = f"Deployment/{STORY.name('finalizer-deployment')}"
PROVIDER_NS, CR_NS = f"Namespace/{STORY.namespace}", f"Namespace/{STORY.cr_namespace}"
CRITICAL_SERVICE = f"CriticalService/{STORY.critical_service}"


def play(order: ideal.Order) -> list[set[str]]:
    """The waves of DELETEs an order sends when every object goes the moment its DELETE is sent (and a namespace's
    content with it)."""
    gone: set[str] = set()
    sent: set[str] = set()
    waves = []
    while wave := order.ready(gone, sent):
        waves.append(wave)
        sent |= wave
        gone |= wave
        for ns in (k for k in wave if k.startswith("Namespace/")):
            gone |= {k for k, p in PATHS.items() if f"/namespaces/{ns.split('/', 1)[1]}/" in p}
    return waves


def violations(waves: list[set[str]]) -> list[tuple[str, str]]:
    """(provider, dependent) pairs whose provider was sent no later than what the safety check puts first; a
    namespace's DELETE counts for its content, and a namespace sent with its own content is safe (it cannot be gone
    before its content is)."""
    when = {k: i for i, wave in enumerate(waves) for k in wave}
    inside = {ns: {k for k, p in PATHS.items() if f"/namespaces/{ns.split('/', 1)[1]}/" in p}
              for ns in PATHS if ns.startswith("Namespace/")}
    for ns in [k for k in when if k.startswith("Namespace/")]:
        for k in inside[ns]:
            when.setdefault(k, when[ns])
    return [(p, d) for p, ds in DEPENDENTS.items() for d in ds
            if when[p] < when[d] or (when[p] == when[d] and d not in inside.get(p, ()))]


def test_the_neutral_ideal_deletes_the_crd_only_after_its_instances_and_keeps_the_safe_order() -> None:
    waves = play(ideal.neutral(PATHS, DEPENDENTS))
    assert waves[0] == CRS | {CR_NS}
    assert waves[1] == {CRD}
    # The provider and its namespace together: deleting the namespace deletes the provider, which may go now.
    assert waves[2] == {DEPLOYMENT, PROVIDER_NS}
    assert waves[3] == {CRITICAL_SERVICE}
    assert set().union(*waves) == set(PATHS)
    assert violations(waves) == []


def test_a_one_pass_order_marks_the_crd_with_its_instances_and_is_otherwise_the_same() -> None:
    waves = play(ideal.one_pass(PATHS, DEPENDENTS))
    assert waves[0] == CRS | {CR_NS, CRD}
    assert waves[1:] == [{DEPLOYMENT, PROVIDER_NS}, {CRITICAL_SERVICE}]
    assert violations(waves) == []


def test_the_namespace_deleter_sends_only_the_namespaces_and_what_lies_outside_them() -> None:
    order = ideal.namespaces(PATHS, DEPENDENTS)
    assert order.targets == {CR_NS, PROVIDER_NS, CRD, CRITICAL_SERVICE}
    waves = play(order)
    assert waves == [{CR_NS, CRD}, {PROVIDER_NS}, {CRITICAL_SERVICE}]
    assert violations(waves) == []


def test_the_negative_control_an_order_without_the_safety_checks_edges_is_caught() -> None:
    unsafe = ideal.one_pass(PATHS, {})
    assert violations(play(unsafe)) != []


def test_only_the_workload_is_counted_for_every_tool() -> None:
    assert set(ideal.counted(PATHS)) == set(PATHS) - {CRITICAL_SERVICE}


def test_flux_passes_double_from_750_ms() -> None:
    assert ideal.flux_passes(12) == (0.0, 0.75, 2.25, 5.25, 11.25)
