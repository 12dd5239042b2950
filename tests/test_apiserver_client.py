"""Real clients against the stand-in served over HTTP, and the webhook client against a real HTTPS server.

The official `kubernetes` client (v37) talks to the stand-in served by hypercorn on 127.0.0.1:0; a
tiny HTTPS server (python ssl, certificates made with cryptography) plays the validating webhook.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from criticalsvc.api import GroupResource, ObjectRef
from criticalsvc.sim.apiserver.server import ServerThread
from criticalsvc.sim.apiserver.standin import StandIn
from criticalsvc.sim.kubeconfig import write_kubeconfig
from criticalsvc.sim.store import StatusError, Store
from criticalsvc.sim.webhook_client import WebhookClient
from criticalsvc.sim.webhooks import RegisteredWebhook, WebhookRule

DEPLOYMENTS = GroupResource("apps", "deployments")
DELETE_DEPLOYMENTS = (WebhookRule(frozenset({"DELETE"}), frozenset({DEPLOYMENTS})),)


# --- certificates --------------------------------------------------------------------------------------
def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(subject: str, key: ec.EllipticCurvePrivateKey, issuer: tuple[str, ec.EllipticCurvePrivateKey] | None,
          *, ca: bool = False, server: bool = False) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(subject))
               .issuer_name(_name(issuer[0] if issuer else subject)).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
               .not_valid_after(now + datetime.timedelta(hours=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
            key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False),
            critical=True)
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]), critical=False)
    return builder.sign(issuer[1] if issuer else key, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class PKI:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as files."""

    def __init__(self, directory: Path) -> None:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = _cert("test-ca", ca_key, None, ca=True)
        self.ca_pem = _pem(ca)
        self.files: dict[str, str] = {}
        for name, server in (("server", True), ("client", False)):
            key = ec.generate_private_key(ec.SECP256R1())
            cert = _cert(name, key, ("test-ca", ca_key), server=server)
            (directory / f"{name}.crt").write_bytes(_pem(cert))
            (directory / f"{name}.key").write_bytes(_key_pem(key))
            self.files[name] = str(directory / f"{name}.crt")
            self.files[f"{name}-key"] = str(directory / f"{name}.key")
        (directory / "ca.crt").write_bytes(self.ca_pem)
        self.files["ca"] = str(directory / "ca.crt")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return PKI(tmp_path_factory.mktemp("pki"))


# --- a tiny HTTPS webhook --------------------------------------------------------------------------------
class WebhookServer:
    """Answers AdmissionReviews by path: /allow, /deny, /500, /garbage, /wrong-uid, /wrong-version,
    /absent, /bad-status, /slow, /readback (GETs the stand-in's copy of the object first, then allows)."""

    def __init__(self, pki: PKI, *, require_client_cert: bool = False) -> None:
        self.requests: list[dict[str, Any]] = []
        self.readback: list[int] = []
        self.standin_url = ""
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                review = json.loads(body)
                owner.requests.append({"path": self.path, "content_type": self.headers["Content-Type"],
                                       "review": review})
                route = self.path.split("?")[0]
                uid = review["request"]["uid"]
                reply: Any = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                              "response": {"uid": uid, "allowed": True}}
                status = 200
                if route == "/deny":
                    reply["response"] = {"uid": uid, "allowed": False, "status": {
                        "code": 403, "reason": "Forbidden", "message": "not while dependents exist"}}
                elif route == "/500":
                    status = 500
                elif route == "/wrong-uid":
                    reply["response"]["uid"] = "someone-else"
                elif route == "/wrong-version":
                    reply["apiVersion"] = "admission.k8s.io/v1beta1"
                elif route == "/absent":
                    del reply["response"]
                elif route == "/bad-status":
                    reply["response"] = {"uid": uid, "allowed": False, "status": "no"}
                elif route == "/slow":
                    time.sleep(1.5)
                elif route == "/readback":
                    ns, name = review["request"]["namespace"], review["request"]["name"]
                    owner.readback.append(httpx.get(
                        f"{owner.standin_url}/apis/apps/v1/namespaces/{ns}/deployments/{name}", timeout=5).status_code)
                data = b"<html>not json" if route == "/garbage" else json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pki.files["server"], pki.files["server-key"])
        if require_client_cert:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(pki.files["ca"])
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        # A short poll interval: shutdown() waits for the serving loop to notice.
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.01},
                                       daemon=True)

    def __enter__(self) -> WebhookServer:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def store_with(hook: Any, policy: str = "Fail") -> Store:
    store = Store(clock=time.time)
    store.webhooks.append(RegisteredWebhook(hook, rules=DELETE_DEPLOYMENTS, failure_policy=policy))  # type: ignore[arg-type]
    store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}})
    store.create(deployment("web"))
    return store


