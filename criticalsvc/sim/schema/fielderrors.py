"""Field errors and the 422 Invalid Status made of them, as apimachinery builds them
(pkg/util/validation/field/errors.go, pkg/api/errors/errors.go NewInvalid, pkg/util/errors aggregate)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from .goformat import go_quote, render_value


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
            text = f"{text}: {render_value(self.bad_value)}"
        return f"{text}: {self.detail}" if self.detail else text

    def __str__(self) -> str:
        return f"{self.field}: {self.body()}"

    def cause(self) -> dict[str, str]:
        """The metav1.StatusCause errors.NewInvalid makes of it (empty members are omitted, as in Go)."""
        cause = {"reason": self.type, "message": self.body(), "field": self.field}
        return {k: v for k, v in cause.items() if v}


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
