"""Helpers for tests against one real local Prefect server (see conftest.py for the fixtures).

Import this module only after conftest.py has set the ``PREFECT_*`` environment (conftest does so
when pytest loads it, before any test module is imported): Prefect reads its settings when it is
first imported.

What is here:
- ``ManagedProcess``: a subprocess in its own session with its output in a log file, stopped with
  its whole process tree (SIGTERM to the group and to every descendant, SIGKILL after a deadline);
- flow runs: ``start_flow_in_subprocess`` / ``run_flow_in_subprocess`` (a separate Python
  process), ``serve_flow`` (``flow.serve()`` in a subprocess, a deployment),
  ``deploy_to_work_pool``, ``start_deployment_run``, ``wait_for_flow_run``;
- cancellation: ``cancel_flow_run_via_api`` (``POST /flow_runs/{id}/set_state`` with a Cancelling
  state, as the UI does), ``cancel_flow_run_via_cli`` (``prefect flow-run cancel ID``);
- reading: ``flow_run``, ``task_runs``, ``flow_run_logs``, ``wait_for_logs``, ``artifacts``;
- processes: ``pid_alive``, ``process_tree``, ``marked_processes`` (every process started under this
  test session carries ``OPENJD_PREFECT_TEST_SESSION`` in its environment, so orphans are found).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
from prefect import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterId,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.client.schemas.objects import Artifact, FlowRun, Log, StateType, TaskRun
from prefect.client.schemas.sorting import LogSort, TaskRunSort

# Set by conftest.py in os.environ (and so inherited by every subprocess).
SESSION_MARKER = "OPENJD_PREFECT_TEST_SESSION"

FINAL_STATE_TYPES = frozenset(
    {StateType.COMPLETED, StateType.FAILED, StateType.CANCELLED, StateType.CRASHED}
)


def api_url() -> str:
    return os.environ["PREFECT_API_URL"]


# --------------------------------------------------------------------------- processes


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def process_tree(pid: int) -> list[psutil.Process]:
    """The process and all its live descendants (empty when it is gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def marked_processes(exclude: Iterable[int] = ()) -> list[psutil.Process]:
    """Every live process of this test session (found by the inherited environment marker),
    except this process and the pids in ``exclude``."""
    marker = os.environ.get(SESSION_MARKER)
    if not marker:
        return []
    skip = {os.getpid(), *exclude}
    found = []
    for proc in psutil.process_iter():
        if proc.pid in skip:
            continue
        try:
            if proc.environ().get(SESSION_MARKER) == marker and proc.status() != "zombie":
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def kill_processes(procs: Sequence[psutil.Process], grace: float = 5.0) -> None:
    """SIGTERM every process, then SIGKILL whatever is still there after ``grace`` seconds."""
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)


def spawn(
    cmd: list[str], log_path: Path, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in a new session, stdout and stderr appended to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            env=env if env is not None else dict(os.environ),
            start_new_session=True,
        )


# Every ManagedProcess started in this pytest process, for the session's final clean-up and for
# the logs shown on a failure.
REGISTRY: list[ManagedProcess] = []


