"""The simulator's nondeterminism as explicit choice points, and every path through them up to a depth.

The simulator draws all of its nondeterminism from one `random.Random` (criticalsvc/sim/cluster.py): the
order in which a retrying client's requests issued "at once" reach the API server (`shuffle` of its
targets, then a `uniform(0, 0.01)` spread each), the order in which the namespace controller walks the
resource types in one pass (`shuffle`: discovery returns a Go map), and each finalizer controller's
reconcile delay (`uniform(0.5, 2)`). Everything else - backoffs, kubectl's file order, the ManifestWork
agent's sorted pass, the garbage collector - is deterministic in virtual time, and callbacks due at the
same instant run in the order they were scheduled (VirtualEngine's sequence number).

`ChoiceRandom` replaces that seeded stream by a `Path` of choices:

* `shuffle(x)` chooses a permutation, one choice point per position (n, n-1, ..., 2 alternatives);
* a `uniform(a, b)` narrower than `NARROW` (the 10 ms request spread) returns `a`: the order of
  requests "at once" is already chosen by the shuffle before it, and equal times keep that order, so the
  spread adds no order the shuffle has not. A wider one (a finalizer's reconcile delay) chooses between
  `a` and `b`: the earliest and the latest moment the controller may act;
* anything else the simulator might draw raises, so no nondeterminism goes unexplored unnoticed.

**The leader's steps** (criticalsvc/verify/enforcement.py) are choice points of their own, taken with `pick`:
which of the leader's loops moves next (the labeller, the router writing criticalsvc-providers, its probe), which
object the labeller's next PATCH commits for (it sends them at once), and which API server answers a probe - the
one holding the newest configuration (the first alternative) or one that lags, holding an older version.

**Partial-order reduction, and why it is sound.** In `shuffle`, an element `inert` says is a no-op
wherever it goes keeps its place and takes no choice: a resource type with no object in any terminating
namespace, in the namespace controller's pass (its deletecollection lists nothing, calls no webhook and
changes nothing, so it commutes with every other step). Every permutation of the remaining elements is
still enumerated.

**The bound.** `paths(depth)` enumerates every choice vector whose first `depth` choices range over all
alternatives and whose later choices are the first alternative (a depth-bounded search, as context-
bounded model checking bounds preemptions): every interleaving that departs from the canonical one only
at its first `depth` choice points. A run that meets fewer points than `depth` is explored exhaustively.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, MutableSequence, Sequence
from typing import Any, TypeVar

import attrs

from ..errors import InvalidInput

T = TypeVar("T")

# Below this width a uniform draw is the spread of requests issued at once (clients.SPREAD = 0.01 s).
NARROW = 0.5


class ChoiceError(InvalidInput):
    """A recorded path does not fit the run it is replayed on (a different bundle, client or version)."""

    def __init__(self, problem: str) -> None:
        super().__init__("--interleaving", problem)


@attrs.define
class Path:
    """Choices to replay (`prefix`), then the first alternative; records every point met and its arity."""

    prefix: tuple[int, ...] = ()
    taken: list[int] = attrs.field(factory=list)
    arity: list[int] = attrs.field(factory=list)

    def choose(self, n: int) -> int:
        if n <= 1:
            return 0
        i = len(self.taken)
        c = self.prefix[i] if i < len(self.prefix) else 0
        if not 0 <= c < n:
            raise ChoiceError(f"choice {i + 1} is {c}, but that point has {n} alternatives (0-{n - 1})")
        self.taken.append(c)
        self.arity.append(n)
        return c


class ChoiceRandom(random.Random):
    """A random.Random whose draws are the choices of a Path (see the module docstring)."""

    def __init__(self, path: Path, *, inert: Callable[[Any], bool] = lambda _x: False) -> None:
        super().__init__(0)
        self.path = path
        self.inert = inert

    def shuffle(self, x: MutableSequence[Any], random: Any = None) -> None:
        live = [v for v in x if not self.inert(v)]
        slots = [i for i, v in enumerate(x) if not self.inert(v)]
        order = []
        while live:
            order.append(live.pop(self.path.choose(len(live))))
        for i, v in zip(slots, order, strict=True):
            x[i] = v

    def uniform(self, a: float, b: float) -> float:
        if abs(b - a) < NARROW:
            return a
        return (a, b)[self.path.choose(2)]

    def random(self) -> float:
        raise NotImplementedError("the simulator drew random(): add it as a choice point (criticalsvc/verify)")

    def choice(self, seq: Any) -> Any:
        raise NotImplementedError("the simulator drew choice(): add it as a choice point (criticalsvc/verify)")


def pick(path: Path, options: Sequence[T]) -> T:
    """One of `options` (not empty), chosen at a choice point of `path`: the first is the canonical choice."""
    return options[path.choose(len(options))]


def paths(run: Callable[[Path], T], *, depth: int, limit: int | None = None) -> Iterator[tuple[Path, T]]:
    """Run `run` once per choice vector within `depth` (module docstring), depth-first, each with its Path;
    stops after `limit` runs when given (the caller reports that the bound was not exhausted)."""
    prefix: tuple[int, ...] = ()
    done = 0
    while True:
        path = Path(prefix)
        result = run(path)
        yield path, result
        done += 1
        if limit is not None and done >= limit:
            return
        # The odometer over the first `depth` points: the last one with an alternative left moves on.
        taken, arity = path.taken[:depth], path.arity[:depth]
        i = len(taken) - 1
        while i >= 0 and taken[i] + 1 >= arity[i]:
            i -= 1
        if i < 0:
            return
        prefix = (*taken[:i], taken[i] + 1)


def render(choices: Sequence[int]) -> str:
    """`3.0.1`: a path as the command line takes it (`-` for the canonical run, no choices)."""
    return ".".join(str(c) for c in choices) or "-"


def parse(text: str) -> tuple[int, ...]:
    """The inverse of `render`; bad input names the option and the part."""
    if text in ("", "-"):
        return ()
    out = []
    for i, part in enumerate(text.split("."), 1):
        if not part.isdigit():
            raise ChoiceError(f"part {i} ({part!r}) is not a non-negative integer; expected e.g. 3.0.1")
        out.append(int(part))
    return tuple(out)
