"""A job made from a CHECKPOINT template: ``prepare_job`` and the ``PreparedJob`` it returns.

openjd-model does the job creation (parameter preprocessing, ``create_job``); what it lets
through and no run could take is refused first (``core.job._creation``). A ``PreparedJob`` holds the
template, the parameter values and openjd-model's ``Job``, gives every task a stable identity in
the store, and reads the step graph from its template. Planning its steps (which tasks run on a
resume, groups, labels, adaptive chunks) is ``core.job._planning``'s, which its methods call.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from openjd.model import (
    DecodeValidationError,
    EnvironmentTemplate,
    Job,
    JobParameterValues,
    create_job,
    create_job_with_symbol_tables,
    decode_environment_template,
    preprocess_job_parameters,
)

if TYPE_CHECKING:  # imported where rules are read: openjd-sessions took 24 ms of a CLI start
    from openjd.sessions import PathMappingRule

from core._errors import TemplateError
from core.job._creation import (
    MAX_TASKS_PER_STEP,
    int_value_problems,
    join_list_paths,
    list_value_problems,
    long_int_problems,
    normalize_given_paths,
    task_count_problems,
    true_missing,
    value_problems,
    widening_problems,
)
from core.job._inputs import int64_problems, load_document, read_input_file
from core.job._template import (
    JOB_STATUS_PARAMETER,
    MODEL_EXTENSIONS,
    WRAP_NEEDS_EXPR,
    CheckpointJobTemplate,
    canonical_json,
    load_template,
    sha256_hex,
)

__all__ = (
    "MAX_TASKS_PER_STEP",
    "PreparedJob",
    "load_environment_template",
    "framework_parameter_values",
    "load_path_mapping_rules",
    "plain_value",
    "prepare_job",
)


@dataclass
class PreparedJob:
    """A job ready to run: template, job parameter values, the openjd-model ``Job``.

    Attributes:
        template: the validated template.
        job: the openjd-model ``Job`` (``create_job``).
        parameter_values: the preprocessed job parameter values.
        environments: external environment templates, entered before the job's own.
        path_mapping_rules: openjd-sessions ``PathMappingRule``s applied to PATH values.
        job_key: the job's identity in the store: sha256 of the template's (raw) name.
    """

    template: CheckpointJobTemplate
    job: Job
    parameter_values: JobParameterValues
    environments: list[EnvironmentTemplate] = field(default_factory=list)
    path_mapping_rules: list[PathMappingRule] = field(default_factory=list)
    job_key: str = ""
    environment_paths: list[str] = field(default_factory=list)
    """The external environment template files, as absolute paths (kept with the run)."""
    job_scope: dict[str, Any] = field(default_factory=dict)
    """EXPR (RFC 0005): the job-scope symbols openjd-model resolved at job creation
    (``Param.*``, ``RawParam.*``, ``Job.Name``), as typed ``openjd.expr`` values; the base of
    every job and external environment's symbol table. Empty without EXPR."""
    step_scopes: dict[str, dict[str, Any]] = field(default_factory=dict)
    """EXPR: per step name, the job scope plus ``Step.Name`` and the step's template-scope
    ``let`` bindings (``create_job_with_symbol_tables``); the base of the step's actions."""

    @property
    def uses_expr(self) -> bool:
        """The template or an external environment template declares EXPR."""
        if "EXPR" in self.template.extensions:
            return True
        return any("EXPR" in (getattr(e, "extensions", None) or []) for e in self.environments)

    @property
    def parameters(self) -> dict[str, str]:
        """Job parameter values as plain strings (name -> value), each written as
        ``prepare_job`` reads it back (``_parameter_text``): a list (EXPR's ``LIST[...]``
        types) as JSON (``["a", "b"]``; Python's ``str`` of a list is not JSON), a bool as
        ``true``/``false``, anything else as its text."""
        return {
            k: _parameter_text(v.value)
            for k, v in sorted(self.parameter_values.items())
            if k != JOB_STATUS_PARAMETER
        }

    def step(self, name: str) -> Any:
        for step in self.job.steps:
            if step.name == name:
                return step
        raise KeyError(name)

    def step_order(self) -> list[str]:
        """Step names in an order that respects ``dependencies`` (template order otherwise)."""
        return self.template.step_order()

    def dependencies(self, step_name: str) -> list[str]:
        """The steps ``step_name`` depends on (the template's step graph: one source)."""
        return self.template.dependencies(step_name)


