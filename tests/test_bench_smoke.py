"""The over-HTTP scale benchmark (benchmarks/scale_http.py) at tiny sizes: its reviews and its answers are right.

The benchmark's figures are only worth reading if what it sends is what the API server sends and
what comes back is the gate's real decision; both are checked against independent references
(`parse_review`, and `decide()` in this process on the same generated cluster).
"""

from __future__ import annotations

import json
import random

import attrs
import orjson
import pytest

from benchmarks import scale, scale_http
from criticalsvc.admission import parse_review
from criticalsvc.decision import decide
from criticalsvc.snapshot import build_state


def test_review_bodies_decode_to_the_requests_they_were_built_from() -> None:
    """Every review of the benchmark's mix parses back to its request (only the user, the uid prefix and the
    propagation policy the namespace controller sends differ)."""
    reqs = scale.requests(3, 30, 60, random.Random(1))
    assert {r.group_resource.resource for r in reqs} >= {"deployments", "customresourcedefinitions", "namespaces",
                                                          "configmaps"}
    for r in reqs:
        parsed = parse_review(orjson.loads(scale_http.review_body(r, uid_prefix="warm-")))
        assert parsed == attrs.evolve(r, uid="warm-" + r.uid, username=str(scale_http.USER["username"]),
                                      propagation_policy="Background")


@pytest.mark.e2e
def test_tiny_run_answers_every_review_as_decide_does(capsys: pytest.CaptureFixture[str]) -> None:
    """A tiny two-sweep run gets a 200 for every review and exactly as many denials as decide() gives in-process."""
    decisions, seed = 24, 3
    code = scale_http.main(["--services", "2,3", "--crs-per-service", "2", "--objects-services", "2",
                            "--objects", "150,300", "--decisions", str(decisions), "--rounds", "3",
                            "--seed", str(seed), "--json"])
    section = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and section["errors"] == 0
    rows = section["servicesSweep"] + section["objectsSweep"]
    assert [r["objects"] for r in section["objectsSweep"]] == [150, 300]
    base = len(scale.cluster(2, 4))
    for row, filler in zip(rows, [0, 0, 150 - base, 300 - base], strict=True):
        state = build_state(scale.cluster(row["services"], row["crs"], filler))
        expected = sum(not decide(r, state).allowed
                       for r in scale.requests(row["services"], row["crs"], decisions, random.Random(seed)))
        assert row["requests"] == decisions
        assert row["denied"] == expected > 0
        assert row["serverRequests"] == decisions  # the warm-up reviews' log lines were told apart
