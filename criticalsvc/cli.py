"""The `criticalsvc` command line.

Each command lives in `criticalsvc.commands.<name>` and exposes `register(subparsers)` and
`run(args) -> int`. Exit codes are shared: 0 success (for `review`: a response was printed, allowed
or not), 1 the domain answer is "no" (a cycle, a stuck teardown, a denied delete), 2 bad input —
always with one line on stderr saying what is wrong and where. Output into a pipe that closes early
(`criticalsvc plan -o json | head -1`) ends the command quietly with 141 (128 + SIGPIPE), as a shell
reports a command killed by SIGPIPE.

Installed as `kubectl-criticalsvc` too, the same commands run as a kubectl plugin (`kubectl criticalsvc
explain deployment/x -n ns`): kubectl finds executables named `kubectl-<name>` on PATH and runs them with
the rest of the command line and its own environment (KUBECONFIG included), nothing more
(https://kubernetes.io/docs/tasks/extend-kubectl/kubectl-plugins/). Either way, kubectl's flags
-n/--namespace, --context and --kubeconfig may come before the command, as kubectl allows.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from . import __version__
from .errors import CriticalsvcError, InvalidInput

COMMANDS = ("review", "plan", "simulate", "verify", "serve", "certs", "manifests", "explain", "graph", "discover")

EXIT_OK, EXIT_NO, EXIT_BAD_INPUT = 0, 1, 2
EXIT_BROKEN_PIPE = 128 + 13  # 128 + SIGPIPE: what a shell reports for `yes | head -1`

PROG = "criticalsvc"
KUBECTL_PLUGIN_PROG = "kubectl criticalsvc"  # how kubectl users type it; help and errors say the same
# kubectl's flags that the commands reading a cluster take (criticalsvc/commands/_source.py), with a value each.
KUBECTL_FLAGS = ("-n", "--namespace", "--context", "--kubeconfig")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own exit code is also 2; keep its one line
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}\n")


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description="A Kubernetes deletion gate for critical services.")
    parser.add_argument("--version", action="version", version=f"criticalsvc {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f".commands.{name}", __package__)
        except ModuleNotFoundError as exc:
            if exc.name == f"{__package__}.commands.{name}":
                continue  # not built yet
            raise
        module.register(sub)
    return parser


def command_first(argv: Sequence[str]) -> list[str]:
    """`-n ns explain x` -> `explain -n ns x`: kubectl takes its flags anywhere on the line
    (`kubectl -n ns get pods`), argparse takes a command's flags only after the command."""
    moved: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, _value = arg.partition("=")
        if (name in KUBECTL_FLAGS and eq) or (arg.startswith("-n") and not arg.startswith("--") and len(arg) > 2):
            moved.append(arg)  # --context=c, -nns
            i += 1
        elif name in KUBECTL_FLAGS:
            moved += argv[i:i + 2]
            i += 2
        else:
            break
    rest = list(argv[i:])
    return [*rest[:1], *moved, *rest[1:]] if moved else list(argv)


def main(argv: Sequence[str] | None = None, *, prog: str = PROG) -> int:
    args = build_parser(prog).parse_args(command_first(sys.argv[1:] if argv is None else argv))
    if args.command != "serve":  # `serve` sets its own level; elsewhere stdout is the command's output only
        from .logs import configure_logging

        configure_logging("warning")
    try:
        code: int = args.run(args)
        sys.stdout.flush()  # here, so that a closed pipe is noticed while we can still handle it
        return code
    except BrokenPipeError:
        return _stdout_gone()
    except InvalidInput as exc:
        print(f"{prog} {args.command}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except CriticalsvcError as exc:
        print(f"{prog} {args.command}: {exc}", file=sys.stderr)
        return EXIT_NO
    except KeyboardInterrupt:
        return 130


def kubectl_plugin_main() -> int:
    """The `kubectl-criticalsvc` executable: the same commands, named the way kubectl runs them."""
    return main(prog=KUBECTL_PLUGIN_PROG)


def _stdout_gone() -> int:
    """The reader of our stdout went away (`| head -1`): stop quietly, without a traceback.

    Python's recipe (https://docs.python.org/3/library/signal.html#note-on-sigpipe): point stdout at
    /dev/null so that the interpreter's final flush of what is still buffered does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # stdout has no file descriptor (a test's capture)
        pass
    return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