def load_environment_template(path: str | Path) -> EnvironmentTemplate:
    """Read and validate an OpenJD environment template file (YAML or JSON).

    Raises:
        TemplateError: unreadable or invalid, naming the file.
    """
    p = Path(path)
    text = read_input_file(p, "environment template")
    obj = load_document(text, json_format=p.suffix.lower() == ".json", source=p)
    if not isinstance(obj, dict):  # openjd-model's decode fails on it with a TypeError
        kinds = {str: "a single text value", list: "a list", bool: "a boolean"}
        what = "empty" if obj is None else kinds.get(type(obj), "a number")
        raise TemplateError(
            [f"<root>: an environment template must be a mapping; this file is {what}"],
            source=str(p),
        )
    problems = int64_problems(obj)  # openjd-model 0.14 takes INT values past int64
    if problems:
        raise TemplateError(problems, source=str(p))
    try:
        env = decode_environment_template(
            template=obj, supported_extensions=sorted(MODEL_EXTENSIONS)
        )
    except DecodeValidationError as exc:
        raise TemplateError([str(exc)], source=str(p)) from None
    except (ValueError, TypeError, RecursionError) as exc:
        raise TemplateError([f"not a valid environment template: {exc}"], source=str(p)) from None
    declared = list(getattr(env, "extensions", None) or [])
    if "WRAP_ACTIONS" in declared and "EXPR" not in declared:
        raise TemplateError([f"extensions: {WRAP_NEEDS_EXPR}"], source=str(p))
    return env


def load_path_mapping_rules(
    source: str | Path | list[Any] | dict[str, Any],
) -> list[PathMappingRule]:
    """Path mapping rules from a file (JSON, or YAML when it is named ``.yaml``/``.yml``) or a
    decoded object: a list of rules, or ``{"version": "pathmapping-1.0", "path_mapping_rules":
    [...]}`` as openjd-cli takes.

    Raises:
        TemplateError: the rules are unreadable or invalid.
    """
    try:
        obj: Any = source
        if isinstance(source, (str, Path)):
            text = read_input_file(source, "path mapping rules file")
            is_yaml = Path(source).suffix.lower() in (".yaml", ".yml")
            obj = load_document(text, json_format=not is_yaml, source=source)
        if isinstance(obj, dict):
            if obj.get("version") != "pathmapping-1.0":
                raise ValueError(
                    f"'version' must be 'pathmapping-1.0' (got {obj.get('version')!r})"
                )
            obj = obj.get("path_mapping_rules")
            if not isinstance(obj, list):
                raise ValueError("'path_mapping_rules' must be a list of rules")
        if not isinstance(obj, list):
            raise ValueError(
                "expected a list of rules, or an object with 'version' and 'path_mapping_rules'"
            )
        from openjd.sessions import PathMappingRule

        return [PathMappingRule.from_dict(rule=r) for r in obj]
    except TemplateError:
        raise
    except (OSError, ValueError, TypeError, KeyError) as exc:
        where = str(source) if isinstance(source, (str, Path)) else None
        raise TemplateError([f"path mapping rules: {exc}"], source=where) from None


def _parameter_text(value: Any) -> str:
    """One job parameter value as ``prepare_job`` reads it: a list as JSON, a bool as
    ``true``/``false``, anything else as its text."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return json.dumps([plain_value(v) for v in value])
    return str(value)


def plain_value(value: Any) -> Any:
    """A parameter value as plain JSON data: a ``Decimal`` (openjd-model's numbers in
    templates) as an int when it is whole, else a float; lists element by element."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (list, tuple)):
        return [plain_value(v) for v in value]
    return value


def framework_parameter_values(
    template: CheckpointJobTemplate, values: Mapping[str, Any]
) -> dict[str, str]:
    """Job parameter values as a framework gives them (an Airflow DAG run's params, a Prefect
    flow run's parameters), ready for ``prepare_job``: values that are None are left out (the
    default applies); a value equal to its default is left out too, so the run keeps the
    template's default exactly as the CLI does (a framework fills every default in): a
    relative ``PATH`` default is taken from the template's folder, not the current directory,
    and a ``FLOAT`` default written ``40`` stays ``40``, not Python's ``40.0``; lists are
    written as JSON and bools as ``true``/``false``.

    Args:
        values: name -> value (str, int, float, bool, or a list of them).

    Returns:
        name -> value text. Names the template does not define are kept, for ``prepare_job``
        to refuse by name.
    """
    defaults: dict[str, Any] = {}
    kind_of: dict[str, str] = {}
    for definition in template.template.parameterDefinitions or []:
        kind = str(getattr(definition.type, "value", definition.type))
        kind_of[definition.name] = kind
        default = getattr(definition, "default", None)
        if default is not None:
            defaults[definition.name] = plain_value(default)
    out: dict[str, str] = {}
    for name, value in values.items():
        if value is None:
            continue
        if name in defaults:
            plain = plain_value(value)
            if plain == defaults[name] or str(plain) == str(defaults[name]):
                continue
            if kind_of.get(name) == "FLOAT" and _same_float(plain, defaults[name]):
                continue
        out[name] = _parameter_text(value)
    return out


def _same_float(a: Any, b: Any) -> bool:
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return False


