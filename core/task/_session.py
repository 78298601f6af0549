"""OpenJD sessions: environments entered once, then any number of tasks, one after the other.

Behavioural reference: openjd-sessions 0.14 ``Session`` (behind ``openjd run`` and the Deadline
Cloud worker). A session has one working directory. The external and job environments are
entered once, when its first task starts; a step's environments once for that step, and exited
(in reverse order) when the session moves to another step or ends. Variables an environment
sets with ``openjd_env`` in ``onEnter`` reach every later action of the session. Processes an
environment's ``onEnter`` leaves running (a license server, a render daemon) live until that
environment's ``onExit`` has run, and are killed then; processes a task action leaves are still
killed when that action ends.

What openjd-sessions lacks for this product: its actions are not ours to signal and read (see
``_task.py``), and a session whose runner dies leaves its daemons behind. Here every
environment's processes carry a marker (and, where the machine allows it, run in a cgroup named
after it: ``_cgroups``), and the session records its markers in the store under a lease, so that
the next attempt kills what a dead session left (``_attempt.reap_orphans``).

With CHECKPOINT (docs/decisions.md, "Sessions"): on a suspend the running task checkpoints
first, then the environments exit normally; a resume enters them again before
``onCheckpointResume``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from openjd.model import ParameterValueType, SymbolTable

from core._errors import StoreError
from core._host import host_id
from core._records import SessionRecord
from core.job import PreparedJob
from core.process import kill_marked, new_marker, release_marker
from core.store import CheckpointStore, Lease
from core.task._action import ActionHost, StopIntent
from core.task._symbols import add_parameter, apply_let, base_symtab, embedded_files, map_value
from core.task._wrap import defines_wrap, hook, inject_wrapped

__all__ = ("Session", "clean_stale_sessions", "sessions_root")


def sessions_root() -> str:
    """Where session working directories go by default: ``<temp>/openjd-checkpoint-<uid>``."""
    return os.path.join(tempfile.gettempdir(), f"openjd-checkpoint-{os.getuid()}")


def clean_stale_sessions(root: str | None = None) -> int:
    """Remove session working directories left by runners that died (their pid is in the
    name). Returns how many were removed."""
    import psutil

    root = root or sessions_root()
    removed = 0
    try:
        names = os.listdir(root)
    except OSError:
        return 0
    for name in names:
        parts = name.split("-")
        if len(parts) < 3 or parts[0] != "session" or not parts[1].isdigit():
            continue
        if psutil.pid_exists(int(parts[1])):
            continue
        remove_tree(os.path.join(root, name))
        removed += 1
    return removed


def remove_tree(path: str) -> None:
    """Remove a folder and everything in it, ignoring errors, never following links. Unlike
    ``shutil.rmtree`` (recursive before Python 3.12), a tree of any depth is removed: a task
    may leave thousands of nested folders in its working directory."""
    try:
        shutil.rmtree(path, ignore_errors=True)
        return
    except RecursionError:
        pass
    stack = [path]
    tried: set[str] = set()  # folders already emptied as far as possible: never again
    while stack:
        current = stack[-1]
        try:
            entries = list(os.scandir(current))
        except OSError:
            stack.pop()
            continue
        deeper = [
            e.path for e in entries if e.is_dir(follow_symlinks=False) and e.path not in tried
        ]
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                try:
                    os.unlink(entry.path)
                except OSError:
                    pass
        if deeper:
            stack.extend(deeper)
            continue
        try:
            os.rmdir(current)
        except OSError:
            pass
        tried.add(current)
        stack.pop()


@dataclass
class _Entered:
    """An environment the session has entered."""

    model: Any
    path: str
    files: dict[str, str]
    marker: str
    step: str | None
    """The step whose environment it is; None for external and job environments."""
    env_before: dict[str, str] = field(default_factory=dict)
    """The session's variables before it was entered (restored when it exits)."""


