"""Custom-resource validation against the CRD's structural schema, worded as kube-apiserver words it.

`validate(obj, schema, old)` is a pure function: it returns the field errors the real API server finds
when an object of a CRD-served type is created (`old=None`), updated or patched (`old` = the stored
object: unchanged parts are *ratcheted*), or when its status subresource is written
(`status_only=True`). `invalid_status()` turns them into the 422 `Invalid` metav1.Status. The API-server
stand-in (sim/apiserver/strategy.py) calls both after defaulting and before the admission webhooks, as the real
server's registry does (rest.BeforeCreate / BeforeUpdate run strategy validation before the
validating-admission callback).

What is modelled, and where upstream says so (paths in github.com/kubernetes/…; read at the master
commits of July 2026, the 1.37 line):

* The pipeline - apiextensions-apiserver pkg/registry/customresource/strategy.go (Validate,
  ValidateUpdate, hasBlockingErr), status_strategy.go (ValidateUpdate), validator.go
  (ValidateStatusUpdate validates `status` against the status schema with the field path `status`):
  OpenAPI schema errors first; then the x-kubernetes-validations CEL rules, unless a schema error is
  "blocking" (Unsupported value, Required value, Too long, Too many, or a type error), in which case
  the rules are skipped and one more error is added:
  `<nil>: Invalid value: null: some validation rules were not checked because the object was invalid;
  correct the existing errors to complete validation`.
* The OpenAPI part - kube-openapi pkg/validation/validate (schema.go: per node the type, allOf/anyOf/
  oneOf/not, string, format, number, slice, enum and object validators, in that order; object_validator.go,
  slice_validator.go, values.go, type.go) with the messages of pkg/validation/errors/schema.go
  (`spec.x in body should match '^…$'`, `spec.x in body must be of type string: "integer"`,
  `… should be greater than or equal to 0`, `… should have at least 1 items`,
  `… should have at least 2 properties`, `… should be at least 1 chars long`), turned into field
  errors by apiextensions-apiserver pkg/apiserver/validation/validation.go
  (kubeOpenAPIResultToFieldErrors): required -> `Required value`; enum -> `Unsupported value: "x":
  supported values: "a", "b"`; maxLength -> `Too long: may not be more than N bytes`; maxItems and
  maxProperties -> `Too many: N: must have at most M items`; a type error -> `Invalid value: "<JSON
  type>": <kube-openapi message>` (FieldValueTypeInvalid); anything else -> `Invalid value: <value>:
  <kube-openapi message>`.
* Pruning before validation - apiextensions-apiserver pkg/apiserver/customresource_handler.go
  (unstructuredSchemaCoercer.apply), schema/pruning/algorithm.go and schema/defaulting/prunenulls.go:
  fields the schema does not declare (without x-kubernetes-preserve-unknown-fields) and non-nullable
  nulls without a default are dropped before validation, so they are never errors (the stand-in
  stores the object unpruned; only the copy validated here is pruned).
* Ratcheting (CRDValidationRatcheting, on by default since 1.30) - apiextensions-apiserver
  pkg/apiserver/validation/ratcheting.go and apiserver pkg/cel/common/equality.go (CorrelatedObject):
  on an update an error is dropped when the nearest node that correlates with the old object (object
  properties by name; list-type=map items by their keys; nothing inside atomic or set lists) is
  unchanged.
* CEL rules - apiextensions-apiserver pkg/apiserver/schema/cel/validation.go (validateExpressions,
  fieldErrorForReason, ruleMessageOrDefault, evalMessageExpression): a false rule is reported at the
  node's path plus `fieldPath`, as `Invalid value: <detail>` for objects and lists (the value is
  omitted) or `Invalid value: "<scalar>": <detail>`; the detail is the trimmed messageExpression value
  when it evaluates to a non-empty one-line string, else `message`, else `failed rule: <rule>`;
  `reason` FieldValueForbidden / FieldValueRequired / FieldValueDuplicate give `Forbidden: …`,
  `Required value: …`, `Duplicate value…`. Map entries are addressed `spec.m[key]` there (kube-openapi
  says `spec.m.key`). Rules are evaluated with cel-python (`celpy`): a rule it cannot compile or whose
  function it does not know (the Kubernetes CEL libraries: isURL, quantity, lists, sets, optionals,
  ...) is skipped rather than guessed; runtime-error texts are translated for the common cases only.
* Field errors - apimachinery pkg/util/validation/field/errors.go (ErrorBody: strings `%q`, numbers
  and booleans `%v`, other values as JSON, `Too long`/`Required value`/`Forbidden` without a value),
  and pkg/api/errors/errors.go (NewInvalid): message `<Kind>.<group> "<name>" is invalid: <err>` or,
  for several distinct errors, `… is invalid: [<err1>, <err2>]` (apimachinery pkg/util/errors
  aggregate), details {name, group, kind, causes: [{reason, message, field}]} with one cause per
  error. kubectl rebuilds its `The CriticalService "x" is invalid: …` line from the causes.

Sources (master, July 2026; the 1.37 line):
  https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apimachinery/pkg/util/validation/field/errors.go
  https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apimachinery/pkg/api/errors/errors.go
  https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apimachinery/pkg/util/errors/errors.go
  https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/validation/validation.go
  https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/validation/ratcheting.go
  https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/validation/formats.go
  https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel/validation.go
  https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning/algorithm.go
  https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting/prunenulls.go
  https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apiextensions-apiserver/pkg/registry/customresource/strategy.go
  https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apiextensions-apiserver/pkg/registry/customresource/status_strategy.go
  https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apiextensions-apiserver/pkg/registry/customresource/validator.go
  https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apiserver/pkg/cel/common/equality.go
  https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apiserver/pkg/registry/rest/create.go
  https://github.com/kubernetes/kube-openapi/blob/master/pkg/validation/errors/schema.go
  https://github.com/kubernetes/kube-openapi/blob/master/pkg/validation/validate/schema.go (and type.go,
  validator.go, object_validator.go, slice_validator.go, schema_props.go, values.go)
  https://github.com/kubernetes/kube-openapi/blob/master/pkg/validation/strfmt/time.go (date-time)

Not modelled (documented, not hidden): sibling properties are checked in schema order and map entries
in the object's order, where the real server follows Go's randomised map order (so with several
errors the real order may differ); metadata (name format, generateName) and TypeMeta validation; the
formats other than date-time, date, byte, password and the uuid family; the list-type=map/set
uniqueness check; CEL cost budgets, `optionalOldSelf`, and the Kubernetes CEL extension libraries;
anyOf/oneOf error selection keeps the first failing branch rather than kube-openapi's best match.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import functools
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

import attrs

__all__ = [
    "OMIT",
    "FieldError",
    "aggregate",
    "invalid_status",
    "served_schema",
    "validate",
]

try:  # Go's regexp is RE2; google-re2 comes with cel-python.
    import re2 as _re_engine
except ImportError:  # pragma: no cover - cel-python always brings it
    _re_engine = re


class _Omit:
    """field.OmitValueType: the error's value is not shown."""

    _instance: _Omit | None = None

    def __new__(cls) -> _Omit:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "OMIT"