def prepare_job(
    template: CheckpointJobTemplate | str | Path,
    parameters: Mapping[str, Any] | None = None,
    *,
    environments: Iterable[EnvironmentTemplate | str | Path] = (),
    path_mapping_rules: list[PathMappingRule] | None = None,
    current_working_dir: Path | None = None,
) -> PreparedJob:
    """Create the job: validate job parameter values and instantiate the template.

    Args:
        template: a loaded template, or a template file to load.
        parameters: job parameter values, name -> value (strings, ints, floats, bools, or
            lists of them for EXPR's list types; a list is passed on as JSON).
        environments: external environment templates (or files), entered before the job's.
        path_mapping_rules: applied to PATH parameter values at run time.
        current_working_dir: where relative PATH values are taken from (default: cwd).

    Raises:
        TemplateError: invalid template or parameter values, naming the parameter.
    """
    tmpl = template if isinstance(template, CheckpointJobTemplate) else load_template(template)
    # openjd-model 0.14 exports EnvironmentTemplate as a typing alias: test for paths instead.
    env_sources = list(environments)
    envs = [load_environment_template(e) if isinstance(e, (str, Path)) else e for e in env_sources]
    narrowing = widening_problems(tmpl, envs, env_sources)
    if narrowing:
        raise TemplateError(narrowing, source=str(tmpl.source) if tmpl.source else None)
    template_dir = tmpl.source.parent if tmpl.source else Path.cwd()
    cwd = (current_working_dir or Path.cwd()).resolve()
    raw = {k: _parameter_text(v) for k, v in (parameters or {}).items()}
    uses_expr = "EXPR" in tmpl.extensions or any(
        "EXPR" in (getattr(e, "extensions", None) or []) for e in envs
    )
    not_lists = list_value_problems(tmpl, raw) + long_int_problems(tmpl, envs, raw)
    if not_lists:
        raise TemplateError(not_lists, source=str(tmpl.source) if tmpl.source else None)
    given = normalize_given_paths(tmpl, envs, raw, cwd, keep_uris=uses_expr)
    try:
        values = preprocess_job_parameters(
            job_template=tmpl.template,
            job_parameter_values=given,
            job_template_dir=template_dir.resolve(),
            current_working_dir=cwd,
            environment_templates=envs or None,
        )
        values = join_list_paths(tmpl, raw, values, template_dir.resolve(), cwd)
        job_scope: dict[str, Any] = {}
        step_scopes: dict[str, dict[str, Any]] = {}
        if uses_expr:
            created = create_job_with_symbol_tables(
                job_template=tmpl.template,
                job_parameter_values=values,
                environment_templates=envs or None,
            )
            job = created.job
            job_scope = _scope_entries(created.job_symbol_table)
            step_scopes = {k: _scope_entries(v) for k, v in created.step_symbol_tables.items()}
        else:  # without EXPR there are no typed scopes, and openjd.expr need not be loaded
            job = create_job(
                job_template=tmpl.template,
                job_parameter_values=values,
                environment_templates=envs or None,
            )
    except OverflowError as exc:  # openjd-model's len() of a range past 2**63 (ssize_t)
        problem = (
            f"job parameters: a step's task parameter range made from them is too large "
            f"to count ({exc}); a step may have at most {MAX_TASKS_PER_STEP:,} tasks"
        )
        raise TemplateError(
            [problem], source=str(tmpl.source) if tmpl.source else None, too_large=[problem]
        ) from None
    except (DecodeValidationError, ValueError, KeyError) as exc:
        lines = true_missing(tmpl, envs, given, [ln for ln in str(exc).splitlines() if ln.strip()])
        raise TemplateError(
            [f"job parameters: {line}" for line in lines] or [str(exc)],
            source=str(tmpl.source) if tmpl.source else None,
        ) from None
    problems = int_value_problems(values)
    problems += value_problems(values, [tmpl.document, *(_dump(e) for e in envs)])
    too_large = task_count_problems(job)
    problems += too_large
    if problems:
        raise TemplateError(
            problems, source=str(tmpl.source) if tmpl.source else None, too_large=too_large
        )
    return PreparedJob(
        template=tmpl,
        job=job,
        parameter_values=values,
        environments=envs,
        environment_paths=[
            str(Path(e).resolve()) for e in env_sources if isinstance(e, (str, Path))
        ],
        path_mapping_rules=list(path_mapping_rules or []),
        job_key=sha256_hex(canonical_json({"name": tmpl.name}))[:16],
        job_scope=job_scope,
        step_scopes=step_scopes,
    )


def _scope_entries(table: Any) -> dict[str, Any]:
    """A ``SerializedSymbolTable`` from job creation as flat ``{name: ExprValue}`` entries in
    this host's path format, ready to seed a ``SymbolTable`` (as openjd-sessions 0.14
    ``Session._resolved_base_entries`` does)."""
    from openjd.expr import PathFormat

    host_format = PathFormat.WINDOWS if os.name == "nt" else PathFormat.POSIX
    engine = table.to_symtab(path_format=host_format)
    return {name: engine[name] for name in engine.symbols}


def _dump(env: EnvironmentTemplate) -> Any:
    try:
        return env.model_dump(exclude_none=True)
    except AttributeError:  # pragma: no cover - not a pydantic model
        return {}
