"""The soak run (benchmarks/soak.py): the gate under a fixed rate, zero errors, flat memory.

The CI profile soaks for 6 s at 100 requests/s. Its RSS bound is 20 %, not the issue's 5 %: in a
6 s run the baseline window (1.2-2.4 s in) still sees the allocator and the connection pool warming
up - one more TLS connection opened late costs the gate ~290 KiB, 0.4 % of its ~66 MiB, and a
loaded CI machine makes the client open several - so a short run's growth is mostly warm-up, not a
leak. The long profile runs with the real 5 % bound: CRITICALSVC_SOAK_SECONDS=600 pytest
tests/test_soak.py (rate: CRITICALSVC_SOAK_RATE, default 200).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from benchmarks import soak
from benchmarks.latency import ROOT, _stop, _wait_ports

LONG_SECONDS = float(os.environ.get("CRITICALSVC_SOAK_SECONDS", "0") or 0)
CI_RSS_BOUND = 0.20


@pytest.fixture(scope="module")
def mix() -> list[soak.Case]:
    return soak.cases(20, 2000)


def _case(mix: list[soak.Case], name: str) -> soak.Case:
    return next(c for c in mix if c.name == name)


def _answer(uid: str, allowed: bool, code: int | None = None) -> bytes:
    response: dict[str, object] = {"uid": uid, "allowed": allowed}
    if code is not None:
        response["status"] = {"code": code, "reason": "Forbidden", "message": "still needed"}
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}).encode()


def _check_run(section: dict[str, object], *, rate: float, duration: float, rss_bound: float) -> None:
    assert section["errorCount"] == 0, section["firstErrors"]
    assert section["requests"] == section["answered"] == round(rate * duration)
    assert 0 < section["protectedRequests"] == section["protectedDenied"]
    by_case = section["byCase"]
    assert isinstance(by_case, dict)
    assert all(counts["requests"] == counts["ok"] > 0 for counts in by_case.values()), by_case
    growth = section["rssGrowth"]
    assert isinstance(growth, float) and growth < rss_bound, section


# --- judging answers (no server) ------------------------------------------------------------------
def test_wrong_allow_of_a_protected_delete_is_an_error(mix):
    """An allowed: true answer to a protected provider DELETE is counted as a wrongAllow error."""
    case = _case(mix, "provider-delete")
    assert soak.classify(case, 200, _answer("u1", False, 403), "u1") is None
    assert soak.classify(case, 200, _answer("u1", True), "u1") == soak.WRONG_ALLOW
    tally = soak.Tally()
    tally.record(case, soak.classify(case, 200, _answer("u1", True), "u1"), denied=False)
    assert tally.errors == {soak.WRONG_ALLOW: 1}


@pytest.mark.parametrize(("name", "status", "body", "uid", "error"), [
    ("configmap-delete", 200, _answer("u1", False, 403), "u1", soak.WRONG_DENY),
    ("configmap-delete", 200, _answer("u2", True), "u1", soak.BAD_RESPONSE),
    ("provider-delete", 200, _answer("u1", False), "u1", soak.BAD_RESPONSE),
    ("provider-delete", 200, b"{not json", "u1", soak.BAD_RESPONSE),
    ("provider-delete", 503, b'{"error": "not ready"}', "u1", soak.SERVER_ERROR),
    ("provider-delete", 400, b'{"error": "request.uid: required"}', "u1", soak.UNEXPECTED_STATUS),
    ("malformed-array", 200, _answer("u1", True), "u1", soak.UNEXPECTED_STATUS),
    ("malformed-array", 400, b"{}", "u1", soak.BAD_RESPONSE),
])
def test_answers_the_api_server_would_not_accept_are_errors(mix, name, status, body, uid, error):
    """A false deny, a uid mismatch, a deny without a 403, garbage, a 5xx or a 400 without a reason is an error."""
    assert soak.classify(_case(mix, name), status, body, uid) == error


def test_malformed_bodies_are_answered_with_a_reason_not_counted_as_errors(mix):
    """A 400 naming what is wrong is the expected answer to a malformed review."""
    case = _case(mix, "malformed-truncated")
    assert soak.classify(case, 400, b'{"error": "body: not valid JSON: unexpected end of data"}', "u1") is None


def test_rss_growth_skips_warm_up_and_compares_medians():
    """Growth compares the median of the second fifth with the last fifth, ignoring the warm-up and outliers."""
    warm_up = [40, 60, 80, 95]  # the first fifth of 20 samples
    flat = [100] * 16
    flat[1] = flat[14] = 500  # one sample in each window taken mid-collection
    assert soak.rss_growth(warm_up + flat) == (100.0, 100.0, 0.0)
    assert soak.rss_growth(warm_up + [100] * 12 + [110] * 4) == (100.0, 110.0, pytest.approx(0.10))
    assert soak.rss_growth([100, 200]) is None


def test_rss_slope_fits_the_last_half_hour_in_percent_per_10_minutes():
    # One sample a minute: 30 flat minutes, then +1,000 KiB (of ~100 MiB) every 10 minutes for 30 minutes.
    flat = [102_400] * 30
    rising = [102_400 + 100 * m for m in range(31)]
    slope = soak.rss_slope(flat + rising, 60.0)
    mean = sum(rising) / len(rising)
    assert slope == pytest.approx(1000 / mean * 100, rel=1e-9)  # only the last 30 minutes count
    assert soak.rss_slope(flat + flat, 60.0) == 0.0
    falling = soak.rss_slope(rising[::-1], 60.0)
    assert falling is not None and falling < 0
    assert soak.rss_slope([100, 101], 60.0) is None


def test_mix_keeps_its_proportions_in_every_block(mix):
    """Every stretch of sum(weights) requests carries each case exactly `weight` times."""
    block = sum(c.weight for c in mix)
    order = soak.schedule(mix, block * 3, seed=1)
    for b in range(3):
        chunk = order[b * block:(b + 1) * block]
        assert [chunk.count(i) for i in range(len(mix))] == [c.weight for c in mix]


# --- against real processes -----------------------------------------------------------------------
@pytest.mark.e2e
def test_allow_all_endpoint_fails_the_soak(mix, tmp_path):
    """Driven at an allow-all endpoint, every protected DELETE is a wrongAllow and every malformed body an error."""
    subprocess.run([sys.executable, "-m", "criticalsvc", "certs", "--out", str(tmp_path), "--san", "127.0.0.1"],
                   check=True, capture_output=True)
    bare = subprocess.Popen([sys.executable, "-m", "benchmarks", "latency", "--serve-bare", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    try:
        port = _wait_ports(tmp_path / "bare-ports.json", bare, "the bare endpoint")["listen"]
        tally = asyncio.run(soak.drive(url=f"https://127.0.0.1:{port}/validate", ca_file=str(tmp_path / "ca.crt"),
                                       mix=mix, rate=100, duration=1.0, pid=bare.pid, sample_interval=0.25))
    finally:
        _stop(bare)
    protected = sum(tally.by_case[c.name]["requests"] for c in mix if c.protected)
    malformed = sum(tally.by_case[c.name]["requests"] for c in mix if c.status == 400)
    assert tally.errors[soak.WRONG_ALLOW] == protected > 0
    assert sum(tally.errors.values()) == protected + malformed
    assert all(tally.by_case[c.name]["ok"] == tally.by_case[c.name]["requests"] for c in mix if c.allowed)


@pytest.mark.e2e
def test_short_soak_has_no_errors_and_flat_memory():
    """Six seconds at 100 requests/s: every answer right, every protected DELETE denied, RSS within 20 %."""
    section = soak.soak(duration=6.0, rate=100.0, sample_interval=0.25, connections=8, churn_rounds=0)
    _check_run(section, rate=100.0, duration=6.0, rss_bound=CI_RSS_BOUND)
    assert section["goal"] == "errors == 0, rssGrowth < 5%"


@pytest.mark.e2e
def test_connections_closed_by_the_client_do_not_hold_memory():
    """Keep-alive connections the client closes while idle give their memory back (< 32 KiB kept per connection)."""
    mix = soak.cases(20, 2000)
    with soak.running_gate() as gate:
        result = asyncio.run(soak.churn(url=gate.url, ca_file=gate.ca_file, body=mix[0].bodies[0],
                                        pid=gate.process.pid))
        gate.check_alive("the connection churn")
    assert result["churnStatuses"] == {"200": soak.CHURN_CONNECTIONS * soak.CHURN_ROUNDS}
    assert result["churnRetainedKiBPerConnection"] < soak.CHURN_RETAINED_GOAL_KIB, result


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.skipif(not LONG_SECONDS, reason="long profile: set CRITICALSVC_SOAK_SECONDS (e.g. 600)")
def test_long_soak_meets_the_goals():
    """The long profile (CRITICALSVC_SOAK_SECONDS) meets the issue's goals: zero errors, RSS growth under 5 %."""
    rate = float(os.environ.get("CRITICALSVC_SOAK_RATE", "200"))
    section = soak.soak(duration=LONG_SECONDS, rate=rate)
    _check_run(section, rate=rate, duration=LONG_SECONDS, rss_bound=soak.RSS_GROWTH_GOAL)
    assert section["goalMet"] is True