@dataclass
class ManagedProcess:
    """A subprocess in a session of its own, stdout and stderr into ``log_path``."""

    name: str
    cmd: list[str]
    log_path: Path
    cwd: Path | None = None
    env: dict[str, str] | None = None
    keep: bool = False  # lives for the session (server, workers): not stopped after a test
    proc: subprocess.Popen[bytes] = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.proc is None:
            self.proc = spawn(self.cmd, self.log_path, cwd=self.cwd, env=self.env)
        REGISTRY.append(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def log(self, tail: int | None = None) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        if tail is not None:
            text = "\n".join(text.splitlines()[-tail:])
        return text

    def tree(self) -> list[psutil.Process]:
        return process_tree(self.pid)

    def signal_tree(self, sig: int) -> None:
        """Send ``sig`` to the process group and to every descendant (also those that started a
        session of their own)."""
        procs = self.tree()
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for proc in procs:
            try:
                proc.send_signal(sig)
            except psutil.NoSuchProcess:
                pass

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM the whole tree, SIGKILL it after ``timeout`` s; returns the exit code."""
        procs = self.tree()
        if self.running():
            self.signal_tree(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        # Whatever survived the SIGTERM (descendants included) is killed.
        leftovers = [p for p in procs if p.is_running() and p.pid != self.pid]
        if self.running():
            self.signal_tree(signal.SIGKILL)
            self.proc.wait(timeout=10)
        if leftovers:
            kill_processes(leftovers, grace=2.0)
        return self.proc.returncode

    def kill_tree(self) -> None:
        """SIGKILL the process and every descendant at once (a host dying)."""
        self.signal_tree(signal.SIGKILL)
        self.proc.wait(timeout=10)


def python_process(
    name: str,
    code: str,
    *args: str,
    log_dir: Path,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> ManagedProcess:
    """``python -c code args...`` with this interpreter, as a ManagedProcess."""
    full_env = dict(os.environ)
    full_env["PYTHONUNBUFFERED"] = "1"
    if env:
        full_env.update(env)
    return ManagedProcess(
        name=name,
        cmd=[sys.executable, "-c", textwrap.dedent(code), *args],
        log_path=log_dir / f"{name}-{uuid.uuid4().hex[:8]}.log",
        cwd=cwd,
        env=full_env,
    )


# --------------------------------------------------------------------------- flows


def write_module(directory: Path, name: str, source: str) -> Path:
    """Write ``source`` (dedented) as ``directory/name.py`` and return its path. Flows that a
    subprocess, ``serve()`` or a worker runs must live in such an importable file."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    return path


_RUN_FLOW = """
import importlib, json, sys
import prefect
sys.path.insert(0, sys.argv[1])
flow = getattr(importlib.import_module(sys.argv[2]), sys.argv[3])
with prefect.tags(sys.argv[5]):
    state = flow(**json.loads(sys.argv[4]), return_state=True)
print("OPENJD_FLOW_RESULT " + json.dumps({
    "flow_run_id": str(state.state_details.flow_run_id),
    "type": state.type.value,
    "name": state.name,
}), flush=True)
"""


@dataclass
class SubprocessFlowRun:
    returncode: int
    flow_run_id: uuid.UUID | None
    state_type: str | None  # as the flow call returned it ("COMPLETED", "FAILED", ...)
    state_name: str | None
    output: str


@dataclass
class FlowProcess:
    """A flow called in a separate Python process (``start_flow_in_subprocess``)."""

    process: ManagedProcess
    tag: str  # a tag unique to this call, on its flow run

    def flow_run_id(self, timeout: float = 60.0) -> uuid.UUID:
        """The flow run's id, once the server has it (found by the unique tag)."""
        from prefect.client.schemas.filters import FlowRunFilterTags

        deadline = time.monotonic() + timeout
        with get_client(sync_client=True) as client:
            while True:
                found = client.read_flow_runs(
                    flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[self.tag]))
                )
                if found:
                    return found[0].id
                if not self.process.running() or time.monotonic() > deadline:
                    raise AssertionError(f"no flow run tagged {self.tag}:\n{self.process.log(60)}")
                time.sleep(0.2)

    def wait(self, timeout: float = 120.0) -> SubprocessFlowRun:
        """Wait for the process to exit; its flow run id and final state as the call saw it."""
        try:
            self.process.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.stop(timeout=5)
            raise AssertionError(
                f"{self.process.name} did not end in {timeout} s:\n{self.process.log(60)}"
            ) from None
        output = self.process.log()
        result: dict[str, str] = {}
        for line in output.splitlines():
            if line.startswith("OPENJD_FLOW_RESULT "):
                result = json.loads(line.split(" ", 1)[1])
        return SubprocessFlowRun(
            returncode=self.process.proc.returncode,
            flow_run_id=uuid.UUID(result["flow_run_id"]) if result else None,
            state_type=result.get("type"),
            state_name=result.get("name"),
            output=output,
        )


