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

Checked at compile time, as cel-go's checker would for a `dyn`-typed `object`: the syntax, every
identifier referring to a declared variable (`object`, the variables of comprehension macros such as
`exists(k, ...)`, CEL's type names), and every function or method called being one the evaluator has
(CEL's standard library as cel-python implements it; Kubernetes' CEL libraries such as `lowerAscii`
or `quantity` are not, so they are refused here rather than erroring on every object). Types are not
checked statically (`object` is dyn: its fields are only known per object), so
`object.spec.replicas > 'a'` compiles and errors per object.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Mapping
from typing import Any

import attrs

from .errors import InvalidSpec

# The variable a condition reads, as in ValidatingAdmissionPolicy's `object`.
OBJECT = "object"
# A condition is stored in every CriticalService and shown in every denial that it shapes; the CRD
# caps it (api/criticalservices.criticalsvc.io.yaml, maxLength; tests/test_condition.py keeps the two equal).
MAX_LENGTH = 1024
# cel-python's interpreter recurses ~4.5 Python frames per level of its parse tree, so with Python's
# default limit of 1000 frames it fails past ~220 levels (20 nested parentheses; measured). 160 levels
# (14 parentheses, or any number of `&&` clauses: they nest 1 level each) leaves the caller's own frames
# room, and is above the 12 repetitions of recursive rules cel-spec requires every implementation to
# support (https://github.com/google/cel-spec/blob/master/doc/langdef.md, "Syntax").
MAX_DEPTH = 160
# CEL's type identifiers, declared in every environment (cel-spec langdef.md, "Type Values").
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
    # The fields of `object` the expression reads (`("status", "phase")`), None when it reads the whole
    # object; evaluation converts only these (see `_pruned`).
    paths: tuple[tuple[str, ...], ...] | None = attrs.field(default=None, eq=False, hash=False, repr=False)

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
    compiled = _compile(expression)
    if isinstance(compiled, str):
        if lenient:
            return Condition(expression, None, error=f"{path} does not compile: {compiled}")
        raise InvalidSpec(path, compiled)
    program, paths = compiled
    return Condition(expression, program, paths=paths)


@functools.lru_cache(maxsize=512)
def _compile(expression: str) -> Any:
    """(program, paths), or the compile error's one-line text (remembered too: a CriticalService is
    re-parsed on every watch event of it)."""
    try:
        return _compile_checked(expression)
    except RecursionError:
        # `((((...))))` 300 deep exhausts the Python stack of cel-python's parser before MAX_DEPTH is
        # checked: the same answer.
        return "syntax error: expression recursion limit exceeded"


def _compile_checked(expression: str) -> Any:
    from celpy.celparser import CELParseError

    env = _env()
    try:
        ast = env.compile(expression)
    except CELParseError as exc:
        # cel-python's message is the expression with a caret under the column; say it in one line.
        line, column = getattr(exc, "line", None), getattr(exc, "column", None)
        where = f" at line {line}, column {column}" if line and column else ""
        return f"syntax error{where}"
    if _depth(ast) > MAX_DEPTH:
        return "syntax error: expression recursion limit exceeded"
    undeclared = _undeclared(ast)
    if undeclared is not None:
        return f"undeclared reference to '{undeclared}'"
    unknown = _unknown_function(ast)
    if unknown is not None:
        # cel-go's checker refuses a call it has no declaration for; without this, every object would
        # count with "no such function" and the criterion would silently never hold.
        return f"undeclared reference to '{unknown}': not a function of CEL's standard library as the gate evaluates it"
    return env.program(ast), _read_paths(ast)


@functools.cache
def _env() -> Any:
    import celpy  # deferred: only CriticalServices with conditions need it

    # celpy.Environment() raises the process's recursion limit to 2500 as a side effect (celpy/__init__.py,
    # Environment.__init__); the gate keeps Python's own, so a deeply nested expression is a compile
    # error ("recursion limit exceeded") rather than a deeper C stack for every thread.
    limit = sys.getrecursionlimit()
    try:
        return celpy.Environment()
    finally:
        sys.setrecursionlimit(limit)


@functools.cache
def _functions() -> frozenset[str]:
    """The functions and methods a condition may call: cel-python's standard library (operators aside)
    and the macros (cel-spec langdef.md, "Macros" and "Functions")."""
    import celpy.evaluation

    named = {f for f in celpy.evaluation.base_functions if f[:1].isalpha()}
    return frozenset(named | _BINDING_MACROS | {"has", "all"})


def _unknown_function(ast: Any) -> str | None:
    """The first function or method called that the evaluator does not have, or None."""
    from lark import Token

    for node in ast.iter_subtrees_topdown():
        if node.data == "ident_arg" and node.children and isinstance(node.children[0], Token):
            name = str(node.children[0])
        elif node.data == "member_dot_arg" and len(node.children) in (2, 3) and isinstance(node.children[1], Token):
            name = str(node.children[1])
        else:
            continue
        if name not in _functions():
            return name
    return None


def _depth(ast: Any) -> int:
    """The parse tree's depth, counted without recursion (the tree may be deeper than the stack allows)."""
    from lark import Tree

    deepest, stack = 0, [(ast, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(node, Tree):
            stack.extend((child, depth + 1) for child in node.children)
    return deepest


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


def _read_paths(ast: Any) -> tuple[tuple[str, ...], ...] | None:
    """The member chains on `object` the expression reads (`object.status.phase` -> ("status", "phase")),
    none a prefix of another; None when `object` is also used whole (`type(object)`, `object[k]`)."""
    from lark import Token, Tree

    def chain(member: Any) -> tuple[str, ...] | None:
        # member -> member_dot(member, IDENT) | primary(ident(IDENT)); anything else is not a static chain.
        if not (isinstance(member, Tree) and member.data == "member" and member.children):
            return None
        inner = member.children[0]
        if isinstance(inner, Tree) and inner.data == "member_dot" and len(inner.children) == 2 \
                and isinstance(inner.children[1], Token):
            head = chain(inner.children[0])
            return None if head is None else (*head, str(inner.children[1]))
        if isinstance(inner, Tree) and inner.data == "primary" and inner.children and \
                isinstance(inner.children[0], Tree) and inner.children[0].data == "ident" and \
                str(inner.children[0].children[0]) == OBJECT:
            return ()
        return None

    found: set[tuple[str, ...]] = set()

    def walk(node: Any) -> bool:
        """Collect the chains under `node`; False when `object` is used whole."""
        if not isinstance(node, Tree):
            return True
        if node.data == "member":
            path = chain(node)
            if path == ():
                return False
            if path is not None:
                found.add(path)
                return True
        return all(walk(child) for child in node.children)

    if not walk(ast):
        return None
    # A macro's variable shadowing `object` (`[1].all(object, ...)`) is legal CEL; reading it as the
    # object's fields would be wrong, so such expressions convert the whole object.
    if any(OBJECT in _macro_variables(t) for t in ast.iter_subtrees() if t.data == "member_dot_arg"):
        return None
    return tuple(sorted(p for p in found if not any(p[:i] in found for i in range(1, len(p)))))


def _macro_variables(node: Any) -> list[str]:
    from lark import Token, Tree

    if len(node.children) != 3:
        return []
    _target, method, args = node.children
    exprs = args.children if isinstance(args, Tree) else []
    if isinstance(method, Token) and str(method) in _BINDING_MACROS and len(exprs) >= 2:
        bound = _bound_name(exprs[0])
        return [bound] if bound is not None else []
    return []


def _pruned(obj: Mapping[str, Any], paths: tuple[tuple[str, ...], ...]) -> dict[str, Any]:
    """`obj` with only the fields at `paths` (whole subtrees below them). A missing step stays missing and
    a step that is not a map is kept as it is, so every read - and every error - is the same as on `obj`.
    Converting a whole Pod to CEL values costs ~170 µs; its `status.phase` alone, a few."""
    out: dict[str, Any] = {}
    for path in paths:
        src: Any = obj
        dst = out
        for i, key in enumerate(path):
            if not isinstance(src, Mapping) or key not in src:
                break
            if i == len(path) - 1 or not isinstance(src[key], Mapping):
                dst[key] = src[key]
                break
            src = src[key]
            dst = dst.setdefault(key, {})
    return out


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
        whole = dict(obj) if condition.paths is None else _pruned(obj, condition.paths)
        result = condition._program.evaluate({OBJECT: json_to_cel(whole)})
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
