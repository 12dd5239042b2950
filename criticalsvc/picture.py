"""A picture of a teardown: one bar per object over time, refusals marked, grouped by phase.

The value (`Picture`, a tuple of `Bar`s) comes from a simulated teardown (criticalsvc.sim.timeline:
`to_picture`, seconds of virtual time) or from a plan (`plan_picture`: phase N drawn as step N). It is
drawn two ways, both plain text, so nothing but Python is needed:

- `to_gantt`: a Mermaid Gantt chart (https://mermaid.js.org/syntax/gantt.html), which GitHub renders in
  a ```mermaid block. One section per phase, one task per object from its first DELETE to the moment
  it left the API; `crit` marks an object the gate refused at least once, `milestone` one deleted at
  once, `active` one still there at the end.
- `to_svg`: a standalone SVG, rows in deletion order, each with its phase; the time the gate held the
  DELETE back is drawn red, each refusal a tick, what is still there grey.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from xml.sax.saxutils import escape, quoteattr

import attrs

SECONDS, PHASES = "s", "phase"


@attrs.frozen
class Bar:
    """One object of the teardown. Times in the picture's unit; `end` is when it was gone (`gone`), or
    the end of the picture when it is still there."""

    label: str  # `Kind namespace/name`
    phase: int | None  # the plan's phase (1 goes first); None: not in the plan
    start: float  # the first DELETE of it (or of its namespace's content), else when it was marked
    end: float
    marked: float | None = None  # deletionTimestamp set: the DELETE got through (before it: refused)
    refusals: tuple[float, ...] = ()  # each DELETE of it the gate refused
    gone: bool = True

    @property
    def refused(self) -> bool:
        return bool(self.refusals)


@attrs.frozen
class Picture:
    title: str
    bars: tuple[Bar, ...]  # in deletion order
    unit: str = SECONDS  # SECONDS, or PHASES: bar N spans [N, N+1)

    @property
    def end(self) -> float:
        return max((b.end for b in self.bars), default=0.0)

    def sections(self) -> list[tuple[str, list[Bar]]]:
        """(title, bars) per phase in phase order, each in deletion order; objects outside the plan last."""
        phases = sorted({b.phase for b in self.bars}, key=lambda p: (p is None, p or 0))
        return [(phase_title(p), [b for b in self.bars if b.phase == p]) for p in phases]


def phase_title(phase: int | None) -> str:
    return f"phase {phase}" if phase is not None else "not in the plan"


def plan_picture(phases: Sequence[Sequence[str]], *, title: str) -> Picture:
    """A plan as a picture: phase N's objects side by side at step N (the order, not durations)."""
    return Picture(title, tuple(Bar(label, i, float(i), float(i + 1))
                                for i, labels in enumerate(phases, start=1) for label in labels), PHASES)


# --- Mermaid ------------------------------------------------------------------------------------------
# Mermaid's Gantt lexer ends a task's text at ':' (its data follows), '#' (a comment) and ';' (a
# statement end): `[^#:\n;]+ return 'taskTxt'` in
# https://github.com/mermaid-js/mermaid/blob/develop/packages/mermaid/src/diagrams/gantt/parser/gantt.jison
# Entities (`#58;`) cannot help, they start with '#'. Names that contain them (RBAC names may: a
# ClusterRole `system:controller:x`) are drawn with look-alikes that NFC normalization leaves alone.
_MERMAID_LOOKALIKES = str.maketrans({":": "\ua789", "#": "\uff03", ";": "\uff1b"})
# The same lexer is case-insensitive and tries keywords before task text, so a task whose text starts
# with one (a Kind `Click`, a name `section-a`) would be read as that statement. A zero-width space in
# front is not whitespace to JavaScript's \s, so the keyword no longer matches at the start.
_MERMAID_KEYWORD = re.compile(r"(?i)(gantt|dateformat\s|inclusiveenddates|topaxis|axisformat\s|tickinterval\s|"
                              r"includes\s|excludes\s|todaymarker\s|weekday\s|title\s|accdescription\s|section\s|"
                              r"click\s|call\s|href\s|acctitle\s*:|accdescr\s*[:{]|\d{4}-\d\d-\d\d|%)")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def mermaid_text(text: str) -> str:
    """`text` as Mermaid Gantt task or section text: one line, none of its separators."""
    text = _CONTROL.sub(" ", text).translate(_MERMAID_LOOKALIKES).strip()
    return "\u200b" + text if _MERMAID_KEYWORD.match(text) else text


