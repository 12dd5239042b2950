"""`simulate` and `plan` draw the teardown: `-o gantt` (a Mermaid Gantt chart) and `-o svg` (criticalsvc.picture).

Mermaid is JavaScript and not run here; its Gantt grammar is, in the few rules that matter, small enough to
check line by line (`gantt_tasks` below follows the lexer of
https://github.com/mermaid-js/mermaid/blob/develop/packages/mermaid/src/diagrams/gantt/parser/gantt.jison).
"""

from __future__ import annotations

import re
import shlex
import xml.etree.ElementTree as ET
from pathlib import Path

import attrs
import pytest

from criticalsvc.cli import main
from criticalsvc.picture import Bar, Picture, to_gantt, to_svg

ROOT = Path(__file__).resolve().parents[1]
STORY = "api/examples/reference-story.yaml"
SVG = "{http://www.w3.org/2000/svg}"
CRD = "CustomResourceDefinition coolresources.my.crd.group"
DEPLOYMENT = "Deployment finalizer-namespace/finalizer-deployment"
SERVICE = "CriticalService for-finalizer-deployment"
STORY_ORDER = ["CoolResource cool-apps/alpha", "CoolResource cool-apps/beta", "CoolResource cool-apps/gamma", CRD,
               "Namespace cool-apps", DEPLOYMENT, "Namespace finalizer-namespace", SERVICE]

# Mermaid's lexer is case-insensitive and, at the start of a line, tries its keywords before task text:
# a line a keyword matches is that statement, and must end where the keyword's token ends.
KEYWORD = re.compile(r"(?i)\s*(gantt|dateformat\s[^#\n;]+|axisformat\s[^#\n;]+|tickinterval\s[^#\n;]+|"
                     r"todaymarker\s[^\n;]+|title\s[^#\n;]+|section\s[^#:\n;]+|inclusiveenddates|topaxis|"
                     r"includes\s|excludes\s|weekday\s|accdescription\s|click\s|call\s|href\s|\d{4}-\d\d-\d\d)")
TICK = re.compile(r"^    tickInterval [1-9]\d*(millisecond|second|minute|hour)$")
TASK = re.compile(r"^\s*([^#:\n;]+):([^#\n;]+)$")
TAGS = {"active", "done", "crit", "milestone"}


@attrs.frozen
class Task:
    section: str
    text: str
    tags: frozenset[str]
    start: float
    end: float


def _seconds(clock: str) -> float:
    h, m, s = clock.strip().split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


def gantt_tasks(text: str) -> list[Task]:
    """The tasks of a Mermaid Gantt chart, failing on any line Mermaid's lexer would read otherwise."""
    lines = text.splitlines()
    assert lines[0] == "gantt"
    assert "    dateFormat HH:mm:ss.SSS" in lines
    tasks, section = [], ""
    for line in lines:
        if m := KEYWORD.match(line):
            assert m.end() == len(line), f"{line!r} is read as a {m[1].split()[0]!r} statement"
            keyword = m[1].split()[0].lower()
            assert keyword != "tickinterval" or TICK.match(line), line
            assert keyword not in ("click", "call", "href", "includes", "excludes"), line
            if keyword == "section":
                section = m[1].split(None, 1)[1].strip()
            continue
        m = TASK.match(line)
        assert m, f"not a Gantt statement: {line!r}"
        data = [d.strip() for d in m[2].split(",")]
        tags = frozenset(d for d in data if d in TAGS)
        start, end = (d for d in data if d not in TAGS)  # exactly a start and an end, no id
        tasks.append(Task(section, m[1].strip(), tags, _seconds(start), _seconds(end)))
    return tasks


def _run(argv: list[str], capsys: pytest.CaptureFixture[str], *, code: int = 0) -> str:
    assert main(argv) == code
    return capsys.readouterr().out


def svg_bars(text: str) -> list[tuple[str, ET.Element, float, float]]:
    """(label, the object's group, where its bar starts, where it ends) per row, top to bottom."""
    root = ET.fromstring(text)
    assert root.tag == f"{SVG}svg"
    rows = []
    for g in root.iter(f"{SVG}g"):
        if g.get("class") != "object":
            continue
        (label,) = [t.text for t in g.iter(f"{SVG}text") if t.get("class") == "label"]
        (bar,) = [r for r in g.iter(f"{SVG}rect") if "bar" in (r.get("class") or "").split()]
        x, width = float(bar.get("x", "")), float(bar.get("width", ""))
        rows.append((str(label), g, x, x + width))
    return rows


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def test_simulate_gantt_has_a_section_per_phase_and_a_task_per_object(capsys: pytest.CaptureFixture[str]) -> None:
    """The reference story as a Gantt chart: sections phase 1..5 as `plan` numbers them, each object once
    with its start and end, the three objects the gate refused marked `crit`, the CriticalService last."""
    tasks = gantt_tasks(_run(["simulate", "-f", STORY, "-o", "gantt"], capsys))
    assert [t.section for t in tasks] == ["phase 1"] * 3 + ["phase 2"] * 2 + ["phase 3", "phase 4", "phase 5"]
    names = [t.text.split(" — ")[0] for t in tasks]
    assert sorted(names) == sorted(STORY_ORDER)
    crit = {t.text.split(" — ")[0] for t in tasks if "crit" in t.tags}
    assert crit == {DEPLOYMENT, "Namespace finalizer-namespace", SERVICE}
    assert all(re.search(r" — refused \d+×$", t.text) for t in tasks if "crit" in t.tags)
    assert all(0 <= t.start < t.end for t in tasks)
    end = {n: t.end for n, t in zip(names, tasks, strict=True)}
    assert end[CRD] < end[DEPLOYMENT] < end[SERVICE] == max(end.values())


