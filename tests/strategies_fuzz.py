"""Hypothesis strategies for fuzzing `POST /validate`: hostile bodies and mutated AdmissionReviews.

Three families, each a strategy of `Body` (the bytes sent, plus the decoded review when the bytes are
JSON built here):

* `garbage_bodies`  random bytes, truncated serialized reviews, deep nesting past the JSON decoder's
                    limit - nothing a JSON decoder accepts as an object;
* `mutated_reviews` a valid review (the reference story's deletions, a CriticalService create, an
                    unrelated update) changed field by field: wrong types at every level, deleted
                    keys, unknown kinds/resources, wrong apiVersion, huge strings, deep (but decodable)
                    nesting, extra fields;
* `protected_deletes` well-formed DELETEs that still name an object the reference story protects
                    (by `name` or, with `name` "", by `oldObject.metadata.name`), with dry-run, odd
                    options, extra fields, random labels and annotations - the ones a wrong ALLOW
                    would hurt.

The well-formed reviews are built with `render_review`, the API server's side of admission.py. The
oracle lives here too (`wire_valid`, `must_deny`): it reads the raw review and the documented rules
(admission.py's decoding, decision.py's docstring), sharing no code with the gate.
"""

from __future__ import annotations

import copy
from typing import Any

import attrs
import orjson
from hypothesis import strategies as st

from criticalsvc.admission import AdmissionRequest, render_review
from criticalsvc.api import GroupResource

API_VERSION = "admission.k8s.io/v1"
BREAK_GLASS = "criticalsvc.io/break-glass"
DELETION_PROTECTED = "criticalsvc.io/deletion-protected"
OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")
# orjson refuses to decode nesting deeper than 1024 and to encode deeper than 254, so the deep bodies
# are spliced in as text: 200 levels still decode (and reach the gate), 2000 never do.
DECODABLE_DEPTH = 200
UNDECODABLE_DEPTH = 2000
# Big enough to exercise copies and error quoting, small enough for 10,000 bodies in well under a
# minute on 2 cores; the 3 MiB body cap itself is tested in test_server.py.
HUGE = 100_000
DEEP_MARK = "\u2063deep\u2063"


@attrs.frozen
class Target:
    """An object the reference story protects, and how a DELETE review names it."""

    group: str
    resource: str
    namespace: str  # request.namespace the API server sends ("" for cluster-scoped objects)
    name: str
    old_object: dict[str, Any]
    # CriticalService deletes are judged on the spec in oldObject: the oracle only holds while it is intact.
    spec_matters: bool = False


CS_SPEC: dict[str, Any] = {
    "provider": {"group": "apps", "resource": "deployments", "namespace": "finalizer-namespace",
                 "name": "finalizer-deployment"},
    "criteria": [
        # A condition true for every object (so the story's protection is unchanged), for the fuzzer to
        # mutate: the webhook compiles it on every CREATE/UPDATE (criticalsvc/condition.py).
        {"type": "Finalizer", "finalizer": {"group": "my.crd.group", "resource": "coolresources",
                                            "finalizerName": "my.crd.group/super-important"},
         "condition": "has(object.metadata) && object.metadata.name.size() > 0"},
        {"type": "SpecificResource", "specificResource": {"group": "apiextensions.k8s.io",
                                                          "resource": "CustomResourceDefinition",
                                                          "name": "coolresources.my.crd.group"}},
    ],
}

# What api/examples/reference-story.yaml protects while its CoolResources and their CRD exist:
# the provider, its namespace, the CriticalService (its provider exists) and the CriticalService CRD
# (a CriticalService exists).
TARGETS = (
    Target("apps", "deployments", "finalizer-namespace", "finalizer-deployment",
           {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "finalizer-deployment", "namespace": "finalizer-namespace",
                         "labels": {"app": "coolresource-controller"}},
            "spec": {"replicas": 1}}),
    Target("", "namespaces", "finalizer-namespace", "finalizer-namespace",
           {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "finalizer-namespace"},
            "spec": {"finalizers": ["kubernetes"]}}),
    Target("criticalsvc.io", "criticalservices", "", "for-finalizer-deployment",
           {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService",
            "metadata": {"name": "for-finalizer-deployment"}, "spec": CS_SPEC}, spec_matters=True),
    Target("apiextensions.k8s.io", "customresourcedefinitions", "", "criticalservices.criticalsvc.io",
           {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "criticalservices.criticalsvc.io"}}),
)


@attrs.frozen
class Body:
    """One request body; `review` is the JSON value it encodes, or None when it is not JSON at all."""

    data: bytes
    review: Any = None
    decodable: bool = True