def _nice_step(span: float, *, ticks: int = 8) -> float:
    """A tick step of 1, 2 or 5 times a power of ten giving at most about `ticks` ticks over `span`."""
    raw = max(span, 1e-3) / ticks
    power = 10.0 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


# Times are written as a time of day, `dateFormat HH:mm:ss.SSS` from midnight: Mermaid parses them and
# formats the axis in the reader's time zone alike, so the axis reads right everywhere (a Unix timestamp,
# `dateFormat x`, would be shown shifted by the reader's offset). A day is far more than a simulated
# teardown runs: a stalled one stops after criticalsvc.sim.cluster.STALL_WINDOW.
_DAY_MS = 24 * 3600 * 1000


def _clock(ms: int) -> str:
    ms = min(ms, _DAY_MS - 1)
    return f"{ms // 3600000:02d}:{ms // 60000 % 60:02d}:{ms // 1000 % 60:02d}.{ms % 1000:03d}"


def _mermaid_axis(picture: Picture) -> tuple[str, str]:
    """(tickInterval, axisFormat), d3 time formats (https://d3js.org/d3-time-format)."""
    if picture.unit == PHASES:
        return "1second", "phase %-S"  # bar N starts at N s, so the tick at N s names phase N
    step_ms = max(1, round(_nice_step(picture.end) * 1000))
    if step_ms % 60000 == 0:
        return f"{step_ms // 60000}minute", "%-H:%M:%S"
    if step_ms % 1000 == 0:
        return f"{step_ms // 1000}second", "%-M:%S" if picture.end >= 60 else "%-S s"
    return f"{step_ms}millisecond", "%-S.%L s"


def to_gantt(picture: Picture) -> str:
    def ms(t: float) -> int:
        return round(t * 1000)

    tick, axis = _mermaid_axis(picture)
    lines = ["gantt", f"    title {mermaid_text(picture.title)}", "    dateFormat HH:mm:ss.SSS",
             f"    axisFormat {axis}", f"    tickInterval {tick}", "    todayMarker off"]
    for title, bars in picture.sections():
        lines.append(f"    section {mermaid_text(title)}")
        for b in bars:
            tags = [*(["crit"] if b.refused else []), *(["active"] if not b.gone else []),
                    *(["milestone"] if ms(b.end) <= ms(b.start) else [])]
            lines.append(f"    {mermaid_text(_task_label(b, picture.unit))} :{''.join(t + ', ' for t in tags)}"
                         f"{_clock(ms(b.start))}, {_clock(ms(b.end))}")
    return "\n".join(lines) + "\n"


def _task_label(b: Bar, unit: str) -> str:
    notes = []
    if b.refusals:
        notes.append(f"refused {len(b.refusals)}×")
    if not b.gone:
        notes.append("still here")
    return f"{b.label} — {', '.join(notes)}" if notes and unit == SECONDS else b.label


# --- SVG ----------------------------------------------------------------------------------------------
ROW, BAR, CHAR = 22, 12, 7  # px: a row, a bar's height, a character of the 12 px label font (an estimate)
PLOT = 640  # px: the time axis
LABEL_CHARS = 64  # longer labels are cut (the tooltip keeps the whole name)
COLORS = {"bar": "#4c78a8", "held": "#e45756", "refusal": "#b00020", "stuck": "#9d9d9d"}
_XML_INVALID = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")  # not allowed in XML 1.0 at all


def _xml(text: str) -> str:
    return escape(_XML_INVALID.sub("\ufffd", text))


def _attr(text: str) -> str:
    return quoteattr(_XML_INVALID.sub("\ufffd", text))


def _seconds(t: float) -> str:
    return f"+{t:.3f}s"


def _tooltip(b: Bar, unit: str) -> str:
    if unit == PHASES:
        return f"{b.label}: {phase_title(b.phase)}"
    parts = [f"{b.label}: first DELETE {_seconds(b.start)}"]
    if b.refusals:
        parts.append(f"refused {len(b.refusals)}× until {_seconds(b.refusals[-1])}")
    if b.marked is not None:
        parts.append(f"marked {_seconds(b.marked)}")
    parts.append(f"gone {_seconds(b.end)}" if b.gone else "still here")
    return ", ".join(parts)


