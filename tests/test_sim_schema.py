"""criticalsvc.sim.schema: custom resources validated as kube-apiserver validates them, word for word.

The expected texts follow the upstream sources named in sim/schema's docstring (kube-openapi's messages,
kubeOpenAPIResultToFieldErrors, field.Error.ErrorBody, the CEL validator, errors.NewInvalid); the
Bogus-type case is the one measured on a real 1.37 API server (tests/test_clusters_scenarios.py
checks it on both backends). Then the stand-in answers such writes with that 422 before any webhook.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from criticalsvc.sim.apiserver.standin import StandIn
from criticalsvc.sim.schema.fielderrors import FieldError, aggregate, invalid_status
from criticalsvc.sim.schema.goformat import go_float
from criticalsvc.sim.schema.validation import served_schema, validate
from criticalsvc.sim.store import Store, gate_hook
from criticalsvc.sim.webhooks import RegisteredWebhook

ROOT = Path(__file__).resolve().parents[1]
CRD = yaml.safe_load((ROOT / "api" / "criticalservices.criticalsvc.io.yaml").read_text(encoding="utf-8"))
SCHEMA = served_schema(CRD, "v1alpha1")
NOT_CHECKED = ("<nil>: Invalid value: null: some validation rules were not checked because the object was "
               "invalid; correct the existing errors to complete validation")
GROUP_PATTERN = r"^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


def service(*criteria: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """A valid CriticalService (one SpecificResource criterion unless others are given)."""
    return {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": "cs"},
            "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": "ops", "name": "ctrl"},
                     "criteria": list(criteria) or [{"type": "SpecificResource", "specificResource": {
                         "group": "", "resource": "configmaps", "namespace": "ops", "name": "keep"}}],
                     **spec}}


def errors(obj: dict[str, Any], old: dict[str, Any] | None = None, schema: Any = None, **kw: Any) -> list[str]:
    return [str(e) for e in validate(obj, schema if schema is not None else SCHEMA, old, **kw)]


def examples() -> list[dict[str, Any]]:
    found = []
    for path in sorted((ROOT / "api" / "examples").glob("*.yaml")):
        found += [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8"))
                  if isinstance(d, dict) and d.get("kind") == "CriticalService"]
    return found


# --- the project's CRD ------------------------------------------------------------------------------------
def test_every_example_criticalservice_is_valid() -> None:
    found = examples()
    assert len(found) >= 3
    for doc in found:
        assert errors(doc) == [], doc["metadata"]["name"]


def test_an_unsupported_criterion_type_is_the_measured_error() -> None:
    """An enum miss (blocking: the CEL rules are skipped, with the error saying so) and minProperties."""
    found = validate(service({"type": "Bogus"}), SCHEMA)
    assert [str(e) for e in found] == [
        "spec.criteria[0]: Invalid value: 1: spec.criteria[0] in body should have at least 2 properties",
        'spec.criteria[0].type: Unsupported value: "Bogus": supported values: "Finalizer", "SpecificResource", '
        '"Resources"',
        NOT_CHECKED,
    ]
    status = invalid_status("criticalsvc.io", "CriticalService", "cs", found)
    assert status["code"] == 422 and status["reason"] == "Invalid" and status["status"] == "Failure"
    assert status["message"] == 'CriticalService.criticalsvc.io "cs" is invalid: [' + ", ".join(map(str, found)) + "]"
    assert status["details"]["causes"][1] == {
        "reason": "FieldValueNotSupported", "field": "spec.criteria[0].type",
        "message": 'Unsupported value: "Bogus": supported values: "Finalizer", "SpecificResource", "Resources"'}
    assert {k: status["details"][k] for k in ("name", "group", "kind")} == {
        "name": "cs", "group": "criticalsvc.io", "kind": "CriticalService"}


def test_cel_rules_name_the_member_with_the_message_expression() -> None:
    """x-kubernetes-validations with fieldPath and messageExpression; objects omit the value."""
    wrong = {"type": "Finalizer", "specificResource": {"resource": "configmaps", "name": "x"}}
    assert errors(service(wrong)) == [
        "spec.criteria[0].finalizer: Invalid value: required when type is Finalizer",
        "spec.criteria[0].specificResource: Invalid value: must not be set when type is Finalizer",
    ]
    requirement = {"key": "app", "operator": "In"}
    resources = {"type": "Resources", "resources": {"resource": "pods",
                                                    "selector": {"matchExpressions": [requirement]}}}
    assert errors(service(resources)) == [
        "spec.criteria[0].resources.selector.matchExpressions[0].values: Invalid value: must be a non-empty list "
        "of strings for In"]
    requirement.update(operator="Exists", values=["x"])
    assert errors(service(resources)) == [
        "spec.criteria[0].resources.selector.matchExpressions[0].values: Invalid value: must be empty for Exists"]


def test_pattern_is_not_blocking_so_the_rules_still_run() -> None:
    doc = service({"type": "Finalizer", "specificResource": {"resource": "configmaps", "name": "x"}})
    doc["spec"]["provider"]["group"] = "Apps"
    assert errors(doc) == [
        f"spec.provider.group: Invalid value: \"Apps\": spec.provider.group in body should match '{GROUP_PATTERN}'",
        "spec.criteria[0].finalizer: Invalid value: required when type is Finalizer",
        "spec.criteria[0].specificResource: Invalid value: must not be set when type is Finalizer",
    ]


def test_required_type_length_and_list_bounds() -> None:
    doc = service()
    del doc["spec"]["provider"]
    assert errors(doc) == ["spec.provider: Required value", NOT_CHECKED]

    doc = service({"type": "x" * 17, "finalizer": {"resource": "r", "finalizerName": "f"}})
    assert errors(doc)[:2] == ["spec.criteria[0].type: Too long: may not be more than 16 bytes",
                               'spec.criteria[0].type: Unsupported value: "xxxxxxxxxxxxxxxxx": supported values: '
                               '"Finalizer", "SpecificResource", "Resources"']

    doc = service()
    doc["spec"]["provider"]["name"] = 5
    assert errors(doc) == ['spec.provider.name: Invalid value: "integer": spec.provider.name in body must be of '
                           'type string: "integer"', NOT_CHECKED]

    doc = service()
    doc["spec"]["provider"]["name"] = ""
    assert errors(doc) == ['spec.provider.name: Invalid value: "": spec.provider.name in body should be at least 1 '
                           "chars long"]

    doc = service()
    doc["spec"]["criteria"] = []
    assert errors(doc) == ["spec.criteria: Invalid value: 0: spec.criteria in body should have at least 1 items"]

    doc = service()
    doc["spec"]["criteria"] *= 65
    assert errors(doc) == ["spec.criteria: Too many: 65: must have at most 64 items", NOT_CHECKED]

    criterion = {"type": "Finalizer", "finalizer": {"resource": "r", "finalizerName": "f"},
                 "resources": {"resource": "pods"}, "condition": "true"}
    assert errors(service(criterion)) == ["spec.criteria[0]: Too many: 4: must have at most 3 items", NOT_CHECKED]


def test_pruned_fields_and_nulls_are_not_errors() -> None:
    """Undeclared fields and non-nullable nulls are dropped before validation, as the real server does."""
    criterion = {"type": "Finalizer", "finalizer": {"resource": "r", "finalizerName": "f"}, "note": "pruned"}
    doc = service(criterion, extra={"x": 1})
    doc["spec"]["provider"]["namespace"] = None
    assert errors(doc) == []
    doc["spec"]["provider"]["name"] = None  # pruned, so now missing: neither name nor selector (a CEL rule)
    assert errors(doc) == ["spec.provider: Invalid value: set exactly one of name and selector"]


def test_status_writes_are_checked_against_the_status_schema() -> None:
    """The status subresource validates `status` alone: paths under status., messages relative to it."""
    old = service()
    new = copy.deepcopy(old)
    new["status"] = {"criteriaCount": -1, "conditions": [
        {"type": "Ready", "status": "Maybe", "lastTransitionTime": "yesterday", "reason": "Enforcing", "message": ""}]}
    assert errors(new, old, status_only=True) == [
        'status.conditions[0].status: Unsupported value: "Maybe": supported values: "True", "False", "Unknown"',
        'status.conditions[0].lastTransitionTime: Invalid value: "yesterday": conditions[0].lastTransitionTime in '
        'body must be of type date-time: "yesterday"',
        "status.criteriaCount: Invalid value: -1: criteriaCount in body should be greater than or equal to 0",
        NOT_CHECKED,
    ]
    new["status"] = {"criteriaCount": 2 ** 31, "conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": "2026-07-01T10:00:00Z", "reason": "Enforcing",
         "message": "ok"}]}
    assert errors(new, old, status_only=True) == [
        'status: Invalid value: "": Checked value must be of type integer with format int32 in criteriaCount']
    # The spec is not the status subresource's business (and is unchanged anyway).
    new["status"]["criteriaCount"] = 1
    new["spec"]["provider"]["group"] = "Apps"
    assert errors(new, old, status_only=True) == []


def test_updates_ratchet_what_they_leave_unchanged() -> None:
    """CRDValidationRatcheting: an invalid value stored earlier is no error while it is left alone."""
    old = service()
    old["spec"]["provider"]["group"] = "Apps"
    relabelled = copy.deepcopy(old)
    relabelled["metadata"]["labels"] = {"a": "b"}
    assert errors(relabelled, old) == []
    renamed = copy.deepcopy(old)
    renamed["spec"]["provider"]["name"] = "other"  # a sibling changes; group itself is unchanged
    assert errors(renamed, old) == []
    regrouped = copy.deepcopy(old)
    regrouped["spec"]["provider"]["group"] = "Apps2"
    assert errors(regrouped, old) == [
        f"spec.provider.group: Invalid value: \"Apps2\": spec.provider.group in body should match '{GROUP_PATTERN}'"]
    # Inside an atomic list nothing correlates: a changed list is checked whole.
    bad = {"type": "Finalizer", "specificResource": {"resource": "configmaps", "name": "x"}}
    old = service(bad)
    assert errors(copy.deepcopy(old), old) == []
    grown = service(bad, {"type": "SpecificResource", "specificResource": {"resource": "configmaps", "name": "y"}})
    assert errors(grown, old) == [
        "spec.criteria[0].finalizer: Invalid value: required when type is Finalizer",
        "spec.criteria[0].specificResource: Invalid value: must not be set when type is Finalizer",
    ]


# --- small schemas ------------------------------------------------------------------------------------------
def obj_schema(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": {"spec": {"type": "object", "properties": properties}}}


def test_numbers_nullable_int_or_string_and_maps() -> None:
    schema = obj_schema(
        ratio={"type": "number", "minimum": 0.5, "exclusiveMaximum": True, "maximum": 1000000},
        count={"type": "integer", "maximum": 3, "multipleOf": 2},
        note={"type": "string", "nullable": True},
        port={"x-kubernetes-int-or-string": True},
        labels={"type": "object", "maxProperties": 1, "additionalProperties": {"type": "string", "maxLength": 1}},
        mode={"type": "string", "enum": ["a", 1]},
    )
    doc = {"spec": {"ratio": 1e6, "count": 5, "note": None, "port": True, "labels": {"k": "vv", "j": "w"},
                    "mode": "b"}}
    assert errors(doc, schema=schema) == [
        "spec.ratio: Invalid value: 1e+06: spec.ratio in body should be less than 1e+06",
        "spec.count: Invalid value: 5: spec.count in body should be a multiple of 2",
        "spec.count: Invalid value: 5: spec.count in body should be less than or equal to 3",
        'spec.port: Invalid value: "boolean": spec.port in body must be of type integer,string: "boolean"',
        "spec.labels: Too many: 2: must have at most 1 item",
        "spec.labels.k: Too long: may not be more than 1 byte",
        'spec.mode: Unsupported value: "b": supported values: "a", "1"',
        NOT_CHECKED,
    ]
    doc["spec"] = {"ratio": 0.25, "note": "fine", "port": "http", "labels": {"k": "v"}, "mode": "a"}
    assert errors(doc, schema=schema) == [
        "spec.ratio: Invalid value: 0.25: spec.ratio in body should be greater than or equal to 0.5"]
    doc["spec"] = {"note": None, "port": 8080}
    assert errors(doc, schema=schema) == []
    assert errors({"spec": {"count": None}}, schema=schema) == []  # a non-nullable null is pruned
    assert errors({"spec": {"labels": {"k": None}}}, schema=schema) == []
    assert errors({"spec": []}, schema=schema) == [
        'spec: Invalid value: "array": spec in body must be of type object: "array"', NOT_CHECKED]


def test_cel_reasons_scalars_root_rules_and_transition_rules() -> None:
    schema: dict[str, Any] = {
        "type": "object",
        "x-kubernetes-validations": [{"rule": "self.spec.a != 'root'", "message": "a must not be root "}],
        "properties": {"spec": {"type": "object", "properties": {
            "a": {"type": "string", "x-kubernetes-validations": [{"rule": "self.startsWith('x')"}]},
            "b": {"type": "integer", "x-kubernetes-validations": [
                {"rule": "self == oldSelf", "message": "b is immutable", "reason": "FieldValueForbidden"}]},
            "m": {"type": "object", "additionalProperties": {"type": "integer", "x-kubernetes-validations": [
                {"rule": "self < 10", "messageExpression": "'too big: ' + string(self)"}]}},
            "u": {"type": "string", "x-kubernetes-validations": [{"rule": "isURL(self)"}]},  # not in cel-python
        }}},
    }
    assert errors({"spec": {"a": "root", "b": 1, "m": {"k": 12}, "u": "?"}}, schema=schema) == [
        "<nil>: Invalid value: a must not be root",
        "spec.a: Invalid value: \"root\": failed rule: self.startsWith('x')",
        "spec.m[k]: Invalid value: 12: too big: 12",
    ]
    old = {"spec": {"a": "xa", "b": 1}}
    assert errors({"spec": {"a": "xa", "b": 2}}, old, schema=schema) == ["spec.b: Forbidden: b is immutable"]
    assert errors({"spec": {"a": "xa", "b": 1}}, old, schema=schema) == []
    # Evaluation errors are reported with the node's type as the value.
    schema["properties"]["spec"]["x-kubernetes-validations"] = [{"rule": "self.missing == 1"}]
    assert errors({"spec": {"a": "xa"}}, schema=schema) == [
        'spec: Invalid value: "object": no such key: missing evaluating rule: self.missing == 1']


def test_messages_and_status_format_like_go() -> None:
    one = FieldError("FieldValueRequired", "spec.x")
    assert aggregate([one, one]) == "spec.x: Required value"
    status = invalid_status("example.com", "Widget", 'w"1', [one, one])
    assert status["message"] == 'Widget.example.com "w\\"1" is invalid: spec.x: Required value'
    assert len(status["details"]["causes"]) == 2
    assert str(FieldError("FieldValueInvalid", "f", {"b": [1.0, None], "a": "<"}, "d")) == \
        'f: Invalid value: {"a":"\\u003c","b":[1,null]}: d'
    assert str(FieldError("FieldValueInvalid", "f", "tab\there\x01")) == 'f: Invalid value: "tab\\there\\x01"'
    assert [go_float(v) for v in (1e6, 123456.0, 1.5, 1e-5, 0.0001, -2.0)] == [
        "1e+06", "123456", "1.5", "1e-05", "0.0001", "-2"]


# --- the stand-in ---------------------------------------------------------------------------------------------
CS = "/apis/criticalsvc.io/v1alpha1/criticalservices"


def reference_story_service() -> dict[str, Any]:
    docs = yaml.safe_load_all((ROOT / "api" / "examples" / "reference-story.yaml").read_text(encoding="utf-8"))
    return next(d for d in docs if isinstance(d, dict) and d.get("kind") == "CriticalService")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_the_stand_in_answers_422_before_the_webhook_and_still_creates_valid_ones() -> None:
    store = Store(clock=time.time)
    store.create(CRD)
    reviewed: list[str] = []
    gate = gate_hook(store)

    def hook(review: dict[str, Any]) -> dict[str, Any]:
        reviewed.append(f"{review['request']['operation']} {review['request']['name']}")
        return gate(review)

    store.webhooks.append(RegisteredWebhook(hook))
    server = StandIn(store)
    bogus = service({"type": "Bogus"})
    bogus["metadata"]["name"] = "bogus"
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=server.app), base_url="http://standin") as client:
        try:
            refused = await client.post(CS, json=bogus)
            created = await client.post(CS, json=reference_story_service())
            name = created.json()["metadata"]["name"]
            bad_update = created.json()
            bad_update["spec"]["provider"]["name"] = "a/b"
            put = await client.put(f"{CS}/{name}", json=bad_update)
            status = await client.patch(f"{CS}/{name}/status", headers={"Content-Type": "application/merge-patch+json"},
                                        content=b'{"status":{"unmetCriteria":-2}}')
            missing = await client.get(f"{CS}/bogus")
        finally:
            await server.stop()
    assert refused.status_code == 422, refused.text
    body = refused.json()
    assert (body["kind"], body["status"], body["reason"], body["code"]) == ("Status", "Failure", "Invalid", 422)
    assert body["message"].startswith('CriticalService.criticalsvc.io "bogus" is invalid: [')
    assert {"reason": "FieldValueNotSupported", "field": "spec.criteria[0].type",
            "message": 'Unsupported value: "Bogus": supported values: "Finalizer", "SpecificResource", "Resources"'} \
        in body["details"]["causes"]
    assert (body["details"]["kind"], body["details"]["group"], body["details"]["name"]) == (
        "CriticalService", "criticalsvc.io", "bogus")
    assert missing.status_code == 404
    assert created.status_code == 201, created.text
    assert created.json()["spec"]["enforcement"] == "Enforce"  # defaulted, then validated
    assert put.status_code == 422 and put.json()["details"]["causes"] == [{
        "reason": "FieldValueInvalid", "field": "spec.provider.name",
        "message": "Invalid value: \"a/b\": spec.provider.name in body should match '^[^/]+$'"}]
    assert status.status_code == 422 and status.json()["message"] == (
        f'CriticalService.criticalsvc.io "{name}" is invalid: status.unmetCriteria: Invalid value: -2: '
        "unmetCriteria in body should be greater than or equal to 0")
    assert reviewed == [f"CREATE {name}"]  # the refused writes never reached the webhook