OMIT = _Omit()

# field.ErrorType -> its String() (apimachinery pkg/util/validation/field/errors.go).
_TYPE_TEXT = {
    "FieldValueNotFound": "Not found",
    "FieldValueRequired": "Required value",
    "FieldValueDuplicate": "Duplicate value",
    "FieldValueInvalid": "Invalid value",
    "FieldValueNotSupported": "Unsupported value",
    "FieldValueForbidden": "Forbidden",
    "FieldValueTooLong": "Too long",
    "FieldValueTooMany": "Too many",
    "FieldValueTooFew": "Too few",
    "InternalError": "Internal error",
    "FieldValueTypeInvalid": "Invalid value",
    "FieldValueTooShort": "Too short",
}
_NO_VALUE_TYPES = frozenset({"FieldValueRequired", "FieldValueForbidden", "FieldValueTooLong",
                             "FieldValueTooShort", "InternalError"})
# strategy.go hasBlockingErr: these skip the CEL rules.
_BLOCKING = frozenset({"FieldValueNotSupported", "FieldValueRequired", "FieldValueTooLong",
                       "FieldValueTooMany", "FieldValueTypeInvalid"})
_NOT_CHECKED = ("some validation rules were not checked because the object was invalid; correct the "
                "existing errors to complete validation")


