"""A criterion's condition: a CEL expression over one object that says whether the object counts.

`spec.criteria[i].condition: "object.status.phase in ['Pending', 'Running']"` makes only the objects
for which the expression is true block the criterion. The language is CEL as Kubernetes uses it
(ValidatingAdmissionPolicy, CRD validation rules), checked and evaluated with cel-python (`celpy`) -
the usual conditions by a faster evaluator with celpy's answers ("The fast path" below); the one
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
    # The fast evaluator's program when the expression is in its subset (see `_fast_program`), else None.
    fast: Any = attrs.field(default=None, eq=False, hash=False, repr=False)

    def __str__(self) -> str:
        return self.expression

    def __deepcopy__(self, memo: dict[int, Any]) -> Condition:
        # Immutable, and the fast program (a Rust object) cannot be copied: the copy is the condition.
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled by its text (the fast program cannot be pickled); compiling it again gives the same.
        return _revive, (self.expression, self.error)


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
    program, paths, fast = compiled
    return Condition(expression, program, paths=paths, fast=fast)


def _revive(expression: str, error: str | None) -> Condition:
    compiled = _compile(expression)
    if error is not None or isinstance(compiled, str):
        return Condition(expression, None, error=error or f"does not compile: {compiled}")
    program, paths, fast = compiled
    return Condition(expression, program, paths=paths, fast=fast)


@functools.lru_cache(maxsize=512)
def _compile(expression: str) -> Any:
    """(program, paths, fast program or None), or the compile error's one-line text (remembered too: a
    CriticalService is re-parsed on every watch event of it)."""
    try:
        return _compile_checked(expression)
    except RecursionError:
        # `((((...))))` 300 deep exhausts the Python stack of cel-python's parser before MAX_DEPTH is
        # checked: the same answer.
        return "syntax error: expression recursion limit exceeded"


def _compile_checked(expression: str) -> Any:
    from celpy.celparser import CELParseError

    env = cel_environment()
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
    paths = _read_paths(ast)
    # The fast path needs the fields read known (it is given only those, like celpy; see `_pruned`).
    return env.program(ast), paths, _fast_program(ast) if paths is not None else None


@functools.cache
def cel_environment() -> Any:
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
    except Exception as exc:
        return _error_text(str(exc) or type(exc).__name__)
    if condition.fast is not None and _plain(whole):
        try:
            answer = condition.fast.execute({OBJECT: whole})
        except Exception:
            # Not mapped to cel-go's words here: celpy's error algebra (two errors joined by `||` give
            # "no such overload") is not the fast evaluator's, so celpy evaluates it and words it.
            answer = None
        # Only a bool is taken (see "The fast path" below); `is` keeps out 0 and 1.
        if answer is True or answer is False:
            return answer
    try:
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


# ---- The fast path: the usual conditions, compiled by cel-interpreter (Rust) -------------------------
#
# celpy walks its lark parse tree in Python: 150-330 µs per evaluation on this project's machines, a
# quarter of the gate's CPU under watch churn (design/operations.md, "The tail"). The package
# `common-expression-language` (`import cel`: the Rust crate cel-interpreter behind pyo3) evaluates the
# same expressions in 2-20 µs. It is not celpy, though: it follows cel-spec's heterogeneous equality
# (https://github.com/google/cel-spec/blob/508bd98efda47d85bcf1b9930dd5f35fa37e9a18/doc/langdef.md#L1015-L1037:
# `1 == 'a'` is false, `1 == 1.0` true) where cel-python 0.5 errors with "no such overload", its
# `has()` errors on a missing intermediate field where celpy answers false, and its error texts and
# the order in which it meets errors differ. So a condition takes the fast path only when it is built
# from a subset whose answers were checked against celpy (tests/test_condition_fastpath.py, a property
# test with celpy as the oracle), and compiled from a rewritten text that makes the fast evaluator
# error wherever the two could differ:
#
# - a comparison (== != < <= > >=) or `in` of a field with a literal only runs when the field has the
#   literal's type: `object.spec.replicas > 0` is compiled as
#   `(type(object.spec.replicas) == int ? (object.spec.replicas > 0) : <error>)`;
# - only a bool answer is taken from it: any error (or a non-bool result) hands the object to celpy,
#   whose answer and error text are the gate's as before. A guard's error stands where a value would
#   and goes up to the nearest bool (a comparison, which errors with it); `||`, `&&`, exists() and
#   all() only absorb an error when their other operands decide the answer alone, so whatever celpy
#   would have said there, the bool is the same.
#
# The subset: member selection on `object` and on a macro's variable; literals (string without escapes,
# int, double in plain decimal notation, bool, null); == != < <= > >= between such a value and a literal
# (or two values of one known type, like `size(x) > 0`); `in` with a list of literals of one type;
# && || ! and the ternary; has(); size(); startsWith, endsWith, contains; exists and all; integer
# + - * / %. Everything else (double and string arithmetic, indexing, matches, exists_one, map/filter,
# list and map literals elsewhere, uint, bytes, escapes, conversions, timestamps) stays with celpy.
# What the property test found, and why each construct is or is not here: design/operations.md,
# "CEL's fast path".
_SCALAR = {"INT_LIT": "int", "FLOAT_LIT": "double", "STRING_LIT": "string", "BOOL_LIT": "bool", "NULL_LIT": "null"}
# The type names the rewritten text checks with type() (cel-spec langdef.md, "Type Values").
_TYPE_OF = {"int": "int", "double": "double", "string": "string", "bool": "bool", "null": "null_type"}
# Evaluates to an error in any context ("no such overload"); where it stands, the fast path gives up.
_GIVE_UP = "(0 < '')"
_RELATIONS = {"relation_eq": "==", "relation_ne": "!=", "relation_lt": "<", "relation_le": "<=",
              "relation_gt": ">", "relation_ge": ">="}
# Integer arithmetic only: both evaluators truncate `/` and `%` toward zero, as cel-spec says, and
# error on overflow and on division by zero (then celpy answers); doubles and strings stay with celpy.
_ARITHMETIC = {"addition_add": "+", "addition_sub": "-", "multiplication_mul": "*", "multiplication_div": "/",
               "multiplication_mod": "%"}
# Field names that are keywords or reserved words in CEL (cel-spec langdef.md, "Syntax"): kept away
# from a second parser.
_RESERVED = frozenset({"as", "break", "const", "continue", "else", "false", "for", "function", "if",
                       "import", "in", "let", "loop", "package", "namespace", "null", "return", "true",
                       "var", "void", "while"})
_INT64 = 2**63


class _NotFast(Exception):
    """The expression leaves the fast path's subset."""


