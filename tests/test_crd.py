"""The CriticalService CRD (api/): structural, documented, and in step with the parser, the examples,
the status writer and the printer columns.

No API server runs here, so its checks are re-implemented small and strict. Each has a negative
control:
* `structural_errors` follows the structural-schema rules of apiextensions-apiserver
  (pkg/apiserver/schema/validation.go, and the keywords the CRD validation forbids). It is stricter in
  two places: every property must carry a description (so `kubectl explain` is useful), and
  `additionalProperties: false` is refused outright.
* `schema_errors` validates an object with jsonschema the way a strict create (`kubectl apply`,
  fieldValidation=Strict) would. Unknown fields are errors, and x-kubernetes-* keywords are dropped.
* `cel_errors` evaluates the x-kubernetes-validations rules with cel-python. `self` is bound to the
  node, and the message is the messageExpression's value, at the path plus `fieldPath`.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import networkx as nx
import pytest
import yaml

from criticalsvc import api, install, restmapper
from criticalsvc.admission import AdmissionRequest
from criticalsvc.api import DELETION_PROTECTED_LABEL, NAMESPACES, GroupResource, parse_critical_service
from criticalsvc.decision import decide
from criticalsvc.errors import InvalidSpec
from criticalsvc.graph import service_graph
from criticalsvc.manifests import Manifest, load_path
from criticalsvc.snapshot import build_state, is_critical_service
from criticalsvc.status import MAX_BLOCKERS, compute_status

ROOT = Path(__file__).resolve().parent.parent
API_DIR = ROOT / "api"
CRD_FILE = API_DIR / "criticalservices.criticalsvc.io.yaml"
EXAMPLES = sorted((API_DIR / "examples").glob("*.yaml"))

Schema = dict[str, Any]


@functools.cache
def _crd_text() -> str:
    return CRD_FILE.read_text(encoding="utf-8")


def crd() -> dict[str, Any]:
    """A fresh copy of the CRD (tests may break it)."""
    loaded: dict[str, Any] = yaml.safe_load(_crd_text())
    return loaded


def openapi_schema(doc: Mapping[str, Any] | None = None) -> Schema:
    schema: Schema = (doc or crd())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


# --- the structural-schema checker ---------------------------------------------------------------------

_TYPES = {"object", "array", "string", "integer", "number", "boolean"}
_JUNCTORS = ("allOf", "anyOf", "oneOf", "not")
# Refused by the CRD validation wherever they appear (validation.go, specStandardValidatorV3.validate).
_UNSUPPORTED = ("$ref", "$schema", "id", "definitions", "dependencies", "additionalItems", "patternProperties")
# Refused inside a logical junctor: a value validation may constrain but never declare (structural rule 3).
_NESTED_FORBIDDEN = ("type", "description", "title", "default", "additionalProperties", "nullable")
_VALIDATION_REASONS = {"FieldValueInvalid", "FieldValueForbidden", "FieldValueRequired", "FieldValueDuplicate"}
# RE2 (Go's regexp) has no lookaround and no backreferences; Python's re would accept them silently.
_NOT_RE2 = re.compile(r"\(\?<?[=!]|\\[1-9]")


def structural_errors(schema: Any) -> list[str]:
    """Why `schema` is not an acceptable structural, documented CRD schema; [] when it is."""
    errors: list[str] = []
    _check_node(schema, "<root>", "root", errors)
    return errors


def _child(where: str, name: str) -> str:
    return name if where == "<root>" else f"{where}.{name}"


def _check_node(node: Any, where: str, level: str, errors: list[str]) -> None:
    if not isinstance(node, dict):
        errors.append(f"{where}: must be a schema object")
        return
    for key in _UNSUPPORTED:
        if key in node:
            errors.append(f"{where}: {key}: not supported in a CRD schema")
    if node.get("uniqueItems") is True:
        errors.append(f"{where}: uniqueItems: cannot be true (quadratic validation)")
    preserve = node.get("x-kubernetes-preserve-unknown-fields")
    if preserve is not None and preserve is not True:
        errors.append(f"{where}: x-kubernetes-preserve-unknown-fields: must be true or undefined")
    type_ = node.get("type")
    if type_ is None:
        if not (node.get("x-kubernetes-int-or-string") is True or preserve is True):
            errors.append(f"{where}: type: must not be empty for specified {level} nodes")
    elif type_ not in _TYPES:
        errors.append(f"{where}: type: {type_!r} is not one of {sorted(_TYPES)}")
    if level != "root" and not str(node.get("description") or "").strip() and level == "field":
        errors.append(f"{where}: description: every property needs one (kubectl explain shows it)")
    if level == "root":
        _check_root(node, errors)
    if type_ == "array":
        items = node.get("items")
        if items is None:
            errors.append(f"{where}: items: must be specified for an array")
        elif isinstance(items, list):
            errors.append(f"{where}: items: must be one schema, not a list")
    if "additionalProperties" in node:
        if "properties" in node:
            errors.append(f"{where}: additionalProperties: mutually exclusive with properties")
        if node["additionalProperties"] is False:
            errors.append(f"{where}: additionalProperties: false contradicts pruning; leave it out")
    _check_extensions(node, where, errors)
    pattern = node.get("pattern")
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as exc:
            errors.append(f"{where}: pattern: does not compile: {exc}")
        if _NOT_RE2.search(str(pattern)):
            errors.append(f"{where}: pattern: uses lookaround or a backreference, which RE2 rejects")
    if "default" in node:
        undefaulted = {k: v for k, v in node.items() if k != "default"}
        if not jsonschema.Draft4Validator(to_json_schema(undefaulted)).is_valid(node["default"]):
            errors.append(f"{where}: default: {node['default']!r} does not validate against its own schema")
    for junctor in _JUNCTORS:
        if junctor in node:
            nested = node[junctor] if junctor != "not" else [node[junctor]]
            for i, sub in enumerate(nested):
                _check_nested(sub, node, f"{where}.{junctor}[{i}]", errors)
    for name, sub in (node.get("properties") or {}).items():
        if level == "root" and name == "metadata":
            continue  # checked by _check_root: only name/generateName restrictions are allowed
        _check_node(sub, _child(where, name), "field", errors)
    if isinstance(node.get("additionalProperties"), dict):
        _check_node(node["additionalProperties"], f"{where}{{}}", "map value", errors)
    if isinstance(node.get("items"), dict):
        _check_node(node["items"], f"{where}[]", "item", errors)


def _check_root(node: Schema, errors: list[str]) -> None:
    if node.get("type") != "object":
        errors.append("<root>: type: must be object")
    if "additionalProperties" in node:
        errors.append("<root>: additionalProperties: must not be used at the root")
    if not str(node.get("description") or "").strip():
        errors.append("<root>: description: the kind needs one (kubectl explain shows it)")
    props = node.get("properties") or {}
    for name in ("apiVersion", "kind"):
        if name in props and props[name].get("type") != "string":
            errors.append(f"{name}: type: must be string")
    metadata = props.get("metadata")
    if metadata is not None:
        extra = sorted(set(metadata) - {"type", "properties"})
        restricted = sorted(set(metadata.get("properties") or {}) - {"name", "generateName"})
        if metadata.get("type") != "object" or extra or restricted:
            errors.append(f"metadata: must be just `type: object` (with name/generateName restrictions); "
                          f"found {extra + restricted or metadata.get('type')}")


def _check_nested(nested: Any, outer: Any, where: str, errors: list[str]) -> None:
    if not isinstance(nested, dict):
        errors.append(f"{where}: must be a schema object")
        return
    outer = outer if isinstance(outer, dict) else {}
    for key in _NESTED_FORBIDDEN:
        if key in nested:
            errors.append(f"{where}: {key}: must be undefined inside a junctor to be structural")
    for key in nested:
        if key.startswith("x-kubernetes-"):
            errors.append(f"{where}: {key}: must be undefined inside a junctor to be structural")
    for key in _UNSUPPORTED:
        if key in nested:
            errors.append(f"{where}: {key}: not supported in a CRD schema")
    for name, sub in (nested.get("properties") or {}).items():
        if name == "metadata":
            errors.append(f"{where}.{name}: must not be constrained inside a junctor")
        declared = (outer.get("properties") or {}).get(name)
        if declared is None:
            errors.append(f"{where}.{name}: constrained in a junctor but not declared outside it")
        _check_nested(sub, declared, f"{where}.{name}", errors)
    if "items" in nested:
        if "items" not in outer:
            errors.append(f"{where}[]: constrained in a junctor but not declared outside it")
        _check_nested(nested["items"], outer.get("items"), f"{where}[]", errors)
    for junctor in _JUNCTORS:
        if junctor in nested:
            subs = nested[junctor] if junctor != "not" else [nested[junctor]]
            for i, sub in enumerate(subs):
                _check_nested(sub, outer, f"{where}.{junctor}[{i}]", errors)


def _check_extensions(node: Schema, where: str, errors: list[str]) -> None:
    list_type = node.get("x-kubernetes-list-type")
    if list_type is not None:
        if node.get("type") != "array":
            errors.append(f"{where}: x-kubernetes-list-type: only for arrays")
        if list_type not in ("atomic", "set", "map"):
            errors.append(f"{where}: x-kubernetes-list-type: {list_type!r} is not atomic, set or map")
    keys = node.get("x-kubernetes-list-map-keys")
    if list_type == "map":
        items: Schema = node["items"] if isinstance(node.get("items"), dict) else {}
        if not keys:
            errors.append(f"{where}: x-kubernetes-list-map-keys: required when the list type is map")
        for key in keys or ():
            prop = (items.get("properties") or {}).get(key)
            if prop is None or prop.get("type") in ("object", "array"):
                errors.append(f"{where}: x-kubernetes-list-map-keys: {key!r} must be a scalar property of the items")
            elif key not in (items.get("required") or ()) and "default" not in prop:
                errors.append(f"{where}: x-kubernetes-list-map-keys: {key!r} must be required or defaulted")
    elif keys:
        errors.append(f"{where}: x-kubernetes-list-map-keys: only with x-kubernetes-list-type: map")
    map_type = node.get("x-kubernetes-map-type")
    if map_type is not None and (node.get("type") != "object" or map_type not in ("atomic", "granular")):
        errors.append(f"{where}: x-kubernetes-map-type: must be atomic or granular, on an object")
    for i, rule in enumerate(node.get("x-kubernetes-validations") or ()):
        here = f"{where}: x-kubernetes-validations[{i}]"
        if not str(rule.get("rule") or "").strip():
            errors.append(f"{here}: rule: required")
        for key in ("message", "fieldPath"):
            if "\n" in str(rule.get(key) or "") or "\r" in str(rule.get(key) or ""):
                errors.append(f"{here}: {key}: must be one line")
        if "reason" in rule and rule["reason"] not in _VALIDATION_REASONS:
            errors.append(f"{here}: reason: {rule['reason']!r} is not supported")
        if "fieldPath" in rule and resolve_field_path(node, rule["fieldPath"]) is None:
            errors.append(f"{here}: fieldPath: {rule['fieldPath']!r} names no field of this node")


def resolve_field_path(node: Schema, field_path: str) -> Schema | None:
    """The schema a CEL rule's fieldPath (`.a.b`) points at, or None."""
    if not re.fullmatch(r"(\.[A-Za-z_][A-Za-z0-9_]*)+", field_path):
        return None
    found: Schema | None = node
    for name in field_path[1:].split("."):
        found = (found.get("properties") or {}).get(name) if found is not None else None
    return found