def deployment(name: str) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": name}}, "template": {
                "metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}}


WEB = ObjectRef(DEPLOYMENTS, "default", "web")


# --- webhook client ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("path", "policy", "outcome"), [
    ("/allow", "Fail", "deleted"),
    ("/deny", "Fail", 403),
    ("/deny", "Ignore", 403),  # a denial is an answer, not a failed call
    ("/500", "Fail", 500), ("/500", "Ignore", "deleted"),
    ("/garbage", "Fail", 500), ("/garbage", "Ignore", "deleted"),
    ("/wrong-uid", "Fail", 500), ("/wrong-uid", "Ignore", "deleted"),
    ("/wrong-version", "Fail", 500), ("/wrong-version", "Ignore", "deleted"),
    ("/absent", "Fail", 500), ("/absent", "Ignore", "deleted"),
    ("/bad-status", "Fail", 500), ("/bad-status", "Ignore", "deleted"),
])
def test_webhook_outcomes_follow_failure_policy(pki: PKI, path: str, policy: str, outcome: str | int) -> None:
    """Allow deletes, deny is the webhook's 403, and every failed call is 500 under Fail, ignored under Ignore."""
    with WebhookServer(pki) as server:
        hook = WebhookClient(server.url + path, ca_bundle=pki.ca_pem)
        store = store_with(hook, policy)
        try:
            if outcome == "deleted":
                assert store.delete(WEB).outcome == "deleted"
                return
            with pytest.raises(StatusError) as info:
                store.delete(WEB)
        finally:
            hook.close()
    assert info.value.code == outcome
    assert store.exists(DEPLOYMENTS, "default", "web")
    if outcome == 403:
        assert info.value.message == ('admission webhook "gate.criticalsvc.io" denied the request: '
                                      "not while dependents exist")
    else:
        assert info.value.message.startswith('Internal error occurred: failed calling webhook "gate.criticalsvc.io": ')


def test_webhook_timeout_is_a_failed_call(pki: PKI) -> None:
    """A webhook slower than timeoutSeconds is a failed call: 500 under failurePolicy Fail."""
    with WebhookServer(pki) as server:
        hook = WebhookClient(server.url + "/slow", ca_bundle=pki.ca_pem, timeout_seconds=0.5)
        started = time.monotonic()
        with pytest.raises(StatusError) as info:
            store_with(hook).delete(WEB)
        hook.close()
    assert info.value.code == 500 and "context deadline exceeded" in info.value.message
    assert time.monotonic() - started < 1.4


def test_webhook_request_is_what_the_api_server_sends(pki: PKI) -> None:
    """The call is a JSON POST to the URL with ?timeout=10s, carrying the DELETE's AdmissionReview v1."""
    with WebhookServer(pki) as server:
        hook = WebhookClient(server.url + "/allow", ca_bundle=pki.ca_pem)
        store_with(hook).delete(WEB, user="alice")
        hook.close()
    [call] = server.requests
    assert call["path"] == "/allow?timeout=10s" and call["content_type"] == "application/json"
    request = call["review"]["request"]
    assert call["review"]["apiVersion"] == "admission.k8s.io/v1"
    assert (request["operation"], request["name"], request["namespace"]) == ("DELETE", "web", "default")
    assert request["object"] is None and request["oldObject"]["metadata"]["name"] == "web"
    assert request["userInfo"]["username"] == "alice"
    assert request["options"] == {"apiVersion": "meta.k8s.io/v1", "kind": "DeleteOptions",
                                  "propagationPolicy": "Background"}


