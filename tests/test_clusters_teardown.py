"""The reference story torn down on both clusters (the stand-in and the real control plane), through
the gate registered as a user registers it: the safe order comes from the API server calling the
gate, and the namespace controller and garbage collector do their part."""

from __future__ import annotations

from tests.backends import Backend, provider_webhook
from tests.realcluster.teardown import Observer, RepeatingDeleter, Story, apply_story


def test_reference_story_all_at_once_with_a_retrying_deleter(cluster: Backend) -> None:
    """Everything deleted at once, refusals re-sent until done: all of it goes, providers after their dependents."""
    story = Story.make("mw")
    apply_story(cluster.kubectl, cluster.admin, story)
    observer = Observer(cluster.admin, story.paths())
    with cluster.finalizer_controller(story):
        observer.start()
        try:
            deleter = RepeatingDeleter(cluster.admin, story.paths())
            finished = deleter.run(timeout=180)
        finally:
            observer.stop()
    assert finished, f"teardown did not finish; still refused: {[a.message for a in deleter.refused()[-3:]]}"
    assert observer.order_violations(story.dependents()) == []
    refused = {a.key for a in deleter.refused()}
    assert f"Deployment/{story.name('finalizer-deployment')}" in refused, "the gate never held the provider back"
    # Every refusal reached the client as the API server forwards a webhook denial: 403 with the gate's words.
    for attempt in deleter.refused():
        assert attempt.message.startswith('admission webhook "') and "denied the request" in attempt.message


def test_kubectl_delete_f_prints_the_denials_and_repeated_runs_finish(cluster: Backend) -> None:
    """`kubectl delete -f` once: the gate's Forbidden lines verbatim, exit 1; run again until it exits 0."""
    story = Story.make("kd")
    apply_story(cluster.kubectl, cluster.admin, story)
    ns, deploy = story.namespace, story.name("finalizer-deployment")
    with cluster.finalizer_controller(story):
        first = cluster.kubectl("delete", "-f", "-", "--wait=false", input=story.text)
        assert first.returncode == 1, first
        assert ('Error from server (Forbidden): error when deleting "STDIN": admission webhook '
                f'"providers.gate.criticalsvc.io" denied the request: deployments.apps {ns}/{deploy} '
                f"may not be deleted yet: CriticalService {story.critical_service} protects it until: "
                f"coolresources.{story.group} objects still carry finalizer {story.finalizer} (3 objects; first: "
                f"{story.cr_namespace}/alpha, {story.cr_namespace}/beta, {story.cr_namespace}/gamma); "
                f"customresourcedefinitions.apiextensions.k8s.io {story.crd_name} still exists") in \
            provider_webhook(first.stderr)
        assert f'customresourcedefinition.apiextensions.k8s.io "{story.crd_name}" deleted' in first.stdout
        # kubectl does not retry a denied delete; the user runs it again until nothing is left.
        runs = 1
        while True:
            again = cluster.kubectl("delete", "-f", "-", "--wait=false", "--ignore-not-found", input=story.text)
            runs += 1
            if again.returncode == 0:
                break
            assert "may not be deleted yet" in again.stderr, again
            assert runs < 120, f"still refused after {runs} runs: {again.stderr}"
            import time

            time.sleep(0.5)
    assert not any(cluster.admin.exists(p) for p in story.paths().values())


def test_kubectl_get_criticalservices_shows_the_printer_columns(cluster: Backend) -> None:
    """`kubectl get csvc` prints the CRD's columns (a server-side Table), with the gate's status filled in."""
    story = Story.make("pc")
    apply_story(cluster.kubectl, cluster.admin, story)
    out = cluster.kubectl("get", "csvc", story.critical_service)
    assert out.returncode == 0, out.stderr
    header = out.stdout.splitlines()[0].split()
    assert header[:2] == ["NAME", "PROVIDER"], out.stdout
    assert "AGE" in header
