"""The bounded model checker (criticalsvc/verify, `criticalsvc verify`): its CI bound, its negative controls,
and the counterexamples it found, which are now refused at CREATE or documented limits.

* At the `ci` bound (every single CriticalService over the catalogue, every deleter, replay off and on, every
  interleaving of the first choice point) nothing is unsafe or stuck, and the counts say it ran what it says.
* Negative controls: with rule 4's CRD edge taken out of the cycle check (the bug of issue 30), the explorer
  finds the CRD cycle and minimizes it to the two CriticalServices of tests/bundles/verify-crd-cycle.yaml;
  with the gate off it finds an unsafe teardown (a provider gone while its criteria are unmet).
* The counterexamples: the CRD cycle's bundle is refused at CREATE naming the CRD edge; the namespace-content
  cycle (design/criticalservice.md §6) is admitted with a warning and tears down with every deleter but
  namespace deletion, which leaves exactly what the oracle's documented limit says; a ManifestWork held by a
  deletion-protected object leaves what the gate refused unless replay is on (§6).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import attrs
import pytest

from criticalsvc import graph
from criticalsvc.cli import main
from criticalsvc.sim.cluster import Cluster
from criticalsvc.verify import oracle
from criticalsvc.verify.configurations import BOUNDS, Bound, Configuration, Service, configurations, parse_bound
from criticalsvc.verify.explorer import DELETERS, admitted, explore, family, run_one
from criticalsvc.verify.interleavings import ChoiceRandom, paths
from criticalsvc.verify.interleavings import Path as ChoicePath

BUNDLES = Path(__file__).parent / "bundles"
CRD_CYCLE = Configuration((Service("deploy", ("crd",)), Service("widget", ("deploy",))))
NAMESPACE_CYCLE = Configuration((Service("deploy", ("cm",)), Service("widget", ("deploy",))))


def test_the_ci_bound_finds_nothing_and_covers_what_it_says():
    """Every admitted single-CriticalService configuration, torn down every way, is safe and ends as documented."""
    report = explore(BOUNDS["ci"])
    assert report.findings == {}, "\n".join(f"{k}: {f.minimal.violations}" for k, f in report.findings.items())
    # 7 providers x 9 criteria; the self-cycles (a criterion covering its own provider, namespace or CRD) refused.
    assert report.configurations == 63 and 15 <= report.refused <= 25, report.summary()
    admitted = report.configurations - report.refused
    # Each family runs at least its canonical interleaving, and every family with a choice point its alternatives.
    assert report.runs >= 3 * admitted * len(DELETERS) * 2 and report.truncated == 0, report.summary()
    # The leader's labelling and routing, with a lagging API server, for one configuration of each of the 7 providers
    # (tests/test_verify_enforcement.py).
    assert report.enforced == 7 and report.enforcement_runs >= 7 * 8 and report.enforcement_findings == [], \
        report.summary()


def test_the_ci_pairs_bound_finds_nothing():
    """Every admitted pair over the providers and criteria that reach across objects, types and namespaces (the CRD
    cycle among them, now refused at CREATE), torn down every way, canonical interleaving."""
    report = explore(BOUNDS["ci-pairs"])
    assert report.findings == {}, "\n".join(f"{k}: {f.minimal.violations}" for k, f in report.findings.items())
    assert (report.configurations, report.refused) == (230, 118), report.summary()
    assert report.runs == 112 * len(DELETERS) * 2


def test_the_ci_triples_bound_finds_nothing_and_refuses_what_the_gate_refuses():
    """Every admitted set of up to three CriticalServices over three providers and three criteria (cycles of three,
    two services in one namespace), torn down every way, canonical interleaving. It refuses exactly what the gate
    refuses when each configuration is created, although most refusals are inferred from a refused part."""
    report = explore(BOUNDS["ci-triples"])
    assert report.findings == {}, "\n".join(f"{k}: {f.minimal.violations}" for k, f in report.findings.items())
    everything = list(configurations(BOUNDS["ci-triples"]))
    refused = {c for c in everything if admitted(c) is not None}  # each created through the gate, none inferred
    assert (report.configurations, report.refused) == (len(everything), len(refused)), report.summary()
    assert report.runs == (len(everything) - len(refused)) * len(DELETERS) * 2, report.summary()
    # The inference: a configuration with a refused part one CriticalService smaller (most of the triples).
    inferred = [c for c in everything if any(Configuration(c.services[:i] + c.services[i + 1:]) in refused
                                             for i in range(len(c.services)))]
    assert len(inferred) == report.inferred > len(everything) // 2, report.summary()
    assert sum(len(c.services) == 3 for c in everything) == 165  # 9 services: 165 multisets of three


def test_the_processes_change_nothing_but_the_time():
    """--jobs 2 finds what one process finds, in the same order, with the same counts (the negative control without the
    gate, which finds something)."""
    bound = Bound(services=1, criteria=1, providers=("deploy",), criteria_menu=("finalizer", "deploy"), depth=0)
    factory = functools.partial(Cluster, gate=False)
    one, two = (explore(bound, deleters=("flux",), cluster_factory=factory, jobs=j) for j in (1, 2))
    assert one.findings and list(one.findings) == list(two.findings)
    assert attrs.evolve(one, seconds=0, jobs=0, findings={}) == attrs.evolve(two, seconds=0, jobs=0, findings={})


def _without_crd_edges(cs: Any, state: Any) -> Any:
    return [(m, w) for m, w in _TEARDOWN_SET(cs, state) if "CRD" not in w]


_TEARDOWN_SET = graph._teardown_set


def test_negative_control_without_the_crd_edge_the_explorer_finds_the_crd_cycle(monkeypatch):
    """The bug of issue 30 put back: the explorer, over two providers and two criteria, finds the stuck teardown
    and minimizes it to exactly the cycle through the Widget's CRD, for every deleter that should finish."""
    monkeypatch.setattr(graph, "_teardown_set", _without_crd_edges)
    bound = Bound(services=2, criteria=1, providers=("deploy", "widget"), criteria_menu=("crd", "deploy"), depth=0)
    report = explore(bound)
    found = {(f.minimal.deleter, f.minimal.replay): f.minimal for f in report.findings.values()}
    # kubectl once and helm without replay leave what they were refused, as documented; Argo CD never deletes the CRD
    # the cycle runs through, so the Deployment waiting for it stays under Argo CD anyway (§6); every other way must
    # finish.
    assert set(found) == ({(d, r) for d in DELETERS for r in (False, True)} - {("kubectl", False), ("helm", False)}
                          - {("argocd", False), ("argocd", True)}), report.summary()
    for m in found.values():
        assert m.config.services == CRD_CYCLE.services, m.config.label()
        assert m.properties == {"liveness"}
        assert any("deployments.apps a/d stays" in v.text for v in m.violations)


