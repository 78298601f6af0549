"""Resolving an action's fields with EXPR (RFC 0005) typed semantics.

The expressions are openjd-model's own (``FormatString.resolve_value``, evaluated by
``openjd.expr``); this module only applies the rules of the 2023-09 Template Schemas with EXPR
to their typed results, as openjd-sessions 0.14 does (``_runner_base.resolve_action_arg_values``,
``resolve_optional_int_field``, ``resolve_effective_cancelation``):

- an argument that is one whole expression and gives null is left out, a list gives one
  argument per element, anything else its string form;
- ``timeout`` and ``notifyPeriodInSeconds`` given as format strings (FEATURE_BUNDLE_1) are
  resolved right before the action runs: a whole-field null means "not given", anything else
  must be an integer in range;
- a format-string cancelation ``mode`` (FEATURE_BUNDLE_1, used by WRAP_ACTIONS forwarding)
  resolves to ``TERMINATE``, ``NOTIFY_THEN_TERMINATE`` or null (no cancelation declared).

Without EXPR the same functions give the legacy results (every value is a string).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import Any

from openjd.model import FormatStringError, SymbolTable

__all__ = ("is_null", "resolve_args", "resolve_cancelation", "resolve_int_field")

_STRICT_INT = re.compile(r"[+-]?[0-9]+")
MAX_INT_FIELD_VALUE = 2**63 - 1


def _expr_kind(value: Any) -> str:
    """``"plain"``, ``"null"``, ``"list"`` or ``"scalar"`` for a resolved value."""
    if "openjd._openjd_rs" not in sys.modules:  # no expression was evaluated in this process
        return "plain"
    from openjd.expr import ExprValue, TypeCode

    if not isinstance(value, ExprValue):
        return "plain"
    if value.is_null:
        return "null"
    if value.type.type_code == TypeCode.LIST:
        return "list"
    return "scalar"


def is_null(value: Any) -> bool:
    """True if ``value`` is the EXPR engine's typed null."""
    return _expr_kind(value) == "null"


def resolve_args(args: Sequence[Any] | None, symtab: SymbolTable) -> list[str]:
    """An action's ``args`` as the list of arguments to run with (RFC 0005 §1.3.2).

    Raises:
        FormatStringError: an argument cannot be resolved.
    """
    out: list[str] = []
    for arg in args or []:
        try:
            value = arg.resolve_value(symtab=symtab)
        except FormatStringError:
            out.append(arg.resolve(symtab=symtab))  # raises if it cannot be resolved at all
            continue
        kind = _expr_kind(value)
        if kind == "null":
            continue
        if kind == "list":
            out.extend(str(element) for element in value)
        else:
            out.append(value if isinstance(value, str) else str(value))
    return out


def resolve_int_field(
    value: Any,
    symtab: SymbolTable,
    *,
    ge: int | None = None,
    le: int | None = None,
    description: str,
) -> int | None:
    """An optional integer-or-format-string field (``timeout``, ``notifyPeriodInSeconds``).

    None when it is absent or a whole-field expression gives null.

    Raises:
        ValueError: the resolved value is not an integer within the bounds (FormatStringError,
            a ValueError too, when it cannot be resolved).
    """
    if value is None:
        return None
    if isinstance(value, int):
        if value > MAX_INT_FIELD_VALUE:
            raise ValueError(f"{description} must be at most {MAX_INT_FIELD_VALUE}, got {value}")
        return value
    resolved_value = value.resolve_value(symtab=symtab)
    if is_null(resolved_value):
        return None
    text = str(resolved_value)
    if _STRICT_INT.fullmatch(text) is None:
        raise ValueError(f"{description} must be an integer, got '{text}'")
    result = int(text)
    if result > MAX_INT_FIELD_VALUE:
        raise ValueError(f"{description} must be at most {MAX_INT_FIELD_VALUE}, got '{result}'")
    if (ge is not None and result < ge) or (le is not None and result > le):
        bounds = f"between {ge} and {le}" if le is not None else f"at least {ge}"
        raise ValueError(f"{description} must be {bounds}, got '{result}'")
    return result


def resolve_cancelation(cancelation: Any, symtab: SymbolTable) -> tuple[str | None, int | None]:
    """An action's ``cancelation`` model as (mode or None, notify period or None).

    Raises:
        ValueError: a format-string mode resolves to something else than the two modes or
            null, TERMINATE comes with a period, or the period is not an integer in 1..600.
    """
    from openjd.model.v2023_09 import CancelationMethodDeferred, CancelationMode

    def period(value: Any) -> int | None:
        return resolve_int_field(value, symtab, ge=1, le=600, description="notifyPeriodInSeconds")

    if cancelation is None:
        return None, None
    if isinstance(cancelation, CancelationMethodDeferred):
        mode_value = cancelation.mode.resolve_value(symtab=symtab)
        if is_null(mode_value):
            return None, None
        mode = str(mode_value)
        if mode == CancelationMode.TERMINATE.value:
            if period(cancelation.notifyPeriodInSeconds) is not None:
                raise ValueError(
                    "cancelation mode resolved to TERMINATE, which does not accept "
                    "notifyPeriodInSeconds"
                )
            return mode, None
        if mode == CancelationMode.NOTIFY_THEN_TERMINATE.value:
            return mode, period(cancelation.notifyPeriodInSeconds)
        raise ValueError(
            f"cancelation mode must resolve to TERMINATE, NOTIFY_THEN_TERMINATE, or null; got "
            f"'{mode}'"
        )
    if cancelation.mode == CancelationMode.TERMINATE:
        return CancelationMode.TERMINATE.value, None
    return CancelationMode.NOTIFY_THEN_TERMINATE.value, period(cancelation.notifyPeriodInSeconds)