@attrs.frozen
class FieldError:
    """A field.Error: `type` is its ErrorType (the Status cause's reason), `field` its path (`<nil>` for none)."""

    type: str
    field: str
    bad_value: Any = OMIT
    detail: str = ""

    def body(self) -> str:
        """field.Error.ErrorBody: the message without the field path."""
        text = _TYPE_TEXT.get(self.type, f"<unknown error {go_quote(self.type)}>")
        if self.type not in _NO_VALUE_TYPES and self.bad_value is not OMIT:
            text = f"{text}: {_render_value(self.bad_value)}"
        return f"{text}: {self.detail}" if self.detail else text

    def __str__(self) -> str:
        return f"{self.field}: {self.body()}"

    def cause(self) -> dict[str, str]:
        """The metav1.StatusCause errors.NewInvalid makes of it (empty members are omitted, as in Go)."""
        cause = {"reason": self.type, "message": self.body(), "field": self.field}
        return {k: v for k, v in cause.items() if v}


# --- Go formatting -----------------------------------------------------------------------------------------

def go_quote(text: str) -> str:
    """strconv.Quote (Go's %q of a string)."""
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        elif ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


def _digits(value: float) -> tuple[str, int]:
    """The shortest round-trip decimal digits of a finite non-zero |value| and its decimal exponent
    (`d.ddd × 10^exp`)."""
    sign_digits_exp = Decimal(repr(abs(value))).normalize().as_tuple()
    digits = "".join(map(str, sign_digits_exp.digits))
    exponent = int(sign_digits_exp.exponent)
    return digits, len(digits) + exponent - 1


