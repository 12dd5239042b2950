"""`kubectl criticalsvc ...`: the CLI installed as the kubectl plugin `kubectl-criticalsvc`.

kubectl runs an executable named `kubectl-<name>` found on PATH with the rest of the command line and
its own environment (https://kubernetes.io/docs/tasks/extend-kubectl/kubectl-plugins/); the plugin
then takes kubectl's flags (-n, --context, --kubeconfig, $KUBECONFIG) as kubectl does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from criticalsvc.cli import main
from tests.backends import Embedded, kubectl_binary

ROOT = Path(__file__).resolve().parents[1]
STORY = "api/examples/reference-story.yaml"
PLUGIN = Path(sys.executable).with_name("kubectl-criticalsvc")  # the console script pyproject.toml installs
EXPLAIN = ["explain", "deployment/finalizer-deployment"]
STANDIN = "criticalsvc-standin"  # the cluster, user and context name in serve --embedded's kubeconfig


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def _plugin_installed() -> Path:
    assert PLUGIN.is_file(), f"{PLUGIN} is missing: reinstall the package (pip install -e .) to get the entry point"
    return PLUGIN


def test_plugin_help_names_it_the_way_kubectl_users_type_it() -> None:
    """`kubectl-criticalsvc --help` and its commands' usage say `kubectl criticalsvc`, not `criticalsvc`."""
    top = subprocess.run([_plugin_installed(), "--help"], capture_output=True, text=True, timeout=60)
    assert top.returncode == 0, top.stderr
    assert top.stdout.startswith("usage: kubectl criticalsvc ")
    bad = subprocess.run([_plugin_installed(), "explain", "no-slash"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert bad.stderr.startswith("kubectl criticalsvc explain: "), bad.stderr


@pytest.mark.parametrize("before", [["-n", "finalizer-namespace"], ["--namespace=finalizer-namespace"],
                                    ["-nfinalizer-namespace"]])
def test_namespace_before_the_command_is_the_same_as_after(before: list[str],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """`criticalsvc -n ns explain x` answers as `criticalsvc explain x -n ns`: kubectl takes its flags anywhere."""
    assert main([*EXPLAIN, "-n", "finalizer-namespace", "--state", STORY]) == 1
    after = capsys.readouterr().out
    assert main([*before, *EXPLAIN, "--state", STORY]) == 1
    assert capsys.readouterr().out == after
    assert "finalizer-namespace/finalizer-deployment" in after


def test_graph_takes_the_namespace_flag_and_ignores_it(capsys: pytest.CaptureFixture[str]) -> None:
    """`graph -n x` prints what `graph` does: CriticalServices are cluster-scoped, as `kubectl get nodes -n x`."""
    assert main(["graph", "--state", STORY]) == 0
    plain = capsys.readouterr().out
    assert main(["-n", "elsewhere", "graph", "--state", STORY]) == 0
    assert capsys.readouterr().out == plain
    assert "for-finalizer-deployment" in plain




@pytest.mark.e2e
def test_real_kubectl_finds_the_plugin_and_it_answers_as_the_cli(embedded: Embedded, tmp_path: Path) -> None:
    """With kubectl-criticalsvc on PATH, the real kubectl lists it, and `kubectl criticalsvc explain ... -n ns`
    prints what `criticalsvc explain ...` prints, reading the cluster through $KUBECONFIG, --kubeconfig or
    --context as kubectl does."""
    kubectl = kubectl_binary()
    if kubectl is None:
        pytest.skip("no kubectl: neither built (tests/realcluster) nor on PATH")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl-criticalsvc").symlink_to(_plugin_installed())
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
           "KUBECONFIG": str(embedded.kubeconfig), "HOME": str(tmp_path)}

    def run(*argv: str | Path, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*argv], cwd=ROOT, env={**env, **extra}, capture_output=True, text=True, timeout=60)

    listed = run(kubectl, "plugin", "list")
    assert str(bin_dir / "kubectl-criticalsvc") in listed.stdout, listed.stdout + listed.stderr
    for _ in range(2):  # twice, as the README says: the custom resources need their CRD first
        applied = run(kubectl, "apply", "-f", STORY, "--cache-dir", str(tmp_path / "cache"))
    assert applied.returncode == 0, applied.stderr

    cli = run(sys.executable, "-m", "criticalsvc", *EXPLAIN, "-n", "finalizer-namespace",
              "--kubeconfig", str(embedded.kubeconfig))
    assert cli.returncode == 1, cli.stderr
    assert "DENIED" in cli.stdout
    # $KUBECONFIG as a list, kubectl's way: the first file's current context points nowhere, and a context
    # of its own names the stand-in's cluster (defined in the second file) and the namespace.
    other = tmp_path / "other.kubeconfig"
    other.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "nowhere",
        "clusters": [{"name": "nowhere", "cluster": {"server": "http://127.0.0.1:1"}}],
        "users": [{"name": "nowhere", "user": {}}],
        "contexts": [{"name": "nowhere", "context": {"cluster": "nowhere", "user": "nowhere"}},
                     {"name": "story", "context": {"cluster": STANDIN, "user": STANDIN,
                                                   "namespace": "finalizer-namespace"}}]}))
    merged = f"{other}{os.pathsep}{embedded.kubeconfig}"
    seen = run(kubectl, "--context", "story", "get", "deployment", "finalizer-deployment", "-o", "name",
               "--cache-dir", str(tmp_path / "cache"), KUBECONFIG=merged)
    assert seen.stdout == "deployment.apps/finalizer-deployment\n", seen.stderr  # kubectl resolves it so

    for argv, extra in [
        ([*EXPLAIN, "-n", "finalizer-namespace"], {}),  # $KUBECONFIG
        (["--kubeconfig", str(embedded.kubeconfig), *EXPLAIN, "-n", "finalizer-namespace"], {"KUBECONFIG": ""}),
        (["-n", "finalizer-namespace", *EXPLAIN, "--kubeconfig", str(embedded.kubeconfig)], {"KUBECONFIG": ""}),
        (["--context", "story", *EXPLAIN], {"KUBECONFIG": merged}),  # the context's namespace, without -n
    ]:
        plugin = run(kubectl, "criticalsvc", *argv, **extra)
        assert (plugin.returncode, plugin.stdout) == (1, cli.stdout), f"{argv}: {plugin.stderr}"

    graph = run(kubectl, "criticalsvc", "graph")
    assert graph.returncode == 0, graph.stderr
    assert "for-finalizer-deployment" in graph.stdout
