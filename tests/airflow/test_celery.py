"""Several hosts with the CeleryExecutor: two ``airflow celery worker`` processes (host-a,
host-b: own folders, own ``TMPDIR``, own ``OPENJD_CHECKPOINT_HOST_ID``, both on the ``default``
queue) stand in for two machines that share one checkpoint store and one Redis broker. The store
is on the S3 protocol (``[openjd_checkpoint] store = s3://...`` on the session's moto server,
``tests/s3server.py``; the workers inherit its endpoint and credentials through the
environment), with managed checkpoint files (``[openjd_checkpoint] files = managed``).

- ``test_managed_files_resume_on_the_other_host``: the training example
  (``examples/managed-files/training.yaml``) keeps its model file and samples in its session
  working directory on host-a; the running task instance is cleared while host-a takes no new
  work, so its next try runs on host-b, where the store restores those files into a session
  working directory of host-b's: it resumes from the restored model file and sums every sample.

Two counters (``tests/data/counter.yaml``, two DAG runs) run on host-a at once (host-b stops
consuming for that while, through Celery's remote control). Once both stored a checkpoint,
host-a's worker is SIGKILLed with everything under it (Celery's pool, the task supervisors, the
task runners, the OpenJD task processes in their own process groups), except the task process
of the second counter: it lives on, as on a host cut off by a network partition, frozen with
SIGSTOP so that it is still there when its retry ends (running, it would finish first: it is
ahead of the checkpoint its retry resumes from). No hook runs, no state changes: Airflow only
notices the missing task heartbeats (``[scheduler] task_instance_heartbeat_timeout``, lowered
here to ``HEARTBEAT_TIMEOUT``), fails both task instances and retries them, on host-b. On an S3
store a dead holder's task lease expires only after its ttl (``LEASE_TTL``), not at once like a
flock: a retry before then would be refused (``already-resumed``), so the counters' DAG waits
``RETRY_DELAY`` before a retry.

- ``test_a_dead_worker_s_task_resumes_on_the_other_host``: the first counter's retry runs on
  host-b, resumes from the last checkpoint and counts right; the DAG run succeeds.
- ``test_a_live_process_of_another_host_is_not_killed``: so does the second counter's, and the
  core on host-b took the task over without killing the process recorded under host-a (it
  kills what a dead holder left only on the host id that recorded it); the test kills it.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import airflow_helpers as ah
import psutil
import pytest
from airflow_fixtures import SESSION_ROOT, new_stack, start_stack, stop_stack

from core import CheckpointStore, RunRecord, RunStatus, TaskRecord
from core._records import ProcessInfo

ROOT = Path(__file__).resolve().parents[2]
COUNTER = ROOT / "tests" / "data" / "counter.yaml"
TRAINING = ROOT / "examples" / "managed-files" / "training.yaml"
DAG_ID = "celery_counter"
TASK = "Count"  # the counter's one step: a mapped task with one instance
TRAINING_DAG_ID = "celery_training"
TRAINING_TASK = "Train"
HOSTS = ("host-a", "host-b")
LOST, OTHER = HOSTS
QUEUE = "default"
MARKER = "OPENJD_CHECKPOINT_SESSION"
HEARTBEAT_TIMEOUT = 12  # [scheduler] task_instance_heartbeat_timeout for this stack, seconds
LEASE_TTL = 60  # a task lease on an S3 store expires this long after its holder's last renewal
RETRY_DELAY = LEASE_TTL  # the counters' retry_delay: the retry comes after HEARTBEAT_TIMEOUT + it
KILL_NOTE = "left running by"  # the core's note when it kills what a dead holder left

DAG_FILE = """
from datetime import timedelta

from airflow_plugin import dag_from_template

