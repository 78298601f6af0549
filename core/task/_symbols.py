"""A session's symbol tables and files (openjd-sessions 0.14 ``Session._symbol_table`` and
``_materialize_files`` as the reference): ``Session.*``, ``Param.*``/``RawParam.*`` with path
mapping and, under EXPR (RFC 0005), their types and ``let`` bindings; embedded files written
into the session's working directory."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from typing import Any

from openjd.model import ParameterValueType, SymbolTable, evaluate_let_bindings

from core.job import JOB_STATUS_PARAMETER, PreparedJob

__all__ = (
    "MAX_LET_BINDING_LENGTH",
    "add_parameter",
    "apply_let",
    "base_symtab",
    "embedded_files",
    "expr_host_rules",
    "map_path",
    "map_value",
)

MAX_LET_BINDING_LENGTH = 4096
"""The longest ``let`` binding evaluated. openjd-expr's parser recurses without a depth guard
and a deeply nested right-hand side overflows the native stack (openjd-sessions 0.14 bounds it
the same way, ``_runner_base.MAX_LET_BINDING_LENGTH``)."""


def apply_let(symtab: SymbolTable, bindings: list[str] | None) -> None:
    """Evaluate a script's EXPR ``let`` bindings (RFC 0005) in order into ``symtab`` with
    openjd-model's own ``evaluate_let_bindings``.

    Raises:
        ValueError: a binding is too long or cannot be evaluated.
    """
    if not bindings:
        return
    for binding in bindings:
        if len(binding) > MAX_LET_BINDING_LENGTH:
            raise ValueError(
                f"let binding {binding[:40]!r}... is {len(binding)} characters, over the "
                f"maximum of {MAX_LET_BINDING_LENGTH}"
            )
    evaluate_let_bindings(symtab=symtab, let_bindings=bindings)


def map_value(job: PreparedJob, value: Any) -> Any:
    """A parameter value with path mapping applied to PATH values (each element of a
    LIST[PATH]); a string, or a list for the EXPR list types."""
    if value.type == ParameterValueType.LIST_PATH and isinstance(value.value, list):
        return [map_path(job, str(v)) for v in value.value]
    if isinstance(value.value, list):
        return list(value.value)
    text = str(value.value)
    if value.type == ParameterValueType.PATH:
        return map_path(job, text)
    return text


def map_path(job: PreparedJob, text: str) -> str:
    """``text`` with the job's first path mapping rule that matches applied."""
    for rule in job.path_mapping_rules:
        changed, result = rule.apply(path=text)
        if changed:
            return str(result)
    return text


def base_symtab(
    job: PreparedJob, directory: str, *, step: str | None = None, job_status: str | None = None
) -> SymbolTable:
    """``Session.*``, ``Param.*`` and ``RawParam.*`` (and ``Job.Status`` in finally steps).

    With EXPR (RFC 0005), as openjd-sessions 0.14 ``Session._symbol_table`` does: the
    symbols openjd-model resolved at job creation come first (the job scope, or with
    ``step`` that step's scope: ``Step.Name`` and its template-scope ``let`` bindings),
    the session's own values layer on top with their EXPR types, and the path mapping
    rules are given to ``openjd.expr`` for the host-context functions
    (``apply_path_mapping``)."""
    symtab = SymbolTable()
    expr = job.uses_expr
    if expr:
        symtab.expr_host_rules = expr_host_rules(job)
        base = job.step_scopes.get(step, {}) if step else job.job_scope
        for name, value in base.items():
            symtab[name] = value
    symtab["Session.WorkingDirectory"] = directory
    if expr:
        symtab.expr_types["Session.WorkingDirectory"] = ParameterValueType.PATH.value
    rules = job.path_mapping_rules
    symtab["Session.HasPathMappingRules"] = "true" if rules else "false"
    rules_file = os.path.join(directory, "path-mapping-rules.json")
    if not os.path.exists(rules_file):
        with open(rules_file, "w", encoding="utf-8") as fh:
            json.dump(
                {
                    "version": "pathmapping-1.0",
                    "path_mapping_rules": [r.to_dict() for r in rules],
                },
                fh,
            )
    symtab["Session.PathMappingRulesFile"] = rules_file
    if expr:  # typed as openjd-sessions types them for EXPR (the legacy path keeps strings)
        symtab.expr_types["Session.HasPathMappingRules"] = ParameterValueType.BOOL.value
        symtab.expr_types["Session.PathMappingRulesFile"] = ParameterValueType.PATH.value
    for name, value in job.parameter_values.items():
        add_parameter(job, symtab, "", name, value)
    if job_status is not None:
        symtab[f"Param.{JOB_STATUS_PARAMETER}"] = job_status
        if expr and step is not None and job.template.is_finally(step):
            # A finally step's template-scope `let` was evaluated at job creation, before
            # the run's outcome was known: evaluate it again with {{Job.Status}}.
            apply_let(symtab, getattr(job.step(step), "let", None))
    return symtab