def start_flow_in_subprocess(
    module: Path,
    flow_name: str,
    parameters: dict[str, Any] | None = None,
    *,
    log_dir: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> FlowProcess:
    """Call flow ``flow_name`` of ``module`` in a separate Python process (no runner: the
    process is the flow run's, as when a user runs a script); returns at once."""
    tag = f"openjd-test-{uuid.uuid4().hex[:12]}"
    proc = python_process(
        f"flow-{flow_name}",
        _RUN_FLOW,
        str(module.parent),
        module.stem,
        flow_name,
        json.dumps(parameters or {}),
        tag,
        log_dir=log_dir,
        env=env,
        cwd=cwd,
    )
    return FlowProcess(process=proc, tag=tag)


def run_flow_in_subprocess(
    module: Path,
    flow_name: str,
    parameters: dict[str, Any] | None = None,
    *,
    log_dir: Path,
    timeout: float = 120.0,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> SubprocessFlowRun:
    """``start_flow_in_subprocess`` and wait for it."""
    started = start_flow_in_subprocess(
        module, flow_name, parameters, log_dir=log_dir, env=env, cwd=cwd
    )
    return started.wait(timeout=timeout)


_SERVE_FLOW = """
import importlib, json, sys
sys.path.insert(0, sys.argv[1])
flow = getattr(importlib.import_module(sys.argv[2]), sys.argv[3])
flow.serve(name=sys.argv[4], print_starting_message=False, **json.loads(sys.argv[5]))
"""


@dataclass
class ServedFlow:
    """A ``flow.serve()`` subprocess and the deployment it created."""

    process: ManagedProcess
    deployment_id: uuid.UUID
    deployment_name: str  # "<flow name>/<deployment name>"

    def run(self, parameters: dict[str, Any] | None = None, **kwargs: Any) -> FlowRun:
        return start_deployment_run(self.deployment_id, parameters, **kwargs)

    def stop(self, timeout: float = 40.0) -> int | None:
        return self.process.stop(timeout=timeout)


def serve_flow(
    module: Path,
    flow_name: str,
    deployment: str = "served",
    *,
    log_dir: Path,
    serve_kwargs: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 90.0,
) -> ServedFlow:
    """Start ``flow.serve(name=deployment)`` in a subprocess; return once its deployment exists.

    The runner polls for scheduled runs every ``PREFECT_RUNNER_POLL_FREQUENCY`` s (conftest sets
    1 s) and hears of cancellations through the events websocket at once."""
    proc = python_process(
        f"serve-{flow_name}",
        _SERVE_FLOW,
        str(module.parent),
        module.stem,
        flow_name,
        deployment,
        json.dumps(serve_kwargs or {}),
        log_dir=log_dir,
        env=env,
        cwd=cwd,
    )
    api_flow_name = _flow_name_in_module(module, flow_name)
    full_name = f"{api_flow_name}/{deployment}"
    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            if not proc.running():
                raise AssertionError(f"serve() exited early:\n{proc.log(80)}")
            try:
                dep = client.read_deployment_by_name(full_name)
                # the runner process has created the deployment: it starts polling right after
                return ServedFlow(process=proc, deployment_id=dep.id, deployment_name=full_name)
            except Exception:  # ObjectNotFound until serve() has registered it
                pass
            if time.monotonic() > deadline:
                proc.stop(timeout=5)
                raise AssertionError(f"deployment {full_name} not there in {timeout} s")
            time.sleep(0.3)


def _flow_name_in_module(module: Path, attr: str) -> str:
    """The Prefect name of flow ``attr`` in ``module``, loaded here under a private name (so
    that modules of the same name in two tests' folders do not mix)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_openjd_probe_{uuid.uuid4().hex}", module)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, attr).name


def deploy_to_work_pool(
    module: Path,
    flow_name: str,
    deployment: str,
    work_pool: str,
    *,
    job_variables: dict[str, Any] | None = None,
    **deploy_kwargs: Any,
) -> uuid.UUID:
    """Create a deployment of ``flow_name`` (code read from ``module``'s folder at run time) for
    ``work_pool``; returns its id. Start runs with ``start_deployment_run``."""
    from prefect import Flow

    flow = Flow.from_source(source=str(module.parent), entrypoint=f"{module.name}:{flow_name}")
    return flow.deploy(
        name=deployment,
        work_pool_name=work_pool,
        build=False,
        push=False,
        job_variables=job_variables or {},
        print_next_steps=False,
        ignore_warnings=True,
        **deploy_kwargs,
    )


def start_deployment_run(
    deployment_id: uuid.UUID, parameters: dict[str, Any] | None = None, **kwargs: Any
) -> FlowRun:
    """Create a flow run of a deployment (scheduled now); a runner or worker picks it up."""
    with get_client(sync_client=True) as client:
        return client.create_flow_run_from_deployment(
            deployment_id, parameters=parameters or {}, **kwargs
        )


def flow_run(flow_run_id: uuid.UUID) -> FlowRun:
    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id)


def wait_for_flow_run(
    flow_run_id: uuid.UUID,
    until: Callable[[FlowRun], bool] | Iterable[StateType] = FINAL_STATE_TYPES,
    timeout: float = 90.0,
    interval: float = 0.25,
) -> FlowRun:
    """Poll the flow run until ``until`` holds (a predicate, or a set of state types; default:
    any final state). Fails with the state history when the time is up."""
    if not callable(until):
        types = frozenset(until)

        def until(fr: FlowRun) -> bool:
            return fr.state is not None and fr.state.type in types

    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            fr = client.read_flow_run(flow_run_id)
            if until(fr):
                return fr
            if time.monotonic() > deadline:
                history = [
                    (s.type.value, s.name, s.message)
                    for s in client.read_flow_run_states(flow_run_id)
                ]
                raise AssertionError(
                    f"flow run {flow_run_id} still {fr.state_type}/{fr.state_name} after "
                    f"{timeout} s; states: {history}"
                )
            time.sleep(interval)


def seconds_from_state_to_last_log(flow_run_id: uuid.UUID, state: str) -> float:
    """Seconds from the flow run's first state named ``state`` (the server's timestamp) to the
    flow run's last log line (stamped by the flow run process as it logged it, on the same
    clock): how long the process ran on after that state, whatever the runner does later."""
    with get_client(sync_client=True) as client:
        states = client.read_flow_run_states(flow_run_id)
    start = next(s.timestamp for s in states if s.name == state)
    return (flow_run_logs(flow_run_id)[-1].timestamp - start).total_seconds()


def flow_run_states(flow_run_id: uuid.UUID) -> list[tuple[str, str]]:
    """The flow run's state history as (type, name), oldest first."""
    with get_client(sync_client=True) as client:
        return [(s.type.value, s.name or "") for s in client.read_flow_run_states(flow_run_id)]


# --------------------------------------------------------------------------- cancellation


def cancel_flow_run_via_api(
    flow_run_id: uuid.UUID, name: str = "Cancelling", message: str | None = None
) -> dict[str, Any]:
    """What the UI's Cancel does: ``POST /api/flow_runs/{id}/set_state`` with a CANCELLING state,
    over plain HTTP. ``name`` may carry a custom state name (e.g. ``HardCancelling``). Returns the
    orchestration result (``status`` is ACCEPT, REJECT or ABORT)."""
    body: dict[str, Any] = {"state": {"type": "CANCELLING", "name": name}, "force": False}
    if message:
        body["state"]["message"] = message
    resp = httpx.post(f"{api_url()}/flow_runs/{flow_run_id}/set_state", json=body, timeout=30)
    resp.raise_for_status()
    return resp.json()


def cancel_flow_run_via_cli(flow_run_id: uuid.UUID, timeout: float = 60.0) -> str:
    """``prefect flow-run cancel ID`` in a subprocess; returns its output, fails on a non-zero
    exit."""
    done = subprocess.run(
        [sys.executable, "-m", "prefect", "flow-run", "cancel", str(flow_run_id)],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"prefect flow-run cancel exited {done.returncode}:\n{out}"
    return out


# --------------------------------------------------------------------------- reading


def task_runs(flow_run_id: uuid.UUID) -> list[TaskRun]:
    """The flow run's task runs, oldest first (with ``.name``, ``.state_type``, ``.state_name``)."""
    with get_client(sync_client=True) as client:
        return client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])),
            sort=TaskRunSort.EXPECTED_START_TIME_ASC,
            limit=200,
        )


