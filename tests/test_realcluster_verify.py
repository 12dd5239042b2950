"""The counterexamples `criticalsvc verify` found (tests/bundles/verify-*.yaml, design/criticalservice.md §7), replayed
on the real control plane with the gate installed, as a user would meet them:

* the CRD cycle (verify-crd-cycle.yaml): the second CriticalService is refused at CREATE, the message naming the
  cycle and its CRD step; the first one's stack still tears down;
* the namespace-content cycle (verify-namespace-cycle.yaml): the closing CREATE is admitted with the warning
  naming the step; deleting only the namespaces is refused for both (the documented limit, §6), and after
  the warning's way out (delete the ConfigMap first) the same namespace deletion finishes;
* the ManifestWork held by an object that stays (verify-manifestwork-held.yaml), with replayDeletion on and
  the real ManifestWork agent's deletion path (tests/realcluster/manifestwork.py): the ManifestWork goes and
  everything goes but the deletion-protected ConfigMap and its namespace (§6: replay closes it); removing the
  label lets those go too.

The bundles are the simulator's: the real API server needs what the simulator leaves out (a Deployment's
selector and template, a CRD's schema), which is added, and every name is made unique (the control plane is
the session's, shared), so the messages are compared with the names renamed the same way.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.backends import deployment_manifest
from tests.realcluster import ocmcrds
from tests.realcluster.cluster import RealCluster
from tests.realcluster.gate import GATE_NAMESPACE
from tests.realcluster.manifestwork import ManifestWorkAgent, Teardown
from tests.realcluster.teardown import (
    RepeatingDeleter,
    all_gone,
    object_path,
    remaining,
    replay_grant,
    wait_for,
)

pytestmark = pytest.mark.realcluster

BUNDLES = Path(__file__).parent / "bundles"
TIMEOUT = 60
SCHEMA = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}


class Bundle:
    """A verify bundle made real and unique: namespaces a, b -> a-<s>, b-<s>; group ex.com -> ex-<s>.com (still
    sorting after apps and criticalsvc.io, as the ManifestWork agent's pass does);
    CriticalServices cs0, cs1 -> cs0-<s>, cs1-<s>; label value x -> x-<s> (so no selector meets another
    test's objects); the Deployment gets a selector and template (0 replicas), the CRD a schema."""

    def __init__(self, name: str, *, replay: bool = False) -> None:
        self.suffix = uuid.uuid4().hex[:5]
        text = json.dumps([d for d in yaml.safe_load_all((BUNDLES / name).read_text()) if d])
        for old in ('"a"', '"b"', '"cs0"', '"cs1"', '"x"'):
            text = text.replace(old, f'{old[:-1]}-{self.suffix}"')
        self.docs: list[dict[str, Any]] = json.loads(text.replace("ex.com", f"ex-{self.suffix}.com"))
        for d in self.docs:
            if d["kind"] == "Deployment":
                md = d["metadata"]
                d["spec"] = deployment_manifest(md["name"], md["namespace"], replicas=0)["spec"]
            elif d["kind"] == "CustomResourceDefinition":
                for v in d["spec"]["versions"]:
                    v["schema"] = copy.deepcopy(SCHEMA)
            elif d["kind"] == "CriticalService" and replay:
                d["spec"]["replayDeletion"] = "WhenTearingDown"

    def name(self, original: str) -> str:
        """The unique name of `original` (a, b, cs0, cs1; `widgets.ex.com`)."""
        if original.endswith("ex.com"):
            return original.replace("ex.com", f"ex-{self.suffix}.com")
        return f"{original}-{self.suffix}"

    def kinds(self, *kinds: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] in kinds]

    def paths(self, *kinds: str) -> dict[str, str]:
        return {f"{d['kind']}/{d['metadata'].get('namespace', '')}/{d['metadata']['name']}": object_path(d)
                for d in self.docs if not kinds or d["kind"] in kinds}

    @property
    def crd(self) -> str:
        return str(self.kinds("CustomResourceDefinition")[0]["metadata"]["name"])

    @property
    def reader(self) -> dict[str, Any]:
        """What a user grants so the gate may read the criteria's types (deploy/README: aggregate-to-reader)."""
        return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": f"criticalsvc-read-verify-{self.suffix}",
                             "labels": {"criticalsvc.io/aggregate-to-reader": "true"}},
                "rules": [{"apiGroups": ["", self.name("ex.com")], "resources": ["configmaps", "widgets"],
                           "verbs": ["get", "list", "watch"]}]}


def apply(realcluster: RealCluster, docs: list[dict[str, Any]]) -> Any:
    return realcluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))


