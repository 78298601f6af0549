"""``openjd-checkpoint``: check and run OpenJD job templates locally, interrupt and resume them.

The CLI is the first adapter of the core API: it maps ``JobRunner``/``TaskExecution`` onto a
terminal (output lines, a progress display, Ctrl-C). ``core/cli/__init__.py`` is its small
entry point.
"""

from __future__ import annotations

import argparse
import gc
import shlex
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from core import (
    CheckpointStore,
    NoticeSettings,
    ResumeHow,
    ResumeRefusedError,
    RunError,
    RunStatus,
    StopEscalation,
    StoreError,
    TemplateError,
    TerminationMode,
    default_store_location,
    prepare_job,
    prepare_run_job,
    report,
    request_termination,
)
from core.cli._completion import add_completion_parser, complete
from core.cli._early import EARLY_SIGNALS
from core.cli._logs import LogKeeper
from core.cli._options import (
    EPILOG,
    add_run_options,
    grace_seconds,
    parse_params,
    path_mapping_rules,
    positive_int,
    retention_days,
    seconds_value,
    version_text,
)
from core.cli._otel import metrics_from_environment
from core.cli._pipes import closed_pipe_exit, flush_stdout
from core.cli._progress import make_progress
from core.cli._progress import write as _write
from core.cli._read import (
    add_json_option,
    add_logs_parser,
    cmd_check,
    cmd_checkpoints_list,
    cmd_runs,
    cmd_show,
    print_warning,
    printable,
    reading,
)
from core.cli._runner import JobRunner, RunResult
from core.local import (
    DEFAULT_GC_GRACE_SECONDS,
    EXIT_CODES,
    Escalation,
    OpenJDCheckpointError,
    action_containment,
    become_child_subreaper,
    collect_file_garbage,
    delete_named_run,
    delete_run,
    describe_exit,
    finish_interrupted_deletes,
    holds_managed_files,
    load_environment_template,
    no_run_words,
    program_words,
    set_aside_runs,
)


def _cmd_run(args: argparse.Namespace) -> int:
    for env_path in args.environment or []:  # each refusal names the option
        try:
            load_environment_template(env_path)
        except TemplateError as exc:
            raise TemplateError([f"--environment {env_path}: {exc}"]) from None
    job = prepare_job(
        args.template,
        parse_params(args.parameter or []),
        environments=args.environment or [],
        path_mapping_rules=(
            path_mapping_rules(args.path_mapping_rules) if args.path_mapping_rules else []
        ),
    )
    return _execute(args, job, how=ResumeHow.REQUEUE if args.fresh else ResumeHow.RETRY)


def _cmd_resume(args: argparse.Namespace) -> int:
    # The run's record is read once, here; the resume check (``begin_attempt``) refuses a
    # changed template, naming its steps, after the refusals that come first.
    job = prepare_run_job(
        _store_from(args),
        None,
        args.run_id,
        template=args.template,
        parameters=parse_params(args.parameter or []),
        check_template=False,
    )
    steps = job.template.regular_steps + job.template.finally_steps
    if args.from_step is not None and args.from_step not in steps:
        raise TemplateError(
            [f"--from {args.from_step!r}: the job has no such step (steps: {', '.join(steps)})"]
        )
    return _execute(
        args,
        job,
        how=ResumeHow.OPERATOR,
        run_id=args.run_id,
        from_step=args.from_step,
        generation=args.generation,
    )


def _notice_settings(args: argparse.Namespace) -> NoticeSettings:
    """The interruption notice settings of ``args``, else of the environment.

    Raises:
        TemplateError: a bad value (exit code 2), naming the option or variable.
    """
    try:
        return NoticeSettings.from_env(
            args.interruption_notices,
            args.notice_poll_seconds,
            where="--interruption-notices",
            poll_where="--notice-poll-seconds",
        )
    except ValueError as exc:
        raise TemplateError([str(exc)]) from None


