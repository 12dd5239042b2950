"""`criticalsvc manifests --ca-bundle-from DIR | --ca-bundle B64`: the full install as one YAML stream.

Renders deploy/ (the same objects `kubectl kustomize deploy/` gives, the CRD included) with every
webhook's caBundle set. With `--ca-bundle-from DIR` (a `criticalsvc certs` directory) the serving
Secret built from DIR's tls.crt/tls.key is included too (unless `--no-secret`), so

    criticalsvc certs --out certs >/dev/null
    criticalsvc manifests --ca-bundle-from certs | kubectl apply -f -

installs a working gate. Note that the stream then holds the serving private key.

`--webhook-url https://HOST:PORT` is for a gate that runs outside the cluster (on a workstation, a
VM, or beside a test control plane): the webhooks call that address, and only what the API server
needs is printed (the CRD, the namespace, the ServiceAccount and RBAC, the webhook configuration).
Run `criticalsvc serve --kubeconfig` there with a token of the ServiceAccount (see README.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .. import install


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "manifests", help="print the install manifests with the webhook caBundle filled in",
        description=__doc__.splitlines()[0] if __doc__ else None)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--ca-bundle-from", type=Path, metavar="DIR",
                        help="a `criticalsvc certs` directory (reads ca.crt, and tls.crt/tls.key for the Secret)")
    source.add_argument("--ca-bundle", metavar="B64", help="the caBundle itself: base64 of the PEM CA certificate")
    p.add_argument("--image", help="container image of the gate (default: the one in deploy/)")
    p.add_argument("--replicas", type=int, help="number of replicas (default: the one in deploy/, 2)")
    p.add_argument("--webhook-url", metavar="https://HOST:PORT",
                   help="the gate runs outside the cluster at this address: the webhooks call it there, and the "
                        "Deployment, Service, PodDisruptionBudget and Secret are left out")
    p.add_argument("--no-secret", action="store_true",
                   help="with --ca-bundle-from: leave the serving Secret out of the stream")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.ca_bundle_from is not None:
        with_serving = not args.no_secret and args.webhook_url is None
        ca_pem, serving = install.read_cert_dir(args.ca_bundle_from, with_serving=with_serving)
    else:
        ca_pem, serving = install.ca_pem_from_base64(args.ca_bundle), None
    objects = install.render_install(ca_pem=ca_pem, serving=serving, image=args.image, replicas=args.replicas,
                                     webhook_url=args.webhook_url)
    if args.replicas == 1:
        print("criticalsvc manifests: warning: with 1 replica every restart of the gate fails gated deletes "
              "closed, and the PodDisruptionBudget (minAvailable 1) blocks node drains", file=sys.stderr)
    sys.stdout.write(install.dump(objects))
    return 0
