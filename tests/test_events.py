"""Events for denied deletions: aggregated per denial, rate-limited overall."""

from criticalsvc.api import GroupResource, ObjectRef
from criticalsvc.events import EventRecorder

TARGET = ObjectRef(GroupResource("apps", "deployments"), "ns", "provider")


def test_repeated_denial_aggregates_into_one_event():
    """A retry loop on the same denial updates one Event's count instead of creating new ones."""
    rec = EventRecorder()
    events = [rec.denial(service="cs", service_uid="u", target=TARGET, message="m", now=100 + i) for i in range(50)]
    assert len({e["metadata"]["name"] for e in events}) == 1
    assert events[-1]["count"] == 50
    assert events[-1]["involvedObject"]["kind"] == "CriticalService"
    assert events[-1]["type"] == "Warning" and events[-1]["reason"] == "DeletionBlocked"


def test_many_distinct_denials_are_capped_by_the_bucket():
    """Distinct denials beyond the burst within a short time are dropped (None)."""
    rec = EventRecorder(burst=5, refill_seconds=10)
    targets = [ObjectRef(TARGET.group_resource, "ns", f"p{i}") for i in range(20)]
    made = [rec.denial(service="cs", service_uid="u", target=t, message="m", now=100.0) for t in targets]
    assert sum(e is not None for e in made) == 5
    later = rec.denial(service="cs", service_uid="u", target=ObjectRef(TARGET.group_resource, "ns", "late"),
                       message="m", now=120.0)
    assert later is not None  # two tokens refilled after 20 s


def test_denial_after_window_starts_a_new_event():
    """After the aggregation window a repeat creates a fresh Event with count 1."""
    rec = EventRecorder(window=60)
    first = rec.denial(service="cs", service_uid="u", target=TARGET, message="m", now=0)
    second = rec.denial(service="cs", service_uid="u", target=TARGET, message="m", now=61)
    assert first["metadata"]["name"] != second["metadata"]["name"] and second["count"] == 1


def test_a_recreated_critical_service_gets_its_own_event():
    """Deleted and re-created under the same name (a new uid): its denials start a new Event naming the
    new uid, rather than raising the count of the old object's Event (which `kubectl describe` of the
    new object would never show)."""
    rec = EventRecorder()
    old = rec.denial(service="cs", service_uid="old-uid", target=TARGET, message="m", now=100)
    again = rec.denial(service="cs", service_uid="old-uid", target=TARGET, message="m", now=101)
    new = rec.denial(service="cs", service_uid="new-uid", target=TARGET, message="m", now=102)
    assert again["metadata"]["name"] == old["metadata"]["name"] and again["count"] == 2  # control: same object
    assert new["metadata"]["name"] != old["metadata"]["name"]
    assert new["count"] == 1 and new["involvedObject"]["uid"] == "new-uid"