def grant_reading(realcluster: RealCluster, bundle: Bundle) -> None:
    """The bundle's reader ClusterRole, applied and aggregated (its CRD served): the gate may list ConfigMaps and
    Widgets."""
    done = apply(realcluster, [bundle.reader])
    assert done.returncode == 0, done.stderr
    done = realcluster.kubectl("wait", "--for=condition=Established", f"crd/{bundle.crd}", "--timeout=60s")
    assert done.returncode == 0, done.stderr
    gate = "system:serviceaccount:criticalsvc-system:criticalsvc"
    for what in ("configmaps", f"widgets.{bundle.name('ex.com')}"):
        wait_for(lambda w=what: realcluster.kubectl("auth", "can-i", "list", w, "--as", gate).stdout.strip() == "yes",
                 timeout=TIMEOUT, what=f"the gate allowed to list {what}")


def apply_objects(realcluster: RealCluster, bundle: Bundle) -> None:
    """Everything but the CriticalServices, the CRD served before its Widget, the gate allowed to read them."""
    done = apply(realcluster, bundle.kinds("Namespace", "CustomResourceDefinition"))
    assert done.returncode == 0, done.stderr
    grant_reading(realcluster, bundle)
    done = apply(realcluster, bundle.kinds("Deployment", "ConfigMap", "Widget"))
    assert done.returncode == 0, done.stderr


def protected(realcluster: RealCluster, path: str) -> bool:
    return realcluster.admin.delete(path, params={"dryRun": "All"}).status_code == 403


def remove_all(realcluster: RealCluster, bundle: Bundle) -> None:
    """Delete what is left of the bundle, re-sending refusals, and say if it could not."""
    left = {k: p for k, p in bundle.paths().items() if realcluster.admin.exists(p)}
    assert RepeatingDeleter(realcluster.admin, left).run(timeout=TIMEOUT), f"left behind: {left}"
    realcluster.admin.delete(object_path(bundle.reader))


def test_the_crd_cycle_is_refused_at_create_naming_the_cycle(realcluster: RealCluster) -> None:
    """cs0 protects Deployment a/d until the CRD widgets.ex.com is gone; cs1, protecting Widget b/w until a/d is
    gone, would close the cycle through the CRD (rule 4): kubectl apply fails on it with the cycle named."""
    bundle = Bundle("verify-crd-cycle.yaml")
    cs0, cs1 = bundle.kinds("CriticalService")
    try:
        apply_objects(realcluster, bundle)
        done = apply(realcluster, [cs0])
        assert done.returncode == 0, done.stderr
        done = apply(realcluster, [cs1])
        assert done.returncode != 0
        c0, c1 = bundle.name("cs0"), bundle.name("cs1")
        assert "denied the request" in done.stderr, done.stderr
        assert f"would close a dependency cycle: {c1} -> {c0} -> {c1}" in done.stderr, done.stderr
        assert f"{c0}.spec.criteria[0] waits for its provider's CRD {bundle.crd} of {c1}" in done.stderr, done.stderr
        assert not realcluster.admin.exists(object_path(cs1))
    finally:
        remove_all(realcluster, bundle)


def test_the_namespace_content_cycle_warns_at_create_and_namespace_deletion_needs_the_way_out(
        realcluster: RealCluster) -> None:
    """Admitted with the warning naming the ConfigMap that goes only with its namespace; deleting only the
    namespaces is refused for both (design/criticalservice.md §6); once the ConfigMap is deleted first, as the
    warning says, the same deletion of the namespaces (and of what lies outside them) finishes."""
    bundle = Bundle("verify-namespace-cycle.yaml")
    cs0, cs1 = bundle.kinds("CriticalService")
    a, b, c0, c1 = bundle.name("a"), bundle.name("b"), bundle.name("cs0"), bundle.name("cs1")
    try:
        apply_objects(realcluster, bundle)
        done = apply(realcluster, [cs0])
        assert done.returncode == 0 and "Warning" not in done.stderr, done.stderr
        done = apply(realcluster, [cs1])
        assert done.returncode == 0, done.stderr
        warning = (f"Warning: deleting only the namespaces can never finish {c1} -> {c0} -> {c1}: "
                   f"{c0}.spec.criteria[0] waits for configmaps {b}/c, which goes only with namespace {b} "
                   f"({c1}'s provider's); delete it first (design/criticalservice.md §6)")
        assert warning in done.stderr, done.stderr
        wait_for(lambda: protected(realcluster, f"/apis/{bundle.name('ex.com')}/v1/namespaces/{b}/widgets/w"),
                 timeout=TIMEOUT, what=f"the gate to protect {c1}'s provider")
        # Deleting only the namespaces: both refused, each naming the CriticalService it waits for.
        for ns, cs in ((a, c0), (b, c1)):
            response = realcluster.admin.delete(f"/api/v1/namespaces/{ns}")
            assert response.status_code == 403, response.text
            assert f"CriticalService {cs}" in response.json()["message"], response.text
        assert all(realcluster.admin.exists(p) for p in bundle.paths().values())
        # The way out the warning names: the ConfigMap first; then deleting the namespaces and what lies outside
        # them (the namespace deleter's part: the CRD, the CriticalServices) finishes, the namespace controller
        # emptying them.
        assert realcluster.admin.delete(f"/api/v1/namespaces/{b}/configmaps/c").status_code == 200
        outside = bundle.paths("Namespace", "CustomResourceDefinition", "CriticalService")
        assert RepeatingDeleter(realcluster.admin, outside).run(timeout=TIMEOUT)
        wait_for(lambda: all_gone(realcluster.admin, bundle.paths().values()), timeout=TIMEOUT,
                 what="the namespaces' content gone with them")
    finally:
        remove_all(realcluster, bundle)


