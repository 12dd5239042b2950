"""`criticalsvc certs --out DIR`: a CA and a serving certificate for the webhook Service.

Writes ca.crt, ca.key, tls.crt, tls.key and secret.yaml (the kubernetes.io/tls Secret the Deployment
mounts, with ca.crt) into DIR and prints the caBundle (base64 of ca.crt) on standard output, so that
`CA_BUNDLE=$(criticalsvc certs --out certs)` works. Run it again on the same DIR to renew the serving
certificate under the same CA (the caBundle stays the same); `--new-ca` replaces the CA.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .. import certs


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "certs", help="create a CA and a serving certificate for the webhook; print the caBundle",
        description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--service", default=certs.DEFAULT_SERVICE, help="Service name (default: %(default)s)")
    p.add_argument("--namespace", default=certs.DEFAULT_NAMESPACE, help="Service namespace (default: %(default)s)")
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="directory to write the files to")
    p.add_argument("--days", type=int, default=certs.SERVING_DAYS,
                   help="validity of the serving certificate in days (default: %(default)s)")
    p.add_argument("--san", action="append", default=[], metavar="NAME|IP",
                   help="an extra subject alternative name (DNS name or IP address); repeatable")
    p.add_argument("--secret-name", default=certs.DEFAULT_SECRET_NAME,
                   help="name of the Secret in secret.yaml (default: %(default)s)")
    p.add_argument("--new-ca", action="store_true", help="replace an existing CA in DIR (the caBundle changes)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    certs.check_dns_label(args.secret_name, "--secret-name")
    ca = certs.write_certificates(args.out, service=args.service, namespace=args.namespace, extra_sans=args.san,
                                  days=args.days, secret_name=args.secret_name, new_ca=args.new_ca)
    print(certs.ca_bundle(ca.cert))
    print(f"criticalsvc certs: wrote {certs.CA_CERT}, {certs.CA_KEY}, {certs.TLS_CERT}, {certs.TLS_KEY}, "
          f"{certs.SECRET} to {args.out}", file=sys.stderr)
    return 0
