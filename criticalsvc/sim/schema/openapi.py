"""The OpenAPI schema validator (kube-openapi pkg/validation/validate) and the field errors
apiextensions-apiserver makes of its results (pkg/apiserver/validation/validation.go,
kubeOpenAPIResultToFieldErrors)."""

from __future__ import annotations

import base64
import binascii
import datetime
import functools
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from .fielderrors import OMIT, FieldError
from .goformat import format_float_f, go_float, go_json, go_quote
from .nodes import child, properties_of
from .ratcheting import Correlation, deep_equal

try:  # Go's regexp is RE2; google-re2 comes with cel-python.
    import re2 as _re_engine
except ImportError:  # pragma: no cover - cel-python always brings it
    _re_engine = re


@attrs.frozen
class _OAError:
    """A kube-openapi errors.Validation (code, Name, Value, Valid, message, Values); code "plain" is any
    other error (a composite or a range error), which becomes an Invalid error at the root path."""

    code: str
    name: str = ""
    value: Any = None
    valid: Any = None
    message: str = ""
    values: tuple[Any, ...] = ()


_IN = "body"


def _types(schema: Mapping[str, Any]) -> list[str]:
    if schema.get("x-kubernetes-int-or-string") is True:
        return ["integer", "string"]
    t = schema.get("type")
    return [t] if isinstance(t, str) and t else []


# validation.go supportedVersionedFormats (1.0 and 1.34), normalized as go-openapi does (no dashes).
_SUPPORTED_STRING_FORMATS = frozenset(f.replace("-", "") for f in (
    "bsonobjectid", "uri", "email", "hostname", "ipv4", "ipv6", "cidr", "mac", "uuid", "uuid3", "uuid4",
    "uuid5", "isbn", "isbn10", "isbn13", "creditcard", "ssn", "hexcolor", "rgbcolor", "byte", "password",
    "date", "duration", "datetime", "k8s-short-name", "k8s-long-name"))


def _format(schema: Mapping[str, Any], types: list[str]) -> str:
    """The schema's format after StripUnsupportedFormatsPostProcessorForVersion."""
    fmt = schema.get("format")
    if not isinstance(fmt, str) or not fmt:
        return ""
    kind = types[0] if len(types) == 1 else ""
    if kind in ("", "string"):
        return fmt if fmt.replace("-", "") in _SUPPORTED_STRING_FORMATS else ""
    if kind == "integer":
        return fmt if fmt in ("int32", "int64") else ""
    if kind == "number":
        return fmt if fmt in ("float", "double") else ""
    return ""


def _schema_info(value: Any) -> tuple[str, str]:
    """typeValidator.schemaInfoForType for decoded JSON."""
    if isinstance(value, bool):
        return "boolean", ""
    if isinstance(value, str):
        return "string", ""
    if isinstance(value, int):
        return "integer", "int64"
    if isinstance(value, float):
        return "number", "float64"
    if isinstance(value, list):
        return "array", ""
    return "object", ""


def _is_json_integer(value: float) -> bool:
    """swag.IsFloat64AJSONInteger."""
    if not math.isfinite(value) or abs(value) > 2.0 ** 53:
        return False
    if value.is_integer():
        return True
    g = float(math.trunc(value))
    return abs(value - g) / min(abs(value) + abs(g), 1.7976931348623157e308) < 1e-9


def _invalid_type(path: str, type_name: str, value: Any) -> _OAError:
    """errors.InvalidType (with In "body")."""
    if isinstance(value, str):
        message = f"{path} in {_IN} must be of type {type_name}: {go_quote(value)}"
    else:
        message = f"{path} in {_IN} must be of type {type_name}"
    return _OAError("type", path, value, message=message)


def _type_errors(value: Any, types: list[str], nullable: bool, fmt: str, path: str) -> list[_OAError]:
    """typeValidator.Validate."""
    if value is None:
        if types and "null" not in types and not nullable:
            return [_invalid_type(path, ",".join(types), "null")]
        return []
    sch_type, format_ = _schema_info(value)
    is_float_int = sch_type == "number" and _is_json_integer(value) and "integer" in types
    is_int_float = sch_type == "integer" and "number" in types
    str_or_list = isinstance(value, (str, list))
    if not str_or_list and fmt and not (sch_type in types or format_ == fmt or is_float_int or is_int_float):
        return [_invalid_type(path, fmt, format_)]
    if not ("number" in types or "integer" in types) and fmt and str_or_list:
        return []
    if not (sch_type in types or is_float_int or is_int_float):
        return [_invalid_type(path, ",".join(types), sch_type)]
    return []


