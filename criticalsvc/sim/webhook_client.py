"""Calling a validating webhook over HTTPS the way kube-apiserver does, and registering webhooks.

The call (design/kubernetes-semantics.md §1, §1.5, §7):

* `POST <url>?timeout=<N>s` with the AdmissionReview v1 JSON the store built, `Content-Type:
  application/json`, over HTTP/1.1 and TLS. The server certificate is verified against the
  configuration's `caBundle` and the URL's host (an IP host needs an IP SAN); a client certificate is
  presented when one is configured (the API server's `--admission-control-config-file` kubeconfig).
* `timeoutSeconds` defaults to 10 s [A2]. httpx applies it per phase (connect, write, read), not to
  the whole exchange; a webhook that trickles bytes could take longer, which no real webhook does.
* A failed call raises WebhookCallError, and the store applies `failurePolicy` to it [D1]: transport
  errors and timeouts, any non-2xx status, a body that is not JSON, a reply that is not an
  `admission.k8s.io/v1` AdmissionReview, a missing `response`, a `response.uid` that is not the
  request's, an `allowed` that is not a boolean [D2]. The messages follow the API server's, so the
  client sees `Internal error occurred: failed calling webhook "<name>": failed to call webhook: ...`.

Threading: a WebhookClient blocks. The store calls hooks synchronously inside a write; the HTTP
stand-in (sim/apiserver/standin.py) runs every write on its own writer thread, never on the event loop, so a
webhook served by the same process (same loop) can answer, and it lets readers in while the call is
out (`Store.around_webhook_call`), so a webhook that reads the API server back does not deadlock.

Registration: `webhooks_from_configuration` turns a ValidatingWebhookConfiguration (as a dict) into
store Webhooks with the real matching rules: operations, apiGroups, apiVersions, resources with `*`
(top-level resources only; `*/*` adds subresources), scope, namespaceSelector evaluated on the
namespace's labels (on a Namespace's own labels; never skipping other cluster-scoped objects) [A2][D4],
and objectSelector evaluated on the request's `object` and `oldObject`, matching if either matches, a
null one never (so on DELETE only oldObject's labels count) [O1], and matchConditions, evaluated with
cel-python on the request as the API server builds it (sim/matchconditions.py).
Admission-configuration objects themselves are never sent to webhooks [D5].

Configurations as API objects: `follow_configurations` registers the webhooks of every
ValidatingWebhookConfiguration stored in the store, and re-registers them when one is updated or deleted,
as kube-apiserver's configuration manager does from its informer [O2] (without its short lag: the next
write already sees the change). `serve --embedded` stores the shipped configuration and follows, so the
configuration the gate writes for provider types (criticalsvc/webhookrouter.py) takes effect on the stand-in
exactly as on a real API server, and the garbage collector removes it with its owner.

[O2] https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/apiserver/pkg/admission/configuration/validating_webhook_manager.go

[O1] https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook/predicates/object/matcher.go
"""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import Callable, Mapping
from typing import Any, Literal

import attrs
import httpx

from ..api import NAMESPACES, GroupResource
from ..errors import CriticalsvcError, InvalidInput, InvalidSpec
from ..labels import LabelSelector, parse_label_selector
from . import matchconditions
from .matchconditions import MatchCondition
from .store import Store, WatchEvent
from .webhooks import EXEMPT, MatchConditionError, RegisteredWebhook, WebhookRule, selects

__all__ = [
    "DEFAULT_TIMEOUT_SECONDS",
    "EXEMPT",
    "ConfiguredWebhook",
    "RuleSpec",
    "WebhookCallError",
    "WebhookClient",
    "follow_configurations",
    "register_webhooks",
    "verify_response",
    "webhooks_from_configuration",
]

# admissionregistration.k8s.io/v1 defaults [A2].
DEFAULT_TIMEOUT_SECONDS = 10
DEFAULT_FAILURE_POLICY: Literal["Fail"] = "Fail"
ADMISSION_API_VERSION = "admission.k8s.io/v1"