def go_float(value: float) -> str:
    """fmt's %v of a float64: strconv's shortest 'g', so %e from a decimal exponent < -4 or >= 6
    (`1e+06`, `1.5`, `123456`)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "-0" if math.copysign(1, value) < 0 else "0"
    digits, exp = _digits(value)
    if exp < -4 or exp >= 6:
        return _e_format(value)
    return ("-" if value < 0 else "") + _fixed(digits, exp)


def _e_format(value: float) -> str:
    """strconv.FormatFloat(f, 'e', -1, 64): shortest mantissa, exponent of at least two digits."""
    digits, exp = _digits(value)
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{'-' if value < 0 else ''}{mantissa}e{'-' if exp < 0 else '+'}{abs(exp):02d}"


def _fixed(digits: str, exp: int) -> str:
    if exp < 0:
        return "0." + "0" * (-exp - 1) + digits
    if len(digits) <= exp + 1:
        return digits + "0" * (exp + 1 - len(digits))
    return digits[:exp + 1] + "." + digits[exp + 1:]


def _format_float_f(value: float) -> str:
    """strconv.FormatFloat(f, 'f', -1, 64) (swag.FormatFloat64)."""
    if value == 0 or not math.isfinite(value):
        return go_float(value)
    digits, exp = _digits(value)
    return ("-" if value < 0 else "") + _fixed(digits, exp)


def go_json(value: Any) -> str:
    """encoding/json.Marshal of a decoded JSON value: compact, sorted keys, HTML-safe, Go's floats."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return "null"  # json.Marshal refuses these; never in decoded JSON
        if value != 0 and (abs(value) < 1e-6 or abs(value) >= 1e21):
            return re.sub(r"e-0(\d)$", r"e-\1", _e_format(value))
        return _format_float_f(value)
    if isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
        return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
                .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{go_json(str(k))}:{go_json(v)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(go_json(v) for v in value) + "]"
    return go_json(str(value))


def _render_value(value: Any) -> str:
    """How ErrorBody prints a bad value: %v for numbers and booleans, %q for strings, JSON otherwise."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return go_float(value)
    if isinstance(value, str):
        return go_quote(value)
    return go_json(value)


# --- the Status -----------------------------------------------------------------------------------------

def aggregate(errors: Sequence[FieldError]) -> str:
    """ErrorList.ToAggregate().Error(): distinct messages; one alone, several as `[a, b]`."""
    seen: list[str] = []
    for error in errors:
        text = str(error)
        if text not in seen:
            seen.append(text)
    return seen[0] if len(seen) == 1 else "[" + ", ".join(seen) + "]"


def invalid_status(group: str, kind: str, name: str, errors: Sequence[FieldError]) -> dict[str, Any]:
    """The metav1.Status of apierrors.NewInvalid(schema.GroupKind{group, kind}, name, errors): code 422,
    reason Invalid, message `<Kind>.<group> "<name>" is invalid: …`, one cause per error."""
    qualified = f"{kind}.{group}" if group else kind
    message = f"{qualified} {go_quote(name)} is invalid"
    if errors:
        message += ": " + aggregate(errors)
    details: dict[str, Any] = {"name": name, "group": group, "kind": kind,
                               "causes": [error.cause() for error in errors]}
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": "Invalid", "details": {k: v for k, v in details.items() if v}, "code": 422}


def served_schema(crd: Mapping[str, Any] | None, version: str) -> Mapping[str, Any] | None:
    """spec.versions[name=version].schema.openAPIV3Schema of a CRD manifest, if it has one."""
    for v in ((crd or {}).get("spec") or {}).get("versions") or ():
        if isinstance(v, Mapping) and v.get("name") == version:
            found = (v.get("schema") or {}).get("openAPIV3Schema")
            return found if isinstance(found, Mapping) else None
    return None


# --- entry point ----------------------------------------------------------------------------------------

def validate(obj: Mapping[str, Any], schema: Mapping[str, Any], old: Mapping[str, Any] | None = None, *,
             status_only: bool = False) -> list[FieldError]:
    """The field errors kube-apiserver reports for `obj` under the structural `schema`, in its order.

    `old=None` is a create; otherwise an update of `old`, whose unchanged parts do not fail (ratcheting).
    `status_only` is a write of the status subresource: only `status` is checked against the schema
    (errors under `status.`), the CEL rules still see the whole object."""
    new_value = _pruned(obj, schema, root=True)
    old_value = _pruned(old, schema, root=True) if old is not None else None
    root = _Correlation(new_value, old_value, schema) if old is not None else None
    errors: list[FieldError] = []
    if status_only:
        status_schema = (schema.get("properties") or {}).get("status")
        if isinstance(new_value, Mapping) and "status" in new_value and isinstance(status_schema, Mapping):
            corr = root.key("status") if root is not None else None
            if corr is None and old_value is not None:
                old_status = old_value.get("status") if isinstance(old_value, Mapping) else None
                corr = _Correlation(new_value["status"], old_status, status_schema)
            errors += _field_errors("status", _openapi(new_value["status"], status_schema, "", corr))
    else:
        errors += _field_errors(None, _openapi(new_value, schema, "", root))
    if any(error.type in _BLOCKING for error in errors):
        return [*errors, FieldError("FieldValueInvalid", "<nil>", None, _NOT_CHECKED)]
    ratchet = _Ratchet(root, None)
    errors += _Cel().walk(new_value, schema, None, old_value, ratchet, root=True)
    return errors


# --- pruning (what the real server drops before it validates) ------------------------------------------

_META_FIELDS = frozenset({"apiVersion", "kind", "metadata"})


def _pruned(value: Any, schema: Mapping[str, Any] | None, *, root: bool = False) -> Any:
    """A copy of `value` with undeclared fields and non-nullable, non-defaulted nulls removed
    (structuralpruning.Prune, then PruneNonNullableNullsWithoutDefaults)."""
    if isinstance(value, Mapping):
        if schema is None:
            return {}
        embedded = root or schema.get("x-kubernetes-embedded-resource") is True
        preserve = schema.get("x-kubernetes-preserve-unknown-fields") is True
        properties = _properties(schema)
        extra = schema.get("additionalProperties")
        out: dict[str, Any] = {}
        for key, item in value.items():
            if embedded and key in _META_FIELDS:
                sub = properties.get(key)
                if item is None and sub is not None and _drops_null(sub):
                    continue
                out[key] = _copy(item)
                continue
            if key in properties:
                sub = properties[key]
            elif isinstance(extra, Mapping):
                sub = extra
            elif extra is True or preserve:
                out[key] = _copy(item)
                continue
            else:
                continue
            if item is None and _drops_null(sub):
                continue
            out[key] = _pruned(item, sub)
        return out
    if isinstance(value, list):
        items = schema.get("items") if schema is not None else None
        if schema is not None and schema.get("x-kubernetes-preserve-unknown-fields") is True and not isinstance(
                items, Mapping):
            return _copy(value)
        return [_pruned(item, items if isinstance(items, Mapping) else None) for item in value]
    return value


def _drops_null(schema: Mapping[str, Any]) -> bool:
    return not schema.get("nullable") and "default" not in schema


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _properties(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    found = schema.get("properties")
    return found if isinstance(found, Mapping) else {}


# --- ratcheting: old/new correlation (apiserver pkg/cel/common/equality.go) ------------------------------

class _Correlation:
    """common.CorrelatedObject: a node of the new object with the old value it corresponds to."""

    __slots__ = ("_children", "_equal", "new", "old", "schema")

    def __init__(self, new: Any, old: Any, schema: Mapping[str, Any] | None) -> None:
        self.new, self.old, self.schema = new, old, schema
        self._equal: bool | None = None
        self._children: dict[Any, _Correlation | None] = {}

    def key(self, field: str) -> _Correlation | None:
        if self.schema is None:
            return None
        if field in self._children:
            return self._children[field]
        child: _Correlation | None = None
        if isinstance(self.old, Mapping) and isinstance(self.new, Mapping) and field in self.old and field in self.new:
            sub = _properties(self.schema).get(field)
            if sub is None and isinstance(self.schema.get("additionalProperties"), Mapping):
                sub = self.schema["additionalProperties"]
            if isinstance(sub, Mapping):
                child = _Correlation(self.new[field], self.old[field], sub)
        self._children[field] = child
        return child

    def index(self, i: int) -> _Correlation | None:
        if self.schema is None:
            return None
        if i in self._children:
            return self._children[i]
        child: _Correlation | None = None
        items = self.schema.get("items")
        if isinstance(self.new, list) and i < len(self.new) and isinstance(items, Mapping):
            old_item = _map_list_get(self.schema, self.old, self.new[i])
            if old_item is not None:
                child = _Correlation(self.new[i], old_item, items)
        self._children[i] = child
        return child

    def equal(self) -> bool:
        """CachedDeepEqual."""
        if self._equal is None:
            self._equal = self._compute_equal()
        return self._equal

    def _compute_equal(self) -> bool:
        new, old = self.new, self.old
        if new is None and old is None:
            return True
        if new is None or old is None:
            return False
        if isinstance(old, list) != isinstance(new, list) or isinstance(old, Mapping) != isinstance(new, Mapping):
            return False
        if isinstance(old, list):
            if len(old) != len(new):
                return False
            for i in range(len(new)):
                child = self.index(i)
                if child is None:  # not correlatable: a map list is then unequal, others compare whole
                    is_map_list = self.schema is not None and self.schema.get("x-kubernetes-list-type") == "map"
                    return not is_map_list and _deep_equal(old, new)
                if not child.equal():
                    return False
            return True
        if isinstance(old, Mapping):
            if len(old) != len(new):
                return False
            for key in new:
                child = self.key(key)
                if child is None or not child.equal():
                    return False
            return True
        return _deep_equal(old, new)


def _map_list_get(schema: Mapping[str, Any], old: Any, item: Any) -> Any:
    """The old item of a list-type=map list with the same map keys as `item`, else None."""
    if schema.get("x-kubernetes-list-type") != "map" or not isinstance(old, list) or not isinstance(item, Mapping):
        return None
    keys = schema.get("x-kubernetes-list-map-keys") or ()
    wanted = [item.get(k) for k in keys]
    for candidate in old:
        if isinstance(candidate, Mapping) and all(
                _deep_equal(candidate.get(k), w) for k, w in zip(keys, wanted, strict=True)):
            return candidate
    return None


def _deep_equal(a: Any, b: Any) -> bool:
    """reflect.DeepEqual of decoded JSON (an int is never equal to a float or a bool)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, Mapping):
        return a.keys() == b.keys() and all(_deep_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_deep_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


# --- the OpenAPI schema validator (kube-openapi pkg/validation/validate) ----------------------------------

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
    text = str(value) if isinstance(value, int) else _format_float_f(value)
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
    return _deep_equal(value, candidate)


def _openapi(value: Any, schema: Mapping[str, Any], path: str, corr: _Correlation | None) -> list[_OAError]:
    """SchemaValidator.Validate of one node, then ratcheting: its errors (and its subtree's) are dropped
    when the node correlates with an unchanged old value."""
    errors = _openapi_node(value, schema, path, corr)
    if errors and corr is not None and corr.equal():
        return []
    return errors


def _openapi_node(value: Any, schema: Mapping[str, Any], path: str, corr: _Correlation | None) -> list[_OAError]:
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
                  corr: _Correlation | None) -> list[_OAError]:
    """schemaSliceValidator.Validate: items, then minItems, maxItems, uniqueItems."""
    errors: list[_OAError] = []
    items = schema.get("items")
    if isinstance(items, Mapping):
        for i, item in enumerate(value):
            errors += _openapi(item, items, f"{path}[{i}]", corr.index(i) if corr is not None else None)
    size = len(value)
    min_items, max_items = schema.get("minItems"), schema.get("maxItems")
    if isinstance(min_items, int) and size < min_items:
        errors.append(_OAError("min_items", path, size, min_items,
                               f"{path} in {_IN} should have at least {min_items} items"))
    if isinstance(max_items, int) and size > max_items:
        errors.append(_OAError("max_items", path, size, max_items,
                               f"{path} in {_IN} should have at most {max_items} items"))
    if schema.get("uniqueItems") is True and any(
            _deep_equal(a, b) for i, a in enumerate(value) for b in value[i + 1:]):
        errors.append(_OAError("unique", path, message=f"{path} in {_IN} shouldn't contain duplicates"))
    return errors