# --- validating objects: the schema (strict) and the CEL rules -------------------------------------------

def to_json_schema(node: Any, *, root: bool = True) -> Any:
    """An OpenAPI v3 CRD schema as a draft-4 JSON Schema for a strict create: unknown fields are errors;
    x-kubernetes-*, descriptions, formats and defaults are dropped (annotations, or checked elsewhere)."""
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key in ("description", "format", "default", "nullable"):
            continue
        if key == "properties":
            out[key] = {name: to_json_schema(sub, root=False) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not"):
            out[key] = to_json_schema(value, root=False)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [to_json_schema(sub, root=False) for sub in value]
        else:
            out[key] = value
    if node.get("nullable") is True and "type" in out:
        out["type"] = [out["type"], "null"]
    if "properties" in node and node.get("x-kubernetes-preserve-unknown-fields") is not True:
        out["additionalProperties"] = False  # fieldValidation=Strict: an unknown field is an error
    return out


def _dotted(path: Iterator[Any] | Any) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def schema_errors(obj: Any, schema: Schema | None = None) -> list[tuple[str, str]]:
    """(path, message) for each way `obj` breaks the CRD's OpenAPI schema."""
    validator = jsonschema.Draft4Validator(to_json_schema(schema or openapi_schema()))
    return sorted((_dotted(e.absolute_path), e.message) for e in validator.iter_errors(obj))


_CEL = celpy.Environment()


@functools.cache
def _program(expression: str) -> Any:
    return _CEL.program(_CEL.compile(expression))


def _evaluate(expression: str, value: Any) -> Any:
    return _program(expression).evaluate({"self": celpy.adapter.json_to_cel(value)})


def cel_errors(obj: Any, schema: Schema | None = None) -> list[str]:
    """`path: message` for each x-kubernetes-validations rule `obj` breaks."""
    errors: list[str] = []
    _cel_walk(obj, schema or openapi_schema(), "", errors)
    return errors


def _cel_walk(value: Any, node: Schema, where: str, errors: list[str]) -> None:
    for rule in node.get("x-kubernetes-validations") or ():
        verdict = _evaluate(rule["rule"], value)
        if verdict is True or (isinstance(verdict, celpy.celtypes.BoolType) and bool(verdict)):
            continue
        message = rule.get("message") or f"failed rule: {rule['rule']}"
        if "messageExpression" in rule:
            evaluated = _evaluate(rule["messageExpression"], value)
            message = str(evaluated) if isinstance(evaluated, str) else message  # StringType is a str
        errors.append(f"{where}{rule.get('fieldPath', '')}: {message}")
    if isinstance(value, dict):
        props = node.get("properties") or {}
        for key, sub in value.items():
            if key in props:
                _cel_walk(sub, props[key], f"{where}.{key}" if where else key, errors)
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        for i, item in enumerate(value):
            _cel_walk(item, node["items"], f"{where}[{i}]", errors)


# --- fixtures ----------------------------------------------------------------------------------------------

def base() -> dict[str, Any]:
    """A valid CriticalService using every criterion type and both selector forms."""
    return {
        "apiVersion": "criticalsvc.io/v1alpha1",
        "kind": "CriticalService",
        "metadata": {"name": "for-ctrl"},
        "spec": {
            "provider": {"group": "apps", "resource": "deployments", "namespace": "ops", "name": "ctrl"},
            "criteria": [
                {"type": "Finalizer",
                 "finalizer": {"group": "my.crd.group", "resource": "coolresources",
                               "finalizerName": "my.crd.group/super-important"}},
                {"type": "SpecificResource",
                 "specificResource": {"group": "apiextensions.k8s.io", "resource": "CustomResourceDefinition",
                                      "name": "coolresources.my.crd.group"}},
                {"type": "Resources",
                 "resources": {"group": "", "resource": "pods", "namespace": "app",
                               "selector": {"matchLabels": {"app": "web"},
                                            "matchExpressions": [{"key": "tier", "operator": "In",
                                                                  "values": ["backend"]}]}}},
            ],
        },
    }


DELETE = object()
_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def edited(path: str, value: Any, obj: dict[str, Any] | None = None) -> dict[str, Any]:
    """A copy of `obj` (default: base()) with `path` (`spec.criteria[0].type`) set to value, or deleted."""
    doc = copy.deepcopy(obj if obj is not None else base())
    steps: list[str | int] = [name if name else int(index) for name, index in _STEP.findall(path)]
    target: Any = doc
    for step in steps[:-1]:
        target = target[step]
    if value is DELETE:
        del target[steps[-1]]
    else:
        target[steps[-1]] = value
    return doc


def parser_verdict(obj: Any) -> InvalidSpec | None:
    try:
        parse_critical_service(obj)
    except InvalidSpec as exc:
        return exc
    return None


def example_services() -> list[tuple[Path, Manifest]]:
    return [(path, m) for path in EXAMPLES for m in load_path(str(path)) if is_critical_service(m.obj)]


def _example_id(case: tuple[Path, Manifest]) -> str:
    return f"{case[0].name}:{case[1].obj['metadata']['name']}"


# --- (a) the CRD is structural and documented ---------------------------------------------------------------

def test_crd_names_match_the_package_and_the_rest_mapper() -> None:
    """The CRD serves exactly the group, version, kind and names the gate and its REST mapper use."""
    doc = crd()
    spec = doc["spec"]
    assert doc["metadata"]["name"] == api.CRD_NAME
    assert (spec["group"], spec["scope"]) == (api.GROUP, "Cluster")
    assert spec["names"]["kind"] == api.KIND and spec["names"]["plural"] == api.PLURAL
    assert spec["names"]["singular"] == "criticalservice"
    assert spec["names"]["shortNames"] == ["csvc"] and spec["names"]["categories"] == ["criticalsvc"]
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == (api.VERSION, True, True)
    assert version["subresources"] == {"status": {}}
    known = next(t for t in restmapper.WELL_KNOWN if t.group_resource == api.CRITICAL_SERVICES)
    assert (known.version, known.kind, known.namespaced) == (api.VERSION, api.KIND, False)
    assert list(known.short_names) == spec["names"]["shortNames"]


def test_schema_is_structural_and_every_property_is_documented() -> None:
    """The CRD's schema passes the structural-schema checker, descriptions included."""
    assert structural_errors(openapi_schema()) == []


def test_kubectl_explain_has_something_to_say_about_nested_fields() -> None:
    """The field paths a user would explain (spec.criteria.finalizer, its finalizerName) have real descriptions."""
    spec = openapi_schema()["properties"]["spec"]
    finalizer = spec["properties"]["criteria"]["items"]["properties"]["finalizer"]
    assert "type is Finalizer" in finalizer["description"]
    assert "metadata.finalizers" in finalizer["properties"]["finalizerName"]["description"]
    assert "Warn" in spec["properties"]["enforcement"]["description"]


def _breaks() -> list[tuple[str, Callable[[Schema], None], str]]:
    def prop(schema: Schema, *names: str) -> Schema:
        node = schema
        for name in names:
            node = node["items"] if name == "[]" else node["properties"][name]
        return node

    crit = ("spec", "criteria", "[]")
    return [
        ("property without type", lambda s: prop(s, "spec", "provider", "name").pop("type"),
         "spec.provider.name: type: must not be empty"),
        ("item without type", lambda s: prop(s, "spec", "criteria", "[]").pop("type"),
         "spec.criteria[]: type: must not be empty"),
        ("unknown type", lambda s: prop(s, "spec", "enforcement").__setitem__("type", "null"),
         "spec.enforcement: type: 'null'"),
        ("property without description", lambda s: prop(s, "spec", "provider", "group").pop("description"),
         "spec.provider.group: description"),
        ("description in a junctor",
         lambda s: prop(s, *crit).__setitem__("oneOf", [{"description": "x", "required": ["finalizer"]}]),
         "spec.criteria[].oneOf[0]: description"),
        ("type in a junctor",
         lambda s: prop(s, *crit).__setitem__("anyOf", [{"properties": {"type": {"type": "string"}}}]),
         "spec.criteria[].anyOf[0].type: type"),
        ("undeclared field in a junctor",
         lambda s: prop(s, *crit).__setitem__("anyOf", [{"properties": {"bogus": {"minLength": 1}}}]),
         "spec.criteria[].anyOf[0].bogus: constrained in a junctor but not declared"),
        ("properties with additionalProperties",
         lambda s: prop(s, *crit, "resources", "selector").__setitem__("additionalProperties", {"type": "string"}),
         "spec.criteria[].resources.selector: additionalProperties: mutually exclusive"),
        ("uniqueItems", lambda s: prop(s, "spec", "criteria").__setitem__("uniqueItems", True),
         "spec.criteria: uniqueItems"),
        ("$ref", lambda s: prop(s, "spec", "provider").__setitem__("$ref", "#/definitions/x"),
         "spec.provider: $ref"),
        ("array without items", lambda s: prop(s, "spec", "criteria").pop("items"),
         "spec.criteria: items: must be specified"),
        ("restricted metadata", lambda s: prop(s, "metadata").__setitem__("required", ["labels"]),
         "metadata: must be just `type: object`"),
        ("list-map without keys", lambda s: prop(s, "status", "conditions").pop("x-kubernetes-list-map-keys"),
         "status.conditions: x-kubernetes-list-map-keys: required"),
        ("CEL fieldPath to nowhere",
         lambda s: prop(s, *crit)["x-kubernetes-validations"][0].__setitem__("fieldPath", ".finaliser"),
         "spec.criteria[]: x-kubernetes-validations[0]: fieldPath"),
        ("default outside the enum", lambda s: prop(s, "spec", "enforcement").__setitem__("default", "Audit"),
         "spec.enforcement: default"),
        ("lookahead pattern", lambda s: prop(s, "spec", "provider", "name").__setitem__("pattern", "^(?!x).*$"),
         "spec.provider.name: pattern: uses lookaround"),
        ("additionalProperties at the root", lambda s: s.__setitem__("additionalProperties", {"type": "string"}),
         "<root>: additionalProperties: must not be used at the root"),
    ]


@pytest.mark.parametrize(("breakage", "expected"), [(b, e) for _, b, e in _breaks()],
                         ids=[name for name, _, _ in _breaks()])
def test_structural_checker_rejects_a_broken_copy(breakage: Callable[[Schema], None], expected: str) -> None:
    """Negative control: each broken copy of the CRD's schema fails the checker, at the broken field."""
    schema = openapi_schema()
    breakage(schema)
    errors = structural_errors(schema)
    assert any(e.startswith(expected) for e in errors), errors


# --- (b) every example validates against the schema and parses -------------------------------------------

@pytest.mark.parametrize("case", example_services(), ids=_example_id)
def test_every_example_service_fits_the_schema_the_cel_rules_and_the_parser(case: tuple[Path, Manifest]) -> None:
    """Each CriticalService under api/examples/ is valid for the API server and for the gate's parser."""
    obj = dict(case[1].obj)
    assert schema_errors(obj) == []
    assert cel_errors(obj) == []
    assert parse_critical_service(obj).name == obj["metadata"]["name"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_loads_as_a_snapshot_without_a_cycle(path: Path) -> None:
    """Each example file loads as a cluster state, explains itself in a header, and closes no cycle."""
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len([line for line in lines[:4] if line.startswith("# ")]) == 4, "a header comment explains the scenario"
    state = build_state(load_path(str(path)))
    services = list(state.critical_services())
    # labelled-objects.yaml needs none: it shows the deletion-protected label alone.
    assert services or all(o.labels.get(DELETION_PROTECTED_LABEL) == "Always" for o in state.objects())
    assert nx.is_directed_acyclic_graph(service_graph(services, state))


def _delete(gr: GroupResource, namespace: str, name: str) -> AdmissionRequest:
    return AdmissionRequest(uid="u", group_resource=gr, operation="DELETE", name=name, namespace=namespace,
                            old_object={"metadata": {"name": name, "namespace": namespace}})


DEPLOYMENTS = GroupResource("apps", "deployments")


@pytest.mark.parametrize(("example", "request_", "allowed", "named", "not_named"), [
    ("webhook-provider.yaml", _delete(DEPLOYMENTS, "widget-system", "widget-webhook"), False,
     ["shop/blue-widget", "widget-validation"], ["scratch-widget"]),
    ("webhook-provider.yaml", _delete(GroupResource("", "services"), "widget-system", "widget-webhook"), False,
     ["shop/blue-widget", "widget-validation"], ["scratch-widget"]),
    ("webhook-provider.yaml", _delete(NAMESPACES, "widget-system", "widget-system"), False,
     ["for-widget-webhook", "for-widget-webhook-service"], []),
    ("namespaced-selector.yaml", _delete(GroupResource("apps", "statefulsets"), "db", "postgres"), False,
     ["shop/cart", "shop/invoicer"], ["storefront", "nightly-report"]),
    ("warn-enforcement.yaml", _delete(DEPLOYMENTS, "cert-system", "cert-controller"), True,
     ["(enforcement: Warn)", "shop/storefront-tls"], []),
    ("conditions.yaml", _delete(DEPLOYMENTS, "broker", "job-broker"), False,
     ["batch/report-2", "batch/ingest"], ["report-1", "archiver"]),
], ids=["webhook-deployment", "webhook-service", "webhook-namespace", "selector", "warn", "conditions"])
def test_examples_behave_as_their_headers_say(example: str, request_: AdmissionRequest, allowed: bool,
                                               named: list[str], not_named: list[str]) -> None:
    """Deleting an example's provider gets the answer its header promises, naming the blocking objects."""
    state = build_state(load_path(str(API_DIR / "examples" / example)))
    decision = decide(request_, state)
    said = decision.message + " ".join(decision.warnings)
    assert decision.allowed is allowed
    assert all(n in said for n in named), said
    assert not any(n in said for n in not_named), said


def test_kustomization_installs_the_crd_and_nothing_else() -> None:
    """api/kustomization.yaml lists only the CRD (never the examples) and renders with the install renderer."""
    kustomization = yaml.safe_load((API_DIR / "kustomization.yaml").read_text(encoding="utf-8"))
    assert set(kustomization) <= install.SUPPORTED_FIELDS
    assert kustomization["resources"] == [CRD_FILE.name]
    (obj,) = install.build(API_DIR)
    assert obj == crd()


# --- (c) invalid specs are rejected by the schema; (d) the CEL rules say which member ---------------------

_EXPR = "spec.criteria[2].resources.selector.matchExpressions[0]"
INVALID: list[tuple[str, str, Any, str]] = [
    # (id, path, value, the layer of the API server that rejects it)
    ("finalizerName missing", "spec.criteria[0].finalizer.finalizerName", DELETE, "schema"),
    ("finalizerName empty", "spec.criteria[0].finalizer.finalizerName", "", "schema"),
    ("finalizerName without a name", "spec.criteria[0].finalizer.finalizerName", "my.crd.group/", "schema"),
    ("finalizerName too long", "spec.criteria[0].finalizer.finalizerName", "f" * 317, "schema"),
    ("no member", "spec.criteria[0].finalizer", DELETE, "schema"),
    ("unknown criterion type", "spec.criteria[0].type", "Label", "schema"),
    ("type missing", "spec.criteria[0].type", DELETE, "schema"),
    ("bad enforcement", "spec.enforcement", "Audit", "schema"),
    ("lowercase enforcement", "spec.enforcement", "warn", "schema"),
    ("criteria empty", "spec.criteria", [], "schema"),
    ("criteria missing", "spec.criteria", DELETE, "schema"),
    ("spec missing", "spec", DELETE, "schema"),
    ("provider missing", "spec.provider", DELETE, "schema"),
    ("provider name with a slash", "spec.provider.name", "a/b", "schema"),
    ("provider name too long", "spec.provider.name", "n" * 254, "schema"),
    ("provider resource missing", "spec.provider.resource", DELETE, "schema"),
    ("provider resource with a group", "spec.provider.resource", "deployments.apps", "schema"),
    ("group in capitals", "spec.provider.group", "Apps", "schema"),
    ("namespace with an underscore", "spec.provider.namespace", "ops_1", "schema"),
    ("namespace too long", "spec.provider.namespace", "n" * 64, "schema"),
    ("unknown provider field", "spec.provider.nmae", "ctrl", "schema"),
    ("unknown spec field", "spec.priority", 1, "schema"),
    ("recreatedProvider unknown", "spec.recreatedProvider", "BestEffort", "schema"),
    ("specificResource name missing", "spec.criteria[1].specificResource.name", DELETE, "schema"),
    ("resources resource missing", "spec.criteria[2].resources.resource", DELETE, "schema"),
    ("matchLabels value not a string", "spec.criteria[2].resources.selector.matchLabels.app", 1, "schema"),
    ("unknown selector field", "spec.criteria[2].resources.selector.matchFields", {}, "schema"),
    ("operator unknown", f"{_EXPR}.operator", "Equals", "schema"),
    ("expression key empty", f"{_EXPR}.key", "", "schema"),
    # Well-formed for the schema alone; only the CEL rules can tell these apart. (Two members make three
    # properties, which maxProperties allows since a criterion may also carry a condition.)
    ("two members", "spec.criteria[0].resources", {"resource": "pods"}, "cel"),
    # spec.provider names one object or selects a set (issue 11): exactly one of the two.
    ("provider name missing", "spec.provider.name", DELETE, "cel"),
    ("provider name and selector", "spec.provider.selector", {"matchLabels": {"app": "db"}}, "cel"),
    ("member of another type", "spec.criteria[0].type", "SpecificResource", "cel"),
    ("Resources naming a SpecificResource member", "spec.criteria[1].type", "Resources", "cel"),
    ("In without values", f"{_EXPR}.values", DELETE, "cel"),
    ("NotIn with no values", f"{_EXPR}.values", [], "cel"),
    ("Exists with values", f"{_EXPR}.operator", "Exists", "cel"),
]


def _related(a: str, b: str) -> bool:
    return a.startswith(b) or b.startswith(a)


@pytest.mark.parametrize(("path", "value", "layer"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_spec_is_rejected_by_the_api_server_and_the_parser_at_the_same_field(
        path: str, value: Any, layer: str) -> None:
    """Each broken rule is refused by the schema (or, where only CEL can say, the CEL rules) and by the parser."""
    obj = edited(path, value)
    refused = parser_verdict(obj)
    assert refused is not None, "the parser must refuse it too"
    if layer == "schema":
        errors = schema_errors(obj)
        assert errors, "the schema must refuse it"
        assert any(_related(refused.path, where) for where, _ in errors), (refused.path, errors)
    else:
        assert schema_errors(obj) == [], "the schema alone cannot express this one"
        # The CEL rule speaks the parser's words, at the parser's path.
        assert str(refused) in cel_errors(obj)


VALID: list[tuple[str, str, Any]] = [
    ("group omitted", "spec.provider.group", DELETE),
    ("core group", "spec.criteria[0].finalizer.group", ""),
    ("resource as a Kind", "spec.provider.resource", "Deployment"),
    ("cluster-scoped provider", "spec.provider.namespace", ""),
    ("namespace omitted", "spec.criteria[2].resources.namespace", DELETE),
    ("selector omitted", "spec.criteria[2].resources.selector", DELETE),
    ("empty selector", "spec.criteria[2].resources.selector", {}),
    ("Exists without values", f"{_EXPR}", {"key": "tier", "operator": "Exists"}),
    ("DoesNotExist with an empty list", f"{_EXPR}", {"key": "tier", "operator": "DoesNotExist", "values": []}),
    ("enforcement Warn", "spec.enforcement", "Warn"),
    ("recreatedProvider Orphan", "spec.recreatedProvider", "Orphan"),
    ("recreatedProvider Protect", "spec.recreatedProvider", "Protect"),
    ("finalizer without a prefix", "spec.criteria[0].finalizer.finalizerName", "cleanup"),
    ("RBAC-style name", "spec.provider.name", "system:controller"),
    ("longest name", "spec.provider.name", "n" * 253),
    ("most criteria", "spec.criteria", [base()["spec"]["criteria"][0]] * 64),
    ("a condition", "spec.criteria[2].condition", "object.status.phase in ['Pending', 'Running']"),
    ("a condition on a Finalizer criterion", "spec.criteria[0].condition", "object.spec.replicas > 0"),
    ("a provider selector", "spec.provider", {"resource": "persistentvolumeclaims", "namespace": "shop",
                                              "selector": {"matchLabels": {"app": "db"}}}),
    ("a provider selector with expressions", "spec.provider",
     {"resource": "PersistentVolumeClaim", "selector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]}}),
    ("an empty provider selector", "spec.provider", {"resource": "persistentvolumeclaims", "selector": {}}),
]


def test_orphan_with_a_provider_selector_is_refused_by_the_cel_rule_and_the_parser_in_the_same_words() -> None:
    """A set has no one object that could be re-created: Orphan needs spec.provider.name."""
    obj = edited("spec.provider", {"resource": "persistentvolumeclaims", "selector": {"matchLabels": {"app": "db"}}})
    obj = edited("spec.recreatedProvider", "Orphan", obj)
    refused = parser_verdict(obj)
    assert refused is not None and refused.path == "spec.recreatedProvider"
    assert schema_errors(obj) == []
    assert cel_errors(obj) == [str(refused)]


@pytest.mark.parametrize(("path", "value"), [c[1:] for c in VALID], ids=[c[0] for c in VALID])
def test_valid_edge_cases_are_accepted_by_the_schema_the_cel_rules_and_the_parser(path: str, value: Any) -> None:
    """The schema never refuses what the parser accepts (the gate's own examples and edge cases)."""
    obj = edited(path, value)
    assert schema_errors(obj) == []
    assert cel_errors(obj) == []
    assert parser_verdict(obj) is None


_FIELD_VALUES: dict[str, tuple[str, list[str]]] = {
    "group": ("spec.provider.group",
              ["apps", "", "my.crd.group", "a.b-c.d", "Apps", "-apps", "apps-", "a..b", "x_y", ".apps"]),
    "namespace": ("spec.provider.namespace", ["ops", "", "o-p-s", "n" * 63, "n" * 64, "Ops", "ops.prod", "-ops"]),
    "resource": ("spec.provider.resource",
                 ["deployments", "Deployment", "x-y", "CustomResourceDefinition", "deployments.apps", "1pods",
                  "pods/status", "-x"]),
    "finalizerName": ("spec.criteria[0].finalizer.finalizerName",
                      ["cleanup", "my.crd.group/super-important", "kubernetes.io/pv-protection", "x_y", "a.b",
                       "a/b/c", "/x", "x/", "UPPER.case/x", "_x", "x-", "f" * 316, "f" * 317]),
    "name": ("spec.provider.name", ["ctrl", "system:controller", "n" * 253, "n" * 254, "a/b", "x", "UPPER"]),
}


@pytest.mark.parametrize("field", sorted(_FIELD_VALUES))
def test_schema_and_parser_agree_on_field_values(field: str) -> None:
    """For each string field, the schema's pattern and length limits accept exactly what the parser accepts."""
    path, values = _FIELD_VALUES[field]
    verdicts = {}
    for value in values:
        obj = edited(path, value)
        by_schema = not schema_errors(obj) and not cel_errors(obj)
        by_parser = parser_verdict(obj) is None
        assert by_schema == by_parser, f"{field}={value!r}: schema {'accepts' if by_schema else 'refuses'}"
        verdicts[value] = by_parser
    assert set(verdicts.values()) == {True, False}, "the table must hold accepted and refused values"


def test_cel_rules_state_which_member_goes_with_which_type() -> None:
    """Each criterion member has its own CEL rule, tied to its type and pointing at its field."""
    item = openapi_schema()["properties"]["spec"]["properties"]["criteria"]["items"]
    rules = {r["fieldPath"]: r for r in item["x-kubernetes-validations"]}
    members = {"Finalizer": "finalizer", "SpecificResource": "specificResource", "Resources": "resources"}
    assert set(item["properties"]["type"]["enum"]) == set(members)
    for type_, member in members.items():
        rule = rules[f".{member}"]
        assert f"has(self.{member})" in rule["rule"] and f"'{type_}'" in rule["rule"]
        assert rule["message"] and rule["messageExpression"]
    expression = item["properties"]["resources"]["properties"]["selector"]["properties"]["matchExpressions"]["items"]
    assert [r["fieldPath"] for r in expression["x-kubernetes-validations"]] == [".values"]


def test_cel_rules_are_budgeted() -> None:
    """Every CEL rule sits under bounded lists and compares only bounded strings, so the API server can price it."""
    found = 0

    def walk(node: Schema, lists: list[Schema], where: str) -> None:
        nonlocal found
        for rule in node.get("x-kubernetes-validations") or ():
            found += 1
            assert all("maxItems" in a for a in lists), f"{where}: an enclosing list has no maxItems"
            for name in re.findall(r"self\.([A-Za-z_]\w*)", rule["rule"] + rule.get("messageExpression", "")):
                field = node["properties"][name]
                assert field["type"] != "string" or "maxLength" in field, f"{where}.{name}: unbounded string"
        for name, sub in (node.get("properties") or {}).items():
            walk(sub, lists, f"{where}.{name}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], [*lists, node], f"{where}[]")

    walk(openapi_schema(), [], "")
    assert found == 7


def test_cel_rules_compile_and_accept_every_criterion_type() -> None:
    """The rules evaluate (no CEL errors) on one well-formed criterion of each type."""
    for criterion in base()["spec"]["criteria"]:
        item = openapi_schema()["properties"]["spec"]["properties"]["criteria"]["items"]
        for rule in item["x-kubernetes-validations"]:
            assert _evaluate(rule["rule"], criterion) == celpy.celtypes.BoolType(True), (rule["rule"], criterion)


# --- (f) printer columns, and the status the gate writes --------------------------------------------------------

# ObjectMeta fields a column may read (metadata is implicit in a CRD schema).
_OBJECT_META: dict[str, Schema] = {
    "name": {"type": "string"}, "creationTimestamp": {"type": "string", "format": "date-time"},
    "generation": {"type": "integer"}, "uid": {"type": "string"},
}
_SEGMENT = re.compile(r'\.([A-Za-z_][A-Za-z0-9_]*)|\[\?\(@\.([A-Za-z_]\w*)=="([^"]*)"\)\]')


def resolve_column(schema: Schema, json_path: str) -> Schema:
    """The schema node a printer column's JSONPath reads; AssertionError when it names nothing."""
    assert json_path.startswith("."), "a column's jsonPath starts with '.'"
    position, node, steps = 0, schema, []
    while position < len(json_path):
        match = _SEGMENT.match(json_path, position)
        assert match is not None, f"{json_path}: cannot read from {json_path[position:]!r}"
        steps.append(match)
        position = match.end()
    for i, step in enumerate(steps):
        name, filter_field, _value = step.groups()
        if name is not None:
            if i == 1 and steps[0].group(1) == "metadata":
                assert name in _OBJECT_META, f"{json_path}: metadata.{name}"
                return _OBJECT_META[name]
            if name == "metadata" and i == 0:
                continue
            declared = (node.get("properties") or {}).get(name)
            assert declared is not None, f"{json_path}: no field {name!r}"
            node = declared
        else:
            assert node.get("type") == "array", f"{json_path}: a filter needs a list"
            node = node["items"]
            assert filter_field in node["properties"], f"{json_path}: items have no {filter_field!r}"
    return node


def test_printer_columns_read_fields_the_schema_declares() -> None:
    """Every printer column's JSONPath names a declared field of its type; filters name documented conditions."""
    version = crd()["spec"]["versions"][0]
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert {"Provider", "Criteria", "Blocking", "Enforcement", "Age"} <= set(columns)
    assert columns["Enforcement"].get("priority") == 1 and "priority" not in columns["Blocking"]
    schema = openapi_schema()
    conditions_doc = schema["properties"]["status"]["properties"]["conditions"]["description"]
    for column in columns.values():
        node = resolve_column(schema, column["jsonPath"])
        expected = {"string": ("string", None), "integer": ("integer", None), "date": ("string", "date-time")}
        type_, format_ = expected[column["type"]]
        assert node["type"] == type_, column
        assert format_ is None or node.get("format") == format_, column
        for value in re.findall(r'=="([^"]*)"', column["jsonPath"]):
            assert f"{value} - " in conditions_doc, f"condition {value} is not documented"


@pytest.mark.parametrize("bad", [".spec.provider.nmae", ".status.criteria", ".metadata.owner", "spec.provider.name",
                                 '.status.conditions[?(@.kind=="Blocking")].status'])
def test_column_resolver_refuses_paths_to_nowhere(bad: str) -> None:
    """Negative control: a JSONPath naming an undeclared field is caught by the column resolver."""
    with pytest.raises(AssertionError):
        resolve_column(openapi_schema(), bad)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_the_status_the_gate_writes_fits_the_schema(path: Path) -> None:
    """compute_status's output for each example service fits the status schema (else status writes would fail)."""
    manifests = load_path(str(path))
    state = build_state(manifests)
    for m in manifests:
        if is_critical_service(m.obj):
            cs = parse_critical_service(m.obj)
            status = compute_status(cs, state, now=1_700_000_000, generation=3)
            assert schema_errors({**m.obj, "status": status}) == []
            assert status["criteriaCount"] == len(m.obj["spec"]["criteria"])


def test_status_blockers_cap_matches_the_schema() -> None:
    """The schema admits as many blockers as the status writer writes, and no more."""
    blockers = openapi_schema()["properties"]["status"]["properties"]["blockers"]
    assert blockers["maxItems"] == MAX_BLOCKERS
    one = {"criterion": 0, "description": "x still exists", "count": 1, "examples": ["x"]}
    obj = {**base(), "status": {"blockers": [one] * (MAX_BLOCKERS + 1)}}
    assert [where for where, _ in schema_errors(obj)] == ["status.blockers"]
