"""A criterion's condition: a CEL expression over one object that says whether the object counts.

`spec.criteria[i].condition: "object.status.phase in ['Pending', 'Running']"` makes only the objects
for which the expression is true block the criterion. The language is CEL as Kubernetes uses it
(ValidatingAdmissionPolicy, CRD validation rules), evaluated with cel-python (`celpy`); the one
variable is `object`, the whole object as the API server serves it.

When it runs. A condition is compiled once, when the CriticalService is parsed (so the webhook
refuses a CREATE/UPDATE whose condition does not compile: design/criticalservice.md, "Conditions"),
and evaluated once per object *when the object enters a state* (a watch event, a snapshot document,
a fresh read): the state keeps the `Outcome` next to the object's slim projection, never the object,
and a decision only reads it (criticalsvc/objects.py, `KubeObject.outcome`).

An outcome is True (the object counts), False (the condition excluded it) or the text of the
evaluation error (`no such key: status`, `no such overload`): an error counts as blocking. The gate
fails closed - a condition that cannot say "this object does not matter" never lets a deletion
through - and the error is shown wherever the object is (denials, `explain`, status blockers).

Checked at compile time, as cel-go's checker would for a `dyn`-typed `object`: the syntax, and every
identifier referring to a declared variable (`object`, the variables of comprehension macros such as
`exists(k, ...)`, CEL's type names). Types are not checked statically (`object` is dyn: its fields
are only known per object), so `object.spec.replicas > 'a'` compiles and errors per object.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

import attrs

from .errors import InvalidSpec

# The variable a condition reads, as in ValidatingAdmissionPolicy's `object`.
OBJECT = "object"
# A condition is stored in every CriticalService and shown in every denial that it shapes; the CRD
# caps it (api/criticalservices.criticalsvc.io.yaml, maxLength; tests/test_api.py keeps the two equal).
MAX_LENGTH = 1024
# CEL's type identifiers, declared in every environment (cel-spec, langdef.md "Type denotations").
_TYPE_NAMES = frozenset({"int", "uint", "double", "bool", "string", "bytes", "list", "map", "null_type",
                         "type", "duration", "timestamp", "dyn"})
# Macros that bind their first argument as a variable (cel-spec langdef.md "Macros").
_BINDING_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})

# A condition's outcome on one object: True (it counts), False (excluded), or an error's text (counts).
Outcome = bool | str


@attrs.frozen(cache_hash=True)
class Condition:
    """A compiled condition; equal (and hashed) by its expression, so states share outcomes per text.

    `error` is set (and `program` None) for a condition that did not compile but was accepted
    leniently (see `compile_condition`): it then errors on every object, so every object counts.
    """

    expression: str
    _program: Any = attrs.field(eq=False, hash=False, repr=False)
    error: str | None = attrs.field(default=None, eq=False, hash=False)

    def __str__(self) -> str:
        return self.expression


def compile_condition(expression: Any, path: str, *, lenient: bool = False) -> Condition:
    """The condition at `path` (`spec.criteria[1].condition`), compiled; raises InvalidSpec.

    `lenient`: a string that does not compile becomes a Condition that errors on every object instead.
    The states (caches, simulator, fresh reads) parse so: the CRD schema cannot compile CEL, so a
    CriticalService written while the gate's webhook was absent may carry one, and ignoring the whole
    CriticalService would lift its protection - the one outcome bad input must never have.
    """
    if not isinstance(expression, str):
        raise InvalidSpec(path, "must be a string (a CEL expression)")
    if not expression.strip():
        raise InvalidSpec(path, "must not be empty")
    if len(expression) > MAX_LENGTH:
        raise InvalidSpec(path, f"Too long: may not be more than {MAX_LENGTH} bytes")
    program = _compile(expression)
    if isinstance(program, str):
        if lenient:
            return Condition(expression, None, error=f"{path} does not compile: {program}")
        raise InvalidSpec(path, program)
    return Condition(expression, program)


@functools.lru_cache(maxsize=512)
def _compile(expression: str) -> Any:
    """The program, or the compile error's one-line text (remembered too: a CriticalService is re-parsed
    on every watch event of it)."""
    from celpy.celparser import CELParseError

    env = _env()
    try:
        ast = env.compile(expression)
    except CELParseError as exc:
        # cel-python's message is the expression with a caret under the column; say it in one line.
        line, column = getattr(exc, "line", None), getattr(exc, "column", None)
        where = f" at line {line}, column {column}" if line and column else ""
        return f"syntax error{where}"
    undeclared = _undeclared(ast)
    if undeclared is not None:
        return f"undeclared reference to '{undeclared}'"
    return env.program(ast)


@functools.cache
def _env() -> Any:
    import celpy  # deferred: only CriticalServices with conditions need it

    return celpy.Environment()


def _undeclared(ast: Any) -> str | None:
    """The first identifier that names no declared variable, or None (cel-go's checker's error)."""
    from lark import Token, Tree

    def walk(node: Any, scope: frozenset[str]) -> str | None:
        if not isinstance(node, Tree):
            return None
        if node.data == "primary" and node.children and isinstance(node.children[0], Tree) \
                and node.children[0].data == "ident":
            name = str(node.children[0].children[0])
            return None if name in scope else name
        if node.data == "member_dot_arg" and len(node.children) == 3:
            target, method, args = node.children
            found = walk(target, scope)
            if found is not None:
                return found
            exprs = args.children if isinstance(args, Tree) else []
            if isinstance(method, Token) and str(method) in _BINDING_MACROS and len(exprs) >= 2:
                bound = _bound_name(exprs[0])
                if bound is not None:
                    inner = scope | {bound}
                    return next((f for e in exprs[1:] if (f := walk(e, inner)) is not None), None)
            return next((f for e in exprs if (f := walk(e, scope)) is not None), None)
        return next((f for child in node.children if (f := walk(child, scope)) is not None), None)

    return walk(ast, frozenset({OBJECT}) | _TYPE_NAMES)


def _bound_name(expr: Any) -> str | None:
    """The variable a macro's first argument binds (`k` in `exists(k, ...)`): a bare identifier."""
    from lark import Tree

    idents = [t for t in expr.iter_subtrees() if isinstance(t, Tree) and t.data == "ident"]
    return str(idents[0].children[0]) if len(idents) == 1 else None