def add_parameter(
    job: PreparedJob, symtab: SymbolTable, prefix: str, name: str, value: Any
) -> None:
    """Set ``<prefix>Param.<name>`` (path-mapped) and ``<prefix>RawParam.<name>``; with
    EXPR, with their types as openjd-sessions records them (``RawParam`` of a PATH stays a
    string, of a LIST[PATH] a LIST[STRING]; CHUNK[INT] range strings stay strings)."""
    key, raw_key = f"{prefix}Param.{name}", f"{prefix}RawParam.{name}"
    if not job.uses_expr:
        symtab[raw_key] = str(value.value)
        symtab[key] = map_value(job, value)
        return
    symtab[raw_key] = value.value
    symtab[key] = map_value(job, value)
    ptype = value.type
    if ptype == ParameterValueType.CHUNK_INT:
        return
    symtab.expr_types[key] = ptype.value
    if ptype == ParameterValueType.LIST_PATH:
        symtab.expr_types[raw_key] = ParameterValueType.LIST_STRING.value
    elif ptype != ParameterValueType.PATH:
        symtab.expr_types[raw_key] = ptype.value


def expr_host_rules(job: PreparedJob) -> list[Any]:
    """The path mapping rules in ``openjd.expr`` form (an empty list: still host scope)."""
    if not job.path_mapping_rules:
        return []
    from openjd.expr import PathFormat, PathMappingRule

    return [
        PathMappingRule(
            source_path_format=getattr(PathFormat, rule.source_path_format.name),
            source_path=str(rule.source_path),
            destination_path=str(rule.destination_path),
        )
        for rule in job.path_mapping_rules
    ]


def embedded_files(
    job: PreparedJob,
    directory: str,
    files: Any,
    symtab: SymbolTable,
    prefix: str,
    *,
    let: list[str] | None = None,
) -> dict[str, str]:
    """Write embedded files into the working directory; add ``<prefix>.File.<name>`` to
    ``symtab``; return those symbols and paths. The script's EXPR ``let`` bindings are
    evaluated into ``symtab`` after the files' paths are known and before their contents
    are written (as openjd-sessions does), so each may use the other.

    Raises:
        ValueError: a binding or a file's data cannot be evaluated (FormatStringError,
            ExpressionError).
        OSError: a file cannot be written.
    """
    if not files:
        apply_let(symtab, let)
        return {}
    directory = tempfile.mkdtemp(prefix="embedded_files", dir=directory)
    paths: dict[str, str] = {}
    for f in files:
        filename = getattr(f, "filename", None) or f"{f.name}_{os.urandom(4).hex()}"
        paths[f"{prefix}.File.{f.name}"] = os.path.join(directory, str(filename))
    for k, v in paths.items():
        symtab[k] = v
        if job.uses_expr:
            symtab.expr_types[k] = ParameterValueType.PATH.value
    apply_let(symtab, let)
    for f in files:
        target = paths[f"{prefix}.File.{f.name}"]
        data = f.data.resolve(symtab=symtab)
        # FEATURE_BUNDLE_1 endOfLine: LF or CRLF; AUTO (the default) is this host's.
        eol = str(getattr(getattr(f, "endOfLine", None), "value", "") or "")
        newline = {"LF": "\n", "CRLF": "\r\n"}.get(eol)
        with open(target, "w", encoding="utf-8", newline=newline) as fh:
            fh.write(data)
        mode = stat.S_IRUSR | stat.S_IWUSR
        if getattr(f, "runnable", False):
            mode |= stat.S_IXUSR
        os.chmod(target, mode)
    return paths
