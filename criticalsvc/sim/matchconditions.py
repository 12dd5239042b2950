"""A webhook's matchConditions, evaluated as kube-apiserver evaluates them, with cel-python.

The variables are those of the webhook's CEL environment: `request` (the AdmissionRequest), `object`
and `oldObject` (null when the operation has none), and no `namespaceObject` (webhooks have none; it is
ValidatingAdmissionPolicy's). `request` is built as the API server builds it: its `omitempty` fields
(name, namespace, subResource, requestSubResource) are absent, not "", when empty, so an expression that
reads one without has() errors, as it does there
(https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/apiserver/pkg/cel/common/valuesschemalesstyped.go).

Outcome, as matcher.go decides it
(https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions/matcher.go):
any condition false skips the webhook; otherwise any error makes the request fail under failurePolicy Fail
(without calling the webhook) and skips the webhook under Ignore; all true calls it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import attrs

from ..condition import cel_environment
from ..errors import InvalidSpec

# The AdmissionRequest's omitempty strings (k8s.io/api admission/v1 types.go).
_OMITTED_WHEN_EMPTY = ("name", "namespace", "subResource", "requestSubResource")
MAX_CONDITIONS = 64  # validateMatchConditions, pkg/apis/admissionregistration/validation


@attrs.frozen
class MatchCondition:
    name: str
    expression: str


@attrs.frozen
class Outcome:
    """`matches`: call the webhook; `error`: the evaluation error that decides under failurePolicy (None when
    every condition evaluated)."""

    matches: bool
    error: str | None = None


def parse_match_conditions(raw: Any, path: str) -> tuple[MatchCondition, ...]:
    """A webhook's `matchConditions`; InvalidSpec names the field, as the API server's validation would."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InvalidSpec(path, "must be a list")
    if len(raw) > MAX_CONDITIONS:
        raise InvalidSpec(path, f"Too many: {len(raw)}: must have at most {MAX_CONDITIONS} items")
    out: list[MatchCondition] = []
    for i, item in enumerate(raw):
        here = f"{path}[{i}]"
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str) or not item["name"]:
            raise InvalidSpec(f"{here}.name", "Required value")
        expression = item.get("expression")
        if not isinstance(expression, str) or not expression.strip():
            raise InvalidSpec(f"{here}.expression", "Required value")
        try:
            _program(expression.strip())
        except Exception as exc:
            raise InvalidSpec(f"{here}.expression", f"compilation failed: {exc}") from exc
        out.append(MatchCondition(item["name"], expression.strip()))
    return tuple(out)


def evaluate(conditions: Sequence[MatchCondition], *, request: Mapping[str, Any]) -> Outcome:
    """Whether the webhook is called for the AdmissionRequest `request` (a review's `request`, as JSON)."""
    if not conditions:
        return Outcome(True)
    activation = _activation(request)
    errors: list[str] = []
    for condition in conditions:
        result = _evaluate(condition.expression, activation)
        if isinstance(result, str):
            errors.append(f"{condition.name}: {result}")
        elif result is False:
            return Outcome(False)
    if errors:
        return Outcome(False, "; ".join(errors))
    return Outcome(True)


def decide(outcome: Outcome, failure_policy: Literal["Fail", "Ignore"]) -> Literal["call", "skip", "fail"]:
    if outcome.error is not None:
        return "fail" if failure_policy == "Fail" else "skip"
    return "call" if outcome.matches else "skip"


def _activation(request: Mapping[str, Any]) -> dict[str, Any]:
    from celpy.adapter import json_to_cel

    fields = {k: v for k, v in request.items() if k not in ("object", "oldObject")
              and not (k in _OMITTED_WHEN_EMPTY and v in ("", None))}
    return {"request": json_to_cel(fields), "object": json_to_cel(request.get("object")),
            "oldObject": json_to_cel(request.get("oldObject"))}


@functools.lru_cache(maxsize=512)
def _program(expression: str) -> Any:
    env = cel_environment()  # cel-python's environment, as criticalsvc/condition.py makes it
    return env.program(env.compile(expression))


def _evaluate(expression: str, activation: Mapping[str, Any]) -> bool | str:
    """True or False, or the error's text (a non-boolean result is an error too)."""
    from celpy.evaluation import CELEvalError

    try:
        result = _program(expression).evaluate(dict(activation))
    except CELEvalError as exc:
        return str(exc.args[0]) if exc.args else str(exc)
    except Exception as exc:  # cel-python raises plain errors for some type mismatches
        return f"{type(exc).__name__}: {exc}"
    if isinstance(result, CELEvalError):
        return str(result.args[0]) if result.args else str(result)
    if isinstance(result, bool) or type(result).__name__ == "BoolType":
        return bool(result)
    return f"expected a bool, got {type(result).__name__}"
