"""Timestamps as Kubernetes writes them.

A metav1.Time (creationTimestamp, deletionTimestamp, a condition's lastTransitionTime, an Event's
firstTimestamp) goes on the wire as RFC 3339 in UTC with whole seconds, `2026-03-02T09:14:51Z`
(k8s.io/apimachinery/pkg/apis/meta/v1/time.go, MarshalJSON: `t.UTC().AppendFormat(buf, time.RFC3339)`).
"""

from __future__ import annotations

from datetime import UTC, datetime


def format_rfc3339(t: float) -> str:
    """`t` (seconds since the epoch) as a metav1.Time: `2026-03-02T09:14:51Z`, the fraction dropped."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


__all__ = ["format_rfc3339"]