# No store or files argument: the workers' [openjd_checkpoint] store and files settings.
dag = dag_from_template(
    {template!r},
    dag_id={dag_id!r},
    default_args={{"retries": 2, "retry_delay": timedelta(seconds={retry_delay})}},
)
"""

pytestmark = pytest.mark.slow


def _require_celery() -> None:
    """Skip without Redis, the Celery provider or the S3 server's packages; in CI (CI=true),
    fail instead."""
    missing = []
    if ah.redis_server_binary() is None:
        missing.append("redis-server (Debian package redis-server; .ci/run installs it)")
    try:
        importlib.metadata.version("apache-airflow-providers-celery")
    except importlib.metadata.PackageNotFoundError:
        missing.append("apache-airflow-providers-celery (the [airflow] extra)")
    for package in ("s3fs", "moto"):
        try:
            importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            missing.append(f"{package} (the [test] extra)")
    if missing:
        message = "the CeleryExecutor tests need " + " and ".join(missing)
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


# ---------------------------------------------------------------------------------- fixtures


class StoreWatcher:
    """Polls the shared store from a thread and keeps every process each core run's task
    records showed (a record is deleted once its run succeeds: a test that looks later still
    learns where each try ran)."""

    def __init__(self, store_url: str, interval: float = 0.5) -> None:
        self.store = CheckpointStore(store_url)
        self.interval = interval
        self._seen: dict[str, list[ProcessInfo]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="celery-store-watch", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                runs = self.store.list_runs()[0]
                for run in runs:
                    if run.external_key is None:
                        continue
                    for rec in self.store.read_tasks(run.job_key, run.run_id)[0]:
                        if rec.process is not None and rec.process.pid:  # 0: starting
                            with self._lock:
                                seen = self._seen.setdefault(run.external_key, [])
                                if rec.process not in seen:
                                    seen.append(rec.process)
            except Exception:  # a run deleted or written meanwhile: next round
                continue

    def processes(self, key: str) -> list[ProcessInfo]:
        """The task processes seen so far for the core run of DAG run ``key``, in order."""
        with self._lock:
            return list(self._seen.get(key, []))

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._seen)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)


@dataclass
class CeleryHosts:
    """The stack (scheduler, dag-processor, api-server; CeleryExecutor), its Redis broker,
    one Celery worker per host, and the shared checkpoint store."""

    stack: ah.AirflowStack
    redis: ah.RedisServer
    workers: dict[str, ah.CeleryWorker]
    store_url: str
    watcher: StoreWatcher
    markers: set[str] = field(default_factory=set)  # of every task process the tests saw

    @property
    def client(self) -> ah.AirflowClient:
        return self.stack.client

    @property
    def store(self) -> CheckpointStore:
        return CheckpointStore(self.store_url)

    def ensure_workers(self, timeout: float = 120.0) -> None:
        """Every host's worker running and consuming (a killed one is started again)."""
        for worker in self.workers.values():
            worker.start()
        for worker in self.workers.values():
            worker.wait_ready(timeout)

    def consume(self, host: str, on: bool) -> None:
        """Make ``host``'s worker start or stop taking tasks from the queue (Celery's
        ``add_consumer``/``cancel_consumer`` remote control commands, through the broker)."""
        from celery import Celery

        app = Celery(broker=self.redis.url(0))
        try:
            destination = [f"celery@{host}"]
            if on:
                replies = app.control.add_consumer(
                    QUEUE,
                    exchange=QUEUE,
                    routing_key=QUEUE,
                    destination=destination,
                    reply=True,
                    timeout=10,
                )
            else:
                replies = app.control.cancel_consumer(
                    QUEUE, destination=destination, reply=True, timeout=10
                )
        finally:
            app.close()
        assert replies and all("ok" in r for reply in replies for r in reply.values()), replies

    def report(self) -> str:
        """The workers' log tails (the stack's come with the failure report)."""
        parts = [f"===== shared checkpoint store: {self.store_url}"]
        for host, worker in self.workers.items():
            parts.append(f"===== celery worker {host}: {worker.log_path} (last 40 lines)")
            parts.append(ah.tail(worker.log_path, 40))
        return "\n".join(parts)