@pytest.mark.parametrize("deleter", ["argocd", "argocd-background"])
def test_under_argo_cd_the_crd_may_stay_and_what_waits_for_it_with_it(monkeypatch, deleter):
    """Argo CD never deletes a CRD: a teardown that leaves only the CRD (the provider waits for no Widget left) and one
    that leaves the CRD and what waits for it (a criterion on the CRD itself) are what the docs say (§6), not stuck;
    without that notion of done the oracle would call both stuck."""
    def judged(criterion: str) -> tuple[str, ...]:
        run = next(family(Configuration((Service("deploy", (criterion,)),)), deleter=deleter, replay=True, depth=0))
        assert not run.completed  # the CRD is still there
        return tuple(v.text for v in run.violations)

    assert judged("widgets") == () and judged("crd") == ()
    monkeypatch.setattr(oracle, "KEEP_CRDS", frozenset())
    only_crd, with_waiters = judged("widgets"), judged("crd")
    crd = "customresourcedefinitions.apiextensions.k8s.io widgets.ex.com stays"
    assert len(only_crd) == 1 and only_crd[0].startswith(crd), only_crd
    assert any(t.startswith("deployments.apps a/d stays") for t in with_waiters), with_waiters


def test_negative_control_without_the_gate_the_explorer_finds_an_unsafe_teardown():
    """With no gate, the Finalizer criterion's controller is deleted before the Widget it must finalize."""
    bound = Bound(services=1, criteria=1, providers=("deploy",), criteria_menu=("finalizer",), depth=0)
    report = explore(bound, deleters=("manifestwork",), cluster_factory=lambda **kw: Cluster(gate=False, **kw))
    assert {f.minimal.replay for f in report.findings.values()} == {False, True}, report.summary()
    for finding in report.findings.values():
        assert "safety" in finding.minimal.properties
        assert any("cs0's provider deployments.apps a/d" in v.text or "provider deployments.apps a/d of cs0" in v.text
                   for v in finding.minimal.violations), finding.minimal.violations