def _object_errors(value: Mapping[str, Any], schema: Mapping[str, Any], path: str,
                   corr: _Correlation | None) -> list[_OAError]:
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
    properties = _properties(schema)
    extra = schema.get("additionalProperties")
    if isinstance(extra, Mapping):
        for key, item in value.items():
            if key not in properties:
                errors += _openapi(item, extra, f"{path}.{key}", _child_corr(corr, path, key))
    for key, sub in properties.items():
        if key in value and isinstance(sub, Mapping):
            errors += _openapi(value[key], sub, f"{path}.{key}" if path else key, _child_corr(corr, path, key))
    for key in schema.get("required") or ():
        if key not in value:
            errors.append(_OAError("required", f"{path}.{key}", message=f"{path}.{key} in {_IN} is required"))
    return errors


def _child_corr(corr: _Correlation | None, path: str, key: str) -> _Correlation | None:
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


def _child(parent: str | None, name: str) -> str:
    """field.Path.Child(name).String() (a nil parent starts a new path)."""
    return name if parent is None else f"{parent}.{name}"


def _field_errors(prefix: str | None, errors: list[_OAError]) -> list[FieldError]:
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
        field = _child(prefix, name) if name and e.name != "." else root
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


# --- CEL (apiextensions-apiserver pkg/apiserver/schema/cel/validation.go) ---------------------------------

