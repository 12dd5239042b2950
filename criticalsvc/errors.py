"""The exception tree of criticalsvc.

    CriticalsvcError                 base of everything raised on purpose
    ├── InvalidInput(ValueError)     input that does not have the expected shape; carries `path`
    │   ├── InvalidSpec              a CriticalService spec breaks the API rules
    │   ├── MalformedReview          an AdmissionReview cannot be decoded
    │   └── MalformedManifest        a manifest / cluster snapshot document is unusable
    ├── DependencyCycle              CriticalServices that would wait for each other forever
    └── StateUnavailable             the cluster state cannot answer now (cache not synced, live
                                     read failed); the gate must deny or answer 503, never guess

Every InvalidInput renders as one line, `<where>: <path>: <problem>`, where `where` names the file
and document when one is known. That line is what a person at a terminal sees.
"""

from __future__ import annotations

from collections.abc import Sequence

# How the webhook's denial begins when the state cannot answer (decision.decide), and the status's Blocking
# message then (status.compute_status): one sentence, so the two say the same thing.
UNVERIFIED = "criticalsvc could not verify the cluster state, so it does not allow this yet"


class CriticalsvcError(Exception):
    """Base class of every error criticalsvc raises on purpose."""


class InvalidInput(CriticalsvcError, ValueError):
    """Input of the wrong shape; `path` is the offending field (`spec.criteria[1].type`)."""

    def __init__(self, path: str, problem: str, *, where: str = "") -> None:
        self.path = path
        self.problem = problem
        self.where = where
        super().__init__(str(self))

    def located(self, where: str) -> InvalidInput:
        """The same error, prefixed with the file/document it came from."""
        located = type(self)(self.path, self.problem, where=where if not self.where else f"{where}: {self.where}")
        return located

    def __str__(self) -> str:
        parts = [p for p in (self.where, self.path) if p]
        return ": ".join([*parts, self.problem])


class InvalidSpec(InvalidInput):
    """A CriticalService spec that breaks the API rules (raised while parsing)."""


class MalformedReview(InvalidInput):
    """An AdmissionReview that cannot be decoded into a request."""


class MalformedManifest(InvalidInput):
    """A manifest or snapshot document that cannot be used (no apiVersion, not a mapping, ...)."""


class DependencyCycle(CriticalsvcError):
    """CriticalServices whose criteria wait for each other: a teardown of them can never finish."""

    def __init__(self, cycle: Sequence[str], steps: Sequence[str] = ()) -> None:
        self.cycle = tuple(cycle)
        # Why each CriticalService of the cycle waits for the next (graph.service_graph's `why`), in the same
        # order: an edge through a CRD, a namespace or a selector is not visible from the names alone.
        self.steps = tuple(steps)
        super().__init__(str(self))

    def __str__(self) -> str:
        return "dependency cycle: " + " -> ".join([*self.cycle, self.cycle[0]])


class StateUnavailable(CriticalsvcError):
    """The cluster state cannot answer a question right now; deciding would be guessing."""