def test_the_crd_cycle_bundle_is_refused_at_create_naming_the_crd_edge(capsys):
    """The explorer's counterexample, as a user would apply it: exit 2, the cycle and its CRD step named."""
    assert main(["simulate", "-f", str(BUNDLES / "verify-crd-cycle.yaml"), "--client", "manifestwork"]) == 2
    err = capsys.readouterr().err
    assert "would close a dependency cycle: cs1 -> cs0 -> cs1" in err
    assert "cs0.spec.criteria[0] waits for its provider's CRD widgets.ex.com of cs1" in err


@pytest.mark.parametrize("client", ["kubectl", "manifestwork"])
def test_the_namespace_content_cycle_tears_down_with_deleters_that_delete_content(client):
    """tests/bundles/verify-namespace-cycle.yaml: a Widget in b waits for Deployment a/d, which waits for
    ConfigMap b/c. Whoever deletes the ConfigMap itself finishes (kubectl re-run, the garbage collector)."""
    repeat = ["--repeat", "30"] if client == "kubectl" else []
    assert main(["simulate", "-f", str(BUNDLES / "verify-namespace-cycle.yaml"), "--client", client, *repeat]) == 0


def test_the_namespace_content_cycle_stays_under_namespace_deletion_as_documented(capsys):
    """Deleting only the namespaces: b is refused while the Widget's criteria are unmet, a while the
    Deployment's are, and the ConfigMap the Deployment waits for is in b - the documented limit (§6)."""
    assert main(["simulate", "-f", str(BUNDLES / "verify-namespace-cycle.yaml"), "--client", "namespace",
                 "--interleaving", "-"]) == 1
    out = capsys.readouterr().out
    assert "STUCK: 7 of 7 objects remain" in out or "STUCK" in out
    for config in (NAMESPACE_CYCLE,):
        for replay in (False, True):
            run = run_one(config, ChoicePath(), deleter="namespace", replay=replay)
            assert not run.completed and run.violations == (), run.violations


def test_interleavings_are_every_choice_vector_to_the_depth():
    """paths() is an odometer over the first `depth` points: 3 x 2 vectors, then the canonical rest."""
    seen = []

    def run(path: ChoicePath) -> None:
        rng = ChoiceRandom(path)
        order = [0, 1, 2]
        rng.shuffle(order)
        seen.append((tuple(order), rng.uniform(0.5, 2.0), rng.uniform(0.0, 0.01)))

    assert [p.taken for p, _ in paths(run, depth=3)] == [
        [0, 0, 0], [0, 0, 1], [0, 1, 0], [0, 1, 1], [1, 0, 0], [1, 0, 1], [1, 1, 0], [1, 1, 1], [2, 0, 0], [2, 0, 1],
        [2, 1, 0], [2, 1, 1]]
    assert len({s[0] for s in seen}) == 6 and {s[1] for s in seen} == {0.5, 2.0} and {s[2] for s in seen} == {0.0}
    seen.clear()
    assert len(list(paths(run, depth=1))) == 3  # the first point only; the rest canonical


def test_bad_bounds_and_interleavings_are_one_line_errors(capsys):
    assert main(["verify", "--bound", "services=9"]) == 2
    assert capsys.readouterr().err.strip() == ("criticalsvc verify: --bound: services='9': expected an integer "
                                               "from 1 to 4")
    assert main(["simulate", "-f", str(BUNDLES / "verify-namespace-cycle.yaml"), "--client", "namespace",
                 "--interleaving", "0.99"]) == 2
    assert capsys.readouterr().err.strip().startswith("criticalsvc simulate: --interleaving: choice 2 is 99")


