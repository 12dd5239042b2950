"""CEL's fast path (issue 21, "the tail"): conditions in the checked subset are evaluated by the Rust
cel-interpreter (`import cel`), and every outcome equals cel-python's, the oracle (criticalsvc/condition.py,
"The fast path"; design/operations.md, "CEL's fast path")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, Phase, example, find, given, settings
from hypothesis import strategies as st

from criticalsvc import condition as cond
from criticalsvc.condition import Condition, Outcome, compile_condition, evaluate_condition

# --- generated conditions from the fast path's grammar, over generated objects ---------------------------

FIELDS = ("a", "b", "c")
STRINGS = ("", "a", "ab", "b", "é", "😀a")
# JSON values with the fields the expressions read: missing keys, wrong types, nested maps and lists,
# ints at and beyond int64's edges (beyond it a JSON int is not a CEL int), strings with non-ASCII.
scalars = (st.none() | st.booleans() | st.sampled_from(STRINGS)
           | st.integers(-3, 3) | st.sampled_from([2**63 - 1, -(2**63), 2**63, 2**64 + 1])
           | st.sampled_from([0.0, -0.0, 1.0, 1.5, -2.5, 3.0]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.sampled_from(FIELDS), inner, max_size=3), max_leaves=8)
# Most objects have every field, so that most reads find a value (and the fast path answers); a third
# have only scalars, so that the types two fields meet with are varied often.
objects = (st.dictionaries(st.sampled_from(FIELDS), values, max_size=3)
           | st.fixed_dictionaries(dict.fromkeys(FIELDS, values | st.fixed_dictionaries(dict.fromkeys(FIELDS, values))))
           | st.fixed_dictionaries(dict.fromkeys(FIELDS, scalars)))

INT_LITERALS = ("0", "1", "2", "-1", "3")
STRING_LITERALS = (*(f"'{s}'" for s in STRINGS), '"a"')
DOUBLE_LITERALS = ("1.5", "0.0", "-2.5", "3.0")
literals = st.sampled_from((*INT_LITERALS, *STRING_LITERALS, *DOUBLE_LITERALS, "true", "false", "null"))
OPS = ("==", "!=", "<", "<=", ">", ">=")


def chains(roots: tuple[str, ...]) -> st.SearchStrategy[str]:
    """`object.a.b`, or a macro variable's `x`, `x.c` (`object` is only read by fields: the fast path
    is given those alone, see `_pruned`)."""
    steps = st.lists(st.sampled_from(FIELDS), min_size=1, max_size=1) | st.lists(st.sampled_from(FIELDS), max_size=3)
    return st.builds(lambda root, path: ".".join((root, *(path or (["a"] if root == "object" else [])))),
                     st.sampled_from(roots), steps)


def selections(roots: tuple[str, ...]) -> st.SearchStrategy[str]:
    """A chain with at least one field selection, as has() takes."""
    return st.builds(lambda root, steps: ".".join((root, *steps)), st.sampled_from(roots),
                     st.lists(st.sampled_from(FIELDS), min_size=1, max_size=3))


def one_typed_list() -> st.SearchStrategy[str]:
    pools = (INT_LITERALS, STRING_LITERALS, DOUBLE_LITERALS, ("true", "false"), ("null",))
    return st.sampled_from(pools).flatmap(lambda pool: st.lists(st.sampled_from(pool), max_size=3)).map(
        lambda items: "[" + ", ".join(items) + "]")


def conditions(depth: int = 2, roots: tuple[str, ...] = ("object",)) -> st.SearchStrategy[str]:
    chain = chains(roots)
    atoms = st.one_of(
        st.builds(lambda c, op, lit: f"{c} {op} {lit}", chain, st.sampled_from(OPS), literals),
        st.builds(lambda lit, op, c: f"{lit} {op} {c}", literals, st.sampled_from(OPS), chain),
        st.builds(lambda c, lst: f"{c} in {lst}", chain, one_typed_list()),
        st.builds(lambda c: f"has({c})", selections(roots)),
        st.builds(lambda c, op, n: f"size({c}) {op} {n}", chain, st.sampled_from(OPS), st.sampled_from(INT_LITERALS)),
        st.builds(lambda c, op, n: f"{c}.size() {op} {n}", chain, st.sampled_from(OPS), st.sampled_from(INT_LITERALS)),
        st.builds(lambda c, m, s: f"{c}.{m}({s})", chain, st.sampled_from(("startsWith", "endsWith", "contains")),
                  st.sampled_from(STRING_LITERALS)),
        st.builds(lambda a, aop, b, op, n: f"{a} {aop} {b} {op} {n}", chain | st.sampled_from(INT_LITERALS),
                  st.sampled_from(("+", "-", "*", "/", "%")), chain | st.sampled_from(INT_LITERALS),
                  st.sampled_from(OPS), st.sampled_from(INT_LITERALS)),
        chain,  # a field used as a bool
        st.sampled_from(("true", "false")),
    )
    if depth == 0:
        return atoms
    inner = conditions(depth - 1, roots)
    variable = "xy"[len(roots) - 1] if len(roots) <= 2 else "z"
    return st.one_of(
        atoms,
        st.builds(lambda a, op, b: f"{a} {op} {b}", inner, st.sampled_from(("&&", "||")), inner),
        st.builds(lambda a: f"!({a})", inner),
        st.builds(lambda a: f"({a})", inner),
        st.builds(lambda a, b, c: f"({a} ? {b} : {c})", inner, inner, inner),
        st.builds(lambda c, m, body: f"{c}.{m}({variable}, {body})", chains(roots), st.sampled_from(("exists", "all")),
                  conditions(depth - 1, (*roots, variable))),
    )


def celpy_only(condition: Condition) -> Condition:
    return attrs.evolve(condition, fast=None)


def disagreement(expression: str, objs: list[dict[str, Any]],
                 evaluate: Callable[[Condition, dict[str, Any]], Outcome]) -> str | None:
    """Where `evaluate` and cel-python (the oracle) differ on the condition: outcome class (True, False,
    an error) or, for errors, the text; None when they agree on every object."""
    condition = compile_condition(expression, "condition")
    for obj in objs:
        oracle = evaluate_condition(celpy_only(condition), obj)
        got = evaluate(condition, obj)
        if type(oracle) is not type(got) or oracle != got:
            return f"{expression!r} on {obj!r}: celpy {oracle!r}, fast path {got!r}"
    return None


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expression=conditions(), objs=st.lists(objects, min_size=1, max_size=4))
# The disagreements found so far (design/operations.md, "CEL's fast path"), each answered by celpy:
@example("('' == object.a ? object.a : size(object.a) < 3)", [{"a": "😀a"}])  # size(): UTF-8 bytes
@example("object.a + object.a == 0", [{"a": ""}])  # concatenation, then heterogeneous equality
@example("object.a == 1.5", [{"a": 2**64}])  # beyond int64: a double
@example("object.a == 'x' || object.a != 1", [{"a": 1}, {"a": None}])  # heterogeneous equality
@example("object.a == 1", [{"a": True}])  # celpy: true
@example("object.a < 1.5 && object.a > 1", [{"a": 1}, {"a": 1.25}])  # int and double
@example("has(object.a.b) || has(object.b.c)", [{"a": None, "b": 1}, {}])  # has() on a missing or non-map field
@example("object.a.exists(x, x == 1)", [{"a": ["b", 1]}, {"a": [1, "b"]}])  # an error before a true
def test_the_fast_path_agrees_with_celpy_on_generated_conditions_and_objects(
        expression: str, objs: list[dict[str, Any]]) -> None:
    assert compile_condition(expression, "condition").fast is not None, f"{expression!r} left the fast path"
    assert disagreement(expression, objs, evaluate_condition) is None


# --- negative controls: the comparison catches evaluators that are wrong ----------------------------------

def _errors_are_false(condition: Condition, obj: dict[str, Any]) -> Outcome:
    """The fast program with its errors taken as False: a protected deletion would be let through."""
    try:
        answer = condition.fast.execute({"object": obj})
    except Exception:
        return False
    return answer if isinstance(answer, bool) else evaluate_condition(celpy_only(condition), obj)


def _unguarded(condition: Condition, obj: dict[str, Any]) -> Outcome:
    """The expression as written, on the Rust evaluator, with no type guards (cel-go's heterogeneous
    equality: `1 == 'a'` is false where celpy says "no such overload")."""
    import cel

    try:
        answer = cel.compile(condition.expression).execute({"object": obj})
    except Exception:
        return evaluate_condition(celpy_only(condition), obj)
    return answer if isinstance(answer, bool) else evaluate_condition(celpy_only(condition), obj)


@pytest.mark.parametrize("wrong", [_errors_are_false, _unguarded], ids=["errors-as-false", "no-type-guards"])
def test_the_oracle_comparison_catches_a_wrong_fast_path(wrong: Callable[[Condition, dict[str, Any]], Outcome]) -> None:
    found = find(st.tuples(conditions(), st.lists(objects, min_size=1, max_size=4)),
                 lambda case: disagreement(case[0], case[1], wrong) is not None,
                 settings=settings(max_examples=2000, deadline=None, database=None,
                                   phases=[Phase.generate]))  # the first found will do: no shrinking
    assert disagreement(found[0], found[1], wrong) is not None


# --- what takes the fast path, and that it is taken ---------------------------------------------------------

@pytest.mark.parametrize("expression", [
    "object.status.phase in ['Pending', 'Running']",  # api/examples
    "has(object.spec.replicas) && object.spec.replicas > 0",
    "object.spec.replicas > 0",
    "object.status.phase == 'Bound'",
    "has(object.data) && has(object.data.state) && object.data.state == 'active'",  # benchmarks/realcluster.py
    "object.metadata.labels.exists(k, k.startsWith('app'))",
    "!(object.status.phase == 'Succeeded') || size(object.status.conditions) > 0",
    "object.spec.suspend ? false : true",
    "object.spec.size % 2 == 0",  # benchmarks/scale.py
])
def test_the_usual_conditions_take_the_fast_path(expression: str) -> None:
    assert compile_condition(expression, "condition").fast is not None


@pytest.mark.parametrize("expression", [
    "object.spec.replicas + 1.5 > 1.5",  # double arithmetic
    "object.metadata.name + 'x' == 'ax'",  # string concatenation
    "object.metadata.labels['app'] == 'db'",  # indexing: celpy's "no such key" names no key
    "object.metadata.name.matches('^db-')",  # RE2 (celpy) and Rust's regex differ at the edges
    "object.spec.containers.exists_one(c, c.name == 'x')",  # celpy 0.5 errors where cel-go answers
    "object.spec.replicas == 1u",  # uint: JSON has none
    "object.spec.a == object.spec.b",  # two fields: their elements' types are not checked
    "object.spec.replicas in [1, 'a']",  # a list of mixed types
    "object.metadata.name == 'a\\'b'",  # escapes
    "object.spec.replicas > 1e3",  # exponent notation
    "type(object.spec) == map",
    "[1, 2].all(object, object > 0)",  # `object` shadowed
    "object.spec.items.map(x, x.n).size() > 0",
])
def test_conditions_outside_the_checked_subset_stay_with_celpy(expression: str) -> None:
    assert compile_condition(expression, "condition").fast is None


def test_the_fast_path_answers_without_celpy() -> None:
    """A condition in the subset is answered by the fast program: with celpy's program gone, the
    answers stand; an object the fast program errors on still reaches celpy (which is then missing)."""
    condition = compile_condition("object.status.phase in ['Pending', 'Running']", "condition")
    no_celpy = attrs.evolve(condition, program=None)
    assert evaluate_condition(no_celpy, {"status": {"phase": "Running"}}) is True
    assert evaluate_condition(no_celpy, {"status": {"phase": "Failed"}}) is False
    # No status: an error, worded by celpy (here: celpy is absent, so the attempt fails closed all the same).
    assert isinstance(evaluate_condition(no_celpy, {}), str)
    assert evaluate_condition(condition, {}) == "no such key: status"


@pytest.mark.parametrize(("expression", "obj", "expected"), [
    # cel-interpreter reads 2**64 as a double (true); celpy says "overflow".
    ("object.spec.replicas > 1.5", {"spec": {"replicas": 2**64}}, "an int beyond int64"),
    ("object.spec.replicas > 0", {"spec": {"replicas": 1.5}}, "a double compared with an int literal"),
    ("object.spec.replicas > 0", {"spec": {"replicas": "3"}}, "a string compared with an int"),
    ("object.spec.replicas > 0", {"spec": {"replicas": True}}, "a bool compared with an int"),
])
def test_values_the_fast_path_would_read_otherwise_are_answered_by_celpy(
        expression: str, obj: dict[str, Any], expected: str) -> None:
    condition = compile_condition(expression, "condition")
    assert condition.fast is not None
    assert evaluate_condition(condition, obj) == evaluate_condition(celpy_only(condition), obj), expected


def test_a_fast_path_error_never_becomes_false() -> None:
    """Errors block (fail closed): the fast program's error on a missing field is celpy's error text."""
    condition = compile_condition("object.spec.replicas > 0 || object.spec.paused == true", "condition")
    assert condition.fast is not None
    outcome = evaluate_condition(condition, {"spec": {}})
    assert isinstance(outcome, str) and outcome == evaluate_condition(celpy_only(condition), {"spec": {}})


def test_the_rewritten_text_guards_each_comparison_by_type() -> None:
    ast = cond.cel_environment().compile("object.spec.replicas > 0")
    assert cond._rewrite(ast, frozenset())[0] == \
        f"(type(object.spec.replicas) == int ? (object.spec.replicas > 0) : {cond._GIVE_UP})"


def test_the_cel_benchmark_times_every_example_condition_on_the_fast_path() -> None:
    """`python -m benchmarks cel` (tiny): every condition of api/examples and of the churn benchmark is
    timed on objects of its resource, and each of them takes the fast path."""
    from benchmarks import cel as bench

    rows = bench.measure(evaluations=1, rounds=1)["table"]["rows"]
    timed = {row[0] for row in rows}
    assert timed == {expression for _resource, expression in bench.conditions()}
    assert "object.status.phase in ['Pending', 'Running']" in timed and len(timed) >= 5
    assert {row[3] for row in rows} == {"yes"}
    assert {row[2] for row in rows} >= {"True", "False"}


def test_a_condition_still_copies_and_pickles() -> None:
    """The fast program is a Rust object that cannot be pickled; a Condition still deep-copies and
    pickles (as it did with cel-python's program alone), and the copy evaluates alike."""
    import copy
    import pickle

    condition = compile_condition("object.spec.replicas > 0", "condition")
    lenient = compile_condition("object.spec.(", "condition", lenient=True)
    for original in (condition, lenient):
        for clone in (copy.deepcopy(original), pickle.loads(pickle.dumps(original))):
            assert clone == original and clone.error == original.error
            for obj in ({"spec": {"replicas": 2}}, {"spec": {}}):
                assert evaluate_condition(clone, obj) == evaluate_condition(original, obj)
    assert pickle.loads(pickle.dumps(condition)).fast is not None