def evaluate_condition(condition: Condition, obj: Mapping[str, Any]) -> Outcome:
    """The condition on one object (its JSON): True, False, or the error's text (fail closed)."""
    from celpy.adapter import json_to_cel
    from celpy.celtypes import BoolType
    from celpy.evaluation import CELEvalError

    if condition.error is not None:
        return condition.error
    try:
        result = condition._program.evaluate({OBJECT: json_to_cel(dict(obj))})
    except CELEvalError as exc:
        result = exc
    except Exception as exc:
        return _error_text(str(exc) or type(exc).__name__)
    if isinstance(result, CELEvalError):
        return _error_text(str(result.args[0]) if result.args else str(result))
    if isinstance(result, BoolType | bool):
        return bool(result)
    return f"the condition evaluated to {type(result).__name__.removesuffix('Type').lower()}, not bool"


def _error_text(message: str) -> str:
    """cel-go's words for cel-python's runtime errors (what a Kubernetes user sees from the API server)."""
    missing = re.fullmatch(r"no such member in mapping: '(.*)'", message)
    if missing:
        return f"no such key: {missing[1]}"
    if message.startswith("found no matching overload"):
        return "no such overload"
    if message == "modulus or divide by zero":
        return "division by zero"
    return message.splitlines()[0][:200]


__all__ = ["MAX_LENGTH", "OBJECT", "Condition", "Outcome", "compile_condition", "evaluate_condition"]
