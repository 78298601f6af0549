"""One job, three runners, equal records (issue 24): the scenario of
``tests/data/equal_records/job.yaml`` driven the same way on the CLI, Airflow and Prefect, and
its stored records read back, normalized and compared with one golden file.

Importable from all three suites (it imports only ``core``). The scenario, on every runner:

1. ``Work[I=1]`` checkpoints and succeeds; ``Work[I=2]`` checkpoints (``2-started``) and waits.
2. ``Conductor`` writes the interruption notice file (``file:`` source): ``Work[I=2]`` is asked
   to checkpoint (``2-noticed``) and stops. The environment's ``onExit`` fails as the session
   closes.
3. The runner goes on the way it goes on after a notice (the CLI: run again, which resumes;
   Airflow and Prefect: their task retry). ``Work[I=2]`` resumes (``2-resumed``) and waits.
4. ``Conductor`` asks for ``CancelledRunFinally``: ``Work[I=2]`` is canceled, ``Cleanup``
   (finally) runs, every session's ``onExit`` fails again.

``load_records(store)`` reads every record of the store's runs through ``CheckpointStore``: the
run record (its notices and environment failures included), its stop requests, its open
sessions, its task records and every checkpoint generation of each task. ``normalize`` then
takes out only what names a process, a host, a moment or an id, so that what is left must be
equal field for field:

- ``run_id`` (every record): a random id; written ``<run>`` (every record of the store names
  its one run). ``job_key`` is kept: it is a hash of the template's name, equal everywhere.
- ``created_at``, ``updated_at`` (run, task), ``saved_at`` and ``commit_seconds``
  (checkpoint, generation), ``requested_at`` (stop request), a notice's ``received_at``,
  ``deadline`` and ``stopped_after``, a stop request's ``deadline``: moments and durations of
  this one run.
- ``runner`` (run), ``process`` (task), ``requested_by`` (stop request): pid, process group,
  start time and host of the process that held the run or task or asked for the stop; the
  ``host`` and ``pid`` of an open session record, the ``host`` that last ran a task, and a
  task's attempt ``history`` (its times and hosts).
- ``external_key``, ``attempt_key`` (run): the scheduler's own ids (an Airflow
  ``dag_id/run_id``, a Prefect flow run id; None for the CLI).
- the test's temporary folder (the notice file's path in a notice's ``detail``, the store's
  path in messages) is written ``<tmp>``, and the clone's folder (in ``template_path``)
  ``<repo>``: where the test happens to run.

Nothing else is dropped: statuses, conditions and their messages, attempts, generations and
their states, the notices' source, kind and attempt, the environment failures' messages, the
stop requests' modes, phases and attempts, skipped and finally steps are compared as stored.

Golden file: ``tests/data/equal_records/records.json``, written by the CLI's test
(``tests/test_equal_records.py``) when ``OPENJD_REGEN_EQUAL_RECORDS=1`` is set::

    OPENJD_REGEN_EQUAL_RECORDS=1 .venv/bin/python -m pytest tests/test_equal_records.py

The CLI's records and an adapter's differ in two ways that the runners' models make, decided to
stay (``docs/decisions.md``); ``expected_for_adapter(golden)`` derives from the golden file
exactly what Airflow and Prefect must record, and their tests compare with that.
"""

from __future__ import annotations

import copy
import difflib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from core import CheckpointStore, request_termination

__all__ = (
    "GOLDEN",
    "JOB",
    "MODE",
    "Conductor",
    "RecordsDifferError",
    "assert_equal_records",
    "expected_for_adapter",
    "load_records",
    "normalize",
    "records_diff",
)

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "equal_records"
JOB = DATA / "job.yaml"
GOLDEN = DATA / "records.json"
MODE = "CancelledRunFinally"
REGEN = "OPENJD_REGEN_EQUAL_RECORDS"

_MOMENTS = ("created_at", "updated_at", "saved_at", "requested_at", "commit_seconds")
_NOTICE_MOMENTS = ("received_at", "deadline", "stopped_after")
_PROCESSES = ("runner", "process", "requested_by")
_EXTERNAL_IDS = ("external_key", "attempt_key")


class RecordsDifferError(AssertionError):
    """A runner's normalized records are not the golden file's (the message is the diff)."""


