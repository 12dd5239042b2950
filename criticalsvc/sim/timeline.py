"""What happened during a simulated teardown, in order: one event per API call an actor made.

An event is (virtual time, store sequence, actor, verb, object, outcome, reason). Actors record
their own calls, so a denial carries the gate's message as the client received it, and "gone"
says which call made an object disappear (a DELETE, the last finalizer's removal, the namespace
controller's finalize). `seq` is the store's resourceVersion after the call: several things happen
at the same virtual instant, and the resourceVersion orders them the way the API server did.

Retrying clients repeat the same denied call many times (50 ms, 100 ms, ... 60 s); the text
rendering folds such a run into its first line ("×12 until +63.2s") so the story stays readable,
while the JSON keeps every call. `to_picture` draws it as criticalsvc.picture's value: a bar per
object, from its first DELETE to when it was gone, with its refusals.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import attrs

from ..api import ObjectRef
from ..picture import Bar, Picture

# Outcomes actors record. "marked": deletionTimestamp set, finalizers pending; "deleted": gone at once;
# "gone": removed by this call (last finalizer dropped, namespace finalized).
MARKED, DELETED, GONE = "marked", "deleted", "gone"
DENIED, FAILED, NOT_FOUND, UNCHANGED = "denied", "failed", "not found", "unchanged"
REMOVED = "finalizer removed"
NOT_RUNNING = "not running"
STATUS = "status"

_WEBHOOK_PREFIX = re.compile(r'^admission webhook "[^"]+" denied the request: ')


@attrs.frozen
class Event:
    time: float  # virtual seconds since the timeline started
    seq: int  # the store's resourceVersion after the call: a total order of what the API server did
    actor: str
    verb: str
    ref: ObjectRef | None
    outcome: str
    reason: str = ""

    @property
    def object(self) -> str:
        return str(self.ref) if self.ref is not None else ""

    def to_dict(self) -> dict[str, Any]:
        obj = None if self.ref is None else {
            "group": self.ref.group_resource.group, "resource": self.ref.group_resource.resource,
            "namespace": self.ref.namespace, "name": self.ref.name}
        return {"time": round(self.time, 6), "seq": self.seq, "actor": self.actor, "verb": self.verb,
                "object": obj, "outcome": self.outcome, "reason": self.reason}


class Timeline:
    """An append-only list of events; `clock` is the engine's `now`, `seq` the store's resourceVersion."""

    def __init__(self, clock: Callable[[], float], *, seq: Callable[[], int] = lambda: 0,
                 start: float | None = None) -> None:
        self._clock = clock
        self._seq = seq
        self.start = clock() if start is None else start
        self.events: list[Event] = []

    def now(self) -> float:
        return self._clock() - self.start

    def record(self, actor: str, verb: str, ref: ObjectRef | None, outcome: str, reason: str = "") -> Event:
        event = Event(self.now(), self._seq(), actor, verb, ref, outcome, reason)
        self.events.append(event)
        return event

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)

    def of(self, ref: ObjectRef) -> list[Event]:
        return [e for e in self.events if e.ref == ref]

    def denials(self) -> list[Event]:
        return [e for e in self.events if e.outcome == DENIED]

    def to_json(self) -> list[dict[str, Any]]:
        return [e.to_dict() for e in self.events]


def gate_message(reason: str) -> str:
    """The gate's own words from an API error message: without the API server's webhook prefix."""
    return _WEBHOOK_PREFIX.sub("", reason)


def _fold(events: Iterable[Event]) -> list[tuple[Event, int, float]]:
    """Consecutive identical calls (same actor, verb, object, outcome, reason) become one line with a count."""
    out: list[tuple[Event, int, float]] = []
    last_of: dict[tuple[str, ObjectRef | None], int] = {}  # (actor, object) -> index in out of its latest line
    # A status a controller keeps rewriting (a CRD cleanup alternating InProgress / Check every minute)
    # folds into the line where it first appeared, even when other statuses came in between.
    statuses: dict[tuple[str, ObjectRef | None, str], int] = {}
    for e in events:
        key = (e.actor, e.ref)
        if e.outcome == STATUS:
            i = statuses.get((e.actor, e.ref, e.reason))
            if i is not None:
                first, n, _last = out[i]
                out[i] = (first, n + 1, e.time)
                continue
            statuses[(e.actor, e.ref, e.reason)] = len(out)
        else:
            i = last_of.get(key)
            if i is not None:
                first, n, _last = out[i]
                if (first.verb, first.outcome, first.reason) == (e.verb, e.outcome, e.reason):
                    out[i] = (first, n + 1, e.time)
                    continue
            last_of[key] = len(out)
        out.append((e, 1, e.time))
    return out


def _describe(e: Event, *, short: Callable[[ObjectRef], str]) -> tuple[str, str]:
    """(headline, detail) of one event: what was done to what and how it went; then why."""
    target = short(e.ref) if e.ref is not None else ""
    reason = gate_message(e.reason)
    if e.ref is not None:
        # The gate's message starts by naming the object, which the headline already did.
        reason = reason.removeprefix(f"{e.ref} may not be deleted yet: ")
    if e.outcome == STATUS:
        return f"{e.actor}: status of {target}", reason
    head = f"{e.actor}: {e.verb} {target}".rstrip()
    if e.outcome in (DENIED, FAILED):
        return f"{head} -> {e.outcome.upper()}", reason
    return f"{head} -> {e.outcome}", reason


def render_text(events: Iterable[Event], *, short: Callable[[ObjectRef], str] = str, width: int = 0,
                hide: Callable[[Event], bool] = lambda e: False) -> str:
    """The timeline, one event per entry: `+12.345s  actor: verb object -> outcome`, then its reason
    (inline when short, else indented below), folded and wrapped at `width` (0: no wrapping)."""
    folded = [f for f in _fold(events) if not hide(f[0])]
    if not folded:
        return "  (nothing happened)\n"
    lines: list[str] = []
    for e, n, last in folded:
        head, detail = _describe(e, short=short)
        if n > 1:
            head += f" [×{n}, last at +{last:.3f}s]"
        prefix = f"  +{e.time:9.3f}s  "
        indent = " " * (len(prefix) + 4)
        inline = f"{head} ({detail})" if detail and e.outcome not in (DENIED, FAILED, STATUS) else \
            f"{head}: {detail}" if detail else head
        if not width or len(prefix) + len(inline) <= width:
            lines.append(prefix + inline)
            continue
        lines.append(prefix + head + (":" if detail else ""))
        if detail:
            lines.extend(textwrap.wrap(detail, width=width, initial_indent=indent, subsequent_indent=indent,
                                       break_on_hyphens=False))
    return "\n".join(lines) + "\n"


def _deletes(e: Event) -> bool:
    # A client's DELETE, the namespace controller's deletecollection, CRD cleanup's "DELETE (no admission)".
    return e.verb.startswith("DELETE") or e.verb == "deletecollection"


def to_picture(events: Iterable[Event], *, order: Sequence[tuple[ObjectRef, float | None, float | None]],
               describe: Callable[[ObjectRef], str], phases: Mapping[ObjectRef, int], title: str) -> Picture:
    """The teardown as a picture (criticalsvc.picture): a bar per object of `order` ((object, marked, gone)
    in deletion order) from the first DELETE of it to when it was gone, its refusals, its plan phase."""
    events = list(events)
    first_delete: dict[ObjectRef, float] = {}
    refusals: dict[ObjectRef, list[float]] = {}
    for e in events:
        if e.ref is None:
            continue
        if _deletes(e):
            first_delete.setdefault(e.ref, e.time)
        if e.outcome == DENIED:
            refusals.setdefault(e.ref, []).append(e.time)
    end = max([e.time for e in events] + [t for _r, m, g in order for t in (m, g) if t is not None], default=0.0)
    bars = []
    for ref, marked, gone in order:
        known = [t for t in (first_delete.get(ref), marked, gone) if t is not None]
        bars.append(Bar(describe(ref), phases.get(ref), min(known, default=end), end if gone is None else gone,
                        marked=marked, refusals=tuple(refusals.get(ref, ())), gone=gone is not None))
    return Picture(title, tuple(bars))