def intents(realcluster: RealCluster) -> str:
    """The gate's deletion intents still recorded (criticalsvc/replay.py), as a failed wait reports them."""
    page = realcluster.admin.get(f"/api/v1/namespaces/{GATE_NAMESPACE}/configmaps"
                                 "?labelSelector=criticalsvc.io%2Fdeletion-intent%3Dtrue") or {}
    return "intents recorded: " + (", ".join(json.dumps(i.get("data")) for i in page.get("items") or []) or "none")


@pytest.fixture(scope="module")
def agent(realcluster: RealCluster) -> Iterator[ManifestWorkAgent]:
    """The work CRDs installed (idempotent: tests/test_realcluster_manifestwork.py does the same), the agent for the
    cluster namespace, and the operator's grant that lets the gate replay deletions of Deployments, Namespaces and
    CriticalServices (api/examples/replay.yaml)."""
    agent = ManifestWorkAgent(realcluster.admin, cluster_namespace="cluster1")
    agent.install_crds(realcluster.kubectl, [p.read_text() for p in ocmcrds.ensure_crds()])
    done = realcluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(replay_grant()))
    assert done.returncode == 0, done.stderr
    yield agent


def test_a_manifestwork_held_by_a_protected_object_with_replay_leaves_only_that_object_and_its_namespace(
        realcluster: RealCluster, agent: ManifestWorkAgent) -> None:
    """The agent's one pass is refused namespace a (the Widget, deleted with its CRD later in the sorted pass,
    still exists; the simulator, whose CRD cleanup takes longer, has Deployment a/d refused too) and may be refused
    cs0; ConfigMap b/c is labelled deletion-protected, so the agent waits for namespace b for good
    and the garbage collector never gets to retry what it was refused. With replayDeletion the gate deletes those
    itself once allowed: only the labelled ConfigMap and its terminating namespace stay, holding the
    ManifestWork. Removing the label lets them go, and the ManifestWork completes."""
    bundle = Bundle("verify-manifestwork-held.yaml", replay=True)
    a, b, cs0 = bundle.name("a"), bundle.name("b"), bundle.name("cs0")
    work = agent.apply(f"held-{bundle.suffix}", bundle.docs)
    grant_reading(realcluster, bundle)
    paths = bundle.paths()
    deployment = paths[f"Deployment/{a}/d"]
    configmap = paths[f"ConfigMap/{b}/c"]
    stays = {configmap, paths[f"Namespace//{b}"]}
    teardown = Teardown(realcluster.admin, work)
    try:
        wait_for(lambda: protected(realcluster, deployment), timeout=TIMEOUT,
                 what=f"the gate to protect {cs0}'s provider")
        teardown.start()
        # Twice the usual wait: the replays chain (namespace a, then cs0 once a is gone), each behind the namespace
        # controller's pass, which a loaded CI machine stretches.
        wait_for(lambda: all_gone(realcluster.admin, set(paths.values()) - stays), timeout=2 * TIMEOUT,
                 what="everything but the labelled ConfigMap and its namespace gone",
                 explain=lambda: f"{remaining(realcluster.admin, set(paths.values()) - stays)}; "
                                 f"{intents(realcluster)}")
        # Sorted, namespaces come before the CRD: namespace a was refused while the Widget still counted.
        assert paths[f"Namespace//{a}"] in {d.path for d in teardown.refused()}, teardown.refused()
        assert realcluster.admin.exists(configmap)
        namespace = realcluster.admin.get(paths[f"Namespace//{b}"]) or {}
        assert namespace.get("metadata", {}).get("deletionTimestamp"), namespace
        assert teardown.manifestwork_gone_at is None and realcluster.admin.exists(work.path)
        # The way out (§6): remove the label; the namespace controller empties b, and the agent finishes.
        patched = realcluster.admin.json_patch(configmap, [
            {"op": "remove", "path": "/metadata/labels/criticalsvc.io~1deletion-protected"}])
        assert patched.status_code == 200, patched.text
        wait_for(lambda: teardown.manifestwork_gone_at is not None, timeout=TIMEOUT, what="the ManifestWork gone")
        assert all_gone(realcluster.admin, paths.values())
    finally:
        if teardown.ident is not None:
            teardown.stop()
        if realcluster.admin.exists(configmap):
            realcluster.admin.json_patch(configmap, [
                {"op": "remove", "path": "/metadata/labels/criticalsvc.io~1deletion-protected"}])
        remove_all(realcluster, bundle)
