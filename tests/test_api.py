"""Parsing a CriticalService: the typed values, and one precise field-path error per broken rule."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from criticalsvc.api import (
    CRITICAL_SERVICES,
    Enforcement,
    FinalizerCriterion,
    GroupResource,
    ObjectRef,
    ResourcesCriterion,
    SpecificResourceCriterion,
    parse_critical_service,
)
from criticalsvc.errors import InvalidInput, InvalidSpec


def base() -> dict[str, Any]:
    """The reference story's CriticalService plus a Resources criterion: valid as it stands."""
    return {
        "apiVersion": "criticalsvc.io/v1alpha1",
        "kind": "CriticalService",
        "metadata": {"name": "for-finalizer-deployment", "uid": "u-1", "labels": {"team": "storage"}},
        "spec": {
            "provider": {"group": "apps", "resource": "deployments", "namespace": "finalizer-namespace",
                         "name": "finalizer-deployment"},
            "criteria": [
                {"type": "SpecificResource",
                 "specificResource": {"group": "apiextensions.k8s.io", "resource": "CustomResourceDefinition",
                                      "name": "coolresources.my.crd.group"}},
                {"type": "Finalizer",
                 "finalizer": {"group": "my.crd.group", "resource": "coolresources",
                               "finalizerName": "my.crd.group/super-important"}},
                {"type": "Resources",
                 "resources": {"group": "", "resource": "pods", "namespace": "app",
                               "selector": {"matchLabels": {"app": "web"},
                                            "matchExpressions": [{"key": "tier", "operator": "In",
                                                                  "values": ["front"]}]}}},
            ],
        },
    }


def test_parses_the_reference_story_service():
    """A valid CR becomes typed criteria in order, with Enforce as the default enforcement."""
    cs = parse_critical_service(base())
    assert cs.name == "for-finalizer-deployment" and cs.uid == "u-1"
    assert cs.provider == ObjectRef(GroupResource("apps", "deployments"), "finalizer-namespace", "finalizer-deployment")
    assert cs.enforcement is Enforcement.ENFORCE
    crd, fin, res = cs.criteria
    assert crd == SpecificResourceCriterion(
        ObjectRef(GroupResource("apiextensions.k8s.io", "CustomResourceDefinition"), "", "coolresources.my.crd.group"))
    assert fin == FinalizerCriterion(GroupResource("my.crd.group", "coolresources"), "my.crd.group/super-important")
    assert isinstance(res, ResourcesCriterion) and res.namespace == "app"
    assert res.selector.matches({"app": "web", "tier": "front"}) and not res.selector.matches({"app": "web"})
    assert cs.ref == ObjectRef(CRITICAL_SERVICES, "", "for-finalizer-deployment")
    assert cs.labels == {"team": "storage"}


def test_reads_enforcement_status_and_deletion_timestamp():
    """enforcement Warn, status.providerUID and metadata.deletionTimestamp are carried into the value."""
    obj = base()
    obj["spec"]["enforcement"] = "Warn"
    obj["status"] = {"providerUID": "p-uid"}
    obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    cs = parse_critical_service(obj)
    assert cs.enforcement is Enforcement.WARN
    assert cs.provider_uid == "p-uid"
    assert cs.deletion_timestamp == "2026-01-01T00:00:00Z"


def test_resources_without_namespace_or_selector_means_everywhere_and_everything():
    """A Resources criterion with no namespace and no selector covers every object of its type."""
    obj = base()
    obj["spec"]["criteria"] = [{"type": "Resources", "resources": {"resource": "configmaps"}}]
    (c,) = parse_critical_service(obj).criteria
    assert isinstance(c, ResourcesCriterion)
    assert c.group_resource == GroupResource("", "configmaps") and c.namespace is None
    assert c.selector.is_empty and c.selector.matches({})
    assert str(c) == "no configmaps exists"


def test_string_forms_follow_kubectl():
    """GroupResource and ObjectRef print as kubectl spells them (`deployments.apps ns/name`, `pods`)."""
    assert str(GroupResource("apps", "deployments")) == "deployments.apps"
    assert str(GroupResource("", "pods")) == "pods"
    assert str(ObjectRef(GroupResource("apps", "deployments"), "ns", "d")) == "deployments.apps ns/d"
    assert str(ObjectRef(GroupResource("", "namespaces"), "", "ns")) == "namespaces ns"


def _set(path: tuple[Any, ...], value: Any):
    def mutate(obj: dict[str, Any]) -> None:
        target = obj
        for key in path[:-1]:
            target = target[key]
        if value is _DELETE:
            del target[path[-1]]
        else:
            target[path[-1]] = value
    return mutate


_DELETE = object()
C0, C1, C2 = ("spec", "criteria", 0), ("spec", "criteria", 1), ("spec", "criteria", 2)
SEL = (*C2, "resources", "selector")

