"""benchmarks/peers.py's pure parts: how the work agent's answers are read, the latency rounds' order, the table."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from benchmarks import peers


def test_a_409_is_forgotten_without_an_error_and_any_other_refusal_is_a_failed_sync() -> None:
    # The agent's reading of its DELETEs (ocm pkg/work/helper/helpers.go): 404 and 409 are dropped silently,
    # every other error is dropped too but reported as the sync's error.
    answers = peers.agent_answers([200, 409, 409, 403, 404, 202], sync_errors=1)
    assert answers == {"sent": 6, "deleted": 2, "gone": 1, "forgotten": 2, "failed": 1, "syncErrors": 1}
    assert peers.agent_answers([], sync_errors=0)["sent"] == 0


@pytest.mark.parametrize("rounds", [2, 4, 6])
def test_latency_rounds_alternate_which_mode_goes_first(rounds: int) -> None:
    orders = [peers.round_order(r) for r in range(rounds)]
    assert all(sorted(o) == sorted(peers.LATENCY_MODES) for o in orders)  # every round measures both
    firsts = [o[0] for o in orders]
    assert firsts.count("none") == firsts.count("tool") == rounds // 2
    assert all(a != b for a, b in itertools.pairwise(firsts))


def _teardown(**extra: Any) -> dict[str, Any]:
    return {"complete": True, "wallSeconds": 10.0, "left": [], "orderViolations": [], "refusedByWebhooks": 3,
            **extra}


def test_the_table_names_a_peer_that_was_not_built_and_what_a_manifestwork_left_behind() -> None:
    latency = {f"{m}{c}": {"p50Ms": 5.0, "p99Ms": 9.0, "n": 10} for m in ("none", "tool") for c in (1, 8)}
    results = [
        {"tool": "none", "teardowns": {"ideal": _teardown(wallSeconds=5.0)}, "scenarios": {},
         "deleteLatency": latency},
        {"tool": "crossplane", "scenarios": {}, "deleteLatency": latency,
         "memoryKiB": {"VmRSS": 2048, "VmHWM": 4096},
         "teardowns": {"manifestwork": _teardown(
             agent=peers.agent_answers([200, 409], 0), manifestWorkGoneSeconds=1.5,
             leftWhenManifestWorkGone=["Deployment/finalizer-deployment"])}},
        {"tool": "kyverno-stuck", "scenarios": {}, "teardowns": {"manifestwork": _teardown(
            complete=False, wallSeconds=None, left=["Deployment/d"], agent=peers.agent_answers([400], 1),
            manifestWorkGoneSeconds=None, leftWhenManifestWorkGone=None)}},
        {"tool": "kyverno", "build": "not built: `cd benchmarks/peers/kyverno && go build ...`: out of memory"},
    ]
    table = peers.render(results)
    rows = table.splitlines()
    assert "| kyverno | - | not built: `cd benchmarks/peers/kyverno && go build ...`: out of memory | | |" in rows
    assert "| crossplane | manifestwork | yes | yes | 10.0 | 2.0 | 3 | - |" in rows
    assert "| crossplane | 2: 1/0/1/0 | 0 | 1.5 | Deployment/finalizer-deployment |" in rows
    assert "| kyverno-stuck | manifestwork | NO | yes | - | - | 3 | Deployment/d |" in rows
    assert "| kyverno-stuck | 1: 0/0/0/1 | 1 | never (still there at the end) | - |" in rows
    assert "| crossplane | 5.0/9.0 / 5.0/9.0 | 5.0/9.0 / 5.0/9.0 | 2 (4) |" in rows


def test_the_controller_model_finds_the_namespace_its_pods_die_with() -> None:
    assert peers.namespace_path("/apis/apps/v1/namespaces/ns-a/deployments/d") == "/api/v1/namespaces/ns-a"
    assert peers.namespace_path("/api/v1/namespaces/ns-b/pods/p") == "/api/v1/namespaces/ns-b"
    with pytest.raises(ValueError, match="not a namespaced object's path"):
        peers.namespace_path("/apis/compute.example.org/v1/clusters/c")
