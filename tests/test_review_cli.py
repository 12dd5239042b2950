"""`criticalsvc review`: the gate's answer against a snapshot, and one clear line for every bad input."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from criticalsvc.cli import main

EXAMPLES = Path(__file__).parent.parent / "api" / "examples"
STORY = str(EXAMPLES / "reference-story.yaml")
DELETE_PROVIDER = str(EXAMPLES / "reviews" / "delete-provider.json")
COLLECTION_ITEM = str(EXAMPLES / "reviews" / "delete-namespace-collection-item.json")
CLI = Path(sys.executable).parent / "criticalsvc"


def review_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["review", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def story_docs() -> list[dict[str, Any]]:
    with open(STORY) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def provider_review() -> dict[str, Any]:
    with open(DELETE_PROVIDER) as f:
        review: dict[str, Any] = json.load(f)
    return review


def without_crd_and_crs(tmp_path: Path) -> Path:
    docs = [d for d in story_docs()
            if d["kind"] not in ("CoolResource", "CustomResourceDefinition")]
    path = tmp_path / "after.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return path


# --- answers ------------------------------------------------------------------------------------------
def test_provider_delete_is_denied_on_the_reference_story(capsys):
    """The provider's DELETE against the reference story prints a 403 denial naming the service, exit 0."""
    code, out, err = review_cli(capsys, "--state", STORY, DELETE_PROVIDER)
    response = json.loads(out)["response"]
    assert code == 0 and err == ""
    assert response["uid"] == "9a4e5c0e-3f0b-4b6e-9b55-0c1d2e3f4a5b" and response["allowed"] is False
    assert response["status"]["code"] == 403 and response["status"]["reason"] == "Forbidden"
    assert "CriticalService for-finalizer-deployment" in response["status"]["message"]
    assert "(3 objects; first: cool-apps/alpha, cool-apps/beta, cool-apps/gamma)" in response["status"]["message"]


def test_provider_delete_is_allowed_once_crd_and_crs_are_gone(tmp_path, capsys):
    """With the CRD and its CRs removed from the snapshot the same review is allowed, exit 0."""
    code, out, _ = review_cli(capsys, "--state", str(without_crd_and_crs(tmp_path)), DELETE_PROVIDER)
    response = json.loads(out)["response"]
    assert code == 0 and response["allowed"] is True and "status" not in response
    assert response["auditAnnotations"] == {"rule": "criteria-met"}


def test_collection_item_review_is_denied_like_the_named_delete(capsys):
    """The namespace controller's deletecollection item (name "") gets the named delete's denial."""
    _, named, _ = review_cli(capsys, "--state", STORY, DELETE_PROVIDER)
    code, item, _ = review_cli(capsys, "--state", STORY, COLLECTION_ITEM)
    assert code == 0
    assert json.loads(item)["response"]["status"] == json.loads(named)["response"]["status"]


def test_kind_list_snapshot_works(tmp_path, capsys):
    """A `kind: List` snapshot, as `kubectl get -o yaml` writes it, gives the same answer as the stream."""
    listed = tmp_path / "list.yaml"
    listed.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": story_docs()}))
    code, out, _ = review_cli(capsys, "--state", str(listed), DELETE_PROVIDER)
    assert code == 0 and json.loads(out)["response"]["allowed"] is False
    assert "for-finalizer-deployment" in json.loads(out)["response"]["status"]["message"]


def test_json_list_snapshot_works(tmp_path, capsys):
    """A `kubectl get -o json` List snapshot works too."""
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": story_docs()}))
    code, out, _ = review_cli(capsys, "--state", str(listed), DELETE_PROVIDER)
    assert code == 0 and json.loads(out)["response"]["allowed"] is False


def test_snapshot_directory_works(tmp_path, capsys):
    """A directory of YAML files is read as one snapshot."""
    for i, doc in enumerate(story_docs()):
        (tmp_path / f"{i:02d}.yaml").write_text(yaml.safe_dump(doc))
    code, out, _ = review_cli(capsys, "--state", str(tmp_path), DELETE_PROVIDER)
    assert code == 0 and json.loads(out)["response"]["allowed"] is False


