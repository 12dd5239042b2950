"""The gate's cost on a real control plane: DELETE latency through kube-apiserver, with and without it.

    python -m benchmarks realcluster [--objects 100] [--rounds 4] [--json]

Starts its own control plane (tests/realcluster: etcd, kube-apiserver, kube-controller-manager built
from the Kubernetes Go modules; skipped with the reason when they cannot be built) with the gate
installed as a user installs it, then measures three things:

1. DELETE latency, gate vs bare. The same kind of object (a Deployment with 0 replicas: a type the
   webhook routes, that nothing protects, so the gate answers ALLOW, its most common answer) is
   created `--objects` at a time and deleted one by one by a sequential client, in `--rounds`
   rounds that alternate "gate registered" and "ValidatingWebhookConfiguration removed", so that
   outside load lands on both alike. Reported: p50/p99 per mode over all rounds and their ratio.
2. The API server's own view: `apiserver_admission_webhook_admission_duration_seconds` for the
   gate's webhooks (count, mean, and p50/p99 estimated from the histogram buckets as Prometheus'
   histogram_quantile does), read from kube-apiserver's /metrics.
3. The reference story's teardown wall time: applied, then deleted all at once by the
   repeating client (every refused DELETE re-sent, 0.5 s between passes) with the test finalizer controller,
   from the first DELETE until every object is gone; plus how many DELETEs the gate refused.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WEBHOOK_CONFIGURATION = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/criticalsvc"
DURATION_METRIC = "apiserver_admission_webhook_admission_duration_seconds"


def _quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def histogram_quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """Prometheus' histogram_quantile over cumulative (upper bound, count) buckets: linear within a bucket."""
    buckets = sorted(buckets)
    total = buckets[-1][1]
    if total == 0:
        return float("nan")
    rank = q * total
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if upper == float("inf"):
                return lower
            return lower + (upper - lower) * ((rank - below) / (count - below) if count > below else 0)
        lower, below = upper, count
    return lower


def webhook_durations(metrics_text: str) -> dict[str, Any]:
    """Per webhook name: count, mean and estimated p50/p99 (ms) of the API server's admission calls."""
    per: dict[str, dict[str, Any]] = {}
    pattern = re.compile(rf'^{DURATION_METRIC}_(bucket|sum|count)\{{([^}}]*)\}} (\S+)$')
    for line in metrics_text.splitlines():
        match = pattern.match(line)
        if not match:
            continue
        kind, labels, value = match.groups()
        fields = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if not fields.get("name", "").endswith("gate.criticalsvc.io"):
            continue
        entry = per.setdefault(fields["name"], {"buckets": {}, "sum": 0.0, "count": 0.0})
        if kind == "bucket":
            upper = float("inf") if fields["le"] == "+Inf" else float(fields["le"])
            entry["buckets"][upper] = entry["buckets"].get(upper, 0.0) + float(value)
        else:
            entry[kind] += float(value)
    out = {}
    for name, entry in sorted(per.items()):
        buckets = list(entry["buckets"].items())
        out[name] = {"calls": int(entry["count"]),
                     "meanMs": round(1000 * entry["sum"] / entry["count"], 2) if entry["count"] else None,
                     "p50Ms": round(1000 * histogram_quantile(buckets, 0.5), 2),
                     "p99Ms": round(1000 * histogram_quantile(buckets, 0.99), 2)}
    return out


def _deployment(name: str) -> dict[str, Any]:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels},
            "spec": {"replicas": 0, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "c", "image": "registry.example/none:1"}]}}}}


def _delete_round(client: Any, namespace: str, count: int, tag: str) -> list[float]:
    base = f"/apis/apps/v1/namespaces/{namespace}/deployments"
    for i in range(count):
        response = client.create(base, _deployment(f"{tag}-{i}"))
        assert response.status_code == 201, response.text
    samples = []
    for i in range(count):
        started = time.perf_counter()
        response = client.delete(f"{base}/{tag}-{i}")
        samples.append(time.perf_counter() - started)
        assert response.status_code == 200, response.text
    return samples