def _fast_program(ast: Any) -> Any:
    """The fast evaluator's program for a condition in the subset above, or None."""
    try:
        source, _kind = _rewrite(ast, frozenset())
    except (_NotFast, RecursionError):  # RecursionError: near MAX_DEPTH, celpy's own limit decides
        return None
    import cel  # deferred like celpy

    try:
        return cel.compile(source)
    except Exception:  # a text the second parser refuses: celpy evaluates it, as before
        return None


def _only(node: Any, data: str) -> Any:
    """The single child of a pass-through grammar node (`addition` without `+`), else not fast."""
    from lark import Tree

    children = [c for c in node.children if c is not None]
    if len(children) != 1 or not isinstance(node, Tree) or node.data != data:
        raise _NotFast
    return children[0]


def _rewrite(node: Any, scope: frozenset[str]) -> tuple[str, str]:
    """(text for the fast evaluator, static type: int, double, string, bool, null, or dyn) of `node`."""
    from lark import Token, Tree

    if not isinstance(node, Tree):
        raise _NotFast
    children = [c for c in node.children if c is not None]
    data = node.data
    if data == "expr":
        if len(children) == 1:
            return _rewrite(children[0], scope)
        test, then, other = (_rewrite(c, scope) for c in children)
        return f"({test[0]} ? {then[0]} : {other[0]})", then[1] if then[1] == other[1] else "dyn"
    if data in ("conditionalor", "conditionaland"):
        if len(children) == 1:
            return _rewrite(children[0], scope)
        left, right = (_rewrite(c, scope)[0] for c in children)
        return f"({left} {'||' if data == 'conditionalor' else '&&'} {right})", "bool"
    if data == "relation":
        if len(children) == 1:
            return _rewrite(children[0], scope)
        op, rhs = children
        if not isinstance(op, Tree):
            raise _NotFast
        lhs = _rewrite(_only(op, op.data), scope)
        if op.data == "relation_in":
            return _membership(lhs, rhs), "bool"
        if op.data not in _RELATIONS:
            raise _NotFast
        return _compare(lhs, _RELATIONS[op.data], _rewrite(rhs, scope)), "bool"
    if data in ("addition", "multiplication"):
        if len(children) == 1:
            return _rewrite(children[0], scope)
        op, rhs = children
        if not (isinstance(op, Tree) and op.data in _ARITHMETIC):
            raise _NotFast
        lhs = _rewrite(_only(op, op.data), scope)
        return f"({_int(lhs)} {_ARITHMETIC[op.data]} {_int(_rewrite(rhs, scope))})", "int"
    if data == "unary":
        if len(children) == 1:
            return _rewrite(children[0], scope)
        op, operand = children
        if not (isinstance(op, Tree) and op.data == "unary_not"):
            raise _NotFast  # unary minus: arithmetic
        return f"!{_rewrite(operand, scope)[0]}", "bool"
    if data == "member":
        return _rewrite(_only(node, "member"), scope)
    if data == "member_dot":
        target, field = children
        source, kind = _rewrite(target, scope)
        if kind != "dyn" or not isinstance(field, Token) or str(field) in _RESERVED:
            raise _NotFast
        return f"{source}.{field}", "dyn"
    if data == "member_dot_arg":
        return _method(children, scope)
    if data == "primary":
        return _primary(_only(node, "primary"), scope)
    raise _NotFast