@attrs.frozen
class _Ratchet:
    """ratchetingOptions: the current correlation, or the nearest correlated ancestor once lost."""

    current: _Correlation | None
    parent: _Correlation | None

    def key(self, field: str, *, root: bool) -> _Ratchet:
        if self.current is None:
            return self
        if root and field in ("apiVersion", "kind"):
            return _Ratchet(None, None)
        return _Ratchet(self.current.key(field), self.current)

    def index(self, i: int) -> _Ratchet:
        if self.current is None:
            return self
        return _Ratchet(self.current.index(i), self.current)

    def should_ratchet(self) -> bool:
        if self.current is not None:
            return self.current.equal()
        return self.parent is not None and self.parent.equal()


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


class _Cel:
    """Validator.validate: each node's rules, then its items, additionalProperties and properties."""

    def walk(self, value: Any, schema: Mapping[str, Any], path: str | None, old: Any, ratchet: _Ratchet, *,
             root: bool = False) -> list[FieldError]:
        if value is None:
            return []
        errors = self._rules(value, schema, path, old, ratchet, root=root)
        if isinstance(value, list):
            items = schema.get("items")
            if isinstance(items, Mapping):
                for i, item in enumerate(value):
                    old_item = _map_list_get(schema, old, item)
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
            for key, sub in _properties(schema).items():
                if key in value and isinstance(sub, Mapping):
                    errors += self.walk(value[key], sub, _child(path, key), old_map.get(key),
                                        ratchet.key(key, root=root))
        return errors

    def _rules(self, value: Any, schema: Mapping[str, Any], path: str | None, old: Any, ratchet: _Ratchet, *,
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
                at = _child(path, normalized)
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

