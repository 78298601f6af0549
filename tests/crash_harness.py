"""Crash harness: SIGKILL the real CLI runner during a stream of checkpoint saves and task
completions, resume it, and check what the store promised (issue 25, "Crash safety proven").

Each *job* is ``WORKLOAD`` in a fresh store: one CHECKPOINT step ``Work`` of ``tasks`` tasks run
two at a time (``--max-parallel 2``), where every ``SAVER_EVERY``-th task is a *saver* (it
counts to ``saves``, printing ``openjd_checkpoint_save`` with the counter as its state every few
ms) and the others are short. Each *attempt* is ``python -m core.cli run`` (again, on the same
store, to resume) as a real subprocess, killed with SIGKILL either at a random moment after its
first task started (``random.Random(seed)``) or by itself at a named kill point
(``OPENJD_CHECKPOINT_KILL_AT=NAME@N``, ``core/_killpoints.py``); attempts repeat until the job
succeeds, then the next job starts, until ``kills`` kills were made. After every attempt:

a. every resume starts from the last acknowledged save or a later one ("acknowledged": the
   runner printed ``<task>: checkpoint generation N stored``): the store's task record holds a
   generation >= N, the resume says ``started (resuming from checkpoint G)`` with G >= N, and
   the state the task was given (its ledger entry) is >= the state of generation N;
b. no task reported ``succeeded`` starts again in a later attempt;
c. nothing torn is read: no ``unreadable`` / ``set aside`` / ``rebuilt`` in the runner's output,
   and every record (``*.json``, not ``.tmp-*``) in the store parses as JSON;
d. no process of a killed attempt is alive when a task of a later attempt starts (each task
   process checks the pids of the earlier attempts in the ledger, and the harness does too);
e. no task runs twice at once: each task process takes a non-blocking flock on a file of its
   own task and records a violation when it cannot.

Task processes are the same file run as ``crash_harness.py task ...`` (stdlib only). Run as a
script: ``python tests/crash_harness.py --kills 220 --seed N [--s3]``; the test is
``tests/test_crash_kills.py``. ``strace_job`` and ``strace_order`` prove the order of the
durable writes against the events (SIGKILL keeps the page cache, so the kills alone cannot).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SAVER_EVERY = 6
"""Tasks T with ``T % SAVER_EVERY == 1`` save checkpoints; the others are short."""
LINGER = 90.0
"""Seconds an orphaned task process lives on (longer than an S3 lease's ttl)."""

WORKLOAD = """\
specificationVersion: 'jobtemplate-2023-09'
extensions: [CHECKPOINT]
name: Crash harness job
parameterDefinitions:
- {name: Harness, type: STRING}
- {name: Ledger, type: STRING}
- {name: Tasks, type: INT, default: 24}
- {name: Saves, type: INT, default: 150}
steps:
- name: Work
  parameterSpace:
    taskParameterDefinitions:
    - {name: T, type: INT, range: "1-{{Param.Tasks}}"}
  script:
    actions:
      onRun:
        command: '%(python)s'
        args: ['{{Param.Harness}}', task, '{{Param.Ledger}}', '{{Task.Param.T}}',
               '{{Param.Saves}}', '']
      onCheckpointResume:
        command: '%(python)s'
        args: ['{{Param.Harness}}', task, '{{Param.Ledger}}', '{{Task.Param.T}}',
               '{{Param.Saves}}', '{{Task.Checkpoint.State}}']
"""

LEASE_HELD = "which has ended: its lease on this store frees"
TORN = re.compile(r"unreadable|set aside|rebuilt", re.IGNORECASE)
STORED = re.compile(r"openjd-checkpoint: Work\[T=(\d+)\]: checkpoint generation (\d+) stored")
SUCCEEDED = re.compile(r"openjd-checkpoint: Work\[T=(\d+)\] succeeded")
STARTED = re.compile(
    r"openjd-checkpoint: Work\[T=(\d+)\] started(?: \(resuming from checkpoint (\d+)\))?"
)


def kill_points() -> tuple[str, ...]:
    """The named kill points, as ``core/_killpoints.py``'s docstring lists them."""
    sys.path.insert(0, str(ROOT))
    from core import _killpoints

    return tuple(re.findall(r"^- ``([a-z.-]+)``", _killpoints.__doc__ or "", re.M))


# --- the task process ---------------------------------------------------------------------------


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot, None when it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def read_ledger(ledger: Path) -> list[dict[str, Any]]:
    """The ledger's entries (one JSON object a line, each written by one ``write``)."""
    path = ledger / "ledger.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def alive_from_earlier(entries: list[dict[str, Any]], attempt: int) -> list[dict[str, Any]]:
    """Entries of attempts before ``attempt`` whose process still runs (same pid, same start)."""
    return [
        e
        for e in entries
        if e["ev"] == "start" and e["attempt"] < attempt and _start_time(e["pid"]) == e["born"]
    ]


def _append(ledger: Path, entry: dict[str, Any]) -> None:
    fd = os.open(ledger / "ledger.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (json.dumps(entry) + "\n").encode())  # one write: whole or absent
    finally:
        os.close(fd)


def _orphaned(parent: int) -> bool:
    """True if this task's runner (``parent`` when the task started) is gone, or was gone
    before the task started (then ``parent`` is whoever adopted it, not a runner)."""
    try:
        runner = b"core.cli" in Path(f"/proc/{parent}/cmdline").read_bytes()
    except OSError:
        runner = False
    return os.getppid() != parent or not runner


def task_main(ledger: Path, t: int, saves: int, state: str) -> int:
    """One task: lock, check the earlier attempts are gone, record, then count (a saver) or
    sleep (a short task). A task whose runner died (``_orphaned``) lingers ``LINGER``
    seconds, as a renderer would go on working, so that checks d and e see an orphan that
    the next attempt failed to stop."""
    attempt, parent = int(os.environ.get("CRASH_ATTEMPT", "0")), os.getppid()
    me = {"t": t, "attempt": attempt, "pid": os.getpid(), "born": _start_time(os.getpid())}
    me |= {"at": time.time(), "ppid": parent}
    lock = os.open(ledger / f"lock-{t}", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        _append(ledger, {**me, "ev": "violation", "what": f"task {t} runs twice at once"})
    old = alive_from_earlier(read_ledger(ledger), attempt)
    if old:
        _append(ledger, {**me, "ev": "violation", "what": f"alive from earlier attempts: {old}"})
    _append(ledger, {**me, "ev": "start", "resumed_from": state or None})
    if t % SAVER_EVERY == 1:
        counter = int(state or 0)
        while counter < saves:
            counter += 1
            try:
                print("openjd_checkpoint_save: " + json.dumps({"state": str(counter)}), flush=True)
            except OSError:
                pass
            time.sleep(0.004)
    else:
        time.sleep(0.02)
    if _orphaned(parent):
        time.sleep(LINGER)
    _append(ledger, {**me, "ev": "end"})
    return 0


# --- the runner's attempts ----------------------------------------------------------------------


@dataclass
class Job:
    """One job's store, ledger and what its attempts acknowledged."""

    store: str
    ledger: Path
    template: Path
    tasks: int
    attempt: int = 0
    acked: dict[int, int] = field(default_factory=dict)
    """Saver task -> the last generation the runner reported stored."""
    acked_state: dict[int, int] = field(default_factory=dict)
    succeeded: dict[int, int] = field(default_factory=dict)
    """Task -> the attempt that reported it succeeded."""
    done: bool = False


@dataclass
class Attempt:
    """One CLI process: its output lines, exit code and how it was killed."""

    how: str
    lines: list[str]
    code: int
    alive_at_start: list[dict[str, Any]] = field(default_factory=list)
    """Task processes of earlier attempts alive when this one reported its first start (d)."""


def cli_command(template: Path, store: str, ledger: Path, *params: str) -> list[str]:
    """``python -m core.cli run`` of the workload, two tasks at a time, every event shown."""
    cmd = [sys.executable, "-m", "core.cli", "run", str(template), "--store", store, "-v"]
    for p in (f"Harness={Path(__file__).resolve()}", f"Ledger={ledger}", *params):
        cmd += ["-p", p]
    # three generations kept (the default): from the fourth on a commit reuses the file of
    # the one it drops (``record.reused``)
    return [*cmd, "--max-parallel", "2", "--keep-generations", "3"]


def cli_env() -> dict[str, str]:
    """The environment of the CLI: this one, with this checkout first on ``PYTHONPATH``."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _run_attempt(job: Job, how: str, env: dict[str, str]) -> Attempt:
    """Start the CLI on ``job`` and let it run (``how`` is ``none``), die at a kill point
    (``NAME@N``) or be SIGKILLed ``random@SECONDS`` after it reported its first task started."""
    job.attempt += 1
    env = dict(env, CRASH_ATTEMPT=str(job.attempt))
    env.pop("OPENJD_CHECKPOINT_KILL_AT", None)
    kind, _, arg = how.partition("@")
    if kind not in ("random", "none"):
        env["OPENJD_CHECKPOINT_KILL_AT"] = how
    cmd = cli_command(job.template, job.store, job.ledger, f"Tasks={job.tasks}")
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []
    first_start = threading.Event()
    alive: list[dict[str, Any]] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if not first_start.is_set() and STARTED.search(line):
                alive.extend(orphans_gone(job))
                first_start.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    if kind == "random":
        while proc.poll() is None and not first_start.wait(0.05):
            pass
        if proc.poll() is None:
            time.sleep(float(arg))
            proc.send_signal(signal.SIGKILL)  # the runner only: its tasks live on, orphaned
    code = proc.wait(timeout=300)
    reader.join(timeout=5)
    return Attempt(how, lines, code, alive)


# --- the checks ---------------------------------------------------------------------------------


def store_records(store: str) -> tuple[dict[str, Any], list[str]]:
    """Every record of the store (path -> parsed JSON) and the paths that do not parse (c)."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(store)
    fs.invalidate_cache()
    parsed: dict[str, Any] = {}
    torn: list[str] = []
    if not fs.exists(root):
        return parsed, torn
    for path in fs.find(root):
        name = path.rsplit("/", 1)[-1]
        if not name.endswith(".json") or name.startswith(".tmp-"):
            continue
        try:
            parsed[path] = json.loads(fs.cat_file(path))
        except (ValueError, FileNotFoundError) as exc:
            torn.append(f"{path}: {exc}")
    return parsed, torn


def check_attempt(job: Job, at: Attempt) -> list[str]:
    """Checks a-e after one attempt; updates what ``job`` has acknowledged. Returns the
    violations found, each a sentence."""
    bad: list[str] = []
    entries = read_ledger(job.ledger)
    mine = [e for e in entries if e["attempt"] == job.attempt]
    bad += [f"ledger: {e['what']} (task {e['t']})" for e in mine if e["ev"] == "violation"]
    first = min((e["at"] for e in mine if e["ev"] == "start"), default=None)
    late = [e for e in entries if e["ev"] == "start" and e["attempt"] < job.attempt
            and first is not None and e["at"] > first]  # fmt: skip
    bad += [f"a task of attempt {e['attempt']} started after this one's first: {e}" for e in late]
    if at.alive_at_start:
        bad.append(f"processes of earlier attempts alive at the first start: {at.alive_at_start}")
    bad += [f"runner output: {line}" for line in at.lines if TORN.search(line)]
    if at.code not in (0, -signal.SIGKILL):
        bad.append(f"runner exited {at.code}: " + " | ".join(at.lines[-5:]))
    for line in at.lines:  # (a), (b): the starts against what earlier attempts acknowledged
        m = STARTED.search(line)
        if m:
            t, gen = int(m[1]), int(m[2] or 0)
            if t in job.succeeded:
                bad.append(f"Work[T={t}] reported succeeded in attempt {job.succeeded[t]} ran")
            if gen < job.acked.get(t, 0):
                bad.append(f"Work[T={t}] resumed from generation {gen} < acked {job.acked[t]}")
    for e in mine:
        t, state = e["t"], e.get("resumed_from")
        if e["ev"] == "start" and t in job.acked_state and int(state or 0) < job.acked_state[t]:
            bad.append(f"Work[T={t}] given state {state} < acknowledged {job.acked_state[t]}")
    for line in at.lines:
        if m := STORED.search(line):
            job.acked[int(m[1])] = max(job.acked.get(int(m[1]), 0), int(m[2]))
        if m := SUCCEEDED.search(line):
            job.succeeded.setdefault(int(m[1]), job.attempt)
    records, torn = store_records(job.store)
    bad += [f"torn record {p}" for p in torn]
    # killed after the run was recorded succeeded: done (a retry would be a new run)
    job.done = at.code == 0 or any(
        p.endswith("/run.json") and r.get("status") == "succeeded" for p, r in records.items()
    )
    if job.done:
        return bad
    # the newest run's tasks: an attempt that refused an older run (it stored nothing) left
    # that run's records beside the new run's, and run ids made in one second sort at random
    runs = [(r.get("created_at", 0), p.rsplit("/", 1)[0]) for p, r in records.items()
            if p.endswith("/run.json")]  # fmt: skip
    newest = max(runs)[1] + "/" if runs else ""
    tasks = {int(r["parameters"]["T"]["value"]): r for p, r in records.items()
             if p.startswith(newest) and re.search(r"/tasks/[0-9a-f-]+\.json$", p)}  # fmt: skip
    for t, gen in job.acked.items():
        rec = tasks.get(t)
        held = ((rec or {}).get("checkpoint") or {}).get("generation", 0)
        if held < gen and t not in job.succeeded:
            bad.append(f"Work[T={t}]: the store holds generation {held} < acknowledged {gen}")
        gens = [r for p, r in records.items() if p.endswith(f".gen-{gen:06d}.json")
                and r["task"]["parameters"]["T"]["value"] == str(t)]  # fmt: skip
        if gens or held == gen:  # the generation file, else the record that holds it
            job.acked_state[t] = int(gens[0]["state"] if gens else rec["checkpoint"]["state"])
    return bad


def orphans_gone(job: Job, timeout: float = 0.0, *, this: bool = False) -> list[dict[str, Any]]:
    """Task processes of the attempts before the current one (and of the current one too if
    ``this``) still alive (d, checked by the harness), after at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        alive = alive_from_earlier(read_ledger(job.ledger), job.attempt + this)
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)


# --- the order of durable writes (strace) -------------------------------------------------------

STRACE_CALLS = "write,fsync,fdatasync,rename,renameat,renameat2"
_CALL = re.compile(
    r"^(\d+)\s+(\d+\.\d+)\s+(?:<\.\.\. (\w+) resumed>|(\w+)\()(.*?)(?: <([\d.]+)>)?$"
)
_FD = re.compile(r"^\d+<([^>]*)>")
_STR = re.compile(r'"((?:[^"\\]|\\.)*)"')


@dataclass
class Call:
    """One system call of the trace: who, when it began and ended, its arguments' text."""

    pid: int
    start: float
    end: float
    name: str
    args: str
    line: int

    @property
    def path(self) -> str:
        """The path of its file descriptor (``strace -y``), or its first string argument."""
        m = _FD.match(self.args) or _STR.search(self.args)
        return m[1] if m else ""

    def text(self, index: int = 0) -> str:
        """Its ``index``-th string argument, unescaped (``strace -s`` must hold it whole)."""
        import ast

        raw = _STR.findall(self.args)[index]
        return ast.literal_eval(f'b"{raw}"').decode("utf-8", "replace")


def read_trace(path: Path) -> list[Call]:
    """The calls of an ``strace -f -y -ttt -T`` output, an interrupted call joined to its end
    (``-T``: each call's duration, so its end)."""
    calls: list[Call] = []
    pending: dict[int, Call] = {}
    for no, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        m = _CALL.match(line)
        if not m:
            continue
        pid, at, took = int(m[1]), float(m[2]), float(m[6] or 0)
        if m[3]:  # "<... fsync resumed>) = 0 <0.000612>"
            call = pending.pop(pid, None)
            if call is not None:
                call.end = max(at, call.start + took)
            continue
        call = Call(pid, at, at + took, m[4], m[5], no)
        calls.append(call)
        if m[5].endswith("<unfinished ...>"):
            pending[pid] = call
    return calls


def strace_order(calls: list[Call]) -> tuple[list[str], list[list[Call]], int]:
    """Check that every ``checkpoint generation N stored`` and ``succeeded`` event was written
    after its task record was made durable: the record's data written to its temporary file and
    fsynced, renamed over ``tasks/<id>.json``, the folder fsynced, each ending before the next
    begins and the last before the event's write begins. Returns the violations, the chain
    of calls of each event (ending with the event's write) and how many events were checked."""
    bad: list[str] = []
    chains: list[list[Call]] = []
    events = 0
    for i, ev in enumerate(calls):
        if ev.name != "write" or "openjd-checkpoint: Work[T=" not in ev.args:
            continue
        text = ev.text()
        stored, done = STORED.search(text), SUCCEEDED.search(text)
        if not (stored or done):
            continue
        events += 1
        t = int((stored or done)[1])  # type: ignore[index]
        chain = _durable_record(calls[:i], t, int(stored[2]) if stored else None)
        if chain is None:
            bad.append(f"trace line {ev.line}: {text.strip()!r} without a durable record first")
        else:
            chains.append([*chain, ev])
    return bad, chains, events


def _durable_record(calls: list[Call], t: int, gen: int | None) -> list[Call] | None:
    """The latest write-fsync-rename-folder fsync of task ``t``'s record holding checkpoint
    ``gen`` (or, ``gen`` None, saying it succeeded), each after the one before, and for a
    checkpoint first the rename that put its generation file in place (preceded by the rename
    of the dropped generation's file to that temporary name, when it was reused); None if
    none."""
    for k in range(len(calls) - 1, -1, -1):
        w = calls[k]
        if w.name != "write" or "/tasks/.tmp-" not in w.path or '\\"step\\"' not in w.args:
            continue
        try:
            rec = json.loads(w.text(0))
        except ValueError:
            continue
        if rec.get("step") != "Work" or rec["parameters"]["T"]["value"] != str(t):
            continue
        if gen is not None and (rec.get("checkpoint") or {}).get("generation") != gen:
            continue
        if gen is None and rec.get("status") != "succeeded":
            continue
        tmp, later = w.path, calls[k + 1 :]
        sync = next((c for c in later if c.name in ("fsync", "fdatasync") and c.path == tmp), None)
        ren = next((c for c in later if c.name.startswith("rename") and c.path == tmp), None)
        if ren is not None and not re.search(r"/tasks/[0-9a-f-]+\.json$", ren.text(1)):
            continue  # not the record (a generation file)
        if sync is None or ren is None or not w.end <= sync.start <= sync.end <= ren.start:
            return None
        folder = tmp.rsplit("/", 1)[0]
        dsync = next((c for c in later if c.name == "fsync" and c.path == folder
                      and c.pid == ren.pid and c.start >= ren.end), None)  # fmt: skip
        if dsync is None:
            return None
        if gen is None:
            return [w, sync, ren, dsync]
        # the generation file is in place before the record is: its body written to its
        # temporary file and that renamed to its name, both ended before the record's rename
        # begins (on a local store on another thread, while the record is written and fsynced:
        # ``core.fs._replace.replace_local_pair``), and where it took the file of the
        # generation it drops, that file's rename to the temporary name before its write
        name = f".gen-{gen:06d}.json"
        upto = calls.index(ren)
        placed = next((c for c in reversed(calls[:upto]) if c.name.startswith("rename")
                       and c.text(1).endswith(name)), None)  # fmt: skip
        if placed is None or placed.end > ren.start:
            return None
        before = list(reversed(calls[: calls.index(placed)]))
        body = next((c for c in before if c.name == "write" and c.path == placed.text(0)), None)
        if body is None or body.end > placed.start or f'"generation": {gen},' not in body.text():
            return None
        taken = next((c for c in before if c.name.startswith("rename")
                      and c.text(1) == placed.text(0)), None)  # fmt: skip
        if taken is not None and taken.end > body.start:
            return None
        return [*([taken] if taken is not None else []), body, placed, w, sync, ren, dsync]
    return None


def strace_job(workdir: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """Run a short job of the workload (one saver, two short tasks) under ``strace`` into
    ``out``."""
    template = workdir / "workload.yaml"
    template.write_text(WORKLOAD % {"python": sys.executable})
    (workdir / "ledger").mkdir(exist_ok=True)
    cmd = ["strace", "-f", "-y", "-ttt", "-T", "-s", "65536", "-e", f"trace={STRACE_CALLS}", "-o"]
    cmd += [str(out), *cli_command(template, str(workdir / "store"), workdir / "ledger")]
    cmd += ["-p", "Tasks=3", "-p", "Saves=60"]  # enough for generation 4+ on a slow machine
    return subprocess.run(cmd, cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=300)


def excerpt(chain: list[Call], root: str) -> str:
    """A chain of ``strace_order`` to quote: each call's pid, start and end, ``root`` shown as
    ``STORE``, file bodies cut."""
    lines = []
    for c in chain:
        a = c.args.replace(" <unfinished ...>", ")").replace(root, "STORE")
        a = re.sub(r"STORE/jobs/\w+/runs/[\w-]+/", "RUN/", a)
        lines.append(f"{c.pid} {c.start:.6f}-{c.end:.6f} {c.name}({a[:130]}")
        lines[-1] += '..."...' if len(a) > 130 else ""
    return "\n".join(lines)


# --- the whole run ------------------------------------------------------------------------------


@dataclass
class Result:
    """What a harness run did and found."""

    seed: int
    kills: int = 0
    by_point: dict[str, int] = field(default_factory=dict)
    jobs: int = 0
    attempts: int = 0
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> str:
        points = ", ".join(f"{k}={v}" for k, v in sorted(self.by_point.items()))
        return (
            f"seed {self.seed}: {self.kills} kills in {self.attempts} attempts of {self.jobs} "
            f"jobs, {len(self.violations)} violations, {self.seconds:.0f} s ({points})"
        )


def run_harness(
    workdir: Path,
    *,
    kills: int,
    seed: int,
    store_url: str | None = None,
    points: tuple[str, ...] | None = None,
    random_share: float = 0.4,
    tasks: int = 24,
    max_attempts: int = 60,
    max_pass: int = 12,
    lease_wait: float = 55.0,
    log: Any = None,
) -> Result:
    """Kill and resume jobs until ``kills`` kills were made. Each attempt is killed at a random
    moment (with probability ``random_share``) or at the next of ``points`` in turn (default:
    every named point), the N-th time the point is passed (N random, at most ``max_pass``,
    three times that for the ``record.*`` points, passed by every record write); a point
    stays next until it killed once. ``tasks`` is the job's size. ``store_url`` is the
    S3 base URL of the stores (default: local folders in ``workdir``); there a dead runner's
    leases free only after their ttl (60 s), so each kill is followed by ``lease_wait`` seconds
    and a refusal for a lease held by an ended process by a retry. ``log`` gets a line per
    attempt. A job that needs more than ``max_attempts`` attempts is a violation."""
    rng = random.Random(seed)
    points = kill_points() if points is None else points
    result = Result(seed)
    started = time.monotonic()
    print(f"crash harness: seed {seed}", file=log or sys.stdout, flush=True)
    template = workdir / "workload.yaml"
    template.write_text(WORKLOAD % {"python": sys.executable})
    env, turn = cli_env(), 0
    while result.kills < kills:
        result.jobs += 1
        name = f"job-{result.jobs}"
        ledger = workdir / name
        ledger.mkdir()
        store = f"{store_url}/{name}" if store_url else str(workdir / name / "store")
        job = Job(store, ledger, template, tasks)
        while not job.done:
            if job.attempt >= max_attempts:
                result.violations.append(f"seed {seed} {name}: unfinished after {job.attempt}")
                break
            if result.kills >= kills:
                how = "none"
            elif not points or (
                # random kills never take the places the named points not yet hit still need
                kills - result.kills > len(points) - min(turn, len(points))
                and rng.random() < random_share
            ):
                how = f"random@{rng.uniform(0.0, 1.5):.3f}"  # seconds after the first start
            else:
                point = points[turn % len(points)]  # the next point once this one killed
                hi = max_pass * (3 if point.startswith("record.") else 1)
                how = f"{point}@{rng.randint(1, hi)}"
            at = _run_attempt(job, how, env)
            result.attempts += 1
            if store_url and at.code == 4 and any(LEASE_HELD in line for line in at.lines):
                time.sleep(5.0)  # an S3 lease of the dead runner: it frees after its ttl
                continue
            killed = at.code == -signal.SIGKILL
            if killed:
                result.kills += 1
                key = how.partition("@")[0]
                result.by_point[key] = result.by_point.get(key, 0) + 1
                turn += key != "random"
            (ledger / f"attempt-{job.attempt}.log").write_text("\n".join(at.lines) + "\n")
            found = check_attempt(job, at)
            # a killed attempt's tasks may run on until the next attempt reaps them
            if not killed and (left := orphans_gone(job, timeout=5.0, this=True)):
                found.append(f"processes alive after the job ended: {left}")
            for v in found:
                result.violations.append(
                    f"seed {seed} {name} attempt {job.attempt} ({how}, exit {at.code}): {v}"
                )
            if killed and store_url:
                time.sleep(lease_wait)
            if log is not None:
                acks = f"acked={job.acked} states={job.acked_state}"
                print(f"{name} attempt {job.attempt}: {how} exit {at.code} {acks} "
                      f"{len(found)} violations", file=log, flush=True)  # fmt: skip
    result.seconds = time.monotonic() - started
    return result


def main(argv: list[str] | None = None) -> int:
    """The script: ``crash_harness.py --kills N --seed S [--s3]``, or a task process."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["task"]:
        return task_main(Path(args[1]), int(args[2]), int(args[3]), args[4])
    parser = argparse.ArgumentParser(prog="crash_harness.py")
    parser.add_argument("--kills", type=int, default=220)
    parser.add_argument("--seed", type=int, default=random.SystemRandom().randrange(10**6))
    parser.add_argument("--s3", action="store_true", help="stores on the moto S3 test server")
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("-v", "--verbose", action="store_true")
    opts = parser.parse_args(args)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the S3 server on a kill
    import tempfile

    workdir = opts.workdir or Path(tempfile.mkdtemp(prefix="openjd-crash-"))
    workdir.mkdir(parents=True, exist_ok=True)
    log = sys.stdout if opts.verbose else None
    if opts.s3:
        sys.path.insert(0, str(ROOT / "tests"))
        from s3server import running_s3_server

        with running_s3_server() as server:
            s3_points = tuple(p for p in kill_points() if not p.startswith("record."))
            res = run_harness(workdir, kills=opts.kills, seed=opts.seed, log=log,
                              store_url=server.new_store(), points=s3_points)  # fmt: skip
    else:
        res = run_harness(workdir, kills=opts.kills, seed=opts.seed, log=log)
    print("\n".join(res.violations))
    print(res.summary())
    return 1 if res.violations else 0


if __name__ == "__main__":
    sys.exit(main())
