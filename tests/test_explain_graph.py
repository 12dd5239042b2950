"""`explain` and `graph` on a snapshot: the gate's own answer, laid out for a person."""

import json
import textwrap

from criticalsvc.cli import main

STORY = "api/examples/reference-story.yaml"


def test_explain_names_each_unmet_criterion(capsys):
    """explain of the provider lists the CriticalService and both unmet criteria, and exits 1 (denied)."""
    code = main(["explain", "deployment/finalizer-deployment", "-n", "finalizer-namespace", "--state", STORY])
    out = capsys.readouterr().out
    assert code == 1
    assert "DENIED" in out and "for-finalizer-deployment" in out
    assert out.count("[UNMET]") == 2
    assert "cool-apps/alpha, cool-apps/beta, cool-apps/gamma" in out


def test_explain_json_matches_the_decision(capsys):
    """explain -o json reports allowed=false and the per-criterion verdicts for a namespace."""
    code = main(["explain", "ns/finalizer-namespace", "--state", STORY, "-o", "json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1 and data["allowed"] is False
    (cs,) = data["criticalServices"]
    assert [c["satisfied"] for c in cs["criteria"]] == [False, False]
    assert cs["criteria"][0]["count"] == 3


def test_explain_allows_an_unprotected_object(capsys):
    """An object no CriticalService protects is ALLOWED, exit 0."""
    code = main(["explain", "ns/cool-apps", "--state", STORY])
    assert code == 0 and "ALLOWED" in capsys.readouterr().out


def test_explain_rejects_bad_targets(capsys):
    """A malformed KIND/NAME and an unknown kind each exit 2 with one line; without -n, as kubectl does,
    the namespace is the context's (a snapshot has none: `default`)."""
    for argv in (["explain", "nokind", "--state", STORY], ["explain", "gizmo/x", "--state", STORY]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("criticalsvc explain:")
    assert main(["explain", "deploy/x", "--state", STORY]) == 0
    assert "default/x" in capsys.readouterr().out


def _cs(name, provider_ns, provider, criterion):
    return textwrap.dedent(f"""\
        apiVersion: criticalsvc.io/v1alpha1
        kind: CriticalService
        metadata: {{name: {name}}}
        spec:
          provider: {{group: apps, resource: deployments, namespace: {provider_ns}, name: {provider}}}
          criteria:
          - {criterion}
        ---
        """)


def test_graph_marks_a_cycle_and_exits_1(tmp_path, capsys):
    """Two CriticalServices waiting for each other's providers are printed as a cycle, exit 1."""
    snap = tmp_path / "state.yaml"
    snap.write_text(
        _cs("a", "ns-a", "pa", "{type: SpecificResource, specificResource: {group: apps, resource: deployments, "
                               "namespace: ns-b, name: pb}}")
        + _cs("b", "ns-b", "pb", "{type: SpecificResource, specificResource: {group: apps, resource: deployments, "
                                 "namespace: ns-a, name: pa}}"))
    code = main(["graph", "--state", str(snap)])
    out = capsys.readouterr().out
    assert code == 1 and "CYCLE: a -> b -> a" in out
    assert main(["graph", "--state", str(snap), "-o", "dot"]) == 1
    assert "color=red" in capsys.readouterr().out


def test_graph_orders_independent_chains(tmp_path, capsys):
    """A chain a waits for b is printed as two teardown phases, b first, exit 0."""
    snap = tmp_path / "state.yaml"
    snap.write_text(
        _cs("a", "ns-a", "pa", "{type: SpecificResource, specificResource: {group: apps, resource: deployments, "
                               "namespace: ns-b, name: pb}}")
        + _cs("b", "ns-b", "pb", "{type: Resources, resources: {group: '', resource: pods, namespace: ns-c}}"))
    code = main(["graph", "--state", str(snap)])
    out = capsys.readouterr().out
    assert code == 0
    assert "teardown phase 1: b" in out and "teardown phase 2: a" in out
    assert main(["graph", "--state", str(snap), "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["edges"][0]["from"] == "b"


def test_explain_shows_replay_and_the_recorded_intent_for_this_object_only():
    """A CriticalService that asks for replay says so, and a recorded intent for the object (this incarnation,
    by UID) is listed with who asked and when; an intent for a re-created object of the same name is not."""
    from criticalsvc.api import GroupResource, ObjectRef
    from criticalsvc.explain import explain, render_text
    from criticalsvc.manifests import load_text
    from criticalsvc.replay import DeletionIntent
    from criticalsvc.snapshot import build_state

    with open("api/examples/reference-story.yaml") as f:
        text = f.read().replace("spec:\n  provider:", "spec:\n  replayDeletion: WhenTearingDown\n  provider:")
    state = build_state(load_text(text, "story"))
    target = ObjectRef(GroupResource("apps", "deployments"), "finalizer-namespace", "finalizer-deployment")
    uid = state.get(target).uid
    mine = DeletionIntent(target, uid, "alice", 1_700_000_000.0, "Background", ("for-finalizer-deployment",))
    stale = DeletionIntent(target, "an-older-uid", "bob", 1_600_000_000.0, None, ("for-finalizer-deployment",))
    out = render_text(explain(target, state, intents=(mine, stale)))
    assert "replayDeletion: WhenTearingDown" in out
    assert "Deletion intent (Waiting): alice asked at 2023-11-14T22:13:20Z (propagationPolicy Background)" in out
    assert "bob" not in out
