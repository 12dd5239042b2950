"""The x-kubernetes-validations CEL rules (apiextensions-apiserver pkg/apiserver/schema/cel/validation.go),
evaluated with cel-python; a rule it cannot compile or evaluate faithfully is skipped, not guessed."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

from .fielderrors import OMIT, FieldError
from .nodes import child, properties_of
from .ratcheting import Ratchet, map_list_get

_OLD_SELF = re.compile(r"\boldSelf\b")
_MAX_MESSAGE_BYTES = 5 * 1024  # celconfig.MaxEvaluatedMessageExpressionSizeBytes


class _Unsupported(Exception):
    """cel-python cannot evaluate this rule faithfully; the rule is skipped."""


@functools.cache
def _cel_env() -> Any:
    import celpy  # deferred: only schemas with x-kubernetes-validations need it

    return celpy.Environment()


def _cel_program(expression: str) -> Any:
    compiled = _cel_compile(expression)
    if isinstance(compiled, _Unsupported):
        raise compiled
    return compiled


@functools.lru_cache(maxsize=256)
def _cel_compile(expression: str) -> Any:
    """The program, or the _Unsupported to raise (a failure is remembered too)."""
    env = _cel_env()
    try:
        return env.program(env.compile(expression))
    except Exception as exc:  # cel-python's grammar lacks it (the real server compiled it with the CRD)
        return _Unsupported(str(exc))


def _cel_eval(expression: str, activation: Mapping[str, Any]) -> Any:
    """The result, or raise _Unsupported (unknown function) or _CelError (a runtime error)."""
    from celpy.evaluation import CELEvalError

    program = _cel_program(expression)
    try:
        result = program.evaluate(dict(activation))
    except CELEvalError as exc:
        result = exc
    if isinstance(result, CELEvalError):
        message = str(result.args[0]) if result.args else str(result)
        if message.startswith("undeclared reference to"):
            raise _Unsupported(message)
        raise _CelError(_cel_go_text(result))
    return result


class _CelError(Exception):
    pass


def _cel_go_text(error: Any) -> str:
    """cel-go's words for the runtime errors cel-python reports differently."""
    message = str(error.args[0]) if error.args else str(error)
    missing = re.fullmatch(r"no such member in mapping: '(.*)'", message)
    if missing:
        return f"no such key: {missing[1]}"
    if message == "modulus or divide by zero":
        return "division by zero"
    if message == "return error for overflow":
        return "integer overflow"
    if message.startswith("found no matching overload"):
        return "no such overload"
    return message


def _is_true(result: Any) -> bool:
    """`evalResult == types.True`: only a boolean true passes."""
    from celpy import celtypes

    return result is True or (isinstance(result, celtypes.BoolType) and bool(result))


def _to_cel(value: Any) -> Any:
    from celpy.adapter import json_to_cel

    return json_to_cel(value)


def _normalized_field_path(field_path: str) -> str:
    """The rule's fieldPath as ValidFieldPath normalizes it: `.a.b` -> `a.b`, `.a['b.c']` -> `a[b.c]`."""
    parts: list[str] = []
    for name, key in re.findall(r"\.([^.\[]+)|\['((?:[^'\\]|\\.)*)'\]", field_path):
        if name:
            parts.append(("." if parts else "") + name)
        else:
            parts.append("[" + re.sub(r"\\(.)", r"\1", key) + "]")
    return "".join(parts)