@pytest.fixture(scope="module")
def celery_hosts(migrated_db: Path, request: pytest.FixtureRequest) -> Iterator[CeleryHosts]:
    """Redis on 127.0.0.1, a CeleryExecutor stack and two workers (host-a, host-b), started
    together, their store on the session's S3 server (whose settings every process of the
    stack inherits); stopped at the end of the module (SIGTERM, then SIGKILL), leaving none of
    their processes (checked with psutil)."""
    _require_celery()
    s3 = request.getfixturevalue("s3_server")  # before the stack: its env carries the endpoint
    root = SESSION_ROOT / "celery-hosts"
    redis = ah.RedisServer(root / "redis")
    store = s3.new_store("celery-hosts")
    settings = {
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__CELERY__BROKER_URL": redis.url(0),
        # Results in Redis too: the default (db+ the metadata database) would have the workers
        # write into the scheduler's sqlite file.
        "AIRFLOW__CELERY__RESULT_BACKEND": redis.url(1),
        "AIRFLOW__CELERY__WORKER_CONCURRENCY": "2",
        "AIRFLOW__CELERY__SYNC_PARALLELISM": "1",  # no process pool in the scheduler
        "AIRFLOW__CELERY__OPERATION_TIMEOUT": "10",  # sending to Redis on a busy machine
        # A lost worker is noticed when its task instances miss heartbeats this long.
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT),
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "2",
        "AIRFLOW__OPENJD_CHECKPOINT__STORE": store,
        "AIRFLOW__OPENJD_CHECKPOINT__FILES": "managed",
    }
    stack = new_stack("celery", migrated_db, extra_env=settings)
    ah.prepare_home(stack.home)
    workers = {
        host: ah.CeleryWorker(host=host, folder=root / host, env=stack.env, concurrency=2)
        for host in HOSTS
    }
    watcher = StoreWatcher(store)
    hosts = CeleryHosts(stack=stack, redis=redis, workers=workers, store_url=store, watcher=watcher)
    # In the dags folder before the dag-processor starts: parsed while the rest starts.
    for dag_id, template, delay in (
        (DAG_ID, COUNTER, RETRY_DELAY),
        (TRAINING_DAG_ID, TRAINING, 1),
    ):
        source = DAG_FILE.format(template=str(template), dag_id=dag_id, retry_delay=delay)
        (stack.dags_folder / f"{dag_id}.py").write_text(source)
    seen: list[psutil.Process] = []
    try:
        started = time.monotonic()
        redis.start()
        for worker in workers.values():  # they start while the stack does
            worker.start()
        start_stack(stack)
        hosts.ensure_workers()
        stack.client.wait_for_dag(DAG_ID, timeout=120)
        stack.client.wait_for_dag(TRAINING_DAG_ID, timeout=120)
        ah.TIMINGS["celery: stack, Redis and two workers ready"] = time.monotonic() - started
        yield hosts
    finally:
        watcher.close()
        stopped = time.monotonic()
        for worker in workers.values():
            seen += worker.tree()
        stoppers = [threading.Thread(target=w.stop) for w in workers.values()]
        for thread in stoppers:  # together: each may wait for Celery's warm shutdown
            thread.start()
        for thread in stoppers:
            thread.join()
        seen += stack.processes()
        stop_stack(stack)
        if redis.proc is not None and redis.proc.poll() is None:
            seen.append(psutil.Process(redis.proc.pid))
        redis.stop()
        ah.TIMINGS["celery: workers, stack and Redis stop"] = time.monotonic() - stopped
        markers = {p.marker or "" for key in watcher.keys() for p in watcher.processes(key)}
        leftovers = [p for p in seen if _alive(p)] + _marked(hosts.markers | markers)
        notes = [n for w in workers.values() for n in w.leftovers]
        if notes:
            ah.NOTES["celery workers leftovers"] = "; ".join(notes)
        _kill(leftovers)
        assert not leftovers, f"processes left behind: {ah.describe(leftovers)}"


@dataclass
class Counter:
    """One counter's DAG run and its task record when host-a was lost."""

    run_id: str
    key: str  # the core run's external key, dag_id/run_id
    n: int
    record: TaskRecord
    checkpointed: int = 0  # the count in the last checkpoint stored before the loss


@dataclass
class LostHost:
    dead: Counter  # its task process died with host-a's worker
    survivor: Counter  # its task process lives on, frozen
    frozen: list[psutil.Process]
    lost_at: float