def test_plan_gantt_draws_phase_n_at_step_n(capsys: pytest.CaptureFixture[str]) -> None:
    """`plan -o gantt`: the phases side by side in order, the axis naming them (`phase %-S` at N s)."""
    out = _run(["plan", "-f", STORY, "-o", "gantt"], capsys)
    assert "    axisFormat phase %-S" in out.splitlines()
    for t in gantt_tasks(out):
        n = int(t.section.removeprefix("phase "))
        assert (t.start, t.end, t.tags) == (n, n + 1, frozenset())


@pytest.mark.parametrize("name", ["system:controller:x", "a#b", "x;y", "a:b#c;d", "section-a", "a\nb"])
def test_mermaid_special_characters_in_names_do_not_break_the_chart(name: str) -> None:
    """Names with ':' (RBAC), '#', ';' or a newline stay one task with its own data; the name stays readable."""
    picture = Picture("t: #1; x", (Bar(f"ClusterRole {name}", 1, 0.0, 1.5, refusals=(0.5,)),
                                   Bar("Section a/b", 1, 0.25, 2.0), Bar("Click a/b", 2, 0.25, 2.0)))
    tasks = gantt_tasks(to_gantt(picture))
    assert len(tasks) == 3
    assert (tasks[0].tags, tasks[0].start, tasks[0].end) == ({"crit"}, 0.0, 1.5)
    shown = tasks[0].text.split(" — ")[0].removeprefix("ClusterRole ")
    assert re.sub(r"\W", "", shown) == re.sub(r"\W", "", name)  # the same letters, separators drawn alike
    # A task text starting with a Gantt keyword ("section ", "click ") would be read as that statement.
    assert [t.section for t in tasks] == ["phase 1", "phase 1", "phase 2"]


def test_simulate_without_gate_draws_what_is_still_there_to_the_end(capsys: pytest.CaptureFixture[str]) -> None:
    """--no-gate gets stuck: the objects still there are `active` bars reaching the end, marked "still here"."""
    tasks = gantt_tasks(_run(["simulate", "-f", STORY, "--no-gate", "-o", "gantt"], capsys, code=1))
    stuck = [t for t in tasks if "active" in t.tags]
    assert {t.text.split(" — ")[0] for t in stuck} == {*STORY_ORDER[:5]}
    assert all(t.text.endswith("still here") and t.end == max(x.end for x in tasks) for t in stuck)


def test_simulate_svg_has_a_bar_per_object_in_deletion_order(capsys: pytest.CaptureFixture[str]) -> None:
    """The SVG parses as XML, one bar per object top to bottom in the order they were gone: the CRD's bar
    ends before the Deployment's, the CriticalService's ends last."""
    rows = svg_bars(_run(["simulate", "-f", STORY, "-o", "svg"], capsys))
    labels = [label for label, *_ in rows]
    # The CRs' finalizer takes a random 0.5-2 s each (the seed's draw): their order among themselves is free;
    # the CRD and the CRs' namespace can go in the same instant (both wait for the last CR).
    assert sorted(labels[:3]) == STORY_ORDER[:3] and sorted(labels[3:5]) == sorted(STORY_ORDER[3:5])
    assert labels[5:] == STORY_ORDER[5:]
    end = {label: e for label, _g, _s, e in rows}
    assert end[CRD] < end[DEPLOYMENT] < end[SERVICE] == max(end.values())
    refused = {label for label, g, *_ in rows if any(ln.get("class") == "refusal" for ln in g.iter(f"{SVG}line"))}
    assert refused == {DEPLOYMENT, "Namespace finalizer-namespace", SERVICE}


def test_plan_svg_draws_each_phase_after_the_one_before(capsys: pytest.CaptureFixture[str]) -> None:
    """`plan -o svg`: phase N's bars begin where phase N-1's end."""
    rows = svg_bars(_run(["plan", "-f", STORY, "-o", "svg"], capsys))
    phase = {label: int(g.get("data-phase", "")) for label, g, *_ in rows}
    assert sorted(phase.values()) == [1, 1, 1, 2, 2, 3, 4, 5]
    for label, _g, start, _end in rows:
        before = [e for other, _, _s, e in rows if phase[other] == phase[label] - 1]
        assert all(abs(start - e) < 0.01 for e in before)


def test_svg_escapes_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An object named `a<b&c` (RBAC names may be) is drawn with that name, the SVG still well-formed."""
    bundle = tmp_path / "odd.yaml"
    bundle.write_text('apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: "a<b&c"}\n'
                      "rules: []\n")
    for command in ("simulate", "plan"):
        out = _run([command, "-f", str(bundle), "-o", "svg"], capsys)
        assert "a&lt;b&amp;c" in out
        assert [label for label, *_ in svg_bars(out)] == ["ClusterRole a<b&c"]
    assert ET.fromstring(to_svg(Picture("<&>\x01", (Bar("x\x00y", None, 0.0, 1.0, gone=False),)))) is not None


def _readme_example() -> tuple[str, str]:
    """The README's Gantt example: (the command in the sh block above it, the ```mermaid block)."""
    text = (ROOT / "README.md").read_text()
    m = re.search(r"```sh\n(criticalsvc simulate [^\n]*-o gantt)\n```\n+```mermaid\n(.*?)```", text, re.S)
    assert m, "README has no `criticalsvc simulate ... -o gantt` block followed by a ```mermaid block"
    return m[1], m[2]


def test_readme_gantt_example_is_what_the_command_prints(capsys: pytest.CaptureFixture[str]) -> None:
    """The README's Mermaid block is exactly what its command prints now, so it cannot go stale."""
    command, block = _readme_example()
    assert _run(shlex.split(command)[1:], capsys) == block