class CelValidator:
    """Validator.validate: each node's rules, then its items, additionalProperties and properties."""

    def walk(self, value: Any, schema: Mapping[str, Any], path: str | None, old: Any, ratchet: Ratchet, *,
             root: bool = False) -> list[FieldError]:
        if value is None:
            return []
        errors = self._rules(value, schema, path, old, ratchet, root=root)
        if isinstance(value, list):
            items = schema.get("items")
            if isinstance(items, Mapping):
                for i, item in enumerate(value):
                    old_item = map_list_get(schema, old, item)
                    errors += self.walk(item, items, f"{'' if path is None else path}[{i}]", old_item,
                                        ratchet.index(i))
        elif isinstance(value, Mapping):
            correlatable = schema.get("x-kubernetes-map-type") in (None, "granular", "atomic")
            old_map = old if isinstance(old, Mapping) and correlatable else {}
            extra = schema.get("additionalProperties")
            if isinstance(extra, Mapping):
                for key, item in value.items():
                    errors += self.walk(item, extra, f"{'' if path is None else path}[{key}]", old_map.get(key),
                                        ratchet.key(key, root=root))
            for key, sub in properties_of(schema).items():
                if key in value and isinstance(sub, Mapping):
                    errors += self.walk(value[key], sub, child(path, key), old_map.get(key),
                                        ratchet.key(key, root=root))
        return errors

    def _rules(self, value: Any, schema: Mapping[str, Any], path: str | None, old: Any, ratchet: Ratchet, *,
               root: bool) -> list[FieldError]:
        rules = [r for r in schema.get("x-kubernetes-validations") or () if isinstance(r, Mapping) and r.get("rule")]
        if not rules:
            return []
        node_type = "object" if root else str(schema.get("type") or "")
        self_value = _root_view(value) if root else value
        activation: dict[str, Any] = {"self": _to_cel(self_value)}
        if old is not None:
            activation["oldSelf"] = _to_cel(_root_view(old) if root else old)
        field = "<nil>" if path is None else path
        errors: list[FieldError] = []
        for rule in rules:
            expression = str(rule["rule"])
            uses_old_self = bool(_OLD_SELF.search(expression))
            if uses_old_self and old is None:
                continue  # transition rules run only against a correlated old value
            try:
                verdict = _cel_eval(expression, activation)
            except _Unsupported:
                continue
            except _CelError as exc:
                text = str(exc)
                if text == "no such overload":
                    detail = (f"'{text}': call arguments did not match a supported operator, function or macro "
                              f"signature for rule: {_rule_text(rule)}")
                else:
                    detail = f"{text} evaluating rule: {_rule_text(rule)}"
                errors.append(FieldError("FieldValueInvalid", field, node_type, detail))
                continue
            if _is_true(verdict):
                continue
            at = path
            normalized = _normalized_field_path(str(rule.get("fieldPath") or ""))
            if normalized:
                at = child(path, normalized)
            detail = self._message(rule, activation)
            shown = OMIT if node_type in ("object", "array") else value
            error = _error_for_reason(rule.get("reason"), "<nil>" if at is None else at, shown, detail)
            if uses_old_self or not ratchet.should_ratchet():
                errors.append(error)
        return errors

    @staticmethod
    def _message(rule: Mapping[str, Any], activation: Mapping[str, Any]) -> str:
        """evalMessageExpression, falling back to ruleMessageOrDefault."""
        expression = rule.get("messageExpression")
        if expression:
            try:
                result = _cel_eval(str(expression), activation)
            except (_Unsupported, _CelError):
                result = None
            if isinstance(result, str):
                text = result.strip()
                if text and "\n" not in text and len(text.encode()) <= _MAX_MESSAGE_BYTES:
                    return text
        message = str(rule.get("message") or "").strip()
        return message or f"failed rule: {str(rule['rule']).strip()}"


def _rule_text(rule: Mapping[str, Any]) -> str:
    """ruleErrorString."""
    message = str(rule.get("message") or "").strip()
    return message or str(rule["rule"]).strip()


def _root_view(value: Any) -> Any:
    """model.WithTypeAndObjectMeta: at the resource root, metadata shows only name and generateName."""
    if not isinstance(value, Mapping):
        return value
    view = dict(value)
    metadata = view.get("metadata")
    if isinstance(metadata, Mapping):
        view["metadata"] = {k: metadata[k] for k in ("name", "generateName") if k in metadata}
    return view


def _error_for_reason(reason: Any, field: str, value: Any, detail: str) -> FieldError:
    """fieldErrorForReason."""
    if reason == "FieldValueForbidden":
        return FieldError("FieldValueForbidden", field, "", detail)
    if reason == "FieldValueRequired":
        return FieldError("FieldValueRequired", field, "", detail)
    if reason == "FieldValueDuplicate":
        return FieldError("FieldValueDuplicate", field, value, "")
    return FieldError("FieldValueInvalid", field, value, detail)