@pytest.fixture(scope="module")
def lost_host(celery_hosts: CeleryHosts) -> Iterator[LostHost]:
    """Both counters running on host-a with a checkpoint; then host-a's worker SIGKILLed with
    its whole process tree but the second counter's task process (frozen)."""
    hosts = celery_hosts
    hosts.ensure_workers()
    frozen: list[psutil.Process] = []
    try:
        hosts.consume(OTHER, False)
        try:
            triggered = [(_trigger(hosts, n), n) for n in (40, 24)]
            dead, survivor = (_running(hosts, run_id, n) for run_id, n in triggered)
            for c in (dead, survivor):
                assert c.record.process is not None and c.record.process.host == LOST
            tree = {p.pid for p in hosts.workers[LOST].tree()}
            assert dead.record.process and dead.record.process.pid in tree
            assert survivor.record.process and survivor.record.process.pid in tree
            frozen = _marked({survivor.record.process.marker or ""})
            assert survivor.record.process.pid in {p.pid for p in frozen}
            for p in frozen:  # first: it does nothing while everything around it dies
                p.send_signal(signal.SIGSTOP)
            spared = {p.pid for p in frozen}
            lost_at = time.monotonic()
            killed = hosts.workers[LOST].kill_tree(spare=lambda p: p.pid in spared)
        finally:
            hosts.consume(OTHER, True)
        assert dead.record.process.pid in killed
        assert not hosts.workers[LOST].running() and not hosts.workers[LOST].tree()
        assert not _marked({dead.record.process.marker or ""}), "died with the worker"
        assert all(_alive(p) for p in frozen)
        for c in (dead, survivor):
            ti = hosts.client.task_instance(DAG_ID, c.run_id, TASK, 0)
            assert ti["state"] == "running" and ti["try_number"] == 1  # nobody noticed
            found = _task_record(hosts.store, c.key)  # nothing stores anything any more
            assert found and found[1] and found[1].checkpoint
            c.checkpointed = int((found[1].checkpoint.state or "0,0").split(",")[0])
        yield LostHost(dead=dead, survivor=survivor, frozen=frozen, lost_at=lost_at)
    except BaseException:
        print(hosts.report())
        raise
    finally:
        _kill(frozen)  # when the test that kills it did not run


# ---------------------------------------------------------------------------------- helpers


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _kill(procs: list[psutil.Process]) -> None:
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)


def _marked(markers: set[str]) -> list[psutil.Process]:
    """Live processes whose OPENJD_CHECKPOINT_SESSION is one of ``markers``."""
    found: list[psutil.Process] = []
    markers = markers - {""}
    if not markers:
        return found
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get(MARKER) in markers:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _task_record(store: CheckpointStore, key: str) -> tuple[RunRecord, TaskRecord | None] | None:
    """The core run of the DAG run ``key`` (``dag_id/run_id``) and its task's record."""
    for run in store.list_runs()[0]:
        if run.external_key == key:
            records = store.read_tasks(run.job_key, run.run_id)[0]
            return run, (records[0] if records else None)
    return None


def _wait_record(
    hosts: CeleryHosts, key: str, ready: Callable[[TaskRecord], bool], what: str, timeout: float
) -> TaskRecord:
    def poll() -> TaskRecord | None:
        found = _task_record(hosts.store, key)
        rec = found[1] if found else None
        return rec if rec is not None and ready(rec) else None

    rec = ah.wait_until(poll, timeout=timeout, interval=0.2, what=what)
    assert rec.process is not None and rec.process.marker
    hosts.markers.add(rec.process.marker)
    return rec


def _trigger(hosts: CeleryHosts, n: int) -> str:
    """A counter to ``n`` (a step every 0.25 s, a checkpoint every 4): its DAG run id."""
    return hosts.client.trigger(DAG_ID, conf={"N": n, "StepSeconds": 0.25, "SaveEvery": 4})


def _running(hosts: CeleryHosts, run_id: str, n: int) -> Counter:
    """The counter once its task stored a checkpoint (and runs its process)."""
    key = f"{DAG_ID}/{run_id}"
    record = _wait_record(
        hosts,
        key,
        lambda r: r.checkpoint is not None and r.process is not None and r.process.pid > 0,
        f"counter {run_id} to store a checkpoint",
        timeout=180,
    )
    return Counter(run_id=run_id, key=key, n=n, record=record)