# (id, mutation, expected one-line error `path: problem`)
BROKEN = [
    ("finalizer-name-missing", _set((*C1, "finalizer", "finalizerName"), _DELETE),
     "spec.criteria[1].finalizer.finalizerName: required"),
    ("finalizer-name-empty", _set((*C1, "finalizer", "finalizerName"), ""),
     "spec.criteria[1].finalizer.finalizerName: required"),
    ("finalizer-name-not-a-string", _set((*C1, "finalizer", "finalizerName"), 7),
     "spec.criteria[1].finalizer.finalizerName: must be a string"),
    ("finalizer-name-invalid", _set((*C1, "finalizer", "finalizerName"), "has spaces/x y"),
     "spec.criteria[1].finalizer.finalizerName: 'has spaces/x y' is not a valid finalizer name"),
    ("type-and-other-member", _set((*C1, "resources"), {"resource": "pods"}),
     "spec.criteria[1].resources: must not be set when type is Finalizer"),
    ("member-of-type-missing", _set((*C0, "specificResource"), _DELETE),
     "spec.criteria[0].specificResource: required when type is SpecificResource"),
    ("member-of-type-null", _set((*C2, "resources"), None),
     "spec.criteria[2].resources: required when type is Resources"),
    ("unknown-type", _set((*C0, "type"), "Pods"),
     "spec.criteria[0].type: must be one of Finalizer, SpecificResource, Resources"),
    ("type-missing", _set((*C0, "type"), _DELETE),
     "spec.criteria[0].type: must be one of Finalizer, SpecificResource, Resources"),
    ("criterion-not-object", _set(C1, "Finalizer"), "spec.criteria[1]: must be an object"),
    ("unknown-field-in-spec", _set(("spec", "priority"), 1), "spec.priority: unknown field"),
    ("unknown-field-in-criterion", _set((*C0, "comment"), "x"), "spec.criteria[0].comment: unknown field"),
    ("unknown-field-in-finalizer", _set((*C1, "finalizer", "namespace"), "a"),
     "spec.criteria[1].finalizer.namespace: unknown field"),
    ("unknown-field-in-resources", _set((*C2, "resources", "name"), "a"),
     "spec.criteria[2].resources.name: unknown field"),
    ("unknown-field-in-provider", _set(("spec", "provider", "kind"), "Deployment"),
     "spec.provider.kind: unknown field"),
    ("bad-enforcement", _set(("spec", "enforcement"), "enforce"), "spec.enforcement: must be Enforce or Warn"),
    ("criteria-empty", _set(("spec", "criteria"), []), "spec.criteria: required: a non-empty list"),
    ("criteria-missing", _set(("spec", "criteria"), _DELETE), "spec.criteria: required: a non-empty list"),
    ("spec-missing", _set(("spec",), _DELETE), "spec: required"),
    ("metadata-missing", _set(("metadata",), _DELETE), "metadata: required"),
    ("name-missing", _set(("metadata", "name"), _DELETE), "metadata.name: required"),
    ("namespaced", _set(("metadata", "namespace"), "default"),
     "metadata.namespace: CriticalService is cluster-scoped; remove the namespace"),
    ("provider-missing", _set(("spec", "provider"), _DELETE), "spec.provider: required"),
    # Issue 11: a provider is one object by name or a set by selector, so a missing name is that choice.
    ("provider-name-missing", _set(("spec", "provider", "name"), _DELETE),
     "spec.provider: set exactly one of name and selector"),
    ("provider-name-empty", _set(("spec", "provider", "name"), ""), "spec.provider.name: required"),
    ("provider-resource-missing", _set(("spec", "provider", "resource"), _DELETE),
     "spec.provider.resource: required"),
    ("provider-name-with-slash", _set(("spec", "provider", "name"), "a/b"),
     "spec.provider.name: 'a/b' is not a valid object name"),
    ("provider-bad-group", _set(("spec", "provider", "group"), "Apps_"),
     "spec.provider.group: 'Apps_' is not a valid API group"),
    ("provider-group-not-string", _set(("spec", "provider", "group"), 1),
     'spec.provider.group: must be a string ("" for the core group)'),
    ("provider-resource-with-group", _set(("spec", "provider", "resource"), "deployments.apps"),
     "spec.provider.resource: 'deployments.apps' is not a resource name or Kind"),
    ("provider-bad-namespace", _set(("spec", "provider", "namespace"), "Bad_NS"),
     "spec.provider.namespace: 'Bad_NS' is not a valid namespace name"),
    ("specific-name-missing", _set((*C0, "specificResource", "name"), _DELETE),
     "spec.criteria[0].specificResource.name: required"),
    ("selector-not-object", _set(SEL, ["app=web"]),
     "spec.criteria[2].resources.selector: must be an object with matchLabels and/or matchExpressions"),
    ("selector-unknown-field", _set((*SEL, "matchFields"), []),
     "spec.criteria[2].resources.selector.matchFields: unknown field"),
    ("selector-bad-operator", _set((*SEL, "matchExpressions", 0, "operator"), "Equals"),
     "spec.criteria[2].resources.selector.matchExpressions[0].operator: must be one of In, NotIn, Exists, "
     "DoesNotExist"),
    ("selector-in-without-values", _set((*SEL, "matchExpressions", 0, "values"), []),
     "spec.criteria[2].resources.selector.matchExpressions[0].values: must be a non-empty list of strings for In"),
    ("selector-exists-with-values", _set((*SEL, "matchExpressions", 0), {"key": "tier", "operator": "Exists",
                                                                          "values": ["x"]}),
     "spec.criteria[2].resources.selector.matchExpressions[0].values: must be empty for Exists"),
    ("selector-key-missing", _set((*SEL, "matchExpressions", 0, "key"), _DELETE),
     "spec.criteria[2].resources.selector.matchExpressions[0].key: required"),
    ("selector-expressions-not-list", _set((*SEL, "matchExpressions"), {"key": "a"}),
     "spec.criteria[2].resources.selector.matchExpressions: must be a list"),
    ("selector-label-value-not-string", _set((*SEL, "matchLabels"), {"app": 1}),
     "spec.criteria[2].resources.selector.matchLabels: must be a map of strings"),
    ("too-many-criteria", lambda o: o["spec"].__setitem__("criteria", o["spec"]["criteria"][:1] * 65),
     "spec.criteria: Too many: 65: must have at most 64 items"),
    ("too-many-expressions", _set((*SEL, "matchExpressions"), [{"key": "k", "operator": "Exists"}] * 33),
     "spec.criteria[2].resources.selector.matchExpressions: Too many: 33: must have at most 32 items"),
]