@functools.lru_cache(maxsize=512)
def _compiled(pattern: str) -> Any:
    return _re_engine.compile(pattern)


def _string_errors(value: str, schema: Mapping[str, Any], path: str) -> list[_OAError]:
    """stringValidator.Validate: the first of maxLength, minLength, pattern that fails (runes counted)."""
    max_length, min_length, pattern = schema.get("maxLength"), schema.get("minLength"), schema.get("pattern")
    if isinstance(max_length, int) and len(value) > max_length:
        return [_OAError("too_long", path, value, max_length,
                         f"{path} in {_IN} should be at most {max_length} chars long")]
    if isinstance(min_length, int) and len(value) < min_length:
        return [_OAError("too_short", path, value, min_length,
                         f"{path} in {_IN} should be at least {min_length} chars long")]
    if isinstance(pattern, str) and pattern:
        try:
            matched = _compiled(pattern).search(value) is not None
        except Exception as exc:  # an invalid pattern: FailedPattern names it
            return [_OAError("pattern", path, value,
                             message=f"{path} in {_IN} should match '{pattern}, but pattern is invalid: {exc}'")]
        if not matched:
            return [_OAError("pattern", path, value, message=f"{path} in {_IN} should match '{pattern}'")]
    return []


_UUID = {
    "uuid": r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$",
    "uuid3": r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?3[0-9a-f]{3}-?[0-9a-f]{4}-?[0-9a-f]{12}$",
    "uuid4": r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?4[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$",
    "uuid5": r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?5[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$",
}
_DATE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})$")
# strfmt DateTimePattern, applied (lower-cased) to what follows the first 't'.
_DATE_TIME = re.compile(r"^([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))$")
_BASE64 = re.compile(r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{4})$")


def _is_date(text: str) -> bool:
    """strfmt.IsDate: time.Parse("2006-01-02")."""
    m = _DATE.match(text)
    if not m:
        return False
    try:
        datetime.date(int(m[1]), int(m[2]), int(m[3]))
    except ValueError:
        return False
    return True


def _is_date_time(text: str) -> bool:
    """strfmt.IsDateTime."""
    if len(text) < 4:
        return False
    parts = text.lower().split("t")
    if len(parts) < 2 or not _is_date(parts[0]):
        return False
    m = _DATE_TIME.search(parts[1])
    if m is None:
        return False
    return m[1] <= "23" and m[2] <= "59" and m[3] <= "59"


def _matches(pattern: str, text: str) -> bool:
    return re.search(pattern, text) is not None


def _is_base64(text: str) -> bool:
    if not _BASE64.match(text):
        return False
    try:
        base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


# The strfmt formats checked here; the other supported ones pass unchecked (see the module docstring).
_FORMAT_CHECKS: dict[str, Callable[[str], bool]] = {
    "datetime": _is_date_time,
    "date": _is_date,
    "byte": _is_base64,
    "password": lambda _: True,
    **{name: functools.partial(_matches, pattern) for name, pattern in _UUID.items()},
}


def _range_error(value: int | float, type_name: str, fmt: str, prefix: str, path: str) -> _OAError | None:
    """validate.IsValueValidAgainstRange (a plain error, so it lands at the root path)."""
    text = str(value) if isinstance(value, int) else format_float_f(value)
    ok = True
    if type_name == "integer":
        bits = 32 if fmt == "int32" else 64
        ok = bool(re.fullmatch(r"[+-]?\d+", text)) and -(2 ** (bits - 1)) <= int(text) < 2 ** (bits - 1)
    elif fmt == "float":
        ok = abs(float(text)) <= 3.4028234663852886e38
    if ok:
        return None
    if fmt:
        return _OAError("plain", message=f"{prefix} value must be of type {type_name} with format {fmt} in {path}")
    return _OAError("plain", message=f"{prefix} value must be of type {type_name} (default format) in {path}")


