"""The gate's own ValidatingWebhookConfigurations, `criticalsvc-providers` and its shards: the routes that routing.py
works out, rendered as objects the API server evaluates (rules, namespaceSelector, objectSelector and CEL
matchConditions), spread over SHARDS configurations, each with its probe webhook; and the comparison with what is
stored. Pure: the router (criticalsvc/webhookrouter.py) reads and writes them.

Semantics this relies on, read at the pinned Kubernetes, are in routing.py's docstring and design/routing.md.
"""

from __future__ import annotations

import copy
import hashlib
import json
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from .api import (
    CRDS,
    DELETION_PROTECTED_ALWAYS,
    DELETION_PROTECTED_LABEL,
    NAMESPACES,
    PROTECTED_LABEL,
    GroupResource,
)
from .labels import LabelSelector, Requirement
from .restmapper import ResourceType
from .routing import (
    ADMISSION_API_VERSION,
    CRDS_WEBHOOK,
    DELETE_WEBHOOK,
    KIND,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    MAX_EXPRESSION_CHARS,
    NAMESPACES_WEBHOOK,
    PROBE_CONFIGMAP,
    PROBE_MESSAGE,
    PROBE_PATH,
    PROBE_WEBHOOK,
    PROVIDERS_CONFIGURATION,
    SHIPPED_CONFIGURATION,
    TEMPLATE_WEBHOOK,
    UPDATE_WEBHOOK,
    Desired,
    Route,
    routes_labels,
)

# The routes are spread over SHARDS configurations, criticalsvc-providers and criticalsvc-providers-1 .. -7, by
# a stable hash of where each route points (its namespace, else its name), so a new CriticalService rewrites one
# eighth of them. kube-apiserver compiles every matchCondition of a configuration it validates when any of them
# changed (ValidateValidatingWebhookConfigurationUpdate, ignoreValidatingWebhookMatchConditions:
# https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/apis/admissionregistration/validation/validation.go#L606-L617)
# and rebuilds the webhooks of a configuration that changed, and only of that one (configurationsCache:
# https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/apiserver/pkg/admission/configuration/validating_webhook_manager.go#L66-L71):
# one configuration of 10,000 CriticalServices' routes, 373 KB, took 0.64 s to admit on an idle control plane.
# Never changed lightly: a route's home moves only when SHARDS does, and the router's write order (shard 0 last)
# covers the one move it knows, from the single configuration of earlier versions (design/routing.md).
SHARDS = 8


# --- rendering ------------------------------------------------------------------------------------------
@attrs.frozen
class Rendered:
    """The owned configuration as it will be written, its digest (what the probe reports), and the routes
    sent more broadly than asked, each with why (`Routing.broad`)."""

    configuration: dict[str, Any]
    digest: str
    broad: Mapping[Route, str]
    shard: int = 0