def flow_run_of_store(store: Any, timeout: float = 60) -> uuid.UUID:
    """The flow run id of the running core run in ``store`` (a ``core.CheckpointStore``), once
    one is there: its external key."""
    from core import RunStatus

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = [r for r in store.list_runs()[0] if r.status == RunStatus.RUNNING]
        if runs and runs[-1].external_key:
            return uuid.UUID(runs[-1].external_key)
        time.sleep(0.1)
    raise AssertionError("no running core run appeared in the store")


def flow_run_logs(flow_run_id: uuid.UUID) -> list[Log]:
    """Every log of the flow run and its task runs, oldest first (paged: the API returns at most
    200 a call, and a slow run's warning may come after its first 200 lines). Logs are sent in
    batches (``PREFECT_LOGGING_TO_API_BATCH_INTERVAL``): use ``wait_for_logs`` for fresh lines."""
    out: list[Log] = []
    with get_client(sync_client=True) as client:
        while True:
            page = client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
                sort=LogSort.TIMESTAMP_ASC,
                limit=200,
                offset=len(out),
            )
            out.extend(page)
            if len(page) < 200:
                return out


def wait_for_logs(flow_run_id: uuid.UUID, contains: str, timeout: float = 30.0) -> list[Log]:
    """Wait until a log line of the flow run contains ``contains``; returns all its logs."""
    deadline = time.monotonic() + timeout
    while True:
        logs = flow_run_logs(flow_run_id)
        if any(contains in log.message for log in logs):
            return logs
        if time.monotonic() > deadline:
            lines = "\n".join(log.message for log in logs[-30:])
            raise AssertionError(f"no log containing {contains!r} in {timeout} s; last:\n{lines}")
        time.sleep(0.3)


