"""A small synchronous Kubernetes client for the tests, on httpx: raw paths, plain JSON, every answer kept.

The tests need what a user's client sees (status codes, `Warning` headers, the Status body of a
denial), so nothing is hidden behind generated models. Used against both the real API server and
the stand-in (`serve --embedded`), with whichever credentials the kubeconfig carries.
"""

from __future__ import annotations

import base64
import ssl
from pathlib import Path
from typing import Any

import httpx
import yaml

JSON = dict[str, Any]


class ALPNOnce(ssl.SSLContext):
    """An SSLContext whose ALPN protocols are set once and then left alone.

    httpcore sets them again on the client's shared context for every new connection, and CPython's
    set_alpn_protocols frees the old list while another thread's handshake may still be copying it: a
    use-after-free (https://github.com/python/cpython/issues/141012). With several threads on one Client
    (a ManifestWork agent's teardown threads) it sent a malformed ClientHello, and kube-apiserver answered
    TLSV1_ALERT_DECODE_ERROR. Setting the same list again changes nothing, so it is skipped.
    """

    _alpn: tuple[str, ...] | None = None

    def set_alpn_protocols(self, alpn_protocols: Any) -> None:
        protocols = tuple(alpn_protocols)
        if self._alpn == protocols:
            return
        if self._alpn is not None:
            raise ValueError(f"this context's ALPN protocols are {list(self._alpn)}, not {list(protocols)}")
        super().set_alpn_protocols(protocols)
        self._alpn = protocols


def tls_context(*, cadata: str | None = None, verify: bool = True) -> ssl.SSLContext:
    """A client context (as ssl.create_default_context makes) that threads may share with httpx."""
    context = ALPNOnce(ssl.PROTOCOL_TLS_CLIENT)
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif cadata is not None:
        context.load_verify_locations(cadata=cadata)
    else:
        context.load_default_certs()
    return context


class Client:
    def __init__(self, kubeconfig: Path) -> None:
        config = yaml.safe_load(kubeconfig.read_text())
        cluster = config["clusters"][0]["cluster"]
        user = config["users"][0]["user"] or {}
        self.base_url: str = cluster["server"]
        # One context of our own in every case (httpx would make one per Client too, and mutate it the same way).
        if "certificate-authority-data" in cluster:
            verify = tls_context(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
        else:
            verify = tls_context(verify=not cluster.get("insecure-skip-tls-verify"))
        if "client-certificate" in user:
            verify.load_cert_chain(user["client-certificate"], user["client-key"])
        headers = {"Authorization": f"Bearer {user['token']}"} if "token" in user else {}
        self.http = httpx.Client(base_url=self.base_url, verify=verify, headers=headers, timeout=30,
                                 trust_env=False)

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self._send(method, path, **kwargs)

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        # A pooled keep-alive connection the server closed while idle fails on reuse with "Server
        # disconnected without sending a response"; client-go's transport re-sends then, so do we (once).
        try:
            return self.http.request(method, path, **kwargs)
        except httpx.RemoteProtocolError:
            return self.http.request(method, path, **kwargs)

    def get(self, path: str) -> JSON | None:
        """The object at `path`, or None when it does not exist (404)."""
        response = self._send("GET", path)
        if response.status_code == 404:
            return None
        response.raise_for_status()
        body: JSON = response.json()
        return body

    def exists(self, path: str) -> bool:
        return self.get(path) is not None

    def create(self, path: str, body: JSON) -> httpx.Response:
        return self._send("POST", path, json=body)

    def delete(self, path: str, *, body: JSON | None = None, params: dict[str, str] | None = None) -> httpx.Response:
        return self._send("DELETE", path, json=body, params=params)

    def merge_patch(self, path: str, patch: JSON) -> httpx.Response:
        return self._send("PATCH", path, json=patch, headers={"Content-Type": "application/merge-patch+json"})

    def json_patch(self, path: str, patch: list[JSON]) -> httpx.Response:
        return self._send("PATCH", path, json=patch, headers={"Content-Type": "application/json-patch+json"})