def test_webhook_tls_is_verified_and_client_certificates_are_presented(pki: PKI, tmp_path: Path) -> None:
    """An untrusted server certificate is a failed call; a server requiring a client certificate gets one."""
    other = PKI(tmp_path)
    with WebhookServer(pki, require_client_cert=True) as server:
        untrusted = WebhookClient(server.url + "/allow", ca_bundle=other.ca_pem)
        anonymous = WebhookClient(server.url + "/allow", ca_bundle=pki.ca_pem)
        with_cert = WebhookClient(server.url + "/allow", ca_bundle=pki.ca_pem,
                                  client_cert=(pki.files["client"], pki.files["client-key"]))
        try:
            with pytest.raises(StatusError) as bad_ca:
                store_with(untrusted).delete(WEB)
            with pytest.raises(StatusError) as no_cert:
                store_with(anonymous).delete(WEB)
            assert store_with(with_cert).delete(WEB).outcome == "deleted"
        finally:
            for hook in (untrusted, anonymous, with_cert):
                hook.close()
    assert bad_ca.value.code == 500 and "CERTIFICATE_VERIFY_FAILED" in bad_ca.value.message
    assert no_cert.value.code == 500


def test_webhook_that_reads_the_api_server_back_does_not_deadlock(pki: PKI) -> None:
    """While a DELETE waits on the webhook, the webhook's own GET to the stand-in is answered."""
    with WebhookServer(pki) as hooks:
        hook = WebhookClient(hooks.url + "/readback", ca_bundle=pki.ca_pem, timeout_seconds=5)
        with ServerThread(StandIn(store_with(hook))) as url:
            hooks.standin_url = url
            started = time.monotonic()
            reply = httpx.delete(f"{url}/apis/apps/v1/namespaces/default/deployments/web", timeout=10)
        hook.close()
    assert reply.status_code == 200 and reply.json()["status"] == "Success"
    assert hooks.readback == [200]  # the webhook saw the object still there, before the delete
    assert time.monotonic() - started < 3


# --- the official kubernetes client ------------------------------------------------------------------
@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[client.ApiClient, StandIn]]:
    """A kubernetes ApiClient built from a kubeconfig written by kubeconfig.py for a served stand-in."""
    standin = StandIn(Store(clock=time.time, history=50))
    with ServerThread(standin) as url:
        path = write_kubeconfig(tmp_path / "kubeconfig", url)
        api_client = config.new_client_from_config(config_file=str(path))
        try:
            yield api_client, standin
        finally:
            api_client.close()


def test_client_lists_namespaces(api: tuple[client.ApiClient, StandIn]) -> None:
    """CoreV1Api.list_namespace returns the stand-in's namespaces as models."""
    names = [n.metadata.name for n in client.CoreV1Api(api[0]).list_namespace().items]
    assert names == ["default", "kube-node-lease", "kube-public", "kube-system"]


def test_client_deployment_lifecycle_and_watch(api: tuple[client.ApiClient, StandIn]) -> None:
    """Create/get/delete a Deployment; a watch from the list's resourceVersion sees ADDED then DELETED."""
    apps = client.AppsV1Api(api[0])
    rv = apps.list_namespaced_deployment("default").metadata.resource_version
    created = apps.create_namespaced_deployment("default", deployment("web"))
    fetched = apps.read_namespaced_deployment("web", "default")
    apps.delete_namespaced_deployment("web", "default")
    with pytest.raises(ApiException) as missing:
        apps.read_namespaced_deployment("web", "default")
    seen = []
    stream = watch.Watch()
    for event in stream.stream(apps.list_namespaced_deployment, "default", resource_version=rv, timeout_seconds=5):
        seen.append((event["type"], event["object"].metadata.name))
        if event["type"] == "DELETED":
            stream.stop()
    assert created.metadata.uid == fetched.metadata.uid
    assert missing.value.status == 404
    assert seen == [("ADDED", "web"), ("DELETED", "web")]


def test_client_watch_of_an_expired_version_raises_410(api: tuple[client.ApiClient, StandIn]) -> None:
    """With the history exhausted, the client's watch raises ApiException 410 (the cue to re-list)."""
    core = client.CoreV1Api(api[0])
    for i in range(60):  # the store keeps 50 events
        core.create_namespaced_config_map("default", {"apiVersion": "v1", "kind": "ConfigMap",
                                                      "metadata": {"name": f"c{i}"}})
    with pytest.raises(ApiException) as gone:
        for _ in watch.Watch().stream(core.list_namespaced_config_map, "default", resource_version="1",
                                      timeout_seconds=5):
            pass
    assert gone.value.status == 410


