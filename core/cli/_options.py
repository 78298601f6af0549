"""The CLI's inputs: job parameter values (``-p``, files, inline JSON), path mapping rules,
the ``run``/``resume`` options and the bounds every number option keeps, with errors that name
the option and the bad value."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from core import FileDataFlow, TemplateError
from core.cli._runner import DEFAULT_FINALLY_TIMEOUT_SECONDS
from core.local import (
    NOTICE_POLL_ENV,
    NOTICES_ENV,
    decode_json,
    load_document,
    load_path_mapping_rules,
    read_input_file,
)

ENV_VERSION = "environment-2023-09"
"""The ``specificationVersion`` that makes ``check`` validate an environment template."""

EPILOG = """\
exit codes of 'run' and 'resume':
  0    every task and finally step succeeded (the run's checkpoints are deleted)
  1    a task or a finally step failed, or the run's --timeout expired (checkpoints are kept:
       running again resumes)
  2    bad template, parameters or usage
  3    checkpoint store error (it could not be read or written: a full disk, a store that went
       away); a task whose end was not stored runs again next time
  4    resume refused, with a code: unknown-run, not-failed, already-resumed, different-input,
       no-checkpoint, chain-changed, state-changed (nothing ran); or this process lost the
       run's lease to another process, which runs the run now (this one wrote nothing more)
  70   internal error (a bug in openjd-checkpoint)
  75   suspended (Ctrl-C, SIGTERM, SIGHUP, an interruption notice, or 'stop --mode
       Suspended'): what the tasks reported is kept (the run's last line says what); run the
       same command again, or 'resume RUN_ID', to resume
  130  canceled or stopped (a second Ctrl-C, or 'stop --mode Cancelled|CancelledRunFinally|
       StoppedRunFinally'); finally steps ran unless the mode was Cancelled

the store is --store, else $OPENJD_CHECKPOINT_STORE, else the per-user state directory.
"""


PARAM_FORMS = (
    "NAME=VALUE, file://PATH or @PATH (a JSON or YAML document of name: value pairs), or "
    "inline JSON such as '{\"NAME\": VALUE}'"
)
"""The forms ``-p``/``--job-param`` takes (those of openjd-cli's ``--job-param``, and ours)."""

_PARAM_OPTION = "-p/--job-param"


def _shown(text: str, limit: int = 120) -> str:
    """An argument for a message, cut to ``limit`` characters."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _param_text(name: str, value: Any, where: str) -> str:
    """A job parameter value from a JSON or YAML document as the text openjd-model takes: a
    string as it is, a boolean as true/false, a number in base 10, a list as JSON."""
    if isinstance(value, str):
        return value
    if value is None:
        raise TemplateError([f"{where}: {name}: the value is null; give a value"])
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)  # a YAML date or time: as written


def _param_document(data: Any, where: str) -> dict[str, str]:
    if not isinstance(data, dict):
        raise TemplateError(
            [
                f"{where}: must hold a mapping of job parameter names to values, not a "
                f"{type(data).__name__}"
            ]
        )
    return {str(k): _param_text(str(k), v, where) for k, v in data.items()}


def _param_file(path: Path, where: str) -> dict[str, str]:
    try:
        text = read_input_file(path, "parameter file")
        data = load_document(text, json_format=path.suffix.lower() == ".json", source=path)
    except TemplateError as exc:
        raise TemplateError([f"{where}: {exc}"]) from None
    return _param_document(data, where)


def parse_params(pairs: list[str]) -> dict[str, str]:
    """Job parameter values from ``-p``/``--job-param`` arguments, combined in order (a later
    value of a name replaces an earlier one). Each argument is one of ``PARAM_FORMS``.

    Raises:
        TemplateError: an argument in none of the forms, or a file or JSON that cannot be read;
            the message names the option and the argument.
    """
    out: dict[str, str] = {}
    for pair in pairs:
        text = pair.strip()
        where = f"{_PARAM_OPTION} {_shown(pair)}"
        if text.startswith("file://"):
            path = Path(text[len("file://") :]).expanduser()
            if text == "file://":
                raise TemplateError([f"{where}: no file named after 'file://'"])
            out.update(_param_file(path, where))
        elif text.startswith("@") or (
            text.endswith((".json", ".yaml", ".yml")) and "=" not in text
        ):
            out.update(_param_file(Path(text.lstrip("@")).expanduser(), where))
        elif text.startswith("{"):
            try:
                data = _inline_json(text)
            except TemplateError as exc:
                raise TemplateError([f"{where}: {exc}"]) from None
            out.update(_param_document(data, where))
        else:
            name, eq, value = pair.partition("=")
            if not eq or not name.strip():
                raise TemplateError([f"{where}: expected {PARAM_FORMS}"])
            out[name.strip()] = value
    return out


def _inline_json(text: str) -> Any:
    """An option's inline JSON value.

    Raises:
        TemplateError: "not valid inline JSON: <what> at column <n>", or the field of an
            integer too long to read (the caller adds where).
    """
    try:
        return decode_json(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        msg = (
            f"{exc.msg} at column {exc.colno}"
            if isinstance(exc, json.JSONDecodeError)
            else "nested too deeply"
        )
        raise TemplateError([f"not valid inline JSON: {msg}"]) from None


def path_mapping_rules(value: str) -> list[Any]:
    """``--path-mapping-rules``: inline JSON, ``file://PATH`` or a plain path (JSON, or YAML when
    the file is named ``.yaml``/``.yml``).

    Raises:
        TemplateError: unreadable or invalid rules, naming the option.
    """
    text = value.strip()
    where = f"--path-mapping-rules {_shown(value)}"
    try:
        if text.startswith(("{", "[")):
            return load_path_mapping_rules(_inline_json(text))
        if text.startswith("file://"):
            if text == "file://":
                raise TemplateError(["no file named after 'file://'"])
            return load_path_mapping_rules(Path(text[len("file://") :]).expanduser())
        return load_path_mapping_rules(Path(value).expanduser())
    except TemplateError as exc:
        raise TemplateError([f"{where}: {exc}"]) from None


def add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-parallel",
        type=_parallel,
        default=None,
        metavar="N",
        help="tasks of a step run at once (default: CPU count, at most 4)",
    )
    p.add_argument(
        "--timeout",
        type=seconds_value,
        default=None,
        metavar="SECONDS",
        help="the regular steps' time budget; on expiry tasks are canceled and the "
        "finally steps run",
    )
    p.add_argument(
        "--finally-timeout",
        type=seconds_value,
        default=DEFAULT_FINALLY_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help="the finally steps' own time budget (default: %(default)s)",
    )
    p.add_argument(
        "--keep-generations",
        type=_generations,
        default=3,
        metavar="K",
        help="checkpoint generations kept per task (default: %(default)s)",
    )
    p.add_argument(
        "--files",
        choices=[flow.value for flow in FileDataFlow],
        default=None,
        help="checkpoint files: 'shared' keeps their paths (a file system every host sees), "
        "'managed' keeps the files in the store and restores them on resume (default: "
        "$OPENJD_CHECKPOINT_FILES, else shared)",
    )
    p.add_argument(
        "--file-root",
        action="append",
        type=_file_root,
        metavar="DIR",
        help="managed files: a folder besides the session working directory whose files may be "
        "captured and restored (repeatable; also $OPENJD_CHECKPOINT_FILE_ROOTS)",
    )
    p.add_argument(
        "--interruption-notices",
        default=None,
        metavar="SOURCES",
        help="checkpoint and suspend the run (exit 75) when the host is about to go away: "
        "a comma-separated list of aws, aws-rebalance, gcp, azure (each optionally "
        "NAME:BASE_URL, default the link-local metadata address), file:PATH, signal:NAME "
        f"(default: ${NOTICES_ENV}, else none)",
    )
    p.add_argument(
        "--notice-poll-seconds",
        default=None,
        metavar="SECONDS",
        help="at most one request per notice source this often, with back-off when it is "
        f"absent (default: ${NOTICE_POLL_ENV}, else 5)",
    )
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress display: only what needs you (failures, warnings, decisions, the "
        "resume command); task output still goes to stdout",
    )
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="plain progress lines with every message the tasks send",
    )


MAX_PARALLEL = 1024
"""The most tasks of a step ``--max-parallel`` may run at once (each is a process and threads)."""

MAX_KEEP_GENERATIONS = 1000
"""The most checkpoint generations ``--keep-generations`` may keep per task."""

MAX_SECONDS = 366 * 86400
"""The longest ``--timeout``, ``--finally-timeout`` or ``stop --wait``: a year, in seconds (far
longer waits overflow the platform's timers)."""

MAX_RETENTION_DAYS = 36600
"""The longest ``gc --retention-days``: a hundred years."""

MAX_GENERATION = 2**63 - 1
"""The largest ``--generation`` number."""


def _bounded_int(high: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number") from None
        if not 1 <= value <= high:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} must be from 1 to {high:,}")
        return value

    return parse


def _bounded_float(high: float, *, allow_zero: bool) -> Any:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a number") from None
        low_ok = value >= 0 if allow_zero else value > 0
        if not (low_ok and value <= high):  # also refuses nan and inf
            bound = "from 0 to" if allow_zero else "more than 0 and at most"
            raise argparse.ArgumentTypeError(f"{text[:40]!r} must be {bound} {high:,.0f}")
        return value

    return parse


positive_int = _bounded_int(MAX_GENERATION)
_parallel = _bounded_int(MAX_PARALLEL)
_generations = _bounded_int(MAX_KEEP_GENERATIONS)
seconds_value = _bounded_float(MAX_SECONDS, allow_zero=False)
retention_days = _bounded_float(MAX_RETENTION_DAYS, allow_zero=True)
grace_seconds = _bounded_float(MAX_SECONDS, allow_zero=True)
"""``gc --grace-seconds``: 0 collects at once (when no run is running) up to a year."""


def _file_root(text: str) -> str:
    """``--file-root``: an absolute path of an existing folder."""
    if not text or not os.path.isabs(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an absolute path")
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a folder")
    return text


def version_text() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("openjd-checkpoint")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree
        return "unknown"
