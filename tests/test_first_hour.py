"""What a new user meets in the first hour (issue 14), each checked the way the user would notice it:

1. the README's kubectl block, pasted right after `serve --embedded ... &`, works at once (the
   kubeconfig appears only when the gate is ready, written atomically);
2. a backgrounded `serve --embedded` does not flood the terminal: logs go to a file (`logs: PATH`);
3. `explain`/`graph` without a cluster suggest something they accept;
4. `explain KIND/NAME` without -n uses the kubeconfig context's namespace, else "default";
5. `plan -o json | head -1` ends quietly, without a BrokenPipeError traceback;
6. `simulate` explains its words, reports enforcement: Warn warnings, ends with what to try next,
   and reports every invalid document of a bundle at once.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from criticalsvc.cli import main

ROOT = Path(__file__).resolve().parents[1]
STORY = "api/examples/reference-story.yaml"
WARN = "api/examples/warn-enforcement.yaml"
CLI = [sys.executable, "-m", "criticalsvc"]


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def _no_cluster_env(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(home))


def _kubeconfig(path: Path, *, namespace: str | None, server: str = "http://127.0.0.1:1") -> Path:
    context = {"cluster": "c", "user": "u", **({"namespace": namespace} if namespace else {})}
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "ctx",
        "clusters": [{"name": "c", "cluster": {"server": server}}], "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "ctx", "context": context}, {"name": "other", "context": {"cluster": "c",
                                                                                     "user": "u", "namespace": "x"}}],
    }))
    return path


# --- 1 and 2: serve --embedded ----------------------------------------------------------------------
class Serve:
    """`serve --embedded` as a user starts it, its stdout and stderr (the terminal) kept apart."""

    def __init__(self, tmp: Path, *extra: str) -> None:
        self.kubeconfig = tmp / "criticalsvc.kubeconfig"
        self.out, self.err = tmp / "terminal.out", tmp / "terminal.err"
        with self.out.open("w") as out, self.err.open("w") as err:
            self.proc = subprocess.Popen([*CLI, "serve", "--embedded", "--kubeconfig-out", str(self.kubeconfig),
                                          "--port-file", str(tmp / "ports.json"), *extra],
                                         stdout=out, stderr=err, cwd=ROOT)

    def wait_for_kubeconfig(self, *, stale: str = "") -> dict[str, object]:
        deadline = time.monotonic() + 60
        while True:  # what `until [ -s PATH ]; do sleep 0.2; done` does, only faster
            try:  # serve removes a stale file at start: it may vanish between two looks
                text = self.kubeconfig.read_text()
            except FileNotFoundError:
                text = ""
            if text and text != stale:
                doc = yaml.safe_load(text)
                assert isinstance(doc, dict)
                return doc
            assert self.proc.poll() is None, self.err.read_text()
            assert time.monotonic() < deadline, f"no kubeconfig after 60 s:\n{self.err.read_text()}"
            time.sleep(0.02)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[type[Serve]]:
    started: list[Serve] = []

    class Started(Serve):
        def __init__(self, tmp: Path, *extra: str) -> None:
            super().__init__(tmp, *extra)
            started.append(self)

    yield Started
    for s in started:
        s.stop()


PROTECTED = {"apiVersion": "v1", "kind": "Namespace",
             "metadata": {"name": "keep", "labels": {"criticalsvc.io/deletion-protected": "Always"}}}


def _delete_protected(server: str) -> httpx.Response:
    """Create a namespace labelled deletion-protected: Always and delete it: only the gate refuses that."""
    assert httpx.post(f"{server}/api/v1/namespaces", json=PROTECTED, timeout=10).status_code == 201
    return httpx.delete(f"{server}/api/v1/namespaces/keep", timeout=10)


@pytest.mark.e2e
def test_embedded_kubeconfig_appears_only_when_the_gate_is_ready(serve: type[Serve], tmp_path: Path) -> None:
    """The moment the kubeconfig exists, the API server answers and every write already goes through the
    gate (deleting a namespace labelled deletion-protected: Always is refused by it); a file from an earlier run
    is not mistaken for it."""
    stale = "stale: kubeconfig of an earlier run\n"
    (tmp_path / "criticalsvc.kubeconfig").write_text(stale)
    s = serve(tmp_path)
    config = s.wait_for_kubeconfig(stale=stale)
    server = config["clusters"][0]["cluster"]["server"]  # type: ignore[index]
    r = _delete_protected(str(server))
    assert r.status_code == 403 and "denied the request" in r.text, r.text
    ports = json.loads((tmp_path / "ports.json").read_text())
    assert httpx.get(f"http://127.0.0.1:{ports['ops_listen']}/readyz", timeout=5).status_code == 200
    assert s.kubeconfig.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir() if "kubeconfig" in p.name) == ["criticalsvc.kubeconfig"]
    # 4: explain without -n reads the live cluster in the kubeconfig's namespace ("default": it names none).
    code = subprocess.run([*CLI, "explain", "deployment/nothing-here", "--kubeconfig", str(s.kubeconfig)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert code.returncode == 0 and "deployments.apps default/nothing-here" in code.stdout, code


@pytest.mark.e2e
def test_embedded_readyz_never_precedes_the_kubeconfig(serve: type[Serve], tmp_path: Path) -> None:
    """A harness polling /readyz (tests/backends.py does) finds the kubeconfig written once it says 200."""
    s = serve(tmp_path)
    ports_file = tmp_path / "ports.json"
    deadline = time.monotonic() + 60
    while not ports_file.exists():
        assert s.proc.poll() is None and time.monotonic() < deadline, s.err.read_text()
        time.sleep(0.01)
    ops = f"http://127.0.0.1:{json.loads(ports_file.read_text())['ops_listen']}/readyz"
    while True:
        try:
            if httpx.get(ops, timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, s.err.read_text()
        time.sleep(0.01)
    assert s.kubeconfig.is_file() and s.kubeconfig.stat().st_size > 0


@pytest.mark.e2e
def test_embedded_logs_go_to_a_file_and_the_terminal_stays_quiet(serve: type[Serve], tmp_path: Path) -> None:
    """Backgrounded, `serve --embedded` prints `logs: PATH` and one ready line; a review, the shutdown
    (watch restarts, TLS closes) write to the log file, never to the terminal."""
    s = serve(tmp_path)
    s.wait_for_kubeconfig()
    config = yaml.safe_load(s.kubeconfig.read_text())
    server = config["clusters"][0]["cluster"]["server"]
    assert _delete_protected(server).status_code == 403
    assert s.stop() == 0
    log = tmp_path / "criticalsvc.log"  # next to the kubeconfig, named after it
    terminal = s.err.read_text().splitlines() + s.out.read_text().splitlines()
    assert terminal == [f"logs: {log}", f"criticalsvc serve --embedded: ready: export KUBECONFIG={s.kubeconfig}"]
    text = log.read_text()
    assert '"event":"listening"' in text and '"operation":"DELETE"' in text and '"event":"stopped"' in text


@pytest.mark.e2e
def test_embedded_log_file_dash_keeps_logs_on_stderr(serve: type[Serve], tmp_path: Path) -> None:
    """`--log-file -` asks for the logs on stderr, as `serve` without --embedded always does."""
    s = serve(tmp_path, "--log-file", "-")
    s.wait_for_kubeconfig()
    assert s.stop() == 0
    err = s.err.read_text()
    assert '"event":"listening"' in err and "logs: " not in err
    assert not (tmp_path / "criticalsvc.log").exists()


def test_default_log_file_is_next_to_the_kubeconfig() -> None:
    from criticalsvc.commands.serve import default_log_file

    assert default_log_file(Path("/tmp/criticalsvc.kubeconfig")) == Path("/tmp/criticalsvc.log")
    assert default_log_file(Path("/tmp/k")) == Path("/tmp/k.log")
    assert default_log_file(Path("/tmp/x.log")) == Path("/tmp/x.log.log")


def _readme_kubectl_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Try it with kubectl"):]
    block = section[section.index("```sh\n") + len("```sh\n"):]
    return block[:block.index("```")].splitlines()


def test_readme_waits_for_the_kubeconfig_before_kubectl() -> None:
    """The quick start waits for the file before the first kubectl, and clears one left by an earlier run."""
    lines = _readme_kubectl_block()
    first_kubectl = next(i for i, line in enumerate(lines) if line.startswith("kubectl"))
    serve_line = next(i for i, line in enumerate(lines) if "serve --embedded" in line)
    wait_line = next(i for i, line in enumerate(lines) if line.startswith("until [ -s /tmp/criticalsvc.kubeconfig ]"))
    assert serve_line < wait_line < first_kubectl
    assert lines[serve_line].startswith("rm -f /tmp/criticalsvc.kubeconfig;")


@pytest.mark.e2e
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_readme_kubectl_block_pasted_at_once_works(tmp_path: Path) -> None:
    """The README's block, pasted as a whole: no `connection to the server localhost:8080 was refused`, the gate
    refuses 3 deletes, and the terminal shows no log lines."""
    lines = _readme_kubectl_block()
    upto = next(i for i, line in enumerate(lines) if line.startswith("kubectl delete"))
    kubeconfig = str(tmp_path / "criticalsvc.kubeconfig")
    script = "\n".join(lines[:upto + 1]).replace("/tmp/criticalsvc.kubeconfig", kubeconfig).replace(
        ".venv/bin/criticalsvc", " ".join(CLI))
    script += '\necho "delete exit: $?"\nkill %1; wait\n'
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"} | {"HOME": str(tmp_path)}
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=180, cwd=ROOT, env=env)
    terminal = done.stdout + done.stderr
    assert "localhost:8080" not in terminal and "refused" not in terminal, terminal
    assert "delete exit: 1" in terminal, terminal
    assert terminal.count("denied the request") == 3, terminal
    assert '{"' not in terminal and "Running on" not in terminal, terminal  # no log line reached the terminal
    assert f"logs: {tmp_path / 'criticalsvc.log'}" in terminal


# --- 3: explain and graph without a cluster ---------------------------------------------------------
@pytest.mark.parametrize("argv", [["explain", "deployment/x", "-n", "a"], ["graph"]])
def test_no_cluster_hint_names_what_the_command_accepts(argv: list[str], tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The hint is `serve --embedded --kubeconfig-out ...` and `--kubeconfig ...`, options that exist."""
    _no_cluster_env(monkeypatch, tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "try --embedded" not in err
    assert "criticalsvc serve --embedded --kubeconfig-out /tmp/k" in err and "--kubeconfig /tmp/k" in err
    assert "--state" in err
    # Every option the hint names for this command is one it accepts.
    from criticalsvc.cli import build_parser

    build_parser().parse_args([*argv, "--kubeconfig", "/tmp/k"])
    build_parser().parse_args(["serve", "--embedded", "--kubeconfig-out", "/tmp/k"])


# --- 4: explain without -n ---------------------------------------------------------------------------
def test_explain_without_namespace_uses_the_context_namespace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """As kubectl: the kubeconfig context's namespace; --context picks another context."""
    _no_cluster_env(monkeypatch, tmp_path)
    config = _kubeconfig(tmp_path / "config", namespace="finalizer-namespace")
    code = main(["explain", "deployment/finalizer-deployment", "--state", STORY, "--kubeconfig", str(config)])
    out = capsys.readouterr().out
    assert code == 1, out
    assert out.startswith("DELETE deployments.apps finalizer-namespace/finalizer-deployment: DENIED")
    main(["explain", "deployment/finalizer-deployment", "--state", STORY, "--kubeconfig", str(config),
          "--context", "other"])
    assert "deployments.apps x/finalizer-deployment" in capsys.readouterr().out


def test_explain_without_namespace_defaults_to_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """No namespace in the context (or no kubeconfig with a snapshot): "default", not a refusal."""
    _no_cluster_env(monkeypatch, tmp_path)
    assert main(["explain", "deployment/finalizer-deployment", "--state", STORY]) == 0
    assert "deployments.apps default/finalizer-deployment" in capsys.readouterr().out
    config = _kubeconfig(tmp_path / "config", namespace=None)
    assert main(["explain", "deployment/finalizer-deployment", "--state", STORY, "--kubeconfig", str(config)]) == 0
    assert "deployments.apps default/finalizer-deployment" in capsys.readouterr().out


def test_default_namespace_follows_kubeconfig_merging(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """$KUBECONFIG as a list: the first file setting current-context wins, the first definition of a context wins."""
    import argparse

    from criticalsvc.commands._source import default_namespace

    _no_cluster_env(monkeypatch, tmp_path)
    empty = tmp_path / "empty"
    empty.write_text("apiVersion: v1\nkind: Config\n")
    config = _kubeconfig(tmp_path / "config", namespace="team-a")
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(empty), str(tmp_path / "missing"), str(config)]))
    args = argparse.Namespace(state=None, kubeconfig=None, context=None)
    assert default_namespace(args) == "team-a"


