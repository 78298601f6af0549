"""Flow parameters from a template's job parameter definitions (translation only).

A job parameter becomes a keyword parameter of the flow function, with its Python type
(``INT`` -> ``int``, ``FLOAT`` -> ``float``, ``STRING`` and ``PATH`` -> ``str``, ``BOOL`` ->
``bool``, EXPR's ``LIST[INT]`` -> ``list[int]`` and so on), its default,
and, through pydantic ``Field``, its description, bounds and allowed values, so that Prefect's
UI shows them and Prefect checks them when a run is created. openjd-model checks every value
again when the job is made (``core.prepare_job``).
"""

from __future__ import annotations

import inspect
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import Field

from core import JOB_STATUS_PARAMETER, CheckpointJobTemplate

__all__ = ("RESUME_PARAMETER", "flow_signature")

RESUME_PARAMETER = "resume"
"""The flow parameter that names an earlier core run to resume (a run id or ``latest``)."""

_TYPES: dict[str, Any] = {
    "INT": int,
    "FLOAT": float,
    "STRING": str,
    "PATH": str,
    "BOOL": bool,
    "LIST[INT]": list[int],
    "LIST[FLOAT]": list[float],
    "LIST[STRING]": list[str],
    "LIST[PATH]": list[str],
    "LIST[BOOL]": list[bool],
    "LIST[LIST[INT]]": list[list[int]],
}


def _plain(value: Any, kind: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        item = (getattr(kind, "__args__", None) or (str,))[0]
        return [_plain(v, item) for v in value]
    if kind is bool:
        return bool(value)
    if isinstance(value, Decimal) or kind in (int, float):
        return kind(value)
    return str(value)


def _annotation(definition: Any) -> Any:
    """The Python annotation of one job parameter definition."""
    type_name = str(getattr(definition.type, "value", definition.type))
    kind = _TYPES.get(type_name, str)
    allowed = getattr(definition, "allowedValues", None)
    if allowed:
        kind_or_literal: Any = Literal[tuple(_plain(v, kind) for v in allowed)]
    else:
        kind_or_literal = kind
    constraints: dict[str, Any] = {}
    if getattr(definition, "description", None):
        constraints["description"] = str(definition.description)
    for attr, key in (("minValue", "ge"), ("maxValue", "le")):
        bound = getattr(definition, attr, None)
        if bound is not None and not allowed:
            constraints[key] = _plain(bound, kind)
    for attr, key in (("minLength", "min_length"), ("maxLength", "max_length")):
        bound = getattr(definition, attr, None)
        if bound is not None and not allowed:
            constraints[key] = int(bound)
    if constraints:
        return Annotated[kind_or_literal, Field(**constraints)]
    return kind_or_literal


def flow_signature(
    template: CheckpointJobTemplate,
) -> tuple[inspect.Signature, dict[str, Any]]:
    """The flow function's signature and annotations: the job parameters in template order
    (required ones first, as Python requires), then ``resume: str | None = None``.

    Raises:
        ValueError: a job parameter is named ``resume``.
    """
    required: list[inspect.Parameter] = []
    optional: list[inspect.Parameter] = []
    annotations: dict[str, Any] = {}
    for definition in template.template.parameterDefinitions or []:
        name = definition.name
        if name == JOB_STATUS_PARAMETER:
            continue
        if name == RESUME_PARAMETER:
            raise ValueError(
                f"job parameter {name!r}: the name is taken by the flow's own resume parameter"
            )
        annotation = _annotation(definition)
        annotations[name] = annotation
        type_name = str(getattr(definition.type, "value", definition.type))
        default = getattr(definition, "default", None)
        if default is None:
            required.append(
                inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation)
            )
        else:
            optional.append(
                inspect.Parameter(
                    name,
                    inspect.Parameter.KEYWORD_ONLY,
                    default=_plain(default, _TYPES.get(type_name, str)),
                    annotation=annotation,
                )
            )
    resume_annotation = Annotated[
        str | None,
        Field(
            description="Resume an earlier run of this job: its run id, or 'latest'. "
            "Empty: a new run (a retry of this flow run continues its own run)."
        ),
    ]
    annotations[RESUME_PARAMETER] = resume_annotation
    resume = inspect.Parameter(
        RESUME_PARAMETER,
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=resume_annotation,
    )
    return inspect.Signature([*required, *optional, resume]), annotations
