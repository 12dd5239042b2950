"""One `kubectl apply -f` of a bundle whose CriticalServices name a type the gate does not watch yet works the
first time, on both clusters: admitting the second CriticalService needs the cache of the type the first one
made the gate watch (whether the two close a cycle depends on those objects' labels), and the gate waits for it
within the webhook's timeout instead of refusing (criticalsvc/server.py, DEFAULT_SYNC_WAIT)."""

from __future__ import annotations

import yaml

from tests.backends import Backend, ok, unique
from tests.realcluster.teardown import wait_for

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
CSVCS = "/apis/criticalsvc.io/v1alpha1/criticalservices"


def _bundle(group: str, ns: str, tag: str) -> str:
    def widget(name: str, labels: dict[str, str]) -> dict[str, object]:
        return {"apiVersion": f"{group}/v1", "kind": "Widget",
                "metadata": {"name": name, "namespace": ns, "labels": labels}}

    def service(name: str, provider: str, criterion: dict[str, object]) -> dict[str, object]:
        return {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": name},
                "spec": {"provider": {"group": group, "resource": "widgets", "namespace": ns, "name": provider},
                         "criteria": [criterion]}}

    docs = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        widget("w1", {"tier": "db"}), widget("w2", {"tier": "web"}),
        # w1 waits for every cache widget of the namespace: w2 is none, which only its labels tell.
        service(f"first-{tag}", "w1", {"type": "Resources", "resources": {
            "group": group, "resource": "widgets", "namespace": ns, "selector": {"matchLabels": {"tier": "cache"}}}}),
        service(f"second-{tag}", "w2", {"type": "SpecificResource", "specificResource": {
            "group": group, "resource": "widgets", "namespace": ns, "name": "w1"}}),
    ]
    return yaml.safe_dump_all(docs)


def test_one_apply_of_a_bundle_naming_a_type_not_watched_yet_works_first_time(cluster: Backend) -> None:
    tag = unique("bundle")
    group = f"{tag}.example.com"
    reader = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
              "metadata": {"name": f"read-{group}", "labels": {"criticalsvc.io/aggregate-to-reader": "true"}},
              "rules": [{"apiGroups": [group], "resources": ["widgets"], "verbs": ["get", "list", "watch"]}]}
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": f"widgets.{group}"},
           "spec": {"group": group, "scope": "Namespaced", "names": {"plural": "widgets", "kind": "Widget"},
                    "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}
    # Beforehand, as the user did: the type exists and the gate may read it.
    ok(cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([reader, crd])))
    ok(cluster.kubectl("wait", "--for=condition=Established", f"crd/widgets.{group}", "--timeout=60s"))
    try:
        applied = cluster.kubectl("apply", "-f", "-", input=_bundle(group, tag, tag))
        assert applied.returncode == 0, applied.stderr
        assert f"criticalservice.criticalsvc.io/second-{tag} created" in applied.stdout
        # ... and the gate enforces what it admitted: w2 waits for w1 (once the gate has routed widgets).
        def refused() -> bool:
            done = cluster.kubectl("delete", f"widgets.{group}", "w2", "-n", tag, "--dry-run=server")
            return done.returncode != 0 and f"CriticalService second-{tag} protects it" in done.stderr

        wait_for(refused, timeout=60, what="the DELETE of w2 refused while w1 exists")
    finally:
        cluster.kubectl("delete", "namespace", tag, "--wait=false")
        for name in (f"second-{tag}", f"first-{tag}"):
            wait_for(lambda name=name: cluster.admin.delete(f"{CSVCS}/{name}").status_code in (200, 404), timeout=90,
                     what=f"the DELETE of CriticalService {name}")
        cluster.kubectl("delete", "crd", f"widgets.{group}", "--wait=false")
        cluster.kubectl("delete", "clusterrole", f"read-{group}")