@pytest.mark.parametrize("argv", [[], ["-"]], ids=["default", "dash"])
def test_review_from_standard_input(monkeypatch, capsys, argv):
    """The review is read from standard input when no file (or `-`) is given."""
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(provider_review())))
    code, out, _ = review_cli(capsys, "--state", STORY, *argv)
    assert code == 0 and json.loads(out)["response"]["allowed"] is False


def test_snapshot_from_standard_input(monkeypatch, capsys):
    """`--state -` reads the snapshot from standard input."""
    with open(STORY) as f:
        monkeypatch.setattr(sys, "stdin", io.StringIO(f.read()))
    code, out, _ = review_cli(capsys, "--state", "-", DELETE_PROVIDER)
    assert code == 0 and json.loads(out)["response"]["allowed"] is False


# --- bad input: exit 2, one line naming what and where ---------------------------------------------------
def _review_with(mutate) -> str:
    review = provider_review()
    mutate(review)
    return json.dumps(review)


def _state_with(extra: str) -> str:
    return Path(STORY).read_text() + "---\n" + extra


BROKEN_CS = """\
apiVersion: criticalsvc.io/v1alpha1
kind: CriticalService
metadata: {name: broken}
spec:
  provider: {group: apps, resource: deployments, namespace: x, name: y}
  criteria:
  - {type: Finalizer, finalizer: {resource: pods}}
"""

# (id, state text or None for the story, review text or None for the provider review, expected stderr line)
BAD_INPUT = [
    ("bad-json", None, '{"apiVersion": "admission.k8s.io/v1",\n  kind', "review.json: line 2 column 3: not valid JSON: "
     "Expecting property name enclosed in double quotes"),
    ("wrong-api-version", None, _review_with(lambda r: r.update(apiVersion="admission.k8s.io/v1beta1")),
     "review.json: apiVersion: expected admission.k8s.io/v1, got 'admission.k8s.io/v1beta1'"),
    ("wrong-kind", None, _review_with(lambda r: r.update(kind="AdmissionResponse")),
     "review.json: kind: expected AdmissionReview, got 'AdmissionResponse'"),
    ("missing-uid", None, _review_with(lambda r: r["request"].pop("uid")), "review.json: request.uid: required"),
    ("missing-request", None, _review_with(lambda r: r.pop("request")), "review.json: request: required"),
    ("bad-operation", None, _review_with(lambda r: r["request"].update(operation="REMOVE")),
     "review.json: request.operation: must be one of CREATE, UPDATE, DELETE, CONNECT"),
    ("missing-resource", None, _review_with(lambda r: r["request"].pop("resource")),
     "review.json: request.resource: required"),
    ("old-object-not-object", None, _review_with(lambda r: r["request"].update(oldObject=[1])),
     "review.json: request.oldObject: must be an object or null"),
    ("review-not-object", None, "[1, 2]", "review.json: an AdmissionReview must be a JSON object"),
    ("state-without-api-version", "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\n"
     "kind: Namespace\nmetadata: {name: b}\n", None, "state.yaml: document 2: apiVersion: required"),
    ("state-invalid-yaml", "apiVersion: v1\nkind: Namespace\nmetadata: {name: a\n", None,
     "state.yaml: line 4: not valid YAML: expected ',' or '}', but got '<stream end>'"),
    ("state-broken-critical-service", _state_with(BROKEN_CS), None,
     "state.yaml: document 9: spec.criteria[0].finalizer.finalizerName: required"),
    ("state-document-not-mapping", "- a\n- b\n", None,
     "state.yaml: document 1: a manifest must be a mapping (an object)"),
    ("state-object-without-name", "apiVersion: v1\nkind: ConfigMap\nmetadata: {namespace: a}\n", None,
     "state.yaml: document 1: metadata.name: required"),
    ("state-cluster-scoped-with-namespace", "apiVersion: v1\nkind: Namespace\nmetadata: {name: a, namespace: b}\n",
     None, "state.yaml: document 1: metadata.namespace: Namespace is cluster-scoped"),
    ("state-bad-list-item", "apiVersion: v1\nkind: List\nitems:\n- {kind: Pod, metadata: {name: p}}\n", None,
     "state.yaml: document 1 items[0]: apiVersion: required"),
]