# --- the oracle ------------------------------------------------------------------------------------
def wire_valid(review: Any) -> bool:
    """Whether `review` is an AdmissionReview v1 the gate must answer (admission.py's documented rules)."""
    if not isinstance(review, dict) or review.get("apiVersion") != API_VERSION:
        return False
    request = review.get("request")
    if review.get("kind") != "AdmissionReview" or not isinstance(request, dict):
        return False
    uid, resource = request.get("uid"), request.get("resource")
    if not (isinstance(uid, str) and uid) or request.get("operation") not in OPERATIONS:
        return False
    if not isinstance(resource, dict) or not isinstance(resource.get("group", ""), str):
        return False
    if not (isinstance(resource.get("resource"), str) and resource["resource"]):
        return False
    strings = ("name", "namespace", "subResource")
    if any(request.get(k) is not None and not isinstance(request[k], str) for k in strings):
        return False
    for key in ("object", "oldObject"):
        value = request.get(key)
        metadata = value.get("metadata") if isinstance(value, dict) else None
        if value is not None and not (isinstance(value, dict) and isinstance(metadata, (dict, type(None)))):
            return False
    return isinstance(request.get("dryRun", False), bool)


def named_target(review: Any) -> Target | None:
    """The protected object a wire-valid DELETE review names, if any."""
    if not wire_valid(review) or review["request"]["operation"] != "DELETE":
        return None
    request = review["request"]
    old = request.get("oldObject")
    metadata = old.get("metadata") if isinstance(old, dict) else None
    # decision.py: `name` is "" for items of a deletecollection, the name is then oldObject.metadata.name.
    name = request.get("name") or str((metadata or {}).get("name") or "")
    for t in TARGETS:
        resource = request["resource"]
        if (resource.get("group", ""), resource["resource"], name) != (t.group, t.resource, t.name):
            continue
        if t.resource == "deployments" and request.get("namespace") != t.namespace:
            continue
        if t.spec_matters and isinstance(old, dict) and old.get("spec") != t.old_object["spec"]:
            continue
        return t
    return None


def must_deny(review: Any) -> bool:
    """Whether the gate must not allow `review` against the reference story (decision.py's rules).

    A DELETE of a protected object is denied unless oldObject says it is already terminating (any
    truthy deletionTimestamp: it passed the gate before) or carries a non-blank break-glass annotation.
    """
    if named_target(review) is None:
        return False
    old = review["request"].get("oldObject")
    metadata = old.get("metadata") if isinstance(old, dict) else None
    if not isinstance(metadata, dict):
        return True
    if metadata.get("deletionTimestamp"):
        return False
    annotations = metadata.get("annotations")
    reason = annotations.get(BREAK_GLASS) if isinstance(annotations, dict) else None
    labels = metadata.get("labels")
    protected_always = isinstance(labels, dict) and labels.get(DELETION_PROTECTED) == "Always"
    return protected_always or not (isinstance(reason, str) and reason.strip())


# --- building blocks ---------------------------------------------------------------------------------
def _huge_text() -> st.SearchStrategy[str]:
    return st.builds(lambda unit, n: (unit * (n // max(len(unit), 1) + 1))[:n],
                     st.text(min_size=1, max_size=4), st.integers(1000, HUGE))


texts = st.one_of(st.text(max_size=20), st.sampled_from(["", " ", "\x00", "Always", "DELETE", "null", "é\u202e"]))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=False), texts)
json_values: st.SearchStrategy[Any] = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)
# A value of the wrong type (or the right type with a hostile value) for any field.
hostile_values = st.one_of(json_values, json_values, json_values, _huge_text(), st.just(DEEP_MARK))


def _encode(review: Any) -> bytes:
    data = orjson.dumps(review)
    mark = orjson.dumps(DEEP_MARK)
    if mark in data:
        deep = b'{"a":' * DECODABLE_DEPTH + b"[1]" + b"}" * DECODABLE_DEPTH
        data = data.replace(mark, deep)
    return data


def _decoded(data: bytes) -> Any:
    return orjson.loads(data)


def base_reviews() -> list[dict[str, Any]]:
    """Well-formed reviews: every protected DELETE, a collection item, a CriticalService create, a ConfigMap update."""
    out = [delete_review(t, name=t.name, old=copy.deepcopy(t.old_object)) for t in TARGETS]
    out.append(delete_review(TARGETS[0], name="", old=copy.deepcopy(TARGETS[0].old_object)))
    create = _review("CREATE", "criticalsvc.io", "criticalservices", "", "new-cs",
                     obj={"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService",
                          "metadata": {"name": "new-cs"}, "spec": copy.deepcopy(CS_SPEC)})
    update = _review("UPDATE", "", "configmaps", "default", "cm",
                     obj={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {"a": "b"}})
    update["request"]["oldObject"] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}}
    return [*out, create, update]


def _review(operation: str, group: str, resource: str, namespace: str, name: str, *,
            obj: dict[str, Any] | None = None, old: dict[str, Any] | None = None) -> dict[str, Any]:
    request = AdmissionRequest(uid=f"uid-{operation.lower()}-{name}", group_resource=GroupResource(group, resource),
                               operation=operation, name=name, namespace=namespace, object=obj, old_object=old,
                               kind=resource, username="fuzz")
    return dict(render_review(request))


