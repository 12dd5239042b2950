"""`criticalsvc plan` and `criticalsvc simulate` from the command line: output, exit codes, bad input."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from criticalsvc.cli import main

STORY = "api/examples/reference-story.yaml"


def _cs(name: str, ns: str, waits_for_ns: str) -> str:
    return textwrap.dedent(f"""\
        ---
        apiVersion: v1
        kind: Namespace
        metadata: {{name: {ns}}}
        ---
        apiVersion: apps/v1
        kind: Deployment
        metadata: {{name: ctrl, namespace: {ns}}}
        ---
        apiVersion: criticalsvc.io/v1alpha1
        kind: CriticalService
        metadata: {{name: {name}}}
        spec:
          provider: {{group: apps, resource: deployments, namespace: {ns}, name: ctrl}}
          criteria:
          - type: SpecificResource
            specificResource: {{group: apps, resource: deployments, namespace: {waits_for_ns}, name: ctrl}}
        """)


@pytest.fixture
def cyclic(tmp_path):
    path = tmp_path / "cyclic.yaml"
    path.write_text(_cs("a", "ns-a", "ns-b") + _cs("b", "ns-b", "ns-a"))
    return str(path)


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# --- simulate ---------------------------------------------------------------------------------------
def test_simulate_story_tells_the_story_and_exits_0(capsys):
    """The README's main job: denials with the gate's reason, the order things went, a closing summary; exit 0."""
    assert main(["simulate", "-f", STORY]) == 0
    out = capsys.readouterr().out
    assert "DELETE Deployment finalizer-namespace/finalizer-deployment -> DENIED" in out
    assert "CriticalService for-finalizer-deployment protects it until" in out
    assert "finalizer-namespace/finalizer-deployment: remove finalizer my.crd.group/super-important" in out
    order = out[out.index("Order (marked"):].splitlines()[1:9]
    assert order[-1].lstrip().startswith("CriticalService for-finalizer-deployment")
    assert order[0].lstrip().startswith("CoolResource cool-apps/")
    assert out.rstrip().splitlines()[-1].startswith("COMPLETED: all 8 objects are gone after")


def test_simulate_without_the_gate_shows_what_holds_each_object_and_exits_1(capsys):
    """--no-gate gets stuck: exit 1, and every remaining object is listed with what holds it."""
    assert main(["simulate", "-f", STORY, "--no-gate"]) == 1
    out = capsys.readouterr().out
    held = out[out.index("What holds each remaining object:"):]
    for name in ("CoolResource cool-apps/alpha", "CustomResourceDefinition coolresources.my.crd.group",
                 "Namespace cool-apps"):
        assert name in held
    assert "finalizer my.crd.group/super-important stays forever" in held
    assert out.rstrip().splitlines()[-1].startswith("STUCK: 5 of 8 objects remain")


def test_simulate_json_has_events_order_and_verdict(capsys):
    """-o json: every event, the order with store sequence numbers, and the verdict; machine-readable."""
    assert main(["simulate", "-f", STORY, "-o", "json", "--client", "namespace", "--seed", "4"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["client"] == "namespace" and data["seed"] == 4 and data["gate"] is True
    assert data["verdict"]["completed"] is True and data["verdict"]["remaining"] == []
    assert any(e["outcome"] == "denied" for e in data["events"])
    assert data["order"][-1]["object"]["display"] == "CriticalService for-finalizer-deployment"
    seqs = [o["gone"]["seq"] for o in data["order"]]
    assert seqs == sorted(seqs)


@pytest.mark.parametrize(("argv", "code"), [
    (["--client", "kubectl"], 1),
    (["--client", "kubectl", "--repeat", "30"], 0),
    (["--client", "namespace", "--legacy-namespace-deletion"], 0),
    (["--client", "manifestwork", "--seed", "99"], 0),
])
def test_simulate_exit_codes_per_client(argv, code, capsys):
    """kubectl alone gives up after one pass (exit 1); re-run, or with a retrying client, the story completes (0)."""
    assert main(["simulate", "-f", STORY, *argv]) == code
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert last.startswith("COMPLETED" if code == 0 else "STUCK")


def test_simulate_accepts_several_files_and_directories(tmp_path, capsys):
    """-f may repeat and name directories; each file is its own bundle."""
    (tmp_path / "d").mkdir()
    text = Path(STORY).read_text()
    parts = text.split("\n---\n")
    (tmp_path / "d" / "1.yaml").write_text("\n---\n".join(parts[:4]))
    (tmp_path / "2.yaml").write_text("\n---\n".join(parts[4:]))
    assert main(["simulate", "-f", str(tmp_path / "d"), "-f", str(tmp_path / "2.yaml")]) == 0
    assert "(2 bundles)" in capsys.readouterr().out


MALFORMED = [
    ("apiVersion: v1\nkind: Namespace\nmetadata: {name: x\n", "bad.yaml: line"),
    ("apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n---\nkind: ConfigMap\nmetadata: {name: c}\n",
     "bad.yaml: document 2: apiVersion: required"),
    ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, namespace: n, labels: [oops]}\n",
     "bad.yaml: document 1: metadata.labels: must be a map of strings"),
    ("", "bad.yaml: no objects in it"),
]
# Documents that parse but that the (simulated) API server refuses to create: only simulate creates them.
REFUSED = [
    ("apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n---\n"
     "apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n",
     'bad.yaml: document 2: Namespace \'x\' cannot be created: namespaces "x" already exists'),
    ("apiVersion: criticalsvc.io/v1alpha1\nkind: CriticalService\nmetadata: {name: c}\nspec: {criteria: []}\n",
     "bad.yaml: document 1: CriticalService 'c' cannot be created: admission webhook \"gate.criticalsvc.io\" "
     "denied the request: CriticalService \"c\" is invalid: spec.provider: required"),
]


@pytest.mark.parametrize(("command", "text", "expected"),
                         [(c, t, e) for c in ("simulate", "plan") for t, e in MALFORMED]
                         + [("simulate", t, e) for t, e in REFUSED])
def test_malformed_bundles_are_one_line_naming_file_and_document(command, text, expected, tmp_path, capsys,
                                                                 monkeypatch):
    """Bad input exits 2 with one line naming the file and the document."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_text(text)
    assert main([command, "-f", "bad.yaml"]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"criticalsvc {command}: {expected}")


