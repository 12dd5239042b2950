"""A kubeconfig for the API-server stand-in: one cluster, one context, a user without credentials.

The stand-in does no authentication. Over http the user entry is empty (kubectl sends no auth header
and prints no warning). Over https kubectl would then prompt for a username and password (clientcmd
asks whenever it cannot identify the user of a secure server), so the user carries a placeholder
bearer token, which the stand-in ignores. For https the CA that signed the server's certificate is
embedded (`certificate-authority-data`); without one, TLS verification is switched off for this
cluster only. The file is written with mode 0600, as kubectl writes its own.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import yaml

__all__ = ["DEFAULT_NAME", "PLACEHOLDER_TOKEN", "kubeconfig", "write_kubeconfig"]

DEFAULT_NAME = "criticalsvc-standin"
PLACEHOLDER_TOKEN = "criticalsvc-standin-does-not-authenticate"


def kubeconfig(server: str, *, name: str = DEFAULT_NAME, namespace: str | None = None,
               ca_pem: bytes | None = None) -> dict[str, Any]:
    """The kubeconfig document (a dict) for `server` (http://host:port or https://host:port)."""
    cluster: dict[str, Any] = {"server": server}
    user: dict[str, Any] = {}
    if server.startswith("https://"):
        user["token"] = PLACEHOLDER_TOKEN
        if ca_pem is not None:
            cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
        else:
            cluster["insecure-skip-tls-verify"] = True
    context: dict[str, Any] = {"cluster": name, "user": name}
    if namespace:
        context["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": context}],
        "current-context": name,
    }


def write_kubeconfig(path: str | os.PathLike[str], server: str, *, name: str = DEFAULT_NAME,
                     namespace: str | None = None, ca_pem: bytes | None = None) -> Path:
    """Write the kubeconfig to `path` (mode 0600, parent directories created); returns the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(kubeconfig(server, name=name, namespace=namespace, ca_pem=ca_pem), sort_keys=False)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(target, 0o600)
    return target