def test_client_custom_objects(api: tuple[client.ApiClient, StandIn]) -> None:
    """CustomObjectsApi works for a CRD-defined type and for CriticalServices, including status patches."""
    api_client, _ = api
    client.ApiextensionsV1Api(api_client).create_custom_resource_definition({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
                 "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                 "versions": [{"name": "v1", "served": True, "storage": True,
                               "schema": {"openAPIV3Schema": {"type": "object"}}}]}})
    custom = client.CustomObjectsApi(api_client)
    custom.create_namespaced_custom_object("example.com", "v1", "default", "widgets", {
        "apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w1", "finalizers": ["x.io/f"]}})
    custom.patch_namespaced_custom_object("example.com", "v1", "default", "widgets", "w1",
                                          {"metadata": {"labels": {"a": "b"}}})
    widgets = custom.list_namespaced_custom_object("example.com", "v1", "default", "widgets")
    custom.create_cluster_custom_object("criticalsvc.io", "v1alpha1", "criticalservices", {
        "apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": "web"},
        "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": "default", "name": "web"},
                 "criteria": [{"type": "Finalizer", "finalizer": {"group": "example.com", "resource": "widgets",
                                                                   "finalizerName": "x.io/f"}}]}})
    custom.patch_cluster_custom_object_status("criticalsvc.io", "v1alpha1", "criticalservices", "web",
                                              {"status": {"providerUID": "u1"}},
                                              _content_type="application/merge-patch+json")
    cs = custom.get_cluster_custom_object("criticalsvc.io", "v1alpha1", "criticalservices", "web")
    assert [(w["metadata"]["name"], w["metadata"]["labels"]) for w in widgets["items"]] == [("w1", {"a": "b"})]
    assert cs["status"] == {"providerUID": "u1"}


def test_client_events_as_the_status_writer_posts_them(api: tuple[client.ApiClient, StandIn]) -> None:
    """A CoreV1Event model can be created and its count merge-patched, as statuswriter.py does."""
    core = client.CoreV1Api(api[0])
    event = client.CoreV1Event.from_dict({
        "apiVersion": "v1", "kind": "Event", "metadata": {"name": "web.1", "namespace": "default"},
        "involvedObject": {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "name": "web"},
        "reason": "DeletionBlocked", "message": "denied", "type": "Warning", "count": 1,
        "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:00:00Z"})
    assert event is not None
    core.create_namespaced_event("default", event)
    patched = core.patch_namespaced_event("web.1", "default", {"count": 2},
                                          _content_type="application/merge-patch+json")
    assert patched.count == 2 and patched.reason == "DeletionBlocked"


def test_client_sees_a_webhook_denial_as_403(api: tuple[client.ApiClient, StandIn]) -> None:
    """A denied DELETE raises ApiException 403 whose body is the Status with the webhook's message."""
    api_client, standin = api

    def deny(review: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {
            "uid": review["request"]["uid"], "allowed": False,
            "status": {"code": 403, "reason": "Forbidden", "message": "protected"}}}

    standin.submit(lambda: standin.store.webhooks.append(RegisteredWebhook(deny, rules=DELETE_DEPLOYMENTS))).result()
    apps = client.AppsV1Api(api_client)
    apps.create_namespaced_deployment("default", deployment("web"))
    with pytest.raises(ApiException) as denied:
        apps.delete_namespaced_deployment("web", "default")
    assert denied.value.status == 403
    assert json.loads(denied.value.body)["message"] == ('admission webhook "gate.criticalsvc.io" denied the '
                                                        "request: protected")


def test_https_stand_in_with_a_generated_kubeconfig(pki: PKI, tmp_path: Path) -> None:
    """Served over TLS, the stand-in is reachable through a kubeconfig that embeds its CA (mode 0600)."""
    with ServerThread(StandIn(Store(clock=time.time)), certfile=pki.files["server"],
                      keyfile=pki.files["server-key"]) as url:
        path = write_kubeconfig(tmp_path / "nested" / "kubeconfig", url, ca_pem=pki.ca_pem)
        api_client = config.new_client_from_config(config_file=str(path))
        try:
            names = [n.metadata.name for n in client.CoreV1Api(api_client).list_namespace().items]
        finally:
            api_client.close()
    assert url.startswith("https://127.0.0.1:")
    assert "default" in names
    assert path.stat().st_mode & 0o777 == 0o600
