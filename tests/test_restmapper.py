"""Kind-vs-resource resolution: the built-in table, CRDs learned from a snapshot, and unserved names."""

from __future__ import annotations

from pathlib import Path

import pytest

from criticalsvc import criteria
from criticalsvc.admission import AdmissionRequest
from criticalsvc.api import CRDS, FinalizerCriterion, GroupResource, ObjectRef, SpecificResourceCriterion
from criticalsvc.decision import Rule, decide
from criticalsvc.manifests import load_path, load_text
from criticalsvc.restmapper import RESTMapper, guess_resource
from criticalsvc.snapshot import build_state

STORY = str(Path(__file__).parent.parent / "api" / "examples" / "reference-story.yaml")
COOL = GroupResource("my.crd.group", "coolresources")


@pytest.mark.parametrize(
    "spelling", ["customresourcedefinitions", "CustomResourceDefinition", "customresourcedefinition", "crd", "crds",
                 "CRD"])
def test_crd_kind_plural_singular_and_short_names_resolve(spelling):
    """Every spelling kubectl accepts for CRDs, the Kind included, resolves to the plural resource."""
    assert RESTMapper().resolve(GroupResource("apiextensions.k8s.io", spelling)) == CRDS


@pytest.mark.parametrize(
    ("group", "spelling", "expected"),
    [("apps", "Deployment", "deployments"), ("apps", "deploy", "deployments"), ("apps", "sts", "statefulsets"),
     ("", "ns", "namespaces"), ("", "Pod", "pods"), ("", "persistentvolumeclaim", "persistentvolumeclaims"),
     ("criticalsvc.io", "csvc", "criticalservices")],
)
def test_built_in_kinds_resolve_within_their_group(group, spelling, expected):
    """Built-in Kinds, singulars and short names resolve to their plural within their own group."""
    assert RESTMapper().resolve(GroupResource(group, spelling)) == GroupResource(group, expected)


@pytest.mark.parametrize("gr", [GroupResource("", "deployments"), GroupResource("apps", "pods"),
                                GroupResource("my.crd.group", "coolresources"), GroupResource("", "")])
def test_unknown_or_wrong_group_names_do_not_resolve(gr):
    """A name outside its group, or of a type nobody serves, resolves to None (not served)."""
    assert RESTMapper().resolve(gr) is None


def test_crds_in_a_snapshot_are_learned():
    """A CRD in the snapshot makes its Kind, plural, singular and short names resolvable."""
    state = build_state(load_path(STORY))
    for spelling in ("CoolResource", "coolresources", "coolresource", "cool"):
        assert state.resolve(GroupResource("my.crd.group", spelling)) == COOL
    t = state.mapper.lookup(COOL)
    assert t is not None and t.namespaced and t.api_version == "my.crd.group/v1"


def test_crd_after_its_instances_in_the_file_is_still_learned():
    """Instances listed before their CRD are stored under the CRD's plural, not a guess."""
    text = """\
apiVersion: example.com/v1
kind: Octopus
metadata: {name: o, namespace: sea}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: octopi.example.com}
spec:
  group: example.com
  scope: Namespaced
  names: {plural: octopi, singular: octopus, kind: Octopus}
  versions: [{name: v1, served: true, storage: true}]
"""
    state = build_state(load_text(text, "state.yaml"))
    assert state.get(ObjectRef(GroupResource("example.com", "octopi"), "sea", "o")) is not None
    assert state.resolve(GroupResource("example.com", "Octopus")) == GroupResource("example.com", "octopi")


@pytest.mark.parametrize("crd", [{}, {"spec": "x"}, {"spec": {"group": "g.io", "names": {"kind": "K"}}},
                                 {"spec": {"group": 1, "names": {"plural": "ks", "kind": "K"}}}])
def test_malformed_crds_are_ignored_not_fatal(crd):
    """A CRD without group, plural or kind teaches the mapper nothing and raises nothing."""
    mapper = RESTMapper()
    before = len(mapper.types())
    assert mapper.learn_crd(crd) is None
    assert len(mapper.types()) == before


def test_removing_a_type_forgets_every_spelling():
    """After remove(), neither the plural nor the Kind nor a short name resolves."""
    mapper = RESTMapper()
    mapper.remove(GroupResource("apps", "deployments"))
    for spelling in ("deployments", "Deployment", "deploy"):
        assert mapper.resolve(GroupResource("apps", spelling)) is None
    assert mapper.resolve(GroupResource("apps", "statefulsets")) is not None


@pytest.mark.parametrize(
    ("text", "expected"),
    [("deploy", GroupResource("apps", "deployments")), ("deployments.apps", GroupResource("apps", "deployments")),
     ("Deployment", GroupResource("apps", "deployments")), ("crd", CRDS), ("pods", GroupResource("", "pods")),
     ("csvc", GroupResource("criticalsvc.io", "criticalservices")), ("gizmo", None)],
)
def test_command_line_names_resolve_like_kubectl(text, expected):
    """`resolve_name` accepts what kubectl accepts on its command line, and None for unknown names."""
    assert RESTMapper().resolve_name(text) == expected


