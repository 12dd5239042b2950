"""Values printed as Go prints them (strconv.Quote, fmt's %v of a float64, encoding/json.Marshal), so
the stand-in's error messages are the real server's word for word."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any


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


def format_float_f(value: float) -> str:
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
        return format_float_f(value)
    if isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
        return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
                .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{go_json(str(k))}:{go_json(v)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(go_json(v) for v in value) + "]"
    return go_json(str(value))


def render_value(value: Any) -> str:
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