@pytest.mark.parametrize(("mutate", "expected"), [pytest.param(m, e, id=i) for i, m, e in BROKEN])
def test_each_broken_rule_is_one_error_naming_its_field(mutate, expected):
    """A spec breaking one API rule raises InvalidSpec whose one line is `<field path>: <problem>`."""
    obj = copy.deepcopy(base())
    mutate(obj)
    with pytest.raises(InvalidSpec) as info:
        parse_critical_service(obj)
    assert str(info.value) == expected
    assert "\n" not in str(info.value)
    assert info.value.path == expected.split(": ", 1)[0]


def test_list_caps_are_the_crd_schemas_and_the_caps_themselves_parse():
    """The parser's list caps are the CRD's maxItems, and a spec at exactly the caps is valid."""
    import yaml

    from criticalsvc.api import MAX_CRITERIA
    from criticalsvc.labels import MAX_EXPRESSIONS

    crd = yaml.safe_load((Path(__file__).resolve().parents[1] / "api/criticalservices.criticalsvc.io.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    criteria = spec["criteria"]
    selector = criteria["items"]["properties"]["resources"]["properties"]["selector"]["properties"]
    assert (criteria["maxItems"], selector["matchExpressions"]["maxItems"]) == (MAX_CRITERIA, MAX_EXPRESSIONS)
    obj = copy.deepcopy(base())
    obj["spec"]["criteria"] = obj["spec"]["criteria"][2:] * MAX_CRITERIA
    obj["spec"]["criteria"][0]["resources"]["selector"]["matchExpressions"] = [
        {"key": f"k{i}", "operator": "Exists"} for i in range(MAX_EXPRESSIONS)]
    assert len(parse_critical_service(obj).criteria) == MAX_CRITERIA


def test_non_object_is_rejected_and_invalid_spec_is_a_value_error():
    """A CR that is not a mapping is rejected; InvalidSpec is catchable as InvalidInput and ValueError."""
    with pytest.raises(ValueError, match="a CriticalService must be a JSON object") as info:
        parse_critical_service(["not", "an", "object"])
    assert isinstance(info.value, InvalidInput)


def test_located_error_prefixes_where_it_was_found():
    """An error located in a file reads `<file>: <document>: <path>: <problem>` on one line."""
    obj = base()
    del obj["spec"]["criteria"][1]["finalizer"]["finalizerName"]
    with pytest.raises(InvalidSpec) as info:
        parse_critical_service(obj)
    located = info.value.located("state.yaml: document 2")
    assert str(located) == "state.yaml: document 2: spec.criteria[1].finalizer.finalizerName: required"
    assert isinstance(located, InvalidSpec)


def test_trailing_newline_is_not_a_valid_name() -> None:
    """A group, namespace or finalizer with a trailing newline is rejected, as the API server would."""
    import pytest

    from criticalsvc.api import parse_critical_service
    from criticalsvc.errors import InvalidSpec

    def spec(group: str = "apps", namespace: str = "ns", finalizer: str = "x.io/f") -> dict:
        return {"metadata": {"name": "x"}, "spec": {
            "provider": {"group": group, "resource": "deployments", "namespace": namespace, "name": "d"},
            "criteria": [{"type": "Finalizer", "finalizer": {"group": "x.io", "resource": "xs",
                                                              "finalizerName": finalizer}}]}}

    for bad, path in ((spec(group="apps\n"), "spec.provider.group"),
                      (spec(namespace="ns\n"), "spec.provider.namespace"),
                      (spec(finalizer="x.io/f\n"), "spec.criteria[0].finalizer.finalizerName")):
        with pytest.raises(InvalidSpec) as err:
            parse_critical_service(bad)
        assert err.value.path == path