def _number_errors(value: int | float, schema: Mapping[str, Any], types: list[str], path: str) -> list[_OAError]:
    """numberValidator.Validate: range, multipleOf, minimum, maximum."""
    type_name, fmt = "", ""
    declared = str(schema.get("format") or "")
    if len(types) == 1 and types[0] == "integer":
        type_name, fmt = "integer", declared if declared in ("int32", "int64") else ""
    elif len(types) == 1 and types[0] == "number":
        type_name, fmt = "number", declared if declared in ("float", "double") else ""
    errors: list[_OAError] = []
    ranged = _range_error(value, type_name, fmt, "Checked", path)
    if ranged is not None:
        errors.append(ranged)
    native = isinstance(value, int)
    multiple = schema.get("multipleOf")
    if isinstance(multiple, (int, float)) and not isinstance(multiple, bool):
        bad_bound = _range_error(multiple, type_name, fmt, "MultipleOf", path)
        if bad_bound is not None:
            errors.append(bad_bound)
        if native and bad_bound is None:  # MultipleOfInt
            factor = int(multiple)
            if factor <= 0:
                errors.append(_OAError("plain", message=f"factor MultipleOf declared for {path} must be positive: "
                                                        f"{factor}"))
            elif value % factor != 0:
                errors.append(_OAError("multiple_of", path, value,
                                       message=f"{path} in {_IN} should be a multiple of {factor}"))
        else:  # MultipleOf on float64s
            factor_f, number = float(multiple), float(value)
            if factor_f <= 0:
                errors.append(_OAError("plain", message=f"factor MultipleOf declared for {path} must be positive: "
                                                        f"{go_float(factor_f)}"))
            else:
                mult = 1 / factor_f * number if factor_f < 1 else number / factor_f
                if not _is_json_integer(mult):
                    errors.append(_OAError("multiple_of", path, number,
                                           message=f"{path} in {_IN} should be a multiple of {go_float(factor_f)}"))
    for keyword, exclusive_keyword, below, prefix in (("minimum", "exclusiveMinimum", True, "Minimum boundary"),
                                                      ("maximum", "exclusiveMaximum", False, "Maximum boundary")):
        bound = schema.get(keyword)
        if not isinstance(bound, (int, float)) or isinstance(bound, bool):
            continue
        exclusive = schema.get(exclusive_keyword) is True
        bad_bound = _range_error(bound, type_name, fmt, prefix, path)
        if bad_bound is not None:
            errors.append(bad_bound)
        limit: int | float
        data: int | float
        if native and bad_bound is None:  # MinimumInt / MaximumInt: the bound truncated to int64
            limit, data = int(bound), value
            shown = str(limit)
        else:
            limit, data = float(bound), float(value)
            shown = go_float(limit)
        if below:
            failed = data <= limit if exclusive else data < limit
            words = "greater than" if exclusive else "greater than or equal to"
        else:
            failed = data >= limit if exclusive else data > limit
            words = "less than" if exclusive else "less than or equal to"
        if failed:
            errors.append(_OAError("min" if below else "max", path, data,
                                   message=f"{path} in {_IN} should be {words} {shown}"))
    return errors


def _enum_equal(value: Any, candidate: Any) -> bool:
    """basicCommonValidator: the value converted to the enum value's type, then DeepEqual."""
    if value is None or candidate is None:
        return False
    if isinstance(candidate, bool) or isinstance(value, bool):
        return isinstance(candidate, bool) and isinstance(value, bool) and candidate == value
    if isinstance(candidate, (int, float)) and isinstance(value, (int, float)):
        return float(value) == float(candidate)
    return deep_equal(value, candidate)


def validate_openapi(value: Any, schema: Mapping[str, Any], path: str, corr: Correlation | None) -> list[_OAError]:
    """SchemaValidator.Validate of one node, then ratcheting: its errors (and its subtree's) are dropped
    when the node correlates with an unchanged old value."""
    errors = _openapi_node(value, schema, path, corr)
    if errors and corr is not None and corr.equal():
        return []
    return errors