def _wait_retry_on(hosts: CeleryHosts, key: str, host: str) -> ProcessInfo:
    """Wait until Airflow noticed the lost worker and the retry's process ran on ``host``;
    the task's processes so far are the first try's (on host-a) and that one."""

    def retried() -> ProcessInfo | None:
        return next((p for p in hosts.watcher.processes(key) if p.host == host), None)

    what = (
        f"the retry to start on {host} (heartbeat timeout {HEARTBEAT_TIMEOUT} s, retry delay "
        f"{RETRY_DELAY} s)"
    )
    process = ah.wait_until(
        retried, timeout=HEARTBEAT_TIMEOUT + RETRY_DELAY + 150, interval=0.2, what=what
    )
    seen = [p.host for p in hosts.watcher.processes(key)]
    assert set(seen) <= {LOST, host} and seen.count(host) == 1, seen  # one retry, there
    return process


def _starts(log: str) -> list[int]:
    return [int(m) for m in re.findall(r"COUNTER-START pid=\d+ from=(\d+)", log)]


def _check_resumed(hosts: CeleryHosts, counter: Counter) -> str:
    """The DAG run succeeded with the right count; its retry (try 2) resumed from the last
    checkpoint; no kill note in any try. Returns the retry's log."""
    client = hosts.client
    run = client.wait_dag_run(DAG_ID, counter.run_id, timeout=180)
    states = {
        (t["task_id"], t["map_index"]): (t["state"], t["try_number"])
        for t in client.task_instances(DAG_ID, counter.run_id)
    }
    assert run["state"] == "success", states
    ti = client.task_instance(DAG_ID, counter.run_id, TASK, 0)
    assert ti["try_number"] == 2, states
    first = client.task_log(DAG_ID, counter.run_id, TASK, 1, map_index=0)
    retry = client.task_log(DAG_ID, counter.run_id, TASK, 2, map_index=0)
    assert _starts(first) == [0], first[-3000:]
    assert "resuming from checkpoint generation" in retry, retry[-3000:]
    assert counter.checkpointed > 0
    assert _starts(retry) == [counter.checkpointed], retry[-3000:]  # not from 0
    n = counter.n
    assert f"COUNTER-DONE n={n} sum={n * (n + 1) // 2}" in retry, retry[-3000:]
    for log in (first, retry):
        assert KILL_NOTE not in log, log[-3000:]
    # Airflow's own path: the scheduler failed the silent task instance, then retried it.
    scheduler_log = hosts.stack.log_path("scheduler").read_text(errors="replace")
    assert "Detected a task instance without a heartbeat" in scheduler_log
    found = _task_record(hosts.store, counter.key)
    assert found is not None
    core_run = found[0]
    assert core_run.status == RunStatus.SUCCEEDED and core_run.attempt == 1
    return retry


# ------------------------------------------------------------------------------------ tests