def test_the_bound_is_what_it_says():
    """The large bound: 63 single and 2016 pairs of CriticalServices, each with and without the label."""
    assert sum(1 for _ in configurations(parse_bound("large"))) == 2 * (63 + 63 * 64 // 2)
    assert parse_bound("large,depth=3").depth == 3 and parse_bound("ci").services == 1
    only = list(configurations(parse_bound("large,protected=only")))
    assert all(c.protected for c in only) and {c.services for c in only} == {
        c.services for c in configurations(parse_bound("large"))}


def test_a_finding_replays_from_its_bundle(tmp_path, capsys):
    """The bundle and command a finding prints reproduce the stuck teardown exactly."""
    bound = Bound(services=2, criteria=1, providers=("deploy", "widget"), criteria_menu=("cm", "deploy"), depth=0)
    run = next(r for r in family(NAMESPACE_CYCLE, deleter="namespace", replay=False, depth=0))
    assert bound.services == 2 and not run.completed
    from criticalsvc.verify.explorer import Finding

    path = tmp_path / "f.yaml"
    finding = Finding(run, run)
    path.write_text(finding.bundle(str(path)))
    command = finding.command(str(path)).split()
    assert command[:2] == ["criticalsvc", "simulate"]
    assert main(command[1:]) == 1
    assert "STUCK" in capsys.readouterr().out


def test_the_namespace_content_cycle_is_admitted_with_a_warning_naming_the_namespace_step():
    """The CREATE that closes it is admitted (kubectl, the ManifestWork agent, the garbage collector finish it) but
    warns that deleting only the namespaces never will, naming the object that goes only with its namespace."""
    from criticalsvc.commands.simulate import record_warnings
    from criticalsvc.manifests import load_path

    cluster = Cluster()
    warnings = record_warnings(cluster)
    cluster.load(load_path(str(BUNDLES / "verify-namespace-cycle.yaml")))
    assert [w.text for w in warnings] == [
        "deleting only the namespaces can never finish cs1 -> cs0 -> cs1: cs0.spec.criteria[0] waits for configmaps "
        "b/c, which goes only with namespace b (cs1's provider's); delete it first (design/criticalservice.md §6)"]


def test_the_command_prints_the_bound_and_writes_each_finding_as_a_bundle_that_replays(tmp_path, capsys):
    """`criticalsvc verify --no-gate` on a tiny bound: exit 1, the summary, one bundle per finding and its command,
    which `simulate` runs to the same stuck end; with the gate, the same bound finds nothing (exit 0)."""
    bound = ["--bound", "services=1,providers=deploy,criteria_menu=finalizer,depth=0", "--deleter", "manifestwork",
             "-q", "--out", str(tmp_path)]
    assert main(["verify", *bound, "--no-gate"]) == 1
    out = capsys.readouterr().out
    assert "1 configurations enumerated, 0 refused at CREATE" in out and "2 distinct minimized violation(s)" in out
    commands = [line.split("replay: ", 1)[1] for line in out.splitlines() if line.strip().startswith("replay: ")]
    assert len(commands) == 2 and sorted(p.name for p in tmp_path.iterdir()) == ["finding-001.yaml", "finding-002.yaml"]
    assert main([*commands[0].split()[1:], "--no-gate"]) == 1
    assert "STUCK" in capsys.readouterr().out
    assert main(["verify", *bound]) == 0
    assert "0 distinct minimized violation(s)" in capsys.readouterr().out


def test_a_manifestwork_held_by_a_protected_object_leaves_what_the_gate_refused_unless_replay_is_on(tmp_path, capsys):
    """tests/bundles/verify-manifestwork-held.yaml: without replay, what the agent was refused (a/d, namespace a,
    cs0) stays beside the labelled ConfigMap and its namespace; with replayDeletion only those two stay."""
    bundle = BUNDLES / "verify-manifestwork-held.yaml"
    assert main(["simulate", "-f", str(bundle), "--client", "manifestwork", "-o", "json"]) == 1
    remaining = sorted(h["object"]["name"] for h in json.loads(capsys.readouterr().out)["verdict"]["remaining"])
    assert remaining == ["a", "b", "c", "cs0", "d"]
    replayed = tmp_path / "replayed.yaml"
    replayed.write_text(bundle.read_text().replace("  criteria:\n", "  replayDeletion: WhenTearingDown\n  criteria:\n"))
    assert main(["simulate", "-f", str(replayed), "--client", "manifestwork", "-o", "json"]) == 1
    remaining = sorted(h["object"]["name"] for h in json.loads(capsys.readouterr().out)["verdict"]["remaining"])
    assert remaining == ["b", "c"]