def _set_gate(cluster: Any, saved: dict[str, Any], *, registered: bool, probe: str) -> None:
    """Register or remove the webhook configuration; wait until the API server acts on the change."""
    from tests.realcluster.teardown import wait_for

    client = cluster.admin
    if client.exists(WEBHOOK_CONFIGURATION) == registered:
        pass
    elif registered:
        body = {k: v for k, v in saved.items() if k != "status"}
        body["metadata"] = {"name": saved["metadata"]["name"], "labels": saved["metadata"].get("labels", {})}
        assert client.create("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
                             body).status_code == 201
    else:
        assert client.delete(WEBHOOK_CONFIGURATION).status_code == 200
    want = 403 if registered else 200  # the probe is a protected Deployment: refused only with the gate
    wait_for(lambda: client.delete(probe, params={"dryRun": "All"}).status_code == want, timeout=60,
             what=f"the API server to {'call' if registered else 'stop calling'} the gate")


def run(objects: int, rounds: int) -> dict[str, Any]:
    from tests.realcluster import build
    from tests.realcluster.cluster import real_cluster
    from tests.realcluster.teardown import FinalizerController, RepeatingDeleter, Story, apply_story

    reason = build.missing_toolchain() if build.cached(build.selected_minor()) is None else None
    if reason is not None:
        return {"skipped": reason}
    binaries = build.ensure_built(build.selected_minor())
    with tempfile.TemporaryDirectory(prefix="bench-realcluster-") as tmp, \
            real_cluster(binaries, Path(tmp)) as cluster:
        client = cluster.admin
        # A protected provider to probe whether the API server calls the gate, and the measured namespace.
        probe_story = Story.make("probe")
        apply_story(cluster.kubectl, client, probe_story)
        assert cluster.kubectl("create", "namespace", "bench").returncode == 0
        saved = client.get(WEBHOOK_CONFIGURATION)
        assert saved is not None
        samples: dict[str, list[float]] = {"gate": [], "bare": []}
        for r in range(rounds):
            for mode in (("gate", "bare") if r % 2 == 0 else ("bare", "gate")):
                _set_gate(cluster, saved, registered=mode == "gate", probe=probe_story.deployment_path)
                samples[mode] += _delete_round(client, "bench", objects, f"{mode}-{r}")
        _set_gate(cluster, saved, registered=True, probe=probe_story.deployment_path)
        metrics = client.request("GET", "/metrics").text
        latency = {mode: {"p50Ms": round(1000 * statistics.median(s), 2), "p99Ms": round(1000 * _quantile(s, 0.99), 2),
                          "deletes": len(s)} for mode, s in samples.items()}
        latency["ratio"] = {"p50": round(latency["gate"]["p50Ms"] / latency["bare"]["p50Ms"], 2),
                            "p99": round(latency["gate"]["p99Ms"] / latency["bare"]["p99Ms"], 2)}

        story = Story.make("bench")
        apply_story(cluster.kubectl, client, story)
        controller = FinalizerController(client, deployment_path=story.deployment_path,
                                         crs_path=f"/apis/{story.group}/v1/coolresources", finalizer=story.finalizer)
        controller.start()
        deleter = RepeatingDeleter(client, story.paths())
        started = time.perf_counter()
        finished = deleter.run(timeout=180)
        wall = time.perf_counter() - started
        controller.stop()
        return {"kubernetes": binaries.kubernetes_version, "deleteLatency": latency,
                "apiserverWebhookDuration": webhook_durations(metrics),
                "referenceStoryTeardown": {"completed": finished, "wallSeconds": round(wall, 2),
                                           "deletesSent": len(deleter.attempts),
                                           "refusedByGate": len(deleter.refused()),
                                           "retryIntervalSeconds": deleter.interval}}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks realcluster", description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=100, help="Deployments per round (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per mode, alternating (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line")
    args = parser.parse_args(argv)
    result = run(args.objects, args.rounds)
    if args.json:
        print(json.dumps(result))
    else:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