def delete_review(target: Target, *, name: str, old: dict[str, Any] | None) -> dict[str, Any]:
    return _review("DELETE", target.group, target.resource, target.namespace, name, old=old)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside `value` (dict keys and list indexes), the root included."""
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def _mutate_once(draw: st.DrawFn, review: Any) -> Any:
    paths = _paths(review)
    path = draw(st.sampled_from(paths))
    action = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
    if not path:
        return draw(hostile_values) if action == "replace" else review
    parent = review
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    if action == "delete":
        del parent[last]
    elif action == "add" and isinstance(parent[last], dict):
        parent[last][draw(st.text(max_size=12))] = draw(hostile_values)
    elif action == "add" and isinstance(parent[last], list):
        parent[last].append(draw(hostile_values))
    else:
        parent[last] = draw(hostile_values)
    return review


@st.composite
def mutated_reviews(draw: st.DrawFn) -> Body:
    """A base review with one to three fields replaced, deleted or added (hostile types and values)."""
    review = copy.deepcopy(draw(st.sampled_from(base_reviews())))
    for _ in range(draw(st.integers(1, 3))):
        review = draw(_mutate_once(review))
    data = _encode(review)
    return Body(data, _decoded(data))


@st.composite
def garbage_bodies(draw: st.DrawFn) -> Body:
    """Bytes no JSON decoder accepts as an object: random bytes, truncated reviews, nesting past the limit."""
    kind = draw(st.sampled_from(["bytes", "truncated", "truncated", "deep", "scalar"]))
    if kind == "bytes":
        data = draw(st.binary(min_size=1, max_size=200))
    elif kind == "truncated":
        full = _encode(draw(st.sampled_from(base_reviews())))
        data = full[: draw(st.integers(1, len(full) - 1))]
    elif kind == "deep":
        opener = draw(st.sampled_from([b"[", b'{"a":']))
        closer = b"]" if opener == b"[" else b"}"
        data = opener * UNDECODABLE_DEPTH + b"1" + closer * UNDECODABLE_DEPTH
    else:
        data = orjson.dumps(draw(st.one_of(scalars, st.lists(scalars, max_size=3))))
    try:
        return Body(data, _decoded(data))
    except orjson.JSONDecodeError:
        return Body(data, None, decodable=False)


@st.composite
def protected_deletes(draw: st.DrawFn) -> Body:
    """A well-formed DELETE naming a protected object, dressed in legitimate and odd variations."""
    target = draw(st.sampled_from(TARGETS))
    by_name = draw(st.booleans())
    old: dict[str, Any] | None = copy.deepcopy(target.old_object)
    assert old is not None
    if by_name and draw(st.booleans()):
        old = None  # the API server always sends oldObject since 1.15, but the gate must cope without it
    else:
        metadata = old["metadata"]
        if by_name and draw(st.booleans()):
            metadata["name"] = draw(st.one_of(texts, st.just(target.name)))  # the request's name wins
        labels = draw(st.dictionaries(st.sampled_from(["app", DELETION_PROTECTED, "x"]), texts, max_size=2))
        metadata["labels"] = labels if draw(st.booleans()) else draw(json_values)
        annotations: Any = draw(st.dictionaries(st.sampled_from([BREAK_GLASS, "x", "kubectl"]),
                                                st.one_of(texts, json_values), max_size=2))
        metadata["annotations"] = annotations if draw(st.booleans()) else draw(json_values)
        if draw(st.integers(0, 3)) == 0:  # mostly absent, so that most examples must be denied
            metadata["deletionTimestamp"] = draw(st.one_of(st.just("2024-01-01T00:00:00Z"), st.none(),
                                                           st.just(""), json_values))
        if draw(st.booleans()):
            metadata[draw(st.text(max_size=10))] = draw(hostile_values)
        if draw(st.booleans()):
            old[draw(st.sampled_from(["status", "extra", "kind", "apiVersion"]))] = draw(json_values)
    review = delete_review(target, name=target.name if by_name else "", old=old)
    request = review["request"]
    choice = draw(st.sampled_from(["absent", "true", "false"]))
    if choice == "absent":
        del request["dryRun"]
    else:
        request["dryRun"] = choice == "true"
    request["options"] = draw(st.one_of(
        st.none(), json_values,
        st.fixed_dictionaries({"kind": st.just("DeleteOptions"), "gracePeriodSeconds": st.integers(-5, 10**12),
                               "propagationPolicy": st.sampled_from(["Orphan", "Foreground", "Background", "Bogus"]),
                               "dryRun": st.lists(st.sampled_from(["All", "None"]), max_size=2)})))
    request["uid"] = draw(st.one_of(st.uuids().map(str), st.text(min_size=1, max_size=40), _huge_text()))
    for key in draw(st.lists(st.text(max_size=10), max_size=3)):
        if key not in request:
            request[key] = draw(hostile_values)
    if draw(st.booleans()):
        request["userInfo"] = draw(json_values)
    if draw(st.booleans()):
        key = draw(st.text(max_size=10).filter(lambda k: k not in ("apiVersion", "kind", "request")))
        review[key] = draw(json_values)
    data = _encode(review)
    return Body(data, _decoded(data))