def test_managed_files_resume_on_the_other_host(celery_hosts: CeleryHosts) -> None:
    """The training task runs on host-a and writes its model file and samples in its session
    working directory there. Cleared while host-a takes no new work, it checkpoints (the store
    keeps the files: ``[openjd_checkpoint] files = managed``) and its next try runs on host-b,
    in a session working directory of host-b's, where the store restored the files: it resumes
    from the restored model file and sums every sample, host-a's included."""
    hosts = celery_hosts
    client = hosts.client
    hosts.ensure_workers()
    # An epoch a second: the store keeps up with the saves, so the one the stop asks for is
    # committed within the 4 s Airflow leaves a killed task (operators.KILL_BUDGET_SECONDS).
    epochs = 10
    expected = sum(k * k for k in range(epochs))
    key = ""
    try:
        hosts.consume(OTHER, False)
        try:
            run_id = client.trigger(TRAINING_DAG_ID, conf={"Epochs": epochs, "EpochSeconds": 1.0})
            key = f"{TRAINING_DAG_ID}/{run_id}"
            first = _wait_record(
                hosts,
                key,
                lambda r: (
                    r.checkpoint is not None
                    and r.checkpoint.generation >= 2
                    and r.process is not None
                    and r.process.pid > 0
                ),
                "the training task to store its second checkpoint",
                timeout=180,
            )
            assert first.process is not None and first.process.host == LOST
            assert first.checkpoint is not None and first.checkpoint.manifest  # files kept
        finally:
            hosts.consume(OTHER, True)
        hosts.consume(LOST, False)
        try:
            client.clear_task_instances(TRAINING_DAG_ID, run_id, [(TRAINING_TASK, 0)])
            retry = _wait_retry_on(hosts, key, OTHER)
        finally:
            hosts.consume(LOST, True)
        assert retry.pid != first.process.pid
        run = client.wait_dag_run(TRAINING_DAG_ID, run_id, timeout=180)
        assert run["state"] == "success", client.task_instances(TRAINING_DAG_ID, run_id)
        ti = client.task_instance(TRAINING_DAG_ID, run_id, TRAINING_TASK, 0)
        log1 = client.task_log(TRAINING_DAG_ID, run_id, TRAINING_TASK, 1, map_index=0)
        log2 = client.task_log(
            TRAINING_DAG_ID, run_id, TRAINING_TASK, ti["try_number"], map_index=0
        )
        a_tmp = str(hosts.workers[LOST].folder / "tmp") + os.sep
        b_tmp = str(hosts.workers[OTHER].folder / "tmp") + os.sep
        saved = re.findall(r'openjd_checkpoint_save: \{"file": "([^"]+)"\}', log1)
        assert saved and all(path.startswith(a_tmp) for path in saved), log1[-3000:]
        [(epoch, model)] = re.findall(r"resumed at epoch (\d+) from (\S+)", log2)
        assert model.startswith(b_tmp) and model.endswith("model.txt"), log2[-3000:]
        assert 2 <= int(epoch) < epochs
        assert f"result: {expected}" in log2, log2[-3000:]
        assert "checkpoint files: managed" in log2
        listing = client.request(
            "GET", f"/openjd/dags/{TRAINING_DAG_ID}/dagRuns/{run_id}/checkpoints"
        ).json()
        assert listing["file_data_flow"] == "managed" and listing["status"] == "succeeded"
    except BaseException:
        print(hosts.report())
        raise


def test_a_dead_worker_s_task_resumes_on_the_other_host(
    celery_hosts: CeleryHosts, lost_host: LostHost
) -> None:
    """The first counter's worker died with its whole process tree, task process included.
    Airflow's heartbeat timeout fails the task instance and retries it; the retry runs on the
    other host and resumes from the last checkpoint; the DAG run succeeds."""
    hosts = celery_hosts
    try:
        retry = _wait_retry_on(hosts, lost_host.dead.key, OTHER)
        ah.TIMINGS["celery: lost host's task running again on the other host"] = (
            time.monotonic() - lost_host.lost_at
        )
        assert lost_host.dead.record.process is not None
        assert retry.pid != lost_host.dead.record.process.pid
        _check_resumed(hosts, lost_host.dead)
        ah.TIMINGS["celery: lost host's DAG run done on the other host"] = (
            time.monotonic() - lost_host.lost_at
        )
    except BaseException:
        print(hosts.report())
        raise


def test_a_live_process_of_another_host_is_not_killed(
    celery_hosts: CeleryHosts, lost_host: LostHost
) -> None:
    """The second counter's task process outlived its worker and task runner (its task lease
    died with the runner). The retry on the other host takes the task over and resumes from
    the checkpoint, but must not kill a process recorded under another host id."""
    hosts = celery_hosts
    survivor = lost_host.survivor
    assert survivor.record.process is not None
    old = survivor.record.process
    try:
        retry = _wait_retry_on(hosts, survivor.key, OTHER)
        assert retry.pid != old.pid
        _check_resumed(hosts, survivor)
        alive = [p for p in lost_host.frozen if _alive(p)]
        assert alive == lost_host.frozen, f"killed across host ids: {ah.describe(alive)}"
        assert old.pid in {p.pid for p in _marked({old.marker or ""})}
    except BaseException:
        print(hosts.report())
        raise
    finally:
        _kill(lost_host.frozen)
    assert not _marked({old.marker or ""})
