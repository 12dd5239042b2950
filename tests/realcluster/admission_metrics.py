"""The API server's own count of its calls to the gate's webhooks, from kube-apiserver's /metrics.

A client counts only the DELETEs it sent; the API server also calls the gate for the garbage
collector's and the controllers' DELETEs, and it knows why a call failed. Two counters of the
validating dispatcher say it, per webhook (staging/src/k8s.io/apiserver/pkg/admission/metrics/metrics.go
at v1.37.2, https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/apiserver/pkg/admission/metrics/metrics.go#L195-L223):

    apiserver_admission_webhook_request_total{name,type,operation,code,rejected}
    apiserver_admission_webhook_rejection_count{name,type,operation,error_type,rejection_code}

The dispatcher (https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook/validating/dispatcher.go#L173-L196)
counts every call in request_total: an ALLOW as code 200, rejected="false"; a denial as the code the
webhook answered with, rejected="true", and once more in rejection_count with error_type="no_error";
a call that failed (no connection, TLS handshake refused, timeout, an HTTP error, an unreadable
answer) as rejected="true" with error_type="calling_webhook_error" - except a call cut short by its
request's cancelled context, which only request_total counts. So "failed calls" below is every
rejected call that was not the gate's own denial, which catches that case too.

Each kube-apiserver counts its own calls. With several behind a balancer, a client's connection reaches
one of them, so two scrapes through it could read two different API servers' counters; `scrape(plane)`
asks each API server directly and sums.
"""

from __future__ import annotations

import re
import time
from collections import Counter

import attrs

from .client import Client
from .controlplane import ControlPlane

REQUESTS = "apiserver_admission_webhook_request_total"
REJECTIONS = "apiserver_admission_webhook_rejection_count"
GATE_WEBHOOKS = ".gate.criticalsvc.io"  # every webhook of the install is named <what>.gate.criticalsvc.io

SAMPLE = re.compile(r"^(?P<metric>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<labels>[^}]*)\} (?P<value>\S+)")
LABEL = re.compile(r'(\w+)="([^"]*)"')

Sample = tuple[str, tuple[tuple[str, str], ...]]  # (metric, sorted labels)


def scrape(source: ControlPlane | Client, *, webhooks: str = GATE_WEBHOOKS) -> Counter[Sample]:
    """The two counters' samples for the gate's webhooks (those whose name ends with `webhooks`), now: summed
    over every API server of a control plane (each read as the admin, who may read /metrics), or those of
    the one API server a client reaches."""
    if isinstance(source, Client):
        response = source.request("GET", "/metrics")
        response.raise_for_status()
        return samples(response.text, webhooks=webhooks)
    total: Counter[Sample] = Counter()
    for index in range(source.apiservers):
        admin = Client(source.kubeconfig_for(index))
        try:
            total.update(scrape(admin, webhooks=webhooks))
        finally:
            admin.close()
    return total


def samples(metrics_text: str, *, webhooks: str = GATE_WEBHOOKS) -> Counter[Sample]:
    """The two counters' samples for the gate's webhooks (or those whose name ends with `webhooks`) in
    Prometheus text. Read line by line, not with
    prometheus_client's parser, which renames the sample of a counter not ending in _total
    (webhook_rejection_count becomes webhook_rejection_count_total)."""
    found: Counter[Sample] = Counter()
    for line in metrics_text.splitlines():
        match = SAMPLE.match(line)
        if match is None or match["metric"] not in (REQUESTS, REJECTIONS):
            continue
        labels = dict(LABEL.findall(match["labels"]))
        if labels.get("name", "").endswith(webhooks):
            found[(match["metric"], tuple(sorted(labels.items())))] += int(float(match["value"]))
    return found


def settled(source: ControlPlane | Client, *, webhooks: str = GATE_WEBHOOKS, timeout: float = 10.0,
            interval: float = 0.5) -> Counter[Sample]:
    """`scrape`, once two in a row agree (within `timeout`, else the last): kube-apiserver counts a denial in
    request_total and in rejection_count one after the other, so a scrape taken while a late call is answered (the
    gate's replay of a refused DELETE, say) may show it rejected and not yet denied: one "failed" call that is not
    (seen once in CI: 5 rejected, 4 denied, no error). A call that really failed stays counted when they settle."""
    deadline = time.monotonic() + timeout
    last = scrape(source, webhooks=webhooks)
    while time.monotonic() < deadline:
        time.sleep(interval)
        now = scrape(source, webhooks=webhooks)
        if now == last:
            return now
        last = now
    return last


@attrs.frozen
class AdmissionCalls:
    """The API server's calls to the gate's webhooks between two scrapes."""

    by_code: dict[str, int]  # request_total: calls per HTTP code (200 = allowed)
    denied: dict[str, int]  # rejection_count{error_type="no_error"}: the gate's denials per code
    errors: dict[str, int]  # rejection_count per other error_type (calling_webhook_error, ...)
    rejected: int  # request_total{rejected="true"}: denials and failed calls

    @classmethod
    def between(cls, before: Counter[Sample], after: Counter[Sample]) -> AdmissionCalls:
        by_code: Counter[str] = Counter()
        denied: Counter[str] = Counter()
        errors: Counter[str] = Counter()
        rejected = 0
        for (metric, labels), value in (after - before).items():
            fields = dict(labels)
            if metric == REQUESTS:
                by_code[fields["code"]] += value
                rejected += value if fields["rejected"] == "true" else 0
            elif fields["error_type"] == "no_error":
                denied[fields["rejection_code"]] += value
            else:
                errors[f"{fields['error_type']} {fields['rejection_code']}"] += value
        return cls(dict(by_code), dict(denied), dict(errors), rejected)

    @property
    def calls(self) -> int:
        return sum(self.by_code.values())

    @property
    def failed(self) -> int:
        """Rejected calls that were not the gate's answer (a calling error, counted or cancelled)."""
        return self.rejected - sum(self.denied.values())

    def __str__(self) -> str:
        return (f"API server: {self.calls} calls to the gate's webhooks (by code {self.by_code}), "
                f"{sum(self.denied.values())} denied by the gate {self.denied}, {self.failed} failed {self.errors}")