@pytest.mark.parametrize(("state", "review", "expected"), [pytest.param(s, r, e, id=i) for i, s, r, e in BAD_INPUT])
def test_bad_input_exits_2_with_one_line(tmp_path, monkeypatch, capsys, state, review, expected):
    """Each malformed input exits 2, prints nothing on stdout and one line on stderr naming what and where."""
    monkeypatch.chdir(tmp_path)  # so the messages carry the short relative names
    Path("state.yaml").write_text(state if state is not None else Path(STORY).read_text())
    Path("review.json").write_text(review if review is not None else json.dumps(provider_review()))
    code, out, err = review_cli(capsys, "--state", "state.yaml", "review.json")
    assert code == 2 and out == ""
    assert err.endswith("\n") and len(err.splitlines()) == 1
    assert err.startswith(f"criticalsvc review: {expected}")


@pytest.mark.parametrize(("argv", "expected"), [
    (["--state", STORY, "missing.json"], "criticalsvc review: missing.json: no such file"),
    (["--state", "nope.yaml", DELETE_PROVIDER], "criticalsvc review: nope.yaml: no such file"),
    (["--state", "-", "-"], "criticalsvc review: --state and the review cannot both be read from standard input"),
])
def test_missing_files_exit_2_with_one_line(tmp_path, monkeypatch, capsys, argv, expected):
    """A missing review or snapshot file (or stdin asked for twice) exits 2 with one line naming it."""
    monkeypatch.chdir(tmp_path)
    code, out, err = review_cli(capsys, *argv)
    assert (code, out, err) == (2, "", expected + "\n")


def test_missing_state_option_is_a_usage_error(capsys):
    """Without --state the command refuses with argparse's one-line usage error and exit 2."""
    with pytest.raises(SystemExit) as info:
        main(["review", DELETE_PROVIDER])
    assert info.value.code == 2
    assert "the following arguments are required: --state" in capsys.readouterr().err.splitlines()[-1]


# --- the installed console script --------------------------------------------------------------------------
def test_console_script_prints_the_denial():
    """The installed `criticalsvc` script prints the denial for the reference story and exits 0."""
    done = subprocess.run([str(CLI), "review", "--state", STORY, DELETE_PROVIDER], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0 and done.stderr == ""
    assert json.loads(done.stdout)["response"]["status"]["code"] == 403


def test_console_script_reads_stdin_and_reports_bad_input_in_one_line():
    """The script reads the review from stdin; a review without uid exits 2 with one line on stderr."""
    review = provider_review()
    del review["request"]["uid"]
    done = subprocess.run([str(CLI), "review", "--state", STORY], input=json.dumps(review), capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == "criticalsvc review: <stdin>: request.uid: required\n"


def _create_configmap_provider(tmp_path: Path) -> str:
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-create", "kind": {"group": "criticalsvc.io", "version": "v1alpha1", "kind": "CriticalService"},
        "resource": {"group": "criticalsvc.io", "version": "v1alpha1", "resource": "criticalservices"},
        "name": "keeps-config", "operation": "CREATE", "userInfo": {"username": "alice"},
        "object": {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService",
                   "metadata": {"name": "keeps-config"},
                   "spec": {"provider": {"group": "", "resource": "configmaps", "namespace": "finalizer-namespace",
                                         "name": "settings"},
                            "criteria": [{"type": "SpecificResource", "specificResource": {
                                "group": "apps", "resource": "deployments", "namespace": "finalizer-namespace",
                                "name": "finalizer-deployment"}}]}}}}
    path = tmp_path / "create.json"
    path.write_text(json.dumps(review))
    return str(path)


def test_review_answers_as_a_default_gate_which_routes_provider_types_itself(tmp_path, capsys):
    """A ConfigMap provider: a default `serve` routes configmaps itself (criticalsvc-providers) and warns nothing,
    so `review` warns nothing either; --no-manage-provider-webhooks answers as a gate run with that flag."""
    code, out, _ = review_cli(capsys, "--state", STORY, _create_configmap_provider(tmp_path))
    response = json.loads(out)["response"]
    assert code == 0 and response["allowed"] is True
    assert "warnings" not in response, response
    code, out, _ = review_cli(capsys, "--state", STORY, "--no-manage-provider-webhooks",
                              _create_configmap_provider(tmp_path))
    (warning,) = json.loads(out)["response"]["warnings"]
    assert warning.startswith("spec.provider: the gate does not manage its routes (--no-manage-provider-webhooks), "
                              "and the shipped configuration sends no DELETE of configmaps")