@pytest.mark.parametrize(
    ("kind", "plural"),
    [("Policy", "policies"), ("Box", "boxes"), ("Mesh", "meshes"), ("Gateway", "gateways"), ("Widget", "widgets"),
     ("Status", "statuses")],
)
def test_unknown_kinds_get_kubectls_guessed_plural(kind, plural):
    """An unknown Kind maps to the plural apimachinery's UnsafeGuessKindToResource would guess."""
    assert guess_resource(kind) == plural
    assert RESTMapper().resource_for_kind("example.com/v1", kind) == GroupResource("example.com", plural)


def test_known_kinds_map_to_their_registered_resource():
    """A known apiVersion/kind maps to its registered resource, core group included."""
    mapper = RESTMapper()
    assert mapper.resource_for_kind("v1", "Namespace") == GroupResource("", "namespaces")
    assert mapper.resource_for_kind("apiextensions.k8s.io/v1", "CustomResourceDefinition") == CRDS


@pytest.mark.parametrize(
    ("gr", "namespace", "name", "path"),
    [(GroupResource("apps", "deployments"), None, "", "/apis/apps/v1/deployments"),
     (GroupResource("apps", "deployments"), "app", "", "/apis/apps/v1/namespaces/app/deployments"),
     (GroupResource("apps", "deployments"), "app", "web", "/apis/apps/v1/namespaces/app/deployments/web"),
     (GroupResource("", "namespaces"), "app", "app", "/api/v1/namespaces/app"),
     (CRDS, "app", "", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions")],
)
def test_rest_paths_are_the_api_servers(gr, namespace, name, path):
    """A type's REST path is the API server's: core under /api, a namespace only for namespaced types."""
    t = RESTMapper().lookup(gr)
    assert t is not None and t.path(namespace=namespace, name=name) == path


def test_criterion_on_an_unserved_type_is_met_without_crashing():
    """A criterion naming a type nobody serves holds: no instance of it can exist."""
    state = build_state(load_path(STORY))
    gizmos = GroupResource("example.com", "Gizmo")
    for c in (FinalizerCriterion(gizmos, "example.com/f"), SpecificResourceCriterion(ObjectRef(gizmos, "ns", "g"))):
        verdict = criteria.evaluate(c, state)
        assert verdict.satisfied and verdict.group_resource is None


def test_provider_guarded_only_by_unserved_types_may_go():
    """A provider whose CriticalService only names unserved types is allowed to be deleted."""
    text = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: d, namespace: ns}
---
apiVersion: criticalsvc.io/v1alpha1
kind: CriticalService
metadata: {name: cs}
spec:
  provider: {group: apps, resource: Deployment, namespace: ns, name: d}
  criteria:
  - {type: Finalizer, finalizer: {group: example.com, resource: Gizmo, finalizerName: example.com/f}}
  - {type: Resources, resources: {group: example.com, resource: gizmos}}
"""
    state = build_state(load_text(text, "state.yaml"))
    request = AdmissionRequest(uid="u", group_resource=GroupResource("apps", "deployments"), operation="DELETE",
                               name="d", namespace="ns", old_object={"metadata": {"name": "d", "namespace": "ns"}})
    decision = decide(request, state)
    assert decision.allowed and decision.rule is Rule.CRITERIA_MET and decision.protected


def test_provider_written_as_a_kind_is_protected():
    """A provider written as a Kind (`Deployment`) guards DELETEs that arrive as `deployments`."""
    text = """\
apiVersion: v1
kind: ConfigMap
metadata: {name: c, namespace: ns, finalizers: [example.com/f]}
---
apiVersion: criticalsvc.io/v1alpha1
kind: CriticalService
metadata: {name: cs}
spec:
  provider: {group: apps, resource: Deployment, namespace: ns, name: d}
  criteria:
  - {type: Finalizer, finalizer: {resource: ConfigMap, finalizerName: example.com/f}}
"""
    state = build_state(load_text(text, "state.yaml"))
    request = AdmissionRequest(uid="u", group_resource=GroupResource("apps", "deployments"), operation="DELETE",
                               name="d", namespace="ns", old_object={"metadata": {"name": "d", "namespace": "ns"}})
    decision = decide(request, state)
    assert not decision.allowed and decision.blocking == ("cs",)
    assert "configmaps ns/c still carries finalizer example.com/f" in decision.message


def test_instances_in_a_snapshot_without_their_crd_still_block():
    """A snapshot holding CRs but not their CRD (`kubectl get coolresources -o yaml`) still blocks the provider."""
    text = """\
apiVersion: my.crd.group/v1
kind: CoolResource
metadata: {name: alpha, namespace: cool-apps, finalizers: [my.crd.group/super-important]}
---
apiVersion: criticalsvc.io/v1alpha1
kind: CriticalService
metadata: {name: cs}
spec:
  provider: {group: apps, resource: deployments, namespace: ns, name: d}
  criteria:
  - {type: Finalizer, finalizer: {group: my.crd.group, resource: CoolResource,
                                  finalizerName: my.crd.group/super-important}}
"""
    state = build_state(load_text(text, "state.yaml"))
    request = AdmissionRequest(uid="u", group_resource=GroupResource("apps", "deployments"), operation="DELETE",
                               name="d", namespace="ns", old_object={"metadata": {"name": "d", "namespace": "ns"}})
    decision = decide(request, state)
    assert not decision.allowed
    assert "cool-apps/alpha still carries finalizer my.crd.group/super-important" in decision.message