def _execute(args: argparse.Namespace, job: Any, *, how: ResumeHow, **resume: Any) -> int:
    # This process is the runner's own: what an action leaves behind (setsid, a double fork)
    # stays its descendant, found after each action without walking /proc.
    become_child_subreaper()
    try:  # probed once, before the first task: its cgroups, or why not (shown with -v)
        containment = action_containment()
    except ValueError as exc:  # a bad $OPENJD_CHECKPOINT_CGROUPS
        raise TemplateError([str(exc)]) from None
    notices = _notice_settings(args)
    store = CheckpointStore(
        args.store,
        keep_generations=args.keep_generations,
        files=args.files,
        file_roots=args.file_root or (),
    )
    display = make_progress(job, quiet=args.quiet, verbose=args.verbose)
    flow = ", checkpoint files: managed" if store.file_flow.value == "managed" else ""
    display.header = f"Running job {job.job.name!r} (store: {store.location}{flow})"
    logs = LogKeeper(store)  # every task attempt's output, kept with the run
    runner = JobRunner(
        job,
        store=store,
        how=how,
        max_parallel=args.max_parallel,
        timeout_seconds=args.timeout,
        finally_timeout_seconds=args.finally_timeout,
        on_output=logs.wrap_output(display.output),
        on_event=logs.wrap_event(display.event),
        on_note=display.note,
        notices=notices.sources,
        notice_poll_seconds=notices.poll_seconds,
        **resume,
    )
    if notices.sources:
        display.note(f"interruption notices from: {notices.describe()}")
    if args.verbose:
        display.note(containment)
    escalation = StopEscalation()  # Suspended, then Cancelled (core's stop escalation)

    def on_signal(signum: int, _frame: Any) -> None:
        # Only noted here; handled by the loop below. A handler that did the work could be
        # entered again by a second Ctrl-C while it holds the run's lock, and wait on itself.
        if not worker.is_alive() and "result" in outcome:
            return  # the run has ended: a late Ctrl-C changes nothing
        escalation.signalled(signum)

    def handle(step: Escalation) -> None:
        if step.first:
            again = (
                "press Ctrl-C again to cancel it"
                if step.signal_name == "SIGINT"
                else "a SIGINT (Ctrl-C), or two more signals, cancel it"
            )
            display.note(
                f"{step.signal_name}: suspending the run: its running tasks are asked "
                f"to stop, and what they reported is kept ({again})"
            )
        else:
            display.note("cancelling the run: killing its tasks")
        try:
            runner.request_termination(step.mode, force=step.force, deadline=step.deadline)
        except RunError as exc:
            display.note(str(exc))

    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = runner.run()
        except BaseException as exc:  # handed to the main thread
            outcome["error"] = exc

    worker = threading.Thread(target=target, name="openjd-run")
    # Installed for the rest of the process: a late Ctrl-C must not become a traceback.
    # SIGHUP (the terminal closed) suspends as SIGTERM does, rather than kill the runner and leave
    # its tasks running unsupervised.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    if EARLY_SIGNALS:  # a Ctrl-C during start-up whose exit something swallowed
        _write(sys.stderr, "openjd-checkpoint: interrupted before the run started\n")
        return EXIT_CODES["canceled"]
    notices.install_signals()  # a signal handler is installed from the main thread
    display.start()
    worker.start()
    while worker.is_alive():
        worker.join(0.1)
        for step in escalation.due() if worker.is_alive() else ():
            handle(step)
    # The run has ended: a late signal changes nothing, even while the interpreter shuts down
    # (which puts back the default handlers of Python-level ones, and would die of it).
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    logs.close()
    display.finish()
    if "error" in outcome:
        raise outcome["error"]
    result: RunResult = outcome["result"]
    display.started()
    _report(args, result, store)
    return result.exit_code


