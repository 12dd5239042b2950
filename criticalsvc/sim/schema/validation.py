"""The entry point: a custom resource checked against its CRD's structural schema, in the real
server's order (pruning, OpenAPI, then CEL unless a blocking error; strategy.go hasBlockingErr)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .cel import CelValidator
from .fielderrors import FieldError
from .openapi import field_errors, validate_openapi
from .pruning import pruned
from .ratcheting import Correlation, Ratchet

# strategy.go hasBlockingErr: these skip the CEL rules.
_BLOCKING = frozenset({"FieldValueNotSupported", "FieldValueRequired", "FieldValueTooLong",
                       "FieldValueTooMany", "FieldValueTypeInvalid"})
_NOT_CHECKED = ("some validation rules were not checked because the object was invalid; correct the "
                "existing errors to complete validation")


def served_schema(crd: Mapping[str, Any] | None, version: str) -> Mapping[str, Any] | None:
    """spec.versions[name=version].schema.openAPIV3Schema of a CRD manifest, if it has one."""
    for v in ((crd or {}).get("spec") or {}).get("versions") or ():
        if isinstance(v, Mapping) and v.get("name") == version:
            found = (v.get("schema") or {}).get("openAPIV3Schema")
            return found if isinstance(found, Mapping) else None
    return None


def validate(obj: Mapping[str, Any], schema: Mapping[str, Any], old: Mapping[str, Any] | None = None, *,
             status_only: bool = False) -> list[FieldError]:
    """The field errors kube-apiserver reports for `obj` under the structural `schema`, in its order.

    `old=None` is a create; otherwise an update of `old`, whose unchanged parts do not fail (ratcheting).
    `status_only` is a write of the status subresource: only `status` is checked against the schema
    (errors under `status.`), the CEL rules still see the whole object."""
    new_value = pruned(obj, schema, root=True)
    old_value = pruned(old, schema, root=True) if old is not None else None
    root = Correlation(new_value, old_value, schema) if old is not None else None
    errors: list[FieldError] = []
    if status_only:
        status_schema = (schema.get("properties") or {}).get("status")
        if isinstance(new_value, Mapping) and "status" in new_value and isinstance(status_schema, Mapping):
            corr = root.key("status") if root is not None else None
            if corr is None and old_value is not None:
                old_status = old_value.get("status") if isinstance(old_value, Mapping) else None
                corr = Correlation(new_value["status"], old_status, status_schema)
            errors += field_errors("status", validate_openapi(new_value["status"], status_schema, "", corr))
    else:
        errors += field_errors(None, validate_openapi(new_value, schema, "", root))
    if any(error.type in _BLOCKING for error in errors):
        return [*errors, FieldError("FieldValueInvalid", "<nil>", None, _NOT_CHECKED)]
    ratchet = Ratchet(root, None)
    errors += CelValidator().walk(new_value, schema, None, old_value, ratchet, root=True)
    return errors