class Session:
    """One OpenJD session: a working directory and the environments entered in it.

    Not thread-safe for running: one task at a time (``TaskExecution(session=...)``), any
    number one after the other, of any steps of the job. ``stop()`` may be called from any
    thread. Use it as a context manager, or call ``close()``.

    Args:
        job: the prepared job.
        run_id: the run whose tasks it runs (None: nothing is recorded in the store).
        store: where its record (host, markers) is kept while it is open, so that the next
            attempt can kill what it left if its process dies.
        working_root: parent directory of the working directory (default ``sessions_root()``).
        os_env: the environment actions start from (default: ``os.environ``).
        job_status: the ``{{Job.Status}}`` of finally steps.
    """

    def __init__(
        self,
        job: PreparedJob,
        *,
        run_id: str | None = None,
        store: CheckpointStore | None = None,
        working_root: str | None = None,
        os_env: dict[str, str] | None = None,
        job_status: str | None = None,
    ) -> None:
        self.job = job
        self.run_id = run_id
        self.store = store
        self.job_status = job_status
        self.session_id = uuid.uuid4().hex[:16]
        self._working_root = working_root
        self.env: dict[str, str] = dict(os.environ if os_env is None else os_env)
        self.working_dir: str | None = None
        self._entered: list[_Entered] = []
        self._job_entered = False
        self._step: str | None = None
        self._lock = threading.Lock()
        self._current: ActionHost | None = None
        self._last: ActionHost | None = None
        self._lease: Lease | None = None
        self._closed = False
        self.broken: str | None = None
        """Why the session can run no more tasks (an environment failed to enter)."""
        self.redacted: set[str] = set()
        """Values declared secret (``openjd_redacted_env``) in this session: redacted from
        the output of every later action of the session, not only the one that declared them."""
        self.defined_env: dict[str, str] = {}
        """Variables the session defined (environments' ``variables`` and ``openjd_env``), for
        ``WrappedAction.Environment`` (RFC 0008): host variables are not in it."""
        self.enter_count = 0
        """How many environments this session entered (for tests and progress)."""
        self.stopped_exits: list[str] = []
        """The ``onExit`` actions a stop killed (forced, or at its deadline), each as a sentence:
        the stop's doing, not failures of their environments."""

    # --- lifetime --------------------------------------------------------------------------------
    def __enter__(self) -> Session:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def open(self) -> str:
        """Make the working directory (once); returns its path."""
        if self.working_dir is None:
            root = self._working_root or sessions_root()
            os.makedirs(root, mode=0o700, exist_ok=True)
            path = tempfile.mkdtemp(prefix=f"session-{os.getpid()}-", dir=root)
            os.chmod(path, 0o700)
            self.working_dir = path
            self.env["OPENJD_SESSION_WORKING_DIR"] = path
        return self.working_dir

    def stop(self, *, force: bool = False, deadline: float | None = None) -> None:
        """Forward a forced stop or a deadline to whatever action the session runs now, an
        environment's ``onExit`` at ``close()`` included (``TaskExecution.stop`` does the
        rest). Thread-safe."""
        if not force and deadline is None:
            return
        with self._lock:
            current = self._current or self._last
        if current is not None:
            if force:
                current.stop(StopIntent.CANCEL, force=True, deadline=deadline)
            else:
                current.stop(StopIntent.CHECKPOINT, deadline=deadline)

    def prepare(self, ex: ActionHost) -> str | None:
        """Enter what ``ex``'s task needs: the job's environments (once), and its step's (after
        exiting another step's). Environment actions run through ``ex``, so its stop requests
        apply to them. Returns why the task cannot run, or None (also None when ``ex`` was
        stopped meanwhile: it then runs nothing)."""
        with self._lock:
            self._current = ex
            self._last = ex
        self.open()
        if self.broken:
            return self.broken
        if not self._job_entered:
            self._job_entered = True
            for model, path in self._job_environments():
                if ex.stop_state.intent is not None:
                    return None
                problem = self._enter(ex, model, path, None)
                if problem:
                    return problem
        step = ex.spec.step_name
        if self._step != step:
            left = self._step
            problem = self._exit_step(ex)
            # the session cannot go on: as openjd run
            if problem and ex.stop_state.intent is None:
                return f"not run: as the session left step {left!r}, {problem}"
            self._step = step
            for model, path in self._step_environments(step):
                if ex.stop_state.intent is not None:
                    return None
                problem = self._enter(ex, model, path, step)
                if problem:
                    return problem
        return None

    def task_done(self, ex: ActionHost) -> None:
        with self._lock:
            if self._current is ex:
                self._current = None

    def close(self, ex: ActionHost | None = None) -> str | None:
        """Exit every environment in reverse order (``onExit``, through ``ex`` or the last
        task's execution), kill what they left running, remove the working directory. A
        forced stop of that execution skips the ``onExit`` actions (it kills one running, as
        its deadline does: ``stopped_exits``). Idempotent. Returns the first ``onExit``
        failure, or None."""
        if self._closed:
            return None
        self._closed = True
        runner = ex or self._last
        problem: str | None = None
        while self._entered:
            entered = self._entered.pop()
            if runner is not None:
                failure = self._exit_one(runner, entered)
                problem = problem or failure
            release_marker(entered.marker)  # a spare no action of it took
            kill_marked([entered.marker])
        if self.working_dir is not None:
            remove_tree(self.working_dir)
        self._forget()
        return problem

    # --- environments ----------------------------------------------------------------------------
    def _job_environments(self) -> list[tuple[Any, str]]:
        out: list[tuple[Any, str]] = []
        for i, tmpl in enumerate(self.job.environments):
            out.append((tmpl.environment, f"environments[{i}].environment"))
        for i, env_model in enumerate(self.job.job.jobEnvironments or []):
            out.append((env_model, f"jobEnvironments[{i}]"))
        return out

    def _step_environments(self, step: str) -> list[tuple[Any, str]]:
        model = self.job.step(step)
        idx = self.job.template.step_index(step)  # action paths use the global step index
        return [
            (env_model, f"steps[{idx}].stepEnvironments[{i}]")
            for i, env_model in enumerate(model.stepEnvironments or [])
        ]

    def _enter(self, ex: ActionHost, model: Any, path: str, step: str | None) -> str | None:
        assert self.working_dir is not None
        marker = new_marker()
        before = dict(self.env)
        if defines_wrap(model) and any(defines_wrap(e.model) for e in self._entered):
            other = next(e.model.name for e in self._entered if defines_wrap(e.model))
            self.broken = (
                f"environment {model.name!r}: only one environment of a session may define wrap "
                f"hooks (onWrapEnvEnter / onWrapTaskRun / onWrapEnvExit); {other!r} already does "
                "(RFC 0008)"
            )
            return self.broken
        symtab = self.env_symtab(step)
        try:
            for name, value in (getattr(model, "variables", None) or {}).items():
                self.env[str(name)] = value.resolve(symtab=symtab)
                self.defined_env[str(name)] = self.env[str(name)]
            files = self.embedded_files(
                getattr(model.script, "embeddedFiles", None),
                symtab,
                "Env",
                let=getattr(model.script, "let", None),
            )
        except (ValueError, OSError) as exc:  # FormatStringError and ExpressionError too
            self.broken = f"environment {model.name!r}: {exc}"
            return self.broken
        self._entered.append(_Entered(model, path, files, marker, step, before))
        self.enter_count += 1
        self._record_markers()
        code, msg = self._run_env_action(ex, model, path, "onEnter", symtab, marker)
        if code != 0:
            self.broken = msg or f"environment {model.name!r} onEnter failed"
            return self.broken
        return None

    def _run_env_action(
        self, ex: ActionHost, model: Any, path: str, which: str, symtab: Any, marker: str
    ) -> tuple[int, str]:
        """Run an environment's ``onEnter`` or ``onExit``, or the wrapping environment's hook
        in its place (WRAP_ACTIONS); keep what it defines with ``openjd_env``."""
        if hook(model, which) is None:
            return 0, ""  # nothing to run, nothing to wrap
        before = dict(self.env)
        wrapper = self.wrapper(which, exclude=model)
        if wrapper is None:
            code, msg = ex.run_environment_action(
                model, path, which, symtab, self.env, marker=marker
            )
        else:
            name = "onWrapEnvEnter" if which == "onEnter" else "onWrapEnvExit"
            try:
                hook_symtab = self.wrap_symtab(wrapper)
                inject_wrapped(
                    hook_symtab,
                    hook(model, which),
                    symtab,
                    environment=self.environment_list(),
                    task_run=False,
                )
                hook_symtab["WrappedEnv.Name"] = model.name
            except ValueError as exc:
                return 1, f"{wrapper.path}.script.actions.{name}: {exc}"
            code, msg = ex.run_environment_action(
                wrapper.model, wrapper.path, name, hook_symtab, self.env, marker=marker
            )
        self._note_env_changes(before)
        return code, msg

    def _note_env_changes(self, before: dict[str, str]) -> None:
        for name, value in self.env.items():
            if before.get(name) != value:
                self.defined_env[name] = value
        for name in before:
            if name not in self.env:
                self.defined_env.pop(name, None)

    # --- WRAP_ACTIONS ------------------------------------------------------------------------
    def wrapper(self, which: str, *, exclude: Any = None) -> _Entered | None:
        """The entered environment whose hook wraps ``which`` (``onEnter``, ``onExit`` or
        ``onRun``), or None. An environment never wraps its own actions."""
        name = {"onEnter": "onWrapEnvEnter", "onExit": "onWrapEnvExit"}.get(which, "onWrapTaskRun")
        for entered in reversed(self._entered):
            if entered.model is not exclude and hook(entered.model, name) is not None:
                return entered
        return None

    def wrap_symtab(self, wrapper: _Entered) -> SymbolTable:
        """The scope a hook resolves in: the wrapping environment's own (its session scope,
        step context, embedded files and ``let`` bindings), never the wrapped action's.

        Raises:
            ValueError: a ``let`` binding cannot be evaluated.
        """
        symtab = self.env_symtab(wrapper.step)
        for k, v in wrapper.files.items():
            symtab[k] = v
            if self.job.uses_expr:
                symtab.expr_types[k] = ParameterValueType.PATH.value
        apply_let(symtab, getattr(wrapper.model.script, "let", None))
        return symtab

    def environment_list(self) -> list[str]:
        """``WrappedAction.Environment``: the session-defined variables as ``KEY=value``."""
        return [f"{k}={v}" for k, v in self.defined_env.items()]

    def _exit_step(self, ex: ActionHost) -> str | None:
        problem: str | None = None
        while self._entered and self._entered[-1].step is not None:
            entered = self._entered.pop()
            failure = self._exit_one(ex, entered)
            problem = problem or failure
            release_marker(entered.marker)  # a spare no action of it took
            kill_marked([entered.marker])
            self.env = entered.env_before
        self._record_markers()
        return problem

    def _exit_one(self, ex: ActionHost, entered: _Entered) -> str | None:
        if ex.stop_state.force:  # a forced stop skips the cleanup it would only kill
            name = entered.model.name
            self.stopped_exits.append(
                f"{entered.path}.script.actions.onExit (environment {name!r}): not run, the "
                "stop was forced"
            )
            return None
        symtab = self.env_symtab(entered.step)
        for k, v in entered.files.items():
            symtab[k] = v
            if self.job.uses_expr:
                symtab.expr_types[k] = ParameterValueType.PATH.value
        try:
            apply_let(symtab, getattr(entered.model.script, "let", None))
        except ValueError as exc:
            return f"environment {entered.model.name!r}: {exc}"
        code, msg = self._run_env_action(
            ex, entered.model, entered.path, "onExit", symtab, entered.marker
        )
        if code != 0 and ex.stop_state.ends_on_exit():
            self.stopped_exits.append(
                f"{entered.path}.script.actions.onExit (environment {entered.model.name!r}): "
                "killed by the stop"
            )
        elif code != 0:
            return msg or f"environment {entered.model.name!r} onExit failed"
        return None

    # --- the store's view: what a dead session left ------------------------------------------
    def _record_markers(self) -> None:
        """Keep the session's record (its lease, host, pid and the markers of the environments
        entered) in the store, for ``reap_run`` to kill what a dead session left running. A
        session that never entered an environment has nothing to clean up: it writes no
        record (an Airflow task instance or a Prefect task run is a session of its own; that
        record was a third of its durable writes)."""
        if self.store is None or self.run_id is None:
            return
        if self._lease is None and not self._entered:
            return
        try:
            if self._lease is None:
                self._lease = self.store.sessions.acquire_lease(
                    self.job.job_key, self.run_id, self.session_id
                )
            self.store.sessions.write(
                SessionRecord(
                    job_key=self.job.job_key,
                    run_id=self.run_id,
                    session_id=self.session_id,
                    host=host_id(),
                    pid=os.getpid(),
                    markers=[e.marker for e in self._entered],
                )
            )
        except StoreError:
            pass  # the session still runs; only the clean-up after a crash is lost

    def _forget(self) -> None:
        if self.store is not None and self.run_id is not None and self._lease is not None:
            try:
                self.store.sessions.delete(self.job.job_key, self.run_id, self.session_id)
            except StoreError:
                pass
            self._lease.release()
            self._lease = None

    # --- symbols, variables, files (core.task._symbols)
    # --------------------------------------------
    def map_value(self, value: Any) -> Any:
        """A parameter value with path mapping applied (``core.task._symbols.map_value``)."""
        return map_value(self.job, value)

    def base_symtab(self, step: str | None = None) -> SymbolTable:
        """``Session.*``, ``Param.*`` and ``RawParam.*`` (``core.task._symbols.base_symtab``)."""
        return base_symtab(self.job, self.open(), step=step, job_status=self.job_status)

    def add_parameter(self, symtab: SymbolTable, prefix: str, name: str, value: Any) -> None:
        """``<prefix>Param.<name>`` and ``<prefix>RawParam.<name>`` (``core.task._symbols``)."""
        add_parameter(self.job, symtab, prefix, name, value)

    def env_symtab(self, step: str | None) -> SymbolTable:
        """The symbol table of an environment's actions (a step's environments: with
        ``Step.Name`` and the step's template-scope ``let`` bindings under EXPR)."""
        symtab = SymbolTable(source=self.base_symtab(step))
        if step is not None and self.job.uses_expr:
            symtab["Step.Name"] = step
        return symtab

    def embedded_files(
        self, files: Any, symtab: SymbolTable, prefix: str, *, let: list[str] | None = None
    ) -> dict[str, str]:
        """Write embedded files into the working directory (``core.task._symbols.embedded_files``).

        Raises:
            ValueError: a binding or a file's data cannot be evaluated. OSError: a file cannot
                be written.
        """
        return embedded_files(self.job, self.open(), files, symtab, prefix, let=let)