def _report(args: argparse.Namespace, result: RunResult, store: CheckpointStore) -> None:
    def say(text: str) -> None:
        _write(sys.stderr, text)

    counts: dict[str, int] = (
        {report.OUTCOME_WORDS["succeeded"]: result.succeeded} if result.succeeded else {}
    )
    for _spec, res in result.results:  # those that did not succeed
        word = report.OUTCOME_WORDS.get(report.outcome_key(res), res.outcome.value)
        counts[word] = counts.get(word, 0) + 1
    summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "no task ran"
    cond = result.condition
    if result.lease_lost is not None:  # another process drives the run: its outcome is not ours
        say(
            f"openjd-checkpoint: run {result.run_id}: stopped here: another process runs the "
            "run now (see the warning above); nothing more was written by this one\n"
        )
        return
    # "run ID STATUS (N outcome, ...)": the tasks this attempt ran, in plain words; then why, in
    # the run's own words, and the outcome counted over every attempt.
    status = report.run_status_words(result.status.value)
    say(f"openjd-checkpoint: run {result.run_id} {status} ({summary})\n")
    if result.store_failed is not None:
        say(
            f"  the checkpoint store failed: {result.store_failed}\n"
            "  make room in the store (or fix it), then run the same command again: a task "
            "whose end was not stored runs again\n"
        )
    if cond.message and cond.message != "suspended; resumable":  # that one the next line says
        say(f"  {cond.message}\n")
    say(f"  {_outcome(store, result)}\n")
    for spec, res in result.results:
        if res.outcome.value == "failed":
            how = describe_exit(res.exit_code)  # the process's own code; none if it never ran
            code = f" ({how})" if how else ""
            say(f"  failed: {spec.describe()}: {res.message}{code}\n")
    if result.skipped:
        say(f"  skipped: {', '.join(result.skipped)}\n")
    if result.status.value != "succeeded" and not _resumable(store, result.run_id):
        say("  nothing was stored to resume from: running it again starts from the top\n")
    elif result.status.value != "succeeded":
        cmd = [*program_words(), "resume", result.run_id]
        if args.store:
            cmd += ["--store", str(args.store)]
        if args.files:  # as given: a resume without them restores no file outside the session
            cmd += ["--files", str(args.files)]
        for root in args.file_root or ():
            cmd += ["--file-root", str(root)]
        say(f"  checkpoints kept in {store.location}\n")
        say(f"  to resume: {shlex.join(cmd)}  (or run the same 'run' command again)\n")


def _outcome(store: CheckpointStore, result: RunResult) -> str:
    """The run's outcome in plain words, counted over all its attempts (``_words``)."""
    run = store.find_run(result.run_id)
    tasks = store.iter_tasks(run.job_key, run.run_id) if run is not None else iter(())
    return report.outcome_sentence(result.status.value, tasks, result.ran)


def _resumable(store: CheckpointStore, run_id: str) -> bool:
    """True if the run stored a checkpoint or a finished task of a regular step."""
    run = store.find_run(run_id)
    if run is None:
        return False
    tasks = store.iter_tasks(run.job_key, run.run_id)
    return any(
        t.step not in run.finally_steps
        and (t.checkpoint or t.completed_frames or t.status.value == "succeeded")
        for t in tasks
    )


def _store_from(args: argparse.Namespace) -> CheckpointStore:
    """The store for commands that only read or remove (they never create it)."""
    return CheckpointStore(args.store, create=False)


def _store_runs(store: CheckpointStore) -> list[Any]:
    """The store's readable runs; unreadable ones are reported on stderr."""
    runs, warnings = store.list_runs()
    for w in warnings:
        print_warning(w)
    return runs


def _store_run(args: argparse.Namespace) -> tuple[CheckpointStore, Any]:
    """The store and the run ``args.run_id`` names, or None (reported on stderr)."""
    store = _store_from(args)
    run = store.find_run(args.run_id)
    if run is None:
        print(f"openjd-checkpoint: {printable(no_run_words(store, args.run_id))}", file=sys.stderr)
    return store, run