def template_webhook(shipped: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The shipped webhook whose clientConfig, namespaceSelector and failurePolicy the owned ones copy."""
    webhooks = [w for w in shipped.get("webhooks") or [] if isinstance(w, Mapping)]
    named = [w for w in webhooks if w.get("name") == TEMPLATE_WEBHOOK and isinstance(w.get("clientConfig"), Mapping)]
    with_client = [w for w in webhooks if isinstance(w.get("clientConfig"), Mapping)]
    found = named or with_client
    return found[0] if found else None


def configuration_name(shard: int) -> str:
    """The name of shard `shard`'s configuration: criticalsvc-providers for 0 (the one earlier versions wrote)."""
    return PROVIDERS_CONFIGURATION if shard == 0 else f"{PROVIDERS_CONFIGURATION}-{shard}"


CONFIGURATION_NAMES = tuple(configuration_name(i) for i in range(SHARDS))


def probe_configmap(shard: int) -> str:
    """The ConfigMap the router's dry-run CREATE names to probe shard `shard` (its probe webhook's alone)."""
    return PROBE_CONFIGMAP if shard == 0 else f"{PROBE_CONFIGMAP}-{shard}"


def shard_of(route: Route) -> int:
    """The configuration that holds `route`: by its namespace (a namespace DELETE by the namespace's name, so a
    namespace and what is routed in it share one), else its name."""
    return shard_in(route.namespace or route.name or "")


def shard_in(namespace_or_name: str) -> int:
    """The shard of what is routed in a namespace (or of a cluster-scoped name): crc32, the same in every process
    and version."""
    return zlib.crc32(namespace_or_name.encode()) % SHARDS


def partition(routes: Iterable[Route]) -> tuple[frozenset[Route], ...]:
    """`routes` by shard_of: SHARDS sets, some empty."""
    parts: list[set[Route]] = [set() for _ in range(SHARDS)]
    for r in routes:
        parts[shard_of(r)].add(r)
    return tuple(frozenset(p) for p in parts)


def render_all(wanted: Desired, shipped: Mapping[str, Any], *, probe_namespace: str) -> list[Rendered]:
    """Every shard that holds a route, rendered (what the router writes, shard by shard, for `wanted`)."""
    return [render(part, wanted.types, shipped, probe_namespace=probe_namespace, shard=i)
            for i, part in enumerate(partition(wanted.routes)) if part]


def render(routes: Iterable[Route], types: Mapping[GroupResource, ResourceType], shipped: Mapping[str, Any], *,
           probe_namespace: str, shard: int = 0) -> Rendered:
    """Shard `shard`'s configuration holding `routes` (those shard_of puts there), its settings copied from the
    stored `shipped` one; `types`: the served version and scope of each provider type (Desired.types).

    Raises ValueError when `shipped` has no webhook to copy a clientConfig from, or no uid to own it by."""
    template = template_webhook(shipped)
    metadata = shipped.get("metadata") or {}
    if template is None:
        raise ValueError(f"ValidatingWebhookConfiguration {metadata.get('name')} has no webhook to copy from")
    if not metadata.get("uid"):
        raise ValueError(f"ValidatingWebhookConfiguration {metadata.get('name')} has no uid (not a stored object)")
    ordered = sorted(routes, key=Route.sort_key)
    broad: dict[Route, str] = {}
    webhooks: list[dict[str, Any]] = []
    not_labelled: dict[str, Any] = {"matchExpressions": [
        {"key": DELETION_PROTECTED_LABEL, "operator": "NotIn", "values": [DELETION_PROTECTED_ALWAYS]}]}
    not_carried: dict[str, Any] = {}
    if routes_labels(shipped):
        # What carries the gate's label is the shipped protected.gate's (and protected-updates.gate's) alone, so
        # one webhook answers and names itself in the message. Safe on a lagging API server: one that holds this
        # configuration holds the shipped webhooks, read stored before it was written (design/routing.md).
        not_carried = {"matchExpressions": [{"key": PROTECTED_LABEL, "operator": "DoesNotExist"}]}
        not_labelled = {"matchExpressions": [*not_labelled["matchExpressions"], *not_carried["matchExpressions"]]}
    for name, operation, kinds, selector in (
            (NAMESPACES_WEBHOOK, "DELETE", lambda gr: gr == NAMESPACES, not_labelled),
            (CRDS_WEBHOOK, "DELETE", lambda gr: gr == CRDS, not_labelled),
            # A labelled object goes to the labelled-objects webhook alone, as before this configuration.
            (DELETE_WEBHOOK, "DELETE", lambda gr: gr not in (NAMESPACES, CRDS), not_labelled),
            # The labelled-objects webhook reviews DELETEs only; an UPDATE's objectSelector matches the new or the
            # old object, so the gate's own label write (the old one lacks it) still comes here.
            (UPDATE_WEBHOOK, "UPDATE", lambda gr: True, not_carried)):
        mine = [r for r in ordered if r.operation == operation and kinds(r.group_resource)]
        if not mine:
            continue
        for i, (part, condition, why, too_large) in enumerate(_split(mine)):
            # Who is broad: the routes that are broad themselves (a selector without a namespace routes every
            # namespace DELETE: that CriticalService is the cause, the others it subsumes are not), or every route
            # of a webhook whose condition is too large to write even alone.
            broad.update((r, why) for r in part if r.broad or too_large)
            piece = name if i == 0 else name.replace(".gate.", f"-{i + 1}.gate.", 1)
            webhooks.append(_webhook(piece, _rules(part, types), template, object_selector=selector,
                                     conditions=[] if condition is None else [{"name": "protected", "expression":
                                                                               condition}],
                                     namespaces=_namespaces(part)))
    own_name = configuration_name(shard)
    # Named in the digest: two shards never answer a probe with one digest, even when both hold nothing.
    digest = _digest([{"name": own_name}, *webhooks])
    webhooks.append(_probe_webhook(template, digest, probe_namespace, probe_configmap(shard)))
    configuration = {
        "apiVersion": ADMISSION_API_VERSION, "kind": KIND,
        "metadata": {
            "name": own_name,
            "labels": {"app.kubernetes.io/name": "criticalsvc", MANAGED_BY_LABEL: MANAGED_BY},
            "ownerReferences": [{"apiVersion": ADMISSION_API_VERSION, "kind": KIND,
                                 "name": str(metadata.get("name") or SHIPPED_CONFIGURATION),
                                 "uid": str(metadata["uid"])}],
        },
        "webhooks": webhooks,
    }
    return Rendered(configuration, digest, broad, shard)


def _split(routes: list[Route]) -> list[tuple[list[Route], str | None, str, bool]]:
    """`routes` as few webhooks as keep each matchCondition under MAX_EXPRESSION_CHARS: (routes, condition,
    why, too large) each; condition None (every request of their types sent) only when a route is broad itself,
    or (too large) when the routes would not fit even one to a webhook. The API server calls every webhook that
    matches, so routes split over several webhooks route exactly what one would: 10,000 CriticalServices of the
    measured mix stay narrow (`python -m benchmarks protection`)."""
    condition, why = _condition(routes)
    if condition is None or len(condition) <= MAX_EXPRESSION_CHARS:
        return [(routes, condition, why, False)]
    pieces = max(2, -(-len(condition) // (MAX_EXPRESSION_CHARS * 9 // 10)))
    while True:
        size = -(-len(routes) // pieces)
        parts = [routes[i:i + size] for i in range(0, len(routes), size)]
        shards = [(part, *_condition(part)) for part in parts]
        if all(c is not None and len(c) <= MAX_EXPRESSION_CHARS for _part, c, _why in shards):
            return [(part, c, w, False) for part, c, w in shards]
        if size == 1:
            too_long = (f"its matchCondition would be past the {MAX_EXPRESSION_CHARS:,} characters the gate writes "
                        "(the API server's CEL parser stops at 100,000): every request of these types is sent")
            return [(part, c, w, False) if c is not None and len(c) <= MAX_EXPRESSION_CHARS
                    else (part, None, too_long, True) for part, c, w in shards]
        pieces *= 2


def _rules(routes: list[Route], types: Mapping[GroupResource, ResourceType]) -> list[dict[str, Any]]:
    """One rule per resource (and subresource), in its served version and scope."""
    out: dict[GroupResource, dict[str, Any]] = {}
    for r in routes:
        base = GroupResource(r.group_resource.group, r.group_resource.resource.partition("/")[0])
        t = types.get(base)
        version, namespaced = (t.version, t.namespaced) if t is not None else ("v1", False)
        out.setdefault(r.group_resource, {
            "apiGroups": [base.group], "apiVersions": [version], "operations": [r.operation],
            "resources": [r.group_resource.resource], "scope": "Namespaced" if namespaced else "Cluster"})
    return [out[gr] for gr in sorted(out, key=lambda g: (g.group, g.resource))]


# The request's fields that are `omitempty` (name, namespace, subResource) are absent, not "", when empty:
# reading one then is an error ("no such key"), so each is read behind has()
# (https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/apiserver/pkg/cel/common/valuesschemalesstyped.go,
# lookupField; https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/api/admission/v1/types.go).
# The object's name: `request.name`, or for a deletecollection's item (no name) the stored object's.
_NAME = ("(has(request.name) ? request.name : (oldObject == null || !has(oldObject.metadata.name) ? '' : "
         "oldObject.metadata.name))")
_NAMESPACE = "(has(request.namespace) ? request.namespace : '')"
_SUBRESOURCE = "(has(request.subResource) ? request.subResource : '')"


def _replicas(var: str) -> str:
    """A Scale's spec.replicas, 0 when absent (autoscaling/v1 ScaleSpec.Replicas is omitempty)."""
    return f"({var} == null || !has({var}.spec) || !has({var}.spec.replicas) ? 0 : {var}.spec.replicas)"


def _labels_of(var: str) -> str:
    # `== null`, not `!= null`: cel-python (the stand-in's evaluator) has no `!=` between a map and null.
    return f"({var} == null || !has({var}.metadata.labels) ? {{}} : {var}.metadata.labels)"


def _condition(routes: list[Route]) -> tuple[str | None, str]:
    """One CEL expression true for every request some route covers; None (send everything) with the reason
    when one of them is broad."""
    broad = [r for r in routes if r.broad]
    if broad:
        first = broad[0]
        if first.group_resource == NAMESPACES:
            why = ("a provider selector without a namespace may gain a member in any namespace, so every "
                   "namespace DELETE is sent")
        else:
            why = f"{first} is routed whole"
        return None, why
    clauses = [f"{_NAME} == ''"]  # nothing identifies the object: the gate decides
    by_type: dict[GroupResource, list[Route]] = {}
    for r in routes:
        by_type.setdefault(r.group_resource, []).append(r)
    for gr in sorted(by_type, key=lambda g: (g.group, g.resource)):
        rs = by_type[gr]
        resource, _, sub = gr.resource.partition("/")
        head = [f"request.resource.group == {_cel_string(gr.group)}",
                f"request.resource.resource == {_cel_string(resource)}"]
        if rs[0].operation == "UPDATE":
            head.append(f"{_SUBRESOURCE} == {_cel_string(sub)}")
        which: list[str] = []
        # A cluster-scoped object by its name alone (a Namespace's request.namespace is its own name), a
        # namespaced one by namespace/name.
        anywhere = sorted({r.name for r in rs if r.name is not None and r.namespace is None})
        if anywhere:
            which.append(f"{_NAME} in {_cel_list(anywhere)}")
        named = sorted({f"{r.namespace}/{r.name}" for r in rs if r.name is not None and r.namespace is not None})
        if named:
            which.append(f"({_NAMESPACE} + '/' + {_NAME}) in {_cel_list(named)}")
        selected = [r for r in rs if r.selector is not None]
        if selected:
            # The labels bound once (`exists` over a one-element list) and read by every selector; on
            # UPDATE either object's labels, as an objectSelector matches either.
            sources = ["oldObject"] if rs[0].operation == "DELETE" else ["object", "oldObject"]
            each = " || ".join([*_one_key_selectors(selected, "l"),
                                *(_in_namespace(r.namespace, _selector_cel(r.selector or LabelSelector(), "l"))
                                  for r in sorted(selected, key=Route.sort_key) if not _one_key(r))])
            which.append(f"[{', '.join(_labels_of(s) for s in sources)}].exists(l, {each})")
        for r in sorted((r for r in rs if r.to_zero or r.replicas_change), key=Route.sort_key):
            asked = []
            if r.to_zero:
                asked.append(f"{_replicas('object')} == 0")
            if r.replicas_change:
                asked.append(f"{_replicas('object')} != {_replicas('oldObject')}")
            which.append(_in_namespace(r.namespace, " || ".join(asked)))
        clauses.append(f"({' && '.join(head)} && ({' || '.join(which)}))")
    return " || ".join(clauses), ""


def _one_key(route: Route) -> bool:
    """Is the route's selector one `key in (values)` (`app=x` is one): many of them are one list lookup per key."""
    selector = route.selector
    return selector is not None and len(selector.requirements) == 1 and selector.requirements[0].operator == "In"


def _one_key_selectors(routes: list[Route], labels: str) -> list[str]:
    """The one-key selectors of `routes` as one list lookup per key, namespace/value (or the value alone for a
    selector in every namespace). The API server's CEL checker and cost estimator take time that grows faster
    than the expression: 1,250 selectors written one by one took kube-apiserver 16 s to admit (295 KB, 6
    webhooks), the same number of names in lists 0.45 s (design/routing.md, "Any number of CriticalServices")."""
    by_key: dict[str, tuple[set[str], set[str]]] = {}
    for r in routes:
        if not _one_key(r):
            continue
        requirement = (r.selector or LabelSelector()).requirements[0]
        scoped, anywhere = by_key.setdefault(requirement.key, (set(), set()))
        if r.namespace:
            scoped.update(f"{r.namespace}/{v}" for v in requirement.values)
        else:
            anywhere.update(requirement.values)
    out = []
    for key in sorted(by_key):
        scoped, anywhere = by_key[key]
        k = _cel_string(key)
        tests = ([f"({_NAMESPACE} + '/' + {labels}[{k}]) in {_cel_list(sorted(scoped))}"] if scoped else []) + \
            ([f"{labels}[{k}] in {_cel_list(sorted(anywhere))}"] if anywhere else [])
        out.append(f"({k} in {labels} && ({' || '.join(tests)}))")
    return out


def _in_namespace(namespace: str | None, expression: str) -> str:
    return f"({_NAMESPACE} == {_cel_string(namespace)} && ({expression}))" if namespace else f"({expression})"


def _selector_cel(selector: LabelSelector, labels: str) -> str:
    """A label selector as CEL over the map `labels`, with its own semantics (labels.Requirement.matches)."""
    if selector.is_empty:
        return "true"
    return " && ".join(_requirement_cel(r, labels) for r in selector.requirements)


def _requirement_cel(r: Requirement, labels: str) -> str:
    key = _cel_string(r.key)
    values = _cel_list(sorted(r.values))
    match r.operator:
        case "In":
            return f"({key} in {labels} && {labels}[{key}] in {values})"
        case "NotIn":
            return f"(!({key} in {labels}) || !({labels}[{key}] in {values}))"
        case "Exists":
            return f"({key} in {labels})"
        case "DoesNotExist":
            return f"!({key} in {labels})"
    raise ValueError(f"unknown label selector operator {r.operator!r}")


def _cel_string(value: str) -> str:
    """A CEL string literal (cel-spec langdef.md, "String and Bytes Values")."""
    out = []
    for ch in value:
        if ch in "\\'":
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "'" + "".join(out) + "'"


def _cel_list(values: Iterable[str]) -> str:
    return "[" + ", ".join(_cel_string(v) for v in values) + "]"


NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # the API server sets it on every namespace, immutable

def _namespaces(routes: list[Route]) -> list[str] | None:
    """The namespaces `routes` are confined to, when every one is (a request elsewhere matches none of them)."""
    namespaces = {r.namespace for r in routes}
    return None if None in namespaces or "" in namespaces else sorted(n for n in namespaces if n)


def _webhook(name: str, rules: list[dict[str, Any]], template: Mapping[str, Any], *,
             object_selector: dict[str, Any], conditions: list[dict[str, str]],
             namespaces: list[str] | None = None) -> dict[str, Any]:
    namespace_selector = copy.deepcopy(dict(template.get("namespaceSelector") or {}))
    if namespaces:
        # The API server matches the namespaceSelector before it evaluates any matchCondition
        # (https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook/generic/webhook.go#L298-L312),
        # on the request's namespace's labels, a namespace its informer has not seen yet read live
        # (https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook/predicates/namespace/matcher.go#L45-L55);
        # kubernetes.io/metadata.name is set by the API server on every
        # namespace and cannot be changed. So a request in a namespace where these routes have no name pays a
        # label match, not the evaluation of a condition that grows with the names routed (at 1,000 CriticalServices
        # 0.63 ms of kube-apiserver's CPU per unprotected DELETE: `python -m benchmarks realcluster`).
        namespace_selector["matchExpressions"] = [
            *(namespace_selector.get("matchExpressions") or []),
            {"key": NAMESPACE_NAME_LABEL, "operator": "In", "values": namespaces}]
    out = {
        "name": name,
        "rules": rules,
        "namespaceSelector": namespace_selector,
        "objectSelector": object_selector,
        # The operator's choice on the shipped configuration (the Helm chart's `failurePolicy`), Fail by default.
        "failurePolicy": template.get("failurePolicy") or "Fail",
        "sideEffects": "NoneOnDryRun",
        "matchPolicy": "Equivalent",
        "timeoutSeconds": 5,
        "admissionReviewVersions": ["v1"],
        "clientConfig": copy.deepcopy(dict(template["clientConfig"])),
    }
    if conditions:
        out["matchConditions"] = conditions
    return out


def _digest(webhooks: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(webhooks, sort_keys=True).encode()).hexdigest()[:16]


def _probe_webhook(template: Mapping[str, Any], digest: str, namespace: str, configmap: str) -> dict[str, Any]:
    """Matches only the router's dry-run CREATE of ConfigMap `configmap` in `namespace`; its path names `digest`."""
    client = copy.deepcopy(dict(template["clientConfig"]))
    if isinstance(client.get("service"), Mapping):
        client["service"] = {**client["service"], "path": f"{PROBE_PATH}{digest}"}
    elif isinstance(client.get("url"), str):
        base = client["url"].split("://", 1)
        scheme, rest = (base[0], base[1]) if len(base) == 2 else ("https", base[0])
        client["url"] = f"{scheme}://{rest.split('/', 1)[0]}{PROBE_PATH}{digest}"
    out = _webhook(PROBE_WEBHOOK, [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                    "resources": ["configmaps"], "scope": "Namespaced"}],
                   {**template, "clientConfig": client}, object_selector={},
                   conditions=[{"name": "probe", "expression": f"has(request.dryRun) && request.dryRun == true && "
                                                               f"{_NAME} == {_cel_string(configmap)}"}])
    out["namespaceSelector"] = {"matchExpressions": [
        {"key": NAMESPACE_NAME_LABEL, "operator": "In", "values": [namespace]}]}
    out["failurePolicy"] = "Ignore"  # a probe that fails is "not routed yet", never a refused user request
    return out


def probe_digest(config: Mapping[str, Any] | None) -> str | None:
    """The digest a stored configuration's probe webhook names, None when it has none."""
    for webhook in (config or {}).get("webhooks") or []:
        if isinstance(webhook, Mapping) and webhook.get("name") == PROBE_WEBHOOK:
            client = webhook.get("clientConfig") or {}
            path = (client.get("service") or {}).get("path") if isinstance(client.get("service"), Mapping) else \
                str(client.get("url") or "")
            if isinstance(path, str) and PROBE_PATH in path:
                return path.rsplit(PROBE_PATH, 1)[1]
    return None


def probe_answer(digest: str) -> str:
    """The denial the gate gives a probe called on `digest`, which the router reads back (digest_in)."""
    return f"{PROBE_MESSAGE} {PROVIDERS_CONFIGURATION} at digest {digest}"


def digest_in(message: str) -> str | None:
    """The digest in a probe's denial as the API server relays it, None when it is not a probe's."""
    marker = f"{PROBE_MESSAGE} {PROVIDERS_CONFIGURATION} at digest "
    if marker not in message:
        return None
    return message.split(marker, 1)[1].split()[0].strip("\"'.") or None


# --- comparing with what is stored ------------------------------------------------------------------------
# admissionregistration/v1 defaults the API server fills in (SetDefaults_ValidatingWebhook, SetDefaults_Rule,
# SetDefaults_ServiceReference:
# https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/apis/admissionregistration/v1/defaults.go).
_WEBHOOK_DEFAULTS = {"failurePolicy": "Fail", "matchPolicy": "Equivalent", "namespaceSelector": {},
                     "objectSelector": {}, "timeoutSeconds": 10}


def _normal_webhook(webhook: Mapping[str, Any]) -> dict[str, Any]:
    out = {**_WEBHOOK_DEFAULTS, **copy.deepcopy(dict(webhook))}
    out["rules"] = [{"scope": "*", **rule} for rule in out.get("rules") or []]
    client = out.get("clientConfig") or {}
    if isinstance(client.get("service"), Mapping):
        client["service"] = {"port": 443, **client["service"]}
    out["clientConfig"] = client
    if not out.get("matchConditions"):
        out.pop("matchConditions", None)
    return out


def same_configuration(stored: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> bool:
    """Whether writing `desired` over `stored` would change anything the API server keeps.

    Compared: webhooks (with the server's defaults applied to both), the ownerReferences, and the labels
    the gate sets. Ignored: resourceVersion, uid, generation, creationTimestamp, managedFields, and labels
    or annotations someone else added."""
    if stored is None:
        return False
    meta, want = stored.get("metadata") or {}, desired.get("metadata") or {}
    labels = meta.get("labels") or {}
    if any(labels.get(k) != v for k, v in (want.get("labels") or {}).items()):
        return False
    owners = [{k: o.get(k) for k in ("apiVersion", "kind", "name", "uid")} for o in meta.get("ownerReferences") or []]
    if owners != want.get("ownerReferences", []):
        return False
    return [_normal_webhook(w) for w in stored.get("webhooks") or []] == \
        [_normal_webhook(w) for w in desired.get("webhooks") or []]


def for_update(desired: Mapping[str, Any], stored: Mapping[str, Any]) -> dict[str, Any]:
    """`desired` as a PUT body over `stored`: its resourceVersion (the API server's optimistic concurrency:
    a Conflict if someone wrote in between), and the labels and annotations others added, kept."""
    body = copy.deepcopy(dict(desired))
    meta = stored.get("metadata") or {}
    body["metadata"]["resourceVersion"] = meta.get("resourceVersion")
    body["metadata"]["labels"] = {**(meta.get("labels") or {}), **body["metadata"]["labels"]}
    if meta.get("annotations"):
        body["metadata"]["annotations"] = dict(meta["annotations"])
    return body