def _openapi_node(value: Any, schema: Mapping[str, Any], path: str, corr: Correlation | None) -> list[_OAError]:
    types = _types(schema)
    fmt = _format(schema, types)
    errors: list[_OAError] = []
    if value is None:
        errors += _type_errors(None, types, schema.get("nullable") is True, fmt, path)
        errors += _enum_errors(None, schema, path)
        return errors
    if types or fmt:
        errors += _type_errors(value, types, schema.get("nullable") is True, fmt, path)
    errors += _junctor_errors(value, schema, path)
    if isinstance(value, str):
        errors += _string_errors(value, schema, path)
        check = _FORMAT_CHECKS.get(fmt.replace("-", "")) if fmt else None
        if check is not None and not check(value):
            errors.append(_invalid_type(path, fmt, value))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        errors += _number_errors(value, schema, types, path)
    if isinstance(value, list):
        errors += _slice_errors(value, schema, path, corr)
    errors += _enum_errors(value, schema, path)
    if isinstance(value, Mapping):
        errors += _object_errors(value, schema, path, corr)
    return errors


def _enum_errors(value: Any, schema: Mapping[str, Any], path: str) -> list[_OAError]:
    enum = schema.get("enum")
    if not isinstance(enum, list) or not enum or any(_enum_equal(value, e) for e in enum):
        return []
    return [_OAError("enum", path, value, message=f"{path} in {_IN} should be one of {enum}", values=tuple(enum))]


def _slice_errors(value: list[Any], schema: Mapping[str, Any], path: str,
                  corr: Correlation | None) -> list[_OAError]:
    """schemaSliceValidator.Validate: items, then minItems, maxItems, uniqueItems."""
    errors: list[_OAError] = []
    items = schema.get("items")
    if isinstance(items, Mapping):
        for i, item in enumerate(value):
            errors += validate_openapi(item, items, f"{path}[{i}]", corr.index(i) if corr is not None else None)
    size = len(value)
    min_items, max_items = schema.get("minItems"), schema.get("maxItems")
    if isinstance(min_items, int) and size < min_items:
        errors.append(_OAError("min_items", path, size, min_items,
                               f"{path} in {_IN} should have at least {min_items} items"))
    if isinstance(max_items, int) and size > max_items:
        errors.append(_OAError("max_items", path, size, max_items,
                               f"{path} in {_IN} should have at most {max_items} items"))
    if schema.get("uniqueItems") is True and any(
            deep_equal(a, b) for i, a in enumerate(value) for b in value[i + 1:]):
        errors.append(_OAError("unique", path, message=f"{path} in {_IN} shouldn't contain duplicates"))
    return errors


def _object_errors(value: Mapping[str, Any], schema: Mapping[str, Any], path: str,
                   corr: Correlation | None) -> list[_OAError]:
    """objectValidator.Validate: min/maxProperties, additionalProperties, properties, required."""
    errors: list[_OAError] = []
    count = len(value)
    min_props, max_props = schema.get("minProperties"), schema.get("maxProperties")
    if isinstance(min_props, int) and count < min_props:
        errors.append(_OAError("too_few_props", path, count, min_props,
                               f"{path} in {_IN} should have at least {min_props} properties"))
    if isinstance(max_props, int) and count > max_props:
        errors.append(_OAError("too_many_props", path, count, max_props,
                               f"{path} in {_IN} should have at most {max_props} properties"))
    properties = properties_of(schema)
    extra = schema.get("additionalProperties")
    if isinstance(extra, Mapping):
        for key, item in value.items():
            if key not in properties:
                errors += validate_openapi(item, extra, f"{path}.{key}", _child_corr(corr, path, key))
    for key, sub in properties.items():
        if key in value and isinstance(sub, Mapping):
            errors += validate_openapi(value[key], sub, f"{path}.{key}" if path else key, _child_corr(corr, path, key))
    for key in schema.get("required") or ():
        if key not in value:
            errors.append(_OAError("required", f"{path}.{key}", message=f"{path}.{key} in {_IN} is required"))
    return errors