def test_simulate_refuses_a_cyclic_bundle_at_creation(cyclic, capsys):
    """The gate refuses the CriticalService closing the cycle when it is created: exit 2, one line, the cycle named."""
    assert main(["simulate", "-f", cyclic]) == 2
    line = one_line(capsys.readouterr().err)
    assert "document 6: CriticalService 'b' cannot be created" in line
    assert "would close a dependency cycle: b -> a -> b" in line


def test_simulate_rejects_repeat_without_kubectl_and_missing_files(capsys):
    """--repeat needs --client kubectl; a missing file is named; both exit 2 with one line."""
    assert main(["simulate", "-f", STORY, "--repeat", "5"]) == 2
    assert "--repeat" in one_line(capsys.readouterr().err)
    assert main(["simulate", "-f", "nope.yaml"]) == 2
    assert one_line(capsys.readouterr().err) == "criticalsvc simulate: nope.yaml: no such file"


# --- plan -------------------------------------------------------------------------------------------
def test_plan_text_numbers_the_designs_phases(capsys):
    """plan prints the reference story as five numbered phases, CRs first and the CriticalService last."""
    assert main(["plan", "-f", STORY]) == 0
    out = capsys.readouterr().out
    phases = [line for line in out.splitlines() if line.startswith("phase ")]
    assert phases == [f"phase {i}:" for i in range(1, 6)]
    body = out[out.index("phase 1:"):]
    assert body.index("CoolResource cool-apps/alpha") < body.index("CustomResourceDefinition") \
        < body.index("Deployment finalizer-namespace") < body.index("Namespace finalizer-namespace") \
        < body.index("CriticalService for-finalizer-deployment")
    assert "no coolresources.my.crd.group carries finalizer my.crd.group/super-important" in body


def test_plan_json_dot_and_mermaid(capsys):
    """-o json gives phases and edges; dot and mermaid draw the same graph."""
    assert main(["plan", "-f", STORY, "-o", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [len(p) for p in data["phases"]] == [3, 2, 1, 1, 1] and data["cycle"] is None
    assert data["phases"][-1][0]["kind"] == "CriticalService"
    assert any(e["why"] == "instances go before their CRD" for e in data["edges"])
    assert main(["plan", "-f", STORY, "-o", "dot"]) == 0
    dot = capsys.readouterr().out
    assert dot.startswith("digraph teardown {") and dot.count(" -> ") == len(data["edges"])
    assert main(["plan", "-f", STORY, "-o", "mermaid"]) == 0
    mermaid = capsys.readouterr().out
    assert mermaid.startswith("flowchart LR") and mermaid.count(" --> ") == len(data["edges"])


@pytest.mark.parametrize("output", ["text", "json", "dot"])
def test_plan_prints_the_cycle_and_exits_1(cyclic, output, capsys):
    """CriticalServices waiting for each other: no order exists; the cycle is printed; exit 1."""
    assert main(["plan", "-f", cyclic, "-o", output]) == 1
    captured = capsys.readouterr()
    if output == "json":
        assert json.loads(captured.out)["cycle"]["services"] in (["a", "b"], ["b", "a"])
    text = captured.out if output != "dot" else captured.err
    assert "dependency cycle: " in text
    assert "a -> b -> a" in text or "b -> a -> b" in text


# --- the benchmark dispatcher -----------------------------------------------------------------------
def test_benchmarks_dispatch_by_name(capsys):
    """`python -m benchmarks teardown ...` runs the teardown benchmark; an unknown name exits 2."""
    from benchmarks.__main__ import main as bench

    assert bench(["teardown", "--operators", "2", "--crs", "5", "--tenants", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["objects"] == 2 + 2 * (5 + 4) and result["completed"] is True
    assert bench(["no-such-benchmark"]) == 2
    assert "teardown" in capsys.readouterr().err