def _primary(node: Any, scope: frozenset[str]) -> tuple[str, str]:
    from lark import Token, Tree

    if not isinstance(node, Tree):
        raise _NotFast
    children = [c for c in node.children if c is not None]
    if node.data == "ident":
        name = str(children[0])
        if name != OBJECT and name not in scope:
            raise _NotFast  # a type name used as a value
        return name, "dyn"
    if node.data == "literal":
        return _literal(children[0])
    if node.data == "paren_expr":
        source, kind = _rewrite(children[0], scope)
        return f"({source})", kind
    if node.data == "ident_arg" and len(children) == 2 and isinstance(children[0], Token):
        args = _args(children[1])
        if str(children[0]) == "has" and len(args) == 1:
            # has() takes a field selection only (cel-spec langdef.md, "Macros").
            selection = _descend(args[0])
            if not (isinstance(selection, Tree) and selection.data == "member_dot"):
                raise _NotFast
            return f"has({_rewrite(selection, scope)[0]})", "bool"
        if str(children[0]) == "size" and len(args) == 1:
            source, kind = _rewrite(args[0], scope)
            if kind != "dyn":
                raise _NotFast
            return _size(source), "int"
    raise _NotFast


def _method(children: list[Any], scope: frozenset[str]) -> tuple[str, str]:
    from lark import Token

    if len(children) not in (2, 3) or not isinstance(children[1], Token):
        raise _NotFast
    target, kind = _rewrite(children[0], scope)
    name = str(children[1])
    args = _args(children[2]) if len(children) == 3 else []
    if kind != "dyn":
        raise _NotFast
    if name == "size" and not args:
        return _size(target), "int"
    if name in ("startsWith", "endsWith", "contains") and len(args) == 1:
        arg, arg_kind = _rewrite(args[0], scope)
        if arg_kind != "string":
            raise _NotFast
        return f"{target}.{name}({arg})", "bool"
    if name in ("exists", "all") and len(args) == 2:
        variable = _descend(args[0])
        if not (hasattr(variable, "data") and variable.data == "primary"):
            raise _NotFast
        ident = _only(variable, "primary")
        if ident.data != "ident":
            raise _NotFast
        bound = str(ident.children[0])
        if bound == OBJECT or bound in scope or bound in _TYPE_NAMES or bound in _RESERVED:
            raise _NotFast
        body, _kind = _rewrite(args[1], scope | {bound})
        return f"{target}.{name}({bound}, {body})", "bool"
    raise _NotFast


def _int(value: tuple[str, str]) -> str:
    """An operand of integer arithmetic: an int, or a value guarded to be one."""
    if value[1] == "int":
        return value[0]
    if value[1] != "dyn":
        raise _NotFast
    return f"(type({value[0]}) == int ? {value[0]} : {_GIVE_UP})"