def load_records(location: str | Path) -> list[dict[str, Any]]:
    """Every record of every run in the store, as JSON-ready dicts (one per run)."""
    store = CheckpointStore(location)
    runs, damaged = store.list_runs()
    assert not damaged, f"damaged run records: {damaged}"
    out = []
    for run in sorted(runs, key=lambda r: r.created_at):
        tasks, bad = store.read_tasks(run.job_key, run.run_id)
        assert not bad, f"damaged task records: {bad}"
        out.append(
            {
                "run": run.model_dump(mode="json"),
                "stop_requests": [
                    r.model_dump(mode="json")
                    for r in store.read_stop_requests(run.job_key, run.run_id)
                ],
                "sessions": [
                    s.model_dump(mode="json") for s in store.sessions.list(run.job_key, run.run_id)
                ],
                "tasks": [
                    {
                        "record": t.model_dump(mode="json"),
                        "generations": [
                            g.model_dump(mode="json") for g in store.list_generations(t)
                        ],
                    }
                    for t in sorted(tasks, key=lambda t: (t.step, t.task_key))
                ],
            }
        )
    return out


def normalize(records: list[dict[str, Any]], tmp: str | Path) -> list[dict[str, Any]]:
    """``records`` without ids, moments and process facts (the module docstring lists them)."""
    tmp = str(tmp)

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            out = {}
            for key, item in value.items():
                if key in _MOMENTS or key in _PROCESSES or key in _EXTERNAL_IDS:
                    continue
                if key == "run_id":
                    out[key] = "<run>"
                else:
                    out[key] = walk(item)
            return out
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, str):
            return value.replace(tmp, "<tmp>").replace(str(REPO), "<repo>")
        return value

    normal = walk(records)
    for entry in normal:
        run = entry["run"]
        run["notices"] = [
            {k: v for k, v in n.items() if k not in _NOTICE_MOMENTS} for n in run["notices"]
        ]
        for request in entry["stop_requests"]:
            request.pop("deadline", None)
        for session in entry["sessions"]:
            session.pop("host", None)
            session.pop("pid", None)
        for task in entry["tasks"]:
            task["record"].pop("host", None)
            task["record"].pop("history", None)
    return normal


def _dump(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True) + "\n"