# --- 5: a closed pipe ---------------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [["plan", "-f", STORY, "-o", "json"], ["simulate", "-f", STORY],
                                  ["graph", "--state", STORY, "-o", "json"]])
def test_closed_pipe_ends_quietly(argv: list[str], tmp_path: Path) -> None:
    """`criticalsvc plan -o json | head -1`: the reader is gone before the output is written; no traceback."""
    with (tmp_path / "err").open("w+") as stderr:
        proc = subprocess.Popen([*CLI, *argv], stdout=subprocess.PIPE, stderr=stderr, cwd=ROOT)
        assert proc.stdout is not None
        proc.stdout.close()  # the reader exits at once (long before the interpreter has even started)
        code = proc.wait(60)
        stderr.seek(0)
        err = stderr.read()
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err, err
    assert err == ""
    assert code == 141


def test_head_minus_one_in_a_shell_pipeline() -> None:
    """The same through a real shell pipeline, as the user types it."""
    done = subprocess.run(["bash", "-c", f"{' '.join(CLI)} plan -f {STORY} -o json | head -1"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.stdout == "{\n" and done.stderr == "", done


# --- 6: simulate --------------------------------------------------------------------------------------
def test_simulate_explains_its_words_once(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "-f", STORY]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert out.count("marked = ") == 1 and "deletionTimestamp" in out and "finalizers" in out
    assert out.count("DENIED = ") == 1 and out.count("gone = ") == 1


def test_simulate_reports_warn_enforcement(capsys: pytest.CaptureFixture[str]) -> None:
    """With enforcement: Warn the teardown gets stuck, and the output says the gate only warned, and where."""
    assert main(["simulate", "-f", WARN]) == 1
    out = capsys.readouterr().out
    warnings = out[out.index("Warnings from the gate (enforcement: Warn)"):out.index("Order (marked")]
    assert "DELETE Deployment cert-system/cert-controller:" in warnings
    assert "would deny deleting deployments.apps cert-system/cert-controller" in warnings
    last = out.rstrip().splitlines()[-1]
    assert last.startswith("STUCK:") and "enforcement: Warn" in last


def test_simulate_json_carries_warnings_and_next_steps(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "-f", WARN, "-o", "json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert {w["object"] for w in data["warnings"]} >= {"Deployment cert-system/cert-controller"}
    assert all(w["operation"] == "DELETE" for w in data["warnings"])
    assert any(step["command"].startswith("criticalsvc explain") for step in data["next"])


@pytest.mark.parametrize(("bundle", "explain_code"), [(STORY, 1), (WARN, 0)])
def test_simulate_ends_with_what_to_try_next(bundle: str, explain_code: int,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A "Try next" block just above the verdict; the commands it names run as printed."""
    main(["simulate", "-f", bundle])
    lines = capsys.readouterr().out.rstrip().splitlines()
    start = lines.index("Try next:")
    commands = [line.strip() for line in lines[start + 1:] if line.startswith("  criticalsvc ")]
    assert f"criticalsvc plan -f {bundle}" in commands
    explain = next(c for c in commands if c.startswith("criticalsvc explain "))
    assert lines[-1].startswith(("COMPLETED", "STUCK")) and lines[-2] == ""
    assert main(explain.split()[1:]) == explain_code
    assert "criterion" not in capsys.readouterr().err


TWO_INVALID = """\
apiVersion: v1
kind: Namespace
metadata: {name: a}
---
apiVersion: criticalsvc.io/v1alpha1
kind: CriticalService
metadata: {name: one}
spec:
  provider: {group: apps, resource: deployments, namespace: a, name: x}
  criteria:
  - type: Finalizer
    finalizer: {group: g, resource: r}
---
kind: ConfigMap
metadata: {name: no-api-version, namespace: a}
---
apiVersion: criticalsvc.io/v1alpha1
kind: CriticalService
metadata: {name: two}
spec:
  provider: {group: apps, resource: deployments, namespace: a}
"""


@pytest.mark.parametrize("command", ["simulate", "plan"])
def test_every_invalid_document_is_reported_at_once(command: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Three bad documents: three lines, each naming the file, document, kind and name, and the field; exit 2."""
    bundle = tmp_path / "bundle.yaml"
    bundle.write_text(TWO_INVALID)
    assert main([command, "-f", str(bundle)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == f"criticalsvc {command}: 3 invalid documents; fix them all, then run again:"
    assert err[1:] == [
        f"  {bundle}: document 2 (CriticalService one): spec.criteria[0].finalizer.finalizerName: required",
        f"  {bundle}: document 3 (ConfigMap no-api-version): apiVersion: required",
        f"  {bundle}: document 4 (CriticalService two): spec.provider: set exactly one of name and selector",
    ]


def test_invalid_documents_across_files_and_lists(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Problems in several -f files, and in a List's items, are all named."""
    (tmp_path / "a.yaml").write_text("apiVersion: v1\nkind: List\nitems:\n"
                                     "- {apiVersion: v1, kind: ConfigMap, metadata: {namespace: n}}\n")
    (tmp_path / "b.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, namespace: n, "
                                     "labels: [oops]}\n")
    assert main(["plan", "-f", str(tmp_path / "a.yaml"), "-f", str(tmp_path / "b.yaml")]) == 2
    err = capsys.readouterr().err
    assert re.search(r"a\.yaml: document 1 items\[0\] \(ConfigMap, no name\): metadata\.name: required", err), err
    assert re.search(r"b\.yaml: document 1 \(ConfigMap c\): metadata\.labels: must be a map of strings", err), err


def test_the_readme_shows_the_quick_start_up_prints() -> None:
    """The README's real-control-plane block is what `python -m tests.realcluster up` prints (which
    tests/test_realcluster_status.py runs verbatim), so the two cannot drift apart."""
    from tests.realcluster.__main__ import quick_start

    printed = quick_start(Path("/tmp/real.kubeconfig"), Path("<the built kubectl's directory>/kubectl"))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = "\n".join(line.strip() for line in printed.splitlines())
    assert f"```sh\n{block}\n```" in readme, block
