"""Timestamps as Kubernetes writes a metav1.Time."""

from criticalsvc.timestamps import format_rfc3339


def test_a_time_is_utc_whole_seconds_with_z():
    """A time becomes RFC 3339 in UTC with the fraction of a second dropped, as metav1.Time marshals it."""
    assert format_rfc3339(1772442891.9) == "2026-03-02T09:14:51Z"
    assert format_rfc3339(0) == "1970-01-01T00:00:00Z"