class WebhookCallError(CriticalsvcError):
    """The webhook could not be called or its reply is unusable; failurePolicy decides [D1][D2]."""


class WebhookClient:
    """An AdmissionHook that POSTs the review to `url`; keeps one connection pool per webhook."""

    def __init__(self, url: str, *, ca_bundle: bytes | str | None = None,
                 client_cert: tuple[str, str] | None = None,
                 timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        if not url.startswith("https://"):
            raise InvalidInput("clientConfig.url", f"must be an https:// URL, got {url!r}")  # [A2]
        self.url = url
        self.timeout_seconds = timeout_seconds
        context = ssl.create_default_context(
            cadata=ca_bundle.decode() if isinstance(ca_bundle, bytes) else ca_bundle)
        if client_cert is not None:
            context.load_cert_chain(*client_cert)
        self._client = httpx.Client(
            verify=context, timeout=httpx.Timeout(timeout_seconds), http1=True, http2=False,
            headers={"Accept": "application/json, */*", "User-Agent": "kube-apiserver-admission"})
        # The API server appends its timeout to the webhook URL (rest client `Timeout`).
        self._params = {"timeout": f"{timeout_seconds:g}s"}

    def __call__(self, review: dict[str, Any]) -> dict[str, Any]:
        try:
            reply = self._client.post(self.url, params=self._params, content=json.dumps(review).encode(),
                                      headers={"Content-Type": "application/json"})
        except httpx.TimeoutException as exc:
            raise WebhookCallError(f'failed to call webhook: Post "{self.url}?timeout={self._params["timeout"]}": '
                                   f"context deadline exceeded ({type(exc).__name__})") from exc
        except httpx.HTTPError as exc:
            raise WebhookCallError(f'failed to call webhook: Post "{self.url}": {exc}') from exc
        if not 200 <= reply.status_code < 300:
            raise WebhookCallError(f"failed to call webhook: the server responded with the status code "
                                   f"{reply.status_code} but did not return more information")
        try:
            body = reply.json()
        except ValueError as exc:
            raise WebhookCallError(f"received invalid webhook response: {exc}") from exc
        return verify_response(body, review)

    def close(self) -> None:
        self._client.close()


def verify_response(body: Any, review: Mapping[str, Any]) -> dict[str, Any]:
    """VerifyAdmissionResponse [D2]: the reply as a dict, or WebhookCallError."""
    if not isinstance(body, dict):
        raise WebhookCallError("received invalid webhook response: not a JSON object")
    if body.get("apiVersion") != ADMISSION_API_VERSION or body.get("kind") != "AdmissionReview":
        raise WebhookCallError(f"received invalid webhook response: expected webhook response of "
                               f"{ADMISSION_API_VERSION}, Kind=AdmissionReview, got "
                               f"{body.get('apiVersion')}, Kind={body.get('kind')}")
    response = body.get("response")
    if not isinstance(response, dict):
        raise WebhookCallError("received invalid webhook response: webhook response was absent")
    uid = review["request"]["uid"]
    if response.get("uid") != uid:
        raise WebhookCallError(f'received invalid webhook response: expected response.uid="{uid}", '
                               f'got "{response.get("uid")}"')
    # The API server decodes the reply into typed structs: fields of the wrong type fail the decode.
    if not isinstance(response.get("allowed"), bool):
        raise WebhookCallError("received invalid webhook response: response.allowed must be a boolean")
    if not isinstance(response.get("status") or {}, dict):
        raise WebhookCallError("received invalid webhook response: response.status must be an object")
    warnings = response.get("warnings") or []
    if not isinstance(warnings, list) or not all(isinstance(w, str) for w in warnings):
        raise WebhookCallError("received invalid webhook response: response.warnings must be a list of strings")
    return body


# --- registration from a ValidatingWebhookConfiguration ---------------------------------------------
@attrs.frozen
class RuleSpec:
    """One admissionregistration/v1 RuleWithOperations; `*` matches anything."""

    operations: frozenset[str]
    api_groups: frozenset[str]
    api_versions: frozenset[str]
    resources: frozenset[str]
    scope: Literal["Cluster", "Namespaced", "*"] = "*"

    def matches(self, operation: str, gr: GroupResource, version: str, namespaced: bool) -> bool:
        def hit(values: frozenset[str], value: str) -> bool:
            return "*" in values or value in values

        if (self.scope == "Cluster" and namespaced) or (self.scope == "Namespaced" and not namespaced):
            return False
        # rules.go: "*" is every resource but no subresource, "*/*" both, "deployments/*" deployments
        # and all their subresources; a subresource request is spelt "resource/subresource" here.
        resource, _, sub = gr.resource.partition("/")

        def resource_hit(pattern: str) -> bool:
            want, _, want_sub = pattern.partition("/")
            return want in ("*", resource) and want_sub in ("*", sub)

        return (hit(self.operations, operation) and hit(self.api_groups, gr.group)
                and hit(self.api_versions, version) and any(resource_hit(p) for p in self.resources))


@attrs.define
class ConfiguredWebhook(RegisteredWebhook):
    """A RegisteredWebhook that matches the way a ValidatingWebhookConfiguration entry does."""

    rule_specs: tuple[RuleSpec, ...] = ()
    namespace_selector: LabelSelector = attrs.field(factory=LabelSelector)
    object_selector: LabelSelector = attrs.field(factory=LabelSelector)
    # name -> that namespace's labels (None if it does not exist); the store's, read inside the write.
    namespace_labels: Callable[[str], Mapping[str, str] | None] = lambda _name: None
    type_of: Callable[[GroupResource], tuple[str, bool] | None] = lambda _gr: None
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    match_conditions: tuple[MatchCondition, ...] = ()

    def matches(self, operation: str, gr: GroupResource, namespace: str,
                obj: Mapping[str, Any] | None = None, old: Mapping[str, Any] | None = None, *, name: str = "",
                request: Callable[[], Mapping[str, Any]] | None = None) -> bool:
        # The API server checks namespaceSelector, objectSelector, then rules (generic/webhook.go
        # ShouldCallHook); all must hold, so the order here (cheapest first) gives the same answer.
        if gr in EXEMPT:
            return False
        served = self.type_of(gr)
        version, namespaced = served if served is not None else ("v1", bool(namespace) and gr != NAMESPACES)
        if not any(r.matches(operation, gr, version, namespaced) for r in self.rule_specs):
            return False
        if not selects(self.object_selector, obj, old):
            return False
        # Cluster-scoped objects other than Namespaces are never skipped by the namespaceSelector [A2].
        # The namespace is gone (or not yet there): match on no labels, as an empty label set.
        if namespace and not self.namespace_selector.is_empty and \
                not self.namespace_selector.matches(self.namespace_labels(namespace) or {}):
            return False
        return self._conditions_hold(request)

    def _conditions_hold(self, request: Callable[[], Mapping[str, Any]] | None) -> bool:
        """matchConditions, evaluated last as the dispatcher does (after ShouldCallHook's selectors and rules)."""
        if not self.match_conditions:
            return True
        if request is None:
            raise MatchConditionError("no request to evaluate matchConditions on")
        outcome = matchconditions.evaluate(self.match_conditions, request=request())
        verdict = matchconditions.decide(outcome, self.failure_policy)
        if verdict == "fail":
            raise MatchConditionError(outcome.error)
        return verdict == "call"

    def close(self) -> None:
        if isinstance(self.hook, WebhookClient):
            self.hook.close()


def _strings(raw: Any, path: str) -> frozenset[str]:
    if not isinstance(raw, list) or not all(isinstance(v, str) for v in raw):
        raise InvalidSpec(path, "must be a list of strings")
    return frozenset(raw)


ServiceResolver = Callable[[str, str, int, str], str]  # (namespace, name, port, path) -> https URL
Hook = Callable[[dict[str, Any]], dict[str, Any]]


def webhooks_from_configuration(config: Mapping[str, Any], *, store: Store,
                                resolve_service: ServiceResolver | None = None,
                                ca_bundle: bytes | str | None = None,
                                client_cert: tuple[str, str] | None = None,
                                hook_factory: Callable[..., Hook] | None = None,
                                ) -> list[ConfiguredWebhook]:
    """The Webhooks a ValidatingWebhookConfiguration declares; InvalidSpec names a bad field.

    `clientConfig.service` needs `resolve_service` (the stand-in has no Services); without one the
    webhook's every call fails, which is what a real cluster does with a Service that has no endpoints.
    `ca_bundle` (PEM) replaces every clientConfig.caBundle (deploy/ ships a placeholder there).
    `hook_factory(url, ca_bundle=..., client_cert=..., timeout_seconds=...)` defaults to WebhookClient.
    """
    factory = hook_factory or WebhookClient
    entries = config.get("webhooks")
    if not isinstance(entries, list):
        raise InvalidSpec("webhooks", "must be a list")
    result: list[ConfiguredWebhook] = []
    for i, entry in enumerate(entries):
        at = f"webhooks[{i}]"
        if not isinstance(entry, Mapping):
            raise InvalidSpec(at, "must be an object")
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidSpec(f"{at}.name", "required")
        versions = entry.get("admissionReviewVersions")
        if not isinstance(versions, list) or "v1" not in versions:
            raise InvalidSpec(f"{at}.admissionReviewVersions", "must include v1 (the only version sent)")
        if entry.get("sideEffects", "None") not in ("None", "NoneOnDryRun"):
            raise InvalidSpec(f"{at}.sideEffects", "must be None or NoneOnDryRun (admissionregistration/v1)")
        policy = entry.get("failurePolicy", DEFAULT_FAILURE_POLICY)
        if policy not in ("Fail", "Ignore"):
            raise InvalidSpec(f"{at}.failurePolicy", "must be Fail or Ignore")
        timeout = entry.get("timeoutSeconds", DEFAULT_TIMEOUT_SECONDS)
        if not isinstance(timeout, int) or not 1 <= timeout <= 30:
            raise InvalidSpec(f"{at}.timeoutSeconds", "must be an integer from 1 to 30")
        specs: list[RuleSpec] = []
        for j, rule in enumerate(entry.get("rules") or []):
            here = f"{at}.rules[{j}]"
            if not isinstance(rule, Mapping):
                raise InvalidSpec(here, "must be an object")
            scope = rule.get("scope", "*")
            if scope not in ("Cluster", "Namespaced", "*"):
                raise InvalidSpec(f"{here}.scope", "must be Cluster, Namespaced or *")
            specs.append(RuleSpec(
                _strings(rule.get("operations"), f"{here}.operations"),
                _strings(rule.get("apiGroups"), f"{here}.apiGroups"),
                _strings(rule.get("apiVersions"), f"{here}.apiVersions"),
                _strings(rule.get("resources"), f"{here}.resources"), scope))
        selector = parse_label_selector(entry.get("namespaceSelector"), f"{at}.namespaceSelector")
        object_selector = parse_label_selector(entry.get("objectSelector"), f"{at}.objectSelector")
        conditions = matchconditions.parse_match_conditions(entry.get("matchConditions"), f"{at}.matchConditions")
        hook = _hook(entry.get("clientConfig"), f"{at}.clientConfig", timeout=timeout, ca_bundle=ca_bundle,
                     client_cert=client_cert, resolve_service=resolve_service, factory=factory)

        def namespace_labels(ns: str) -> Mapping[str, str] | None:
            obj = store.get(NAMESPACES, "", ns)
            return None if obj is None else dict(obj.get("metadata", {}).get("labels") or {})

        def type_of(gr: GroupResource) -> tuple[str, bool] | None:
            t = store.mapper.lookup(gr)
            return None if t is None else (t.version, t.namespaced)

        # The store's plain rules stay empty: ConfiguredWebhook.matches reads rule_specs instead.
        result.append(ConfiguredWebhook(
            hook=hook, rules=(WebhookRule(frozenset(), frozenset()),), failure_policy=policy, name=name,
            excluded_namespaces=frozenset(), rule_specs=tuple(specs), namespace_selector=selector,
            object_selector=object_selector, namespace_labels=namespace_labels, type_of=type_of,
            timeout_seconds=timeout, match_conditions=conditions))
    return result


def _hook(raw: Any, at: str, *, timeout: int, ca_bundle: bytes | str | None, client_cert: tuple[str, str] | None,
          resolve_service: ServiceResolver | None, factory: Callable[..., Hook]) -> Hook:
    if not isinstance(raw, Mapping):
        raise InvalidSpec(at, "required")
    ca: str | None = ca_bundle.decode() if isinstance(ca_bundle, bytes) else ca_bundle
    if ca is None and raw.get("caBundle"):
        try:
            ca = base64.b64decode(str(raw["caBundle"]), validate=True).decode()
        except ValueError as exc:
            raise InvalidSpec(f"{at}.caBundle", "must be base64-encoded PEM") from exc
    url = raw.get("url")
    service = raw.get("service")
    if isinstance(url, str) and url:
        target = url
    elif isinstance(service, Mapping):
        ns, name = str(service.get("namespace", "")), str(service.get("name", ""))
        port, path = int(service.get("port", 443)), str(service.get("path", "/"))
        if resolve_service is None:
            return _unreachable(f'failed to call webhook: service "{name}" in namespace "{ns}" cannot be '
                                "resolved by the API-server stand-in (no service resolver configured)")
        target = resolve_service(ns, name, port, path)
    else:
        raise InvalidSpec(at, "one of url or service is required")
    try:
        return factory(target, ca_bundle=ca, client_cert=client_cert, timeout_seconds=timeout)
    except (ssl.SSLError, ValueError) as exc:
        raise InvalidSpec(f"{at}.caBundle", f"not a usable PEM certificate bundle: {exc}") from exc


def _unreachable(message: str) -> Hook:
    def hook(_review: dict[str, Any]) -> dict[str, Any]:
        raise WebhookCallError(message)

    return hook


def register_webhooks(store: Store, config: Mapping[str, Any], **kwargs: Any) -> list[ConfiguredWebhook]:
    """Add the configuration's webhooks to `store.webhooks` (after any already there); returns them."""
    webhooks = webhooks_from_configuration(config, store=store, **kwargs)
    store.webhooks.extend(webhooks)
    return webhooks


VALIDATING_CONFIGURATIONS = GroupResource("admissionregistration.k8s.io", "validatingwebhookconfigurations")


def follow_configurations(store: Store, **kwargs: Any) -> Callable[[], None]:
    """Keep `store.webhooks` in step with the stored ValidatingWebhookConfigurations (see the module doc);
    `kwargs` as for webhooks_from_configuration. Registers those stored already; returns the unsubscriber.

    A configuration that does not register (a field the API server would have refused) contributes no
    webhook, as the API server would not have stored it."""
    by_name: dict[str, list[ConfiguredWebhook]] = {}

    def drop(name: str) -> None:
        for webhook in by_name.pop(name, []):
            if webhook in store.webhooks:
                store.webhooks.remove(webhook)
            webhook.close()

    def apply(kind: str, config: Mapping[str, Any]) -> None:
        name = str((config.get("metadata") or {}).get("name") or "")
        drop(name)
        if kind == "DELETED":
            return
        try:
            webhooks = webhooks_from_configuration(config, store=store, **kwargs)
        except (InvalidSpec, InvalidInput):
            return
        by_name[name] = webhooks
        store.webhooks.extend(webhooks)

    def on_event(event: WatchEvent) -> None:
        if event.group_resource == VALIDATING_CONFIGURATIONS:
            apply(event.type, event.object)

    for config in store.list(VALIDATING_CONFIGURATIONS):
        apply("ADDED", config)
    return store.subscribe(on_event)
