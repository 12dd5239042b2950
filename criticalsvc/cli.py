"""The `criticalsvc` command line.

Each command lives in `criticalsvc.commands.<name>` and exposes `register(subparsers)` and
`run(args) -> int`. Exit codes are shared: 0 success (for `review`: a response was printed, allowed
or not), 1 the domain answer is "no" (a cycle, a stuck teardown, a denied delete), 2 bad input —
always with one line on stderr saying what is wrong and where. Output into a pipe that closes early
(`criticalsvc plan -o json | head -1`) ends the command quietly with 141 (128 + SIGPIPE), as a shell
reports a command killed by SIGPIPE.
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

COMMANDS = ("review", "plan", "simulate", "serve", "certs", "manifests", "explain", "graph")

EXIT_OK, EXIT_NO, EXIT_BAD_INPUT = 0, 1, 2
EXIT_BROKEN_PIPE = 128 + 13  # 128 + SIGPIPE: what a shell reports for `yes | head -1`


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own exit code is also 2; keep its one line
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="criticalsvc", description="A Kubernetes deletion gate for critical services.")
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


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
        print(f"criticalsvc {args.command}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except CriticalsvcError as exc:
        print(f"criticalsvc {args.command}: {exc}", file=sys.stderr)
        return EXIT_NO
    except KeyboardInterrupt:
        return 130


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