def expected_for_adapter(golden: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What Airflow and Prefect must record for this scenario, derived from the CLI's golden
    (normalized) records: a copy with exactly the two differences below, everything else equal
    field for field. ``golden`` is not changed.

    (A) A notice. ``docs/decisions.md``, "Interruption notices" / "What a notice does" and "One
    executor for every runner": the CLI drives the whole run, so its notice suspends the run (a
    run-level ``Suspended`` stop request; attempt 1 ends interrupted and the next ``run`` is
    attempt 2); on Airflow and Prefect only the unit's try fails, and the framework's task
    retry resumes ``Work[I=2]`` within attempt 1. So, on an adapter:

    - ``stop_requests``: the CLI's notice request ``{mode: Suspended, attempt: 1, phase:
      regular, force: false}`` is not there (the golden must hold exactly one).
    - the run attempt of the resume, the golden's ``run.attempt`` (2), is 1 wherever a run
      attempt is written: ``run.attempt``, ``run.environment_failures[].attempt``,
      ``run.notices[].attempt``, ``stop_requests[].attempt`` (the ``CancelledRunFinally``
      request, made while the resumed task ran), each task record's ``run_attempt``
      (``Cleanup``, ``Work[I=2]``), its ``checkpoint.attempt`` and its ``generations[].attempt``
      (``Work[I=2]``'s ``2-resumed``). Values 1 stay 1. A task record's own ``attempt`` (its
      tries: ``Work[I=2]`` is tried twice on every runner) is not a run attempt and stays.

    (B) Sessions. ``docs/decisions.md``, "Sessions" / "Sessions of a local run", "On Airflow",
    "On Prefect": the CLI keeps one session per ``--max-parallel`` slot for the whole attempt,
    the finally step included, so in attempt 2 the session that resumed ``Work[I=2]`` also ran
    ``Cleanup`` and its failing ``onExit`` is recorded once; an adapter opens one session per
    unit (task instance, task run), so the resumed ``Work[I=2]`` and ``Cleanup`` each close
    one. So ``run.environment_failures`` is the golden's (attempts mapped as in A), in order,
    and one more entry equal to its last: the finally unit's own session, the same
    environment's same failure in the same (last) attempt. Attempt 1's sessions agree (the
    CLI's two slots; an adapter's ``Work[I=1]`` and ``Work[I=2]``'s first try).
    """
    check_nontrivial(golden)
    want = copy.deepcopy(golden)
    (entry,) = want
    run = entry["run"]
    resume = run["attempt"]
    assert resume == 2, f"the golden run should end in attempt 2 (the CLI's resume): {resume}"

    def attempt(value: int) -> int:
        return 1 if value == resume else value

    notice_request = {"attempt": 1, "force": False, "mode": "Suspended", "phase": "regular"}
    suspended = [r for r in entry["stop_requests"] if r["mode"] == "Suspended"]
    assert suspended == [notice_request], suspended
    entry["stop_requests"] = [r for r in entry["stop_requests"] if r["mode"] != "Suspended"]
    for request in entry["stop_requests"]:
        request["attempt"] = attempt(request["attempt"])
    run["attempt"] = attempt(run["attempt"])
    for item in (*run["environment_failures"], *run["notices"]):
        item["attempt"] = attempt(item["attempt"])
    run["environment_failures"].append(copy.deepcopy(run["environment_failures"][-1]))
    for task in entry["tasks"]:
        record = task["record"]
        record["run_attempt"] = attempt(record["run_attempt"])
        if record["checkpoint"] is not None:
            record["checkpoint"]["attempt"] = attempt(record["checkpoint"]["attempt"])
        for generation in task["generations"]:
            generation["attempt"] = attempt(generation["attempt"])
    return want


def assert_equal_records(location: str | Path, tmp: str | Path, runner: str) -> None:
    """The store's records, normalized, equal the golden file's (the CLI's) or, for an adapter
    (``runner`` other than ``"cli"``), ``expected_for_adapter`` of it; with ``OPENJD_REGEN_
    EQUAL_RECORDS=1`` (the CLI's test only) they are written as the new golden file instead."""
    got = normalize(load_records(location), tmp)
    check_nontrivial(got)
    if os.environ.get(REGEN) == "1" and runner == "cli":
        GOLDEN.write_text(_dump(got))
    want = json.loads(GOLDEN.read_text())
    check_nontrivial(want)
    source = f"golden ({GOLDEN.name}, the CLI's)"
    if runner != "cli":
        want = expected_for_adapter(want)
        source = f"expected_for_adapter({GOLDEN.name})"
    if got != want:
        diff = records_diff(want, got, source, runner)
        raise RecordsDifferError(f"the {runner}'s records differ from {source}:\n{diff}")


def records_diff(want: Any, got: Any, want_name: str, got_name: str) -> str:
    """The unified diff of two records' JSON dumps (sorted keys, 2-space indent)."""
    return "".join(
        difflib.unified_diff(
            _dump(want).splitlines(keepends=True),
            _dump(got).splitlines(keepends=True),
            fromfile=want_name,
            tofile=got_name,
        )
    )


def check_nontrivial(records: list[dict[str, Any]]) -> None:
    """The scenario happened: one run, with the notice, an onExit failure, the stop request,
    the resumed task and the finally step (a golden file without them would prove nothing)."""
    assert len(records) == 1, f"{len(records)} runs"
    (entry,) = records
    run = entry["run"]
    assert [n["source"] for n in run["notices"]] == ["file"], run["notices"]
    assert run["environment_failures"], "no onExit failure recorded"
    assert all("onExit" in f["message"] for f in run["environment_failures"])
    assert [r["mode"] for r in entry["stop_requests"]][-1:] == [MODE], entry["stop_requests"]
    assert run["termination"] == MODE and run["finally_steps"] == ["Cleanup"]
    states = {
        (t["record"]["step"], t["record"]["parameters"].get("I", {}).get("value")): [
            g["state"] for g in t["generations"]
        ]
        for t in entry["tasks"]
    }
    assert states.get(("Work", "2"), [])[-1:] == ["2-resumed"], states
    assert "2-noticed" in states[("Work", "2")], states


class Conductor:
    """Watches the store from a thread of the test and does steps 2 and 4 of the scenario at
    their moments: the notice once ``Work[I=1]`` succeeded and ``Work[I=2]`` checkpointed, the
    termination request once ``Work[I=2]`` resumed. ``join()`` raises what went wrong."""

    def __init__(
        self,
        location: str | Path,
        notice_file: Path,
        *,
        sessions: int,
        timeout: float = 90,
        sequential: bool = False,
    ) -> None:
        """``sessions``: how many sessions of the run are open when the notice is due. The
        CLI keeps one per slot open to the end of the phase (2, ``--max-parallel 2``); Airflow
        and Prefect close ``Work[I=1]``'s with its unit (1). A notice that reaches a unit while
        its session exits, after its tasks succeeded, stops that unit too (it fails and is
        retried): not this scenario's.

        ``sequential``: the runner runs one task at a time in an order of its own
        (``dag.test()`` runs the scheduled task instances of a loop in the order of a Python
        set). When it starts ``Work[I=2]`` before ``Work[I=1]`` succeeded the scenario cannot
        be played: the conductor then cancels the run at once (``Cancelled``) and sets
        ``out_of_order``, and the test runs it again on a fresh store."""
        self.sessions = sessions
        self.sequential = sequential
        self.out_of_order = threading.Event()
        self.store = CheckpointStore(location)
        self.notice_file = notice_file
        self.timeout = timeout
        self.error: BaseException | None = None
        self.noticed = threading.Event()
        self.requested = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="equal-records", daemon=True)

    def start(self) -> Conductor:
        self._thread.start()
        return self

    def join(self) -> None:
        self._stop.set()
        self._thread.join(10)
        if self.error is not None:
            raise self.error
        if self.out_of_order.is_set():
            return
        assert self.noticed.is_set(), "the notice was never written"
        assert self.requested.is_set(), "the termination was never requested"

    def _work(self) -> tuple[Any, dict[str, Any]] | None:
        runs, _ = self.store.list_runs()
        if len(runs) != 1:
            return None
        (run,) = runs
        tasks, _ = self.store.read_tasks(run.job_key, run.run_id)
        by_i = {t.parameters["I"]["value"]: t for t in tasks if t.step == "Work"}
        by_i["sessions"] = len(self.store.sessions.list(run.job_key, run.run_id))
        return run, by_i

    def _wait(self, ready: Any, what: str) -> Any:
        end = time.monotonic() + self.timeout
        while time.monotonic() < end and not self._stop.is_set():
            seen = self._work()
            if seen is not None and ready(*seen):
                return seen
            time.sleep(0.05)
        raise TimeoutError(f"equal records: {what} never happened")

    def _run(self) -> None:
        def due(run: Any, by_i: dict[str, Any]) -> bool:
            return (
                "1" in by_i
                and by_i["1"].status.value == "succeeded"
                and "2" in by_i
                and by_i["2"].status.value == "running"
                and by_i["2"].checkpoint is not None
                and by_i["2"].checkpoint.state == "2-started"
                and by_i["sessions"] == self.sessions
            )

        def wrong_order(run: Any, by_i: dict[str, Any]) -> bool:
            return (
                self.sequential
                and "2" in by_i
                and by_i["2"].status.value == "running"
                and not ("1" in by_i and by_i["1"].status.value == "succeeded")
            )

        try:
            what = f"Work[I=2] checkpointed beside a finished Work[I=1], {self.sessions} session(s)"
            run, by_i = self._wait(lambda *seen: due(*seen) or wrong_order(*seen), what)
            if wrong_order(run, by_i):
                self.out_of_order.set()
                request_termination(self.store, run.job_key, run.run_id, "Cancelled")
                return
            time.sleep(0.5)  # a unit that just closed its session has stopped watching by now
            self._wait(due, what)
            self.notice_file.write_text(f"{time.time() + 30}\n")
            self.noticed.set()
            run, _ = self._wait(
                lambda run, by_i: (
                    "2" in by_i
                    and by_i["2"].status.value == "running"
                    and by_i["2"].checkpoint is not None
                    and by_i["2"].checkpoint.state == "2-resumed"
                ),
                "Work[I=2] resumed",
            )
            request_termination(self.store, run.job_key, run.run_id, MODE)
            self.requested.set()
        except BaseException as exc:  # raised again by join()
            self.error = exc