def _ticks(picture: Picture) -> Iterable[tuple[float, float, str]]:
    """(where the grid line goes, where its label goes, the label) along the time axis."""
    if picture.unit == PHASES:  # a line where a phase begins, its name over the middle
        for i in range(1, len(picture.sections()) + 1):
            yield i, i + 0.5, f"phase {i}"
        return
    step = _nice_step(picture.end)
    for k in range(math.floor(picture.end / step + 1e-9) + 1):
        yield k * step, k * step, f"{k * step:g} s"


def to_svg(picture: Picture) -> str:
    t0 = 1.0 if picture.unit == PHASES else 0.0
    span = max(picture.end - t0, 1e-3)
    label_w = min(max((len(b.label) for b in picture.bars), default=10), LABEL_CHARS) * CHAR + 16
    phase_w = (len("not in the plan") if any(b.phase is None for b in picture.bars) else len("phase 00")) * CHAR
    x0 = label_w + phase_w
    top = 56
    width = x0 + PLOT + 24
    height = top + ROW * len(picture.bars) + 48

    def x(t: float) -> float:
        return round(x0 + (t - t0) / span * PLOT, 2)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
           f"<title>{_xml(picture.title)}</title>",
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="8" y="20" font-size="14" font-weight="bold">{_xml(picture.title)}</text>']
    for t, at, text in _ticks(picture):  # the axis: a grid line and a label per tick
        out.append(f'<line class="tick" x1="{x(t)}" y1="{top - 6}" x2="{x(t)}" y2="{height - 40}" stroke="#ddd"/>')
        out.append(f'<text x="{x(at)}" y="{top - 10}" text-anchor="middle" fill="#555">{_xml(text)}</text>')
    for i, b in enumerate(picture.bars):
        y = top + i * ROW
        mid = y + ROW / 2
        label = b.label if len(b.label) <= LABEL_CHARS else b.label[:LABEL_CHARS - 1] + "…"
        out.append(f'<g class="object" data-phase="{b.phase or ""}">')
        out.append(f"<title>{_xml(_tooltip(b, picture.unit))}</title>")
        if b.phase is not None and b.phase % 2 == 0:  # alternate phases shaded, so a phase reads as a band
            out.append(f'<rect x="0" y="{y}" width="{width}" height="{ROW}" fill="#f4f6fa"/>')
        out.append(f'<text class="label" x="8" y="{mid + 4}">{_xml(label)}</text>')
        out.append(f'<text class="phase" x="{label_w}" y="{mid + 4}" fill="#555">{_xml(phase_title(b.phase))}</text>')
        start, end = x(b.start), x(b.end)
        fill = COLORS["bar"] if b.gone else COLORS["stuck"]
        out.append(f'<rect class="bar{"" if b.gone else " stuck"}{" refused" if b.refused else ""}" x="{start}" '
                   f'y="{mid - BAR / 2}" width="{max(end - start, 3):.2f}" height="{BAR}" rx="2" fill="{fill}"/>')
        if b.refused:  # the time the gate held the DELETE back: from the first DELETE to the one that got through
            held_end = x(b.marked) if b.marked is not None else end
            out.append(f'<rect class="held" x="{start}" y="{mid - BAR / 2}" width="{max(held_end - start, 1):.2f}" '
                       f'height="{BAR}" rx="2" fill="{COLORS["held"]}" fill-opacity="0.45"/>')
        for t in sorted({x(r) for r in b.refusals}):
            out.append(f'<line class="refusal" x1="{t}" y1="{mid - BAR / 2 - 2}" x2="{t}" y2="{mid + BAR / 2 + 2}" '
                       f'stroke="{COLORS["refusal"]}" stroke-width="1.5"/>')
        out.append("</g>")
    legend_y = height - 18
    out.append(f'<g class="legend" transform="translate(8,{legend_y})">')
    entries = [("bar", "deleting → gone"), ("held", "refused by the gate until the DELETE got through"),
               ("stuck", "still here at the end")] if picture.unit == SECONDS else \
        [("bar", "delete everything at once: phase N goes once every earlier phase is gone")]
    lx = 0
    for key, text in entries:
        out.append(f'<rect x="{lx}" y="-10" width="14" height="10" fill="{COLORS[key]}"/>')
        out.append(f'<text x="{lx + 18}" y="0">{_xml(text)}</text>')
        lx += 18 + len(text) * CHAR + 16
    out.append("</g>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


__all__ = ["PHASES", "SECONDS", "Bar", "Picture", "mermaid_text", "phase_title", "plan_picture", "to_gantt",
           "to_svg"]
