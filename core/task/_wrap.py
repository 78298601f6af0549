"""WRAP_ACTIONS (RFC 0008): an environment's hooks run in place of the actions they wrap.

Behavioural reference: openjd-sessions 0.14 (``Session._inject_wrapped_*``). While an
environment that defines the hooks is entered, every later environment's ``onEnter`` runs as
its ``onWrapEnvEnter``, every ``onExit`` as ``onWrapEnvExit``, and every task's ``onRun`` (and,
with CHECKPOINT, ``onCheckpointResume``) as ``onWrapTaskRun``. The hook resolves in the wrapping
environment's own scope, plus ``WrappedAction.*`` (the wrapped action's command, arguments,
timeout and cancelation, resolved in the wrapped action's scope), ``WrappedEnv.Name`` or
``WrappedStep.Name``. An inner environment without the action has nothing to replace: no hook
runs. At most one environment of a session may define hooks.
"""

from __future__ import annotations

from typing import Any

from openjd.model import SymbolTable

from core.job import resolve_args, resolve_cancelation, resolve_int_field

__all__ = ("WRAP_HOOKS", "defines_wrap", "inject_wrapped")

WRAP_HOOKS = ("onWrapEnvEnter", "onWrapTaskRun", "onWrapEnvExit")
TASK_RUN_DEFAULT_NOTIFY_PERIOD = 120
ENV_ACTION_DEFAULT_NOTIFY_PERIOD = 30


def defines_wrap(env_model: Any) -> bool:
    """True if the environment's script defines any wrap hook."""
    actions = getattr(getattr(env_model, "script", None), "actions", None)
    return any(getattr(actions, name, None) is not None for name in WRAP_HOOKS)


def hook(env_model: Any, name: str) -> Any:
    """The environment's hook ``name``, or None."""
    return getattr(getattr(getattr(env_model, "script", None), "actions", None), name, None)


def inject_wrapped(
    symtab: SymbolTable,
    action: Any,
    inner: SymbolTable,
    *,
    environment: list[str],
    task_run: bool,
) -> None:
    """Set ``WrappedAction.*`` in the hook's ``symtab`` from ``action`` resolved in ``inner``
    (the scope it would have run in unwrapped).

    Raises:
        ValueError: the wrapped action's fields cannot be resolved (FormatStringError too).
    """
    symtab["WrappedAction.Command"] = action.command.resolve(symtab=inner)
    symtab["WrappedAction.Args"] = resolve_args(action.args, inner)
    symtab["WrappedAction.Environment"] = list(environment)
    symtab["WrappedAction.Timeout"] = resolve_int_field(
        getattr(action, "timeout", None), inner, ge=1, description="timeout"
    )
    mode, period = resolve_cancelation(getattr(action, "cancelation", None), inner)
    if mode == "NOTIFY_THEN_TERMINATE" and period is None:
        period = TASK_RUN_DEFAULT_NOTIFY_PERIOD if task_run else ENV_ACTION_DEFAULT_NOTIFY_PERIOD
    symtab["WrappedAction.Cancelation.Mode"] = mode
    symtab["WrappedAction.Cancelation.NotifyPeriodInSeconds"] = period
