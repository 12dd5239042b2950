"""benchmarks/replay_real.py's ManifestWork columns: "stack gone" (the last object of the story) and
"ManifestWork gone" (the row's makespan), each against the ideal of its own run. Pure: no cluster."""

from __future__ import annotations

from benchmarks.replay_real import Outcome, _row, last_gone, stack_table


def test_stack_gone_is_the_last_object_of_the_story_not_the_manifestwork() -> None:
    gone_at = {"Deployment/d": 3.0, "Namespace/n": 5.0, "ManifestWork": 9.0, "AppliedManifestWork": 8.5}
    assert last_gone(gone_at, ["Deployment/d", "Namespace/n"]) == 5.0
    assert last_gone(gone_at, gone_at) == 9.0


def test_manifestwork_rows_give_both_ratios_against_the_ideal_of_each_run() -> None:
    outcomes = [Outcome(True, 12.0, 3, 1, stack_gone=8.0), Outcome(True, 20.0, 3, 1, stack_gone=9.0)]
    row = _row(("manifestwork", True), outcomes, [8.0, 6.0])
    assert row["makespanSeconds"] == 16.0 and row["ratioMean"] == 2.417 and row["ratioMax"] == 3.333
    assert row["stackGoneSeconds"] == 8.5 and row["stackRatioMean"] == 1.25 and row["stackRatioMax"] == 1.5
    other = _row(("kubectl", True), [Outcome(True, 9.0, 1, 1, stack_gone=9.0)], [8.0])
    table = stack_table([row, other], "title")
    lines = table.splitlines()
    assert len(lines) == 3, table  # title, header, the manifestwork row only
    assert lines[2].split() == ["on", "2/2", "7.00", "8.50", "1.250", "1.500", "16.00", "2.417", "3.333"]


def test_a_stuck_manifestwork_teardown_has_no_ratios() -> None:
    row = _row(("manifestwork", False), [Outcome(False, None, 2, 0, why="stuck")], [8.0])
    assert "stackGoneSeconds" not in row and "makespanSeconds" not in row
    assert stack_table([row], "t").splitlines()[2].split() == ["off", "0/1", "8.00", "stuck", "-", "-", "stuck", "-",
                                                             "-"]


def test_a_story_whose_crd_stays_is_done_without_it_and_timed_against_the_ideals_of_that_story() -> None:
    """Argo CD's case (the CRD stays): its bundle neither waits for the CRD nor orders anything by it, the ideals
    played on it never send the CRD's DELETE, and its row compares with the neutral ideal of that story."""
    from benchmarks import ideal
    from benchmarks.replay_real import Bundle, ideal_row, neutral_ideal, own_ideal
    from tests.realcluster.teardown import Story

    story = Story.make("t")
    crd = f"CustomResourceDefinition/{story.crd_name}"
    bundle = Bundle(story, extra=(("Application", "/apis/argoproj.io/v1alpha1/namespaces/argocd/applications/a"),),
                    stays=(crd,))
    assert crd in story.paths() and crd not in bundle.paths() and set(bundle.stayed()) == {crd}
    assert "Application" in bundle.paths() and not any(crd in v for v in bundle.dependents().values())
    assert crd not in ideal.neutral(bundle.story_paths(), bundle.dependents()).targets
    assert (neutral_ideal("argocd"), own_ideal("argocd", True), own_ideal("argocd", False)) == (
        "ideal-crd-stays", "ideal-argocd", "ideal-argocd-passes")
    assert neutral_ideal("helm") == "ideal"
    ideals = {name: Outcome(True, 6.0, 0, 0, workload_gone=w) for name, w in
              (("ideal", 9.0), ("ideal-crd-stays", 5.0), ("ideal-argocd", 6.0), ("ideal-argocd-passes", 10.0))}
    row = ideal_row(("argocd", True), [Outcome(True, 6.5, 3, 3, workload_gone=6.3)], [ideals])
    assert (row["neutralSeconds"], row["ratioNeutral"], row["ownSeconds"], row["ratioOwn"]) == (5.0, 1.26, 6.0, 1.05)