def _child_corr(corr: Correlation | None, path: str, key: str) -> Correlation | None:
    """SubPropertyValidator: apiVersion and kind at the root are never ratcheted."""
    if corr is None or (path == "" and key in ("apiVersion", "kind")):
        return None
    return corr.key(key)


def _junctor_errors(value: Any, schema: Mapping[str, Any], path: str) -> list[_OAError]:
    """schemaPropsValidator: allOf, anyOf, oneOf and not (value validations only, never ratcheted)."""
    errors: list[_OAError] = []
    any_of = [s for s in schema.get("anyOf") or () if isinstance(s, Mapping)]
    if any_of:
        results = [_openapi_node(value, s, path, None) for s in any_of]
        if all(results):
            errors.append(_OAError("plain", message=f"{go_quote(path)} must validate at least one schema (anyOf)"))
            errors += results[0]
    one_of = [s for s in schema.get("oneOf") or () if isinstance(s, Mapping)]
    if one_of:
        results = [_openapi_node(value, s, path, None) for s in one_of]
        valid = sum(1 for r in results if not r)
        if valid != 1:
            found = "Found none valid" if valid == 0 else f"Found {valid} valid alternatives"
            errors.append(_OAError("plain", message=f"{go_quote(path)} must validate one and only one schema "
                                                    f"(oneOf). {found}"))
            if valid == 0:
                errors += results[0]
    all_of = [s for s in schema.get("allOf") or () if isinstance(s, Mapping)]
    if all_of:
        results = [_openapi_node(value, s, path, None) for s in all_of]
        for r in results:
            errors += r
        valid = sum(1 for r in results if not r)
        if valid != len(results):
            errors.append(_OAError("plain", message=f"{go_quote(path)} must validate all the schemas (allOf)"
                                                    f"{'. None validated' if valid == 0 else ''}"))
    negated = schema.get("not")
    if isinstance(negated, Mapping) and not _openapi_node(value, negated, path, None):
        errors.append(_OAError("plain", message=f"{go_quote(path)} must not validate the schema (not)"))
    return errors


def field_errors(prefix: str | None, errors: list[_OAError]) -> list[FieldError]:
    """kubeOpenAPIResultToFieldErrors (validation.go)."""
    out: list[FieldError] = []
    root = "<nil>" if prefix is None else prefix
    seen: set[str] = set()
    for e in errors:
        if e.message in seen:  # Result.AddErrors keeps one error per message text
            continue
        seen.add(e.message)
        if e.code == "plain":
            out.append(FieldError("FieldValueInvalid", root, "", e.message))
            continue
        name = e.name[1:] if e.name.startswith(".") else e.name
        field = child(prefix, name) if name and e.name != "." else root
        if e.code == "required":
            out.append(FieldError("FieldValueRequired", field, "", ""))
        elif e.code == "enum":
            values = [v if isinstance(v, str) else go_json(v) for v in e.values]
            detail = "supported values: " + ", ".join(go_quote(v) for v in values) if values else ""
            out.append(FieldError("FieldValueNotSupported", field, e.value, detail))
        elif e.code == "too_long":
            out.append(FieldError("FieldValueTooLong", field, "<value omitted>", _too_long(e.valid)))
        elif e.code in ("max_items", "too_many_props"):
            out.append(_too_many(field, e.value, e.valid))
        elif e.code == "type":
            out.append(FieldError("FieldValueTypeInvalid", field, "" if e.value is None else e.value, e.message))
        else:
            out.append(FieldError("FieldValueInvalid", field, "" if e.value is None else e.value, e.message))
    return out


def _too_long(maximum: Any) -> str:
    """field.TooLong's detail."""
    if isinstance(maximum, int) and maximum >= 0:
        return f"may not be more than {maximum} {'byte' if maximum == 1 else 'bytes'}"
    return "value is too long"


def _too_many(field: str, actual: Any, maximum: Any) -> FieldError:
    """field.TooMany."""
    if isinstance(maximum, int) and maximum >= 0:
        detail = f"must have at most {maximum} {'item' if maximum == 1 else 'items'}"
    else:
        detail = "has too many items"
    return FieldError("FieldValueTooMany", field, actual if isinstance(actual, int) and actual >= 0 else OMIT, detail)
