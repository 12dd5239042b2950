"""`criticalsvc review --state STATE.yaml [REVIEW.json | -]`: what would the gate say?

Reads one AdmissionReview (v1) and a cluster snapshot (a multi-document YAML or a `kind: List`, as
`kubectl get ... -o yaml` writes it) and prints the gate's AdmissionReview response. It runs the same
`decide` the webhook runs, on the snapshot instead of the watch caches, with the settings of a default
`serve` (--no-manage-provider-webhooks answers as a gate run with that flag).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..admission import parse_review, render_response
from ..decision import decide
from ..errors import InvalidInput, MalformedReview
from ..manifests import load_path
from ..snapshot import build_state


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "review", help="print the gate's answer to an AdmissionReview against a cluster snapshot",
        description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--state", required=True, metavar="STATE.yaml",
                   help="cluster snapshot: multi-document YAML or kind: List (file, directory or -)")
    # A default `serve` writes the routes of provider types itself (criticalsvc/routing.py), so it warns nothing
    # about a provider type the shipped configuration does not route; `review` answers as that gate does.
    p.add_argument("--manage-provider-webhooks", action=argparse.BooleanOptionalAction, default=True,
                   help="answer as `serve` does with this setting: by default the gate routes every provider type "
                        "itself; with --no-manage-provider-webhooks a CriticalService whose provider type the "
                        "shipped configuration does not route is warned about, as such a gate warns")
    p.add_argument("review", nargs="?", default="-", metavar="REVIEW.json",
                   help="AdmissionReview v1 request (default: standard input)")
    p.set_defaults(run=run)


def read_review(path: str) -> tuple[Any, str]:
    if path == "-":
        text, where = sys.stdin.read(), "<stdin>"
    else:
        try:
            with open(path, encoding="utf-8") as f:
                text, where = f.read(), path
        except FileNotFoundError:
            raise MalformedReview("", "no such file", where=path) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise MalformedReview("", f"cannot read: {exc}", where=path) from None
    try:
        return json.loads(text), where
    except json.JSONDecodeError as exc:
        raise MalformedReview("", f"line {exc.lineno} column {exc.colno}: not valid JSON: {exc.msg}",
                              where=where) from None


def run(args: argparse.Namespace) -> int:
    if args.state == "-" and args.review == "-":
        raise MalformedReview("", "--state and the review cannot both be read from standard input")
    state = build_state(load_path(args.state))
    review, where = read_review(args.review)
    try:
        request = parse_review(review)
    except InvalidInput as exc:
        raise exc.located(where) from None
    decision = decide(request, state, manages_routes=args.manage_provider_webhooks)
    json.dump(render_response(request.uid, decision), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