def _size(source: str) -> str:
    """size() of a list or map. cel-interpreter 0.10 counts a string's UTF-8 bytes (`size('é')` is 2)
    where cel-spec counts code points, as celpy does (found by the property test; cel-spec:
    https://github.com/google/cel-spec/blob/508bd98efda47d85bcf1b9930dd5f35fa37e9a18/doc/langdef.md#L1840-L1855);
    strings go to celpy."""
    return f"(type({source}) == string ? {_GIVE_UP} : size({source}))"


def _literal(token: Any) -> tuple[str, str]:
    kind = _SCALAR.get(getattr(token, "type", ""))
    text = str(token)
    if kind is None:
        raise _NotFast  # uint, bytes, multi-line strings
    if kind == "int" and not (re.fullmatch(r"-?[0-9]+", text) and -_INT64 < int(text) < _INT64):
        raise _NotFast  # hexadecimal, or out of int64's range
    if kind == "double" and not re.fullmatch(r"-?[0-9]+\.[0-9]+", text):
        raise _NotFast  # exponents, `.5`, `1.`: the two parsers' corners
    if kind == "string" and not re.fullmatch(r"'[^'\\\n\r]*'|\"[^\"\\\n\r]*\"", text):
        raise _NotFast  # raw strings and escapes
    return text, kind


def _args(exprlist: Any) -> list[Any]:
    return [c for c in getattr(exprlist, "children", []) if c is not None]


def _descend(node: Any) -> Any:
    """The node an `expr` wraps through single-child levels (`expr > ... > member > member_dot`)."""
    from lark import Tree

    while isinstance(node, Tree) and node.data in ("expr", "conditionalor", "conditionaland", "relation",
                                                   "addition", "multiplication", "unary", "member") \
            and len([c for c in node.children if c is not None]) == 1:
        node = next(c for c in node.children if c is not None)
    return node


def _typed(value: tuple[str, str], kind: str, text: str) -> str:
    """`text`, guarded so that it only runs when `value` has type `kind`."""
    if value[1] == kind:
        return text
    if value[1] != "dyn":
        raise _NotFast  # two different known types: celpy's answer ("no such overload") is all there is
    return f"(type({value[0]}) == {_TYPE_OF[kind]} ? {text} : {_GIVE_UP})"


def _compare(left: tuple[str, str], op: str, right: tuple[str, str]) -> str:
    text = f"({left[0]} {op} {right[0]})"
    if left[1] == "dyn" and right[1] == "dyn":
        raise _NotFast  # two fields: lists and maps would need their elements' types checked too
    if left[1] == "dyn":
        return _typed(left, right[1], text)
    return _typed(right, left[1], text)


def _membership(left: tuple[str, str], right: Any) -> str:
    """`left in [literals of one type]`; any other right-hand side is not fast."""
    from lark import Tree

    listed = _descend(right)
    if not (isinstance(listed, Tree) and listed.data == "primary"):
        raise _NotFast
    literal_list = _only(listed, "primary")
    if not (isinstance(literal_list, Tree) and literal_list.data == "list_lit"):
        raise _NotFast
    items = []
    for exprlist in (c for c in literal_list.children if c is not None):
        for element in _args(exprlist):
            literal = _descend(element)
            if not (isinstance(literal, Tree) and literal.data == "primary"):
                raise _NotFast
            token = _only(literal, "primary")
            if not (isinstance(token, Tree) and token.data == "literal"):
                raise _NotFast
            items.append(_literal(token.children[0]))
    text = f"({left[0]} in [{', '.join(t for t, _k in items)}])"
    if not items:
        return text
    kinds = {kind for _text, kind in items}
    if len(kinds) != 1:
        raise _NotFast
    return _typed(left, kinds.pop(), text)


def _plain(value: Any) -> bool:
    """Whether `value` is JSON data the fast evaluator converts exactly: an int beyond int64 would
    arrive as a double, a datetime (a YAML timestamp) as a timestamp."""
    if value is None or isinstance(value, str | bool | float):
        return True
    if isinstance(value, int):
        return -_INT64 <= value < _INT64
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    return False


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