def _cmd_delete(args: argparse.Namespace) -> int:
    store = _store_from(args)
    try:
        lines = delete_named_run(store, args.run_id, warn=print_warning)
    except RunError as exc:  # running now, or being deleted by a live process
        print(f"openjd-checkpoint: refused: {printable(str(exc))}", file=sys.stderr)
        return EXIT_CODES["refused"]
    if lines is None:
        print(f"openjd-checkpoint: {printable(no_run_words(store, args.run_id))}", file=sys.stderr)
        return 2
    for note in lines[:-1]:
        print(f"openjd-checkpoint: {printable(note)}", file=sys.stderr)
    print(printable(lines[-1]))
    if holds_managed_files(store):
        print(
            "  checkpoint files kept in the store (managed) are freed by 'gc' once no other "
            f"run uses them and they are older than its grace period "
            f"({DEFAULT_GC_GRACE_SECONDS:g} s by default; --grace-seconds)"
        )
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    store, run = _store_run(args)
    if run is None:
        return 2
    try:
        term, note = request_termination(
            store, run.job_key, run.run_id, args.mode, force=args.force
        )
    except RunError as exc:
        print(f"openjd-checkpoint: refused: {printable(str(exc))}", file=sys.stderr)
        return EXIT_CODES["refused"]
    if note:
        how = note
    elif term.force:
        how = "forced: what still runs is killed at once, an environment's onExit included"
    else:
        how = "the run is stopping (ask again, or pass --force, to kill what still runs at once)"
    print(f"asked run {run.run_id} to end: {args.mode}; {how}")
    if args.wait:
        end = time.monotonic() + args.wait
        while time.monotonic() < end:
            rec = store.find_run(run.run_id)
            if rec is not None and rec.status != RunStatus.RUNNING:
                print(f"run {run.run_id} ended: {rec.status.value} ({rec.condition.reason})")
                return 0
            time.sleep(0.2)
        print(f"run {run.run_id} has not ended after {args.wait:g} s", file=sys.stderr)
        return 1
    return 0