def artifacts(flow_run_id: uuid.UUID) -> list[Artifact]:
    """Artifacts created in the flow run (``.key``, ``.type`` such as ``table``, ``.data``)."""
    with get_client(sync_client=True) as client:
        return client.read_artifacts(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )


# --------------------------------------------------------------------------- partitions


def kill_tree_sparing(proc: ManagedProcess, spare_pgid: int, timeout: float = 30.0) -> list[int]:
    """SIGKILL ``proc`` and every descendant except the members of process group
    ``spare_pgid`` (a task process in a session of its own that outlives its runner: the runner
    died, or its host dropped off the network). Waits until the killed ones are gone (or
    zombies) and returns their pids; fails if one is still alive after ``timeout`` seconds."""
    victims: list[psutil.Process] = []
    for p in proc.tree():
        try:
            if os.getpgid(p.pid) != spare_pgid:
                victims.append(p)
        except ProcessLookupError:
            continue
    groups = set()
    for p in victims:
        try:
            groups.add(os.getpgid(p.pid))
        except ProcessLookupError:
            continue
    for group in groups - {spare_pgid}:
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for p in victims:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.proc.wait(timeout=10)
    deadline = time.monotonic() + timeout
    while any(not exited(p.pid) for p in victims):
        if time.monotonic() > deadline:
            alive = [p.pid for p in victims if not exited(p.pid)]
            raise AssertionError(f"processes {alive} of {proc.name} survived SIGKILL")
        time.sleep(0.1)
    return [p.pid for p in victims]


def exited(pid: int) -> bool:
    """True once ``pid`` and all its threads have exited (it may be an unreaped zombie). The
    leader of a thread group shows as a zombie while its other threads still exit and still
    hold the process's descriptors (and so its locks); this waits for those threads too."""
    try:
        if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            return False
        return len(os.listdir(f"/proc/{pid}/task")) <= 1
    except (psutil.NoSuchProcess, FileNotFoundError):
        return True


def flock_holders(path: Path) -> list[int]:
    """The pids that took the ``flock``s held on ``path`` (Linux ``/proc/locks``), for a
    failure message."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return []
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pids = []
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == inode:
            pids.append(int(fields[4]))
    return pids


def freeze_group(pgid: int, timeout: float = 30.0) -> None:
    """SIGSTOP process group ``pgid`` and wait until its leader is stopped. A frozen process
    neither ends on its own nor handles a signal: any signal but SIGKILL sent to it stays
    pending (``signals_pending``) and a SIGKILL makes it disappear, so whoever signals it later
    is seen."""
    os.killpg(pgid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while psutil.Process(pgid).status() != psutil.STATUS_STOPPED:
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pgid} did not stop on SIGSTOP")
        time.sleep(0.05)


def signals_pending(pid: int) -> list[str]:
    """The signals sent to ``pid`` (any of its threads) and not handled yet, by name (Linux:
    the ``SigPnd``/``ShdPnd`` masks of ``/proc``). Empty for a frozen process nobody signalled."""
    mask = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key in ("SigPnd", "ShdPnd"):
                mask |= int(value.strip(), 16)
    names = []
    for bit in range(64):
        if mask & (1 << bit):
            try:
                names.append(signal.Signals(bit + 1).name)
            except ValueError:
                names.append(f"signal {bit + 1}")
    return names


def kill_group_and_wait(leader: psutil.Process, timeout: float = 30.0) -> None:
    """SIGKILL the process group that ``leader`` leads (also a frozen one) and wait until the
    leader is gone. Nothing is signalled once the leader is gone (its pid may be reused)."""
    if not leader.is_running():  # compares the start time too
        return
    try:
        os.killpg(leader.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while pid_alive(leader.pid):
        if time.monotonic() > deadline:
            raise AssertionError(f"process group {leader.pid} survived SIGKILL")
        time.sleep(0.1)