def _cmd_gc(args: argparse.Namespace) -> int:
    store = _store_from(args)
    finished = finish_interrupted_deletes(
        store, grace_seconds=args.grace_seconds, warn=print_warning
    )
    for line in finished:
        print(line)  # before the runs are listed: no warning for what is gone now
    runs = _store_runs(store)
    cutoff = time.time() - args.retention_days * 86400
    removed = 0
    refused = 0  # runs the store would not let go of (a link in a run's folder): said, kept
    for r in runs:
        if r.updated_at > cutoff:
            continue
        try:
            notes = delete_run(store, r)
        except RunError:
            continue  # running now: kept
        except StoreError as exc:  # one run's folder hides no other run
            refused += 1
            _refusal(StoreError(f"run {r.run_id} kept: {exc}"))
            continue
        for note in notes:
            print(f"openjd-checkpoint: {note}", file=sys.stderr)
        removed += 1
        words = report.run_status_words(r.status.value)
        print(printable(f"removed run {r.run_id} ({words}, {r.job_name})"))
    unreadable = set_aside_runs(store, known={r.run_id for r in runs})  # kept for a person
    for line in unreadable:
        print_warning(line)
    also = f", and {len(unreadable)} whose record was unreadable" if unreadable else ""
    print(f"{removed} run(s) removed; kept {len(runs) - removed}{also}")
    try:
        swept = collect_file_garbage(store, grace_seconds=args.grace_seconds)
    except StoreError as exc:  # a run's records unread: the files they name may not go
        _refusal(StoreError(f"checkpoint files: none removed: {exc}"))
        return EXIT_CODES["store"]
    for w in swept.warnings:
        print_warning(w)
    if swept.blobs_removed or swept.manifests_removed or swept.uploads_removed:
        print(
            f"checkpoint files: removed {swept.blobs_removed} file(s) and "
            f"{swept.manifests_removed} manifest(s) no kept checkpoint or run output uses, and "
            f"{swept.uploads_removed} abandoned upload(s); freed {swept.bytes_freed:,} bytes; "
            f"kept {swept.kept_blobs} file(s)"
        )
    elif swept.kept_blobs or swept.young:
        print(
            f"checkpoint files: nothing to remove; kept {swept.kept_blobs} file(s) in use"
            + (
                f" and {swept.young} unused file(s) and manifest(s) younger than "
                f"--grace-seconds {args.grace_seconds:g}"
                if swept.young
                else ""
            )
        )
    return EXIT_CODES["store"] if refused else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="openjd-checkpoint",
        description="Run OpenJD job templates with the CHECKPOINT extension: interrupt tasks "
        "and resume them from their checkpoints.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version_text()}")
    parser.add_argument(
        "--store",
        help="checkpoint store, for any command (also accepted after the command)",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    check = sub.add_parser(
        "check",
        help="validate a job template or an environment template",
        description="Validate a job template, or an environment template (one whose "
        "specificationVersion is environment-2023-09), and say how each step of a job "
        "template resumes. Exit 0 if valid, 2 if not.",
    )
    check.add_argument(
        "template", type=Path, help="job or environment template file (YAML or JSON)"
    )
    add_json_option(check)
    check.set_defaults(func=cmd_check)

    run = sub.add_parser(
        "run",
        help="run a job, resuming an interrupted run of it",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("template", type=Path, help="job template file (YAML or JSON)")
    run.add_argument(
        "-p",
        "--job-param",
        "--parameter",
        dest="parameter",
        action="append",
        metavar="NAME=VALUE|file://PATH|JSON",
        help="job parameter values (repeatable, combined in order; a later value of a name wins): "
        "NAME=VALUE, file://PATH or @PATH (a JSON or YAML document of name: value pairs), or "
        "inline JSON such as '{\"N\": 5}'",
    )
    run.add_argument(
        "--store",
        help=f"checkpoint store (default: {default_store_location()})",
        default=argparse.SUPPRESS,
    )
    run.add_argument(
        "--fresh", action="store_true", help="requeue: run from the top; do not resume"
    )
    run.add_argument(
        "--environment",
        "--env",
        dest="environment",
        action="append",
        type=Path,
        metavar="FILE",
        help="an external environment template (JSON or YAML); repeatable: each session "
        "enters them in the order given, before the job's own environments, and exits them in "
        "reverse",
    )
    run.add_argument(
        "--path-mapping-rules",
        metavar="RULES",
        help="path mapping rules ('pathmapping-1.0', as openjd-cli takes them): inline JSON, "
        "file://PATH, or a plain PATH (a JSON document, or YAML when named .yaml/.yml)",
    )
    add_run_options(run)
    run.set_defaults(func=_cmd_run)

    resume = sub.add_parser(
        "resume",
        help="resume a stored run exactly where asked (refuses with a code otherwise)",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    resume.add_argument("run_id")
    resume.add_argument(
        "--template",
        type=Path,
        default=None,
        help="the job template (default: the path the run was started from)",
    )
    resume.add_argument(
        "-p",
        "--job-param",
        "--parameter",
        dest="parameter",
        action="append",
        metavar="NAME=VALUE|file://PATH|JSON",
        help="job parameter values, in the forms 'run' takes (default: the run's; others are "
        "refused)",
    )
    resume.add_argument(
        "--from",
        dest="from_step",
        metavar="STEP",
        default=None,
        help="run STEP and every later step again (from their checkpoints)",
    )
    resume.add_argument(
        "--generation",
        type=positive_int,
        default=None,
        metavar="N",
        help="resume checkpointed tasks from checkpoint generation N",
    )
    resume.add_argument("--store", help="checkpoint store", default=argparse.SUPPRESS)
    add_run_options(resume)
    resume.set_defaults(func=_cmd_resume)

    stop = sub.add_parser(
        "stop",
        help="ask a running run (in any process) to end early",
        epilog="exit codes: 0 asked (and, with --wait, ended); 1 --wait ran out; 2 no such run; "
        "4 refused: the run has ended, or is stopping in a mode this one may not replace",
    )
    stop.add_argument("run_id")
    stop.add_argument(
        "--mode",
        required=True,
        choices=[m.value for m in TerminationMode],
        help="Cancelled, CancelledRunFinally, StoppedRunFinally (TEP-0058) or "
        "Suspended (interrupt with checkpoints; resumable)",
    )
    stop.add_argument(
        "--force",
        action="store_true",
        help="kill what still runs at once, an environment's onExit included (a second "
        "request for a run already stopping is forced too, as a second Ctrl-C is)",
    )
    stop.add_argument(
        "--wait",
        type=seconds_value,
        default=None,
        metavar="SECONDS",
        help="wait up to SECONDS for the run to end",
    )
    stop.add_argument("--store", help="checkpoint store", default=argparse.SUPPRESS)
    stop.set_defaults(func=_cmd_stop)

    runs = sub.add_parser("runs", help="list stored runs with their states")
    runs.add_argument("--store", help="checkpoint store", default=argparse.SUPPRESS)
    add_json_option(runs)
    runs.set_defaults(func=reading(cmd_runs))

    add_logs_parser(sub)
    add_completion_parser(sub)

    gc = sub.add_parser("gc", help="delete runs (and checkpoints) older than the retention")
    gc.add_argument(
        "--retention-days",
        type=retention_days,
        default=7.0,
        metavar="DAYS",
        help="keep runs updated within DAYS (default: %(default)s)",
    )
    gc.add_argument(
        "--grace-seconds",
        type=grace_seconds,
        default=DEFAULT_GC_GRACE_SECONDS,
        metavar="SECONDS",
        help="managed checkpoint files younger than this are kept even when unreferenced: a "
        "live run may be about to commit them (default: %(default)s)",
    )
    gc.add_argument("--store", help="checkpoint store", default=argparse.SUPPRESS)
    gc.set_defaults(func=_cmd_gc)

    ck = sub.add_parser("checkpoints", help="list, show or delete stored runs and checkpoints")
    ck.add_argument("--store", help="checkpoint store", default=argparse.SUPPRESS)
    cks = ck.add_subparsers(dest="action", required=True)
    ls = cks.add_parser("list", help="list the tasks that hold checkpoints")
    add_json_option(ls)
    ls.set_defaults(func=reading(cmd_checkpoints_list))
    show = cks.add_parser("show", help="show a run's tasks and checkpoints")
    show.add_argument("run_id")
    add_json_option(show)
    show.set_defaults(func=reading(cmd_show))
    rm = cks.add_parser("delete", help="delete a run and its checkpoints")
    rm.add_argument("run_id")
    rm.set_defaults(func=_cmd_delete)
    for p in (ls, show, rm):
        p.add_argument("--store", help="checkpoint store", default=argparse.SUPPRESS)
    return parser


def _refusal(exc: BaseException) -> None:
    """Say why the command was refused, on standard error, with control characters escaped
    (``printable``)."""
    _write(sys.stderr, f"openjd-checkpoint: {printable(str(exc))}\n")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``openjd-checkpoint`` console script. Returns the exit code."""
    try:
        parser = build_parser()
        words = sys.argv[1:] if argv is None else argv
        if words[:1] == ["__complete"]:  # the shell completion script asks
            print("\n".join(complete(parser, words[1:])))
            return 0
        args = parser.parse_args(argv)
        if argv is None:  # the command itself (not a test calling main in its own process)
            # What the imports made lives as long as the process: out of the collector's
            # reach, a full collection no longer walks it (openjd-model's and pydantic's
            # classes and schemas). 1,000 trivial tasks: 0.93x wall, 0.94x CPU (farm-bench).
            gc.freeze()
        shutdown = metrics_from_environment(
            lambda line: _write(sys.stderr, f"openjd-checkpoint: {line}\n")
        )
        try:
            code: int = args.func(args)
        finally:
            shutdown()
        flush_stdout()
        return code
    except BrokenPipeError:  # '| head' read what it wanted: end quietly, as 'yes | head' does
        return closed_pipe_exit()
    except KeyboardInterrupt:  # Ctrl-C before the run started: nothing to keep
        _write(sys.stderr, "openjd-checkpoint: interrupted before the run started\n")
        return EXIT_CODES["canceled"]
    except TemplateError as exc:
        _refusal(exc)
        return EXIT_CODES["usage"]
    except ResumeRefusedError as exc:
        _refusal(exc)
        return EXIT_CODES["refused"]
    except (StoreError, RunError) as exc:
        _refusal(exc)
        return EXIT_CODES["store"]
    except OpenJDCheckpointError as exc:  # pragma: no cover
        _refusal(exc)
        return 1
    except OSError as exc:  # a path the user gave that cannot be read or written: no traceback
        _refusal(exc)
        return EXIT_CODES["store"]
    except Exception:  # a bug: say so, with the traceback, and do not look like a task failure
        import traceback

        traceback.print_exc()
        print("openjd-checkpoint: internal error (a bug; please report it)", file=sys.stderr)
        return EXIT_CODES["internal"]
