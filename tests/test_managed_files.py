"""Managed file data flow (issue 11): the store carries checkpoint files and restores them.

Real processes write real files; the store is a local folder, ``memory://`` or (where the
S3-protocol fixture is available) moto's server on 127.0.0.1. A resume runs in another session
folder, standing in for another host.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import blake3
import pytest

from core import CheckpointStore, StopIntent, TaskExecution, TaskOutcome, prepare_job, report
from core.files._blobs import manifest_key
from core.job import TaskSpec, plan_tasks
from core.job._template import parse_template
from core.run import collect_file_garbage
from core.store import this_process

pytestmark = pytest.mark.slow
RUN_ID = "20260101-000000-000011"

# The task: frame files and a checkpoint file in the session working directory. Each frame
# ``k`` holds the number k*k; the result is the sum of every frame file present at the end, so
# a resume that lost the earlier frames computes a wrong number.
WORKER = r"""
import json, os, signal, sys, time
total_frames, delay = int(sys.argv[1]), float(sys.argv[2])
resume_file = sys.argv[3] if len(sys.argv) > 3 else ""
wd = os.getcwd()
os.makedirs("frames", exist_ok=True)
n = 0
if resume_file:
    n = int(open(resume_file).read())
    print(f"RESUMED AT {n} FROM {resume_file}", flush=True)
    print('openjd_checkpoint_resume_status: {"status": "RESUMED"}', flush=True)
stopping = False
def on_signal(sig, frame):
    global stopping
    stopping = True
signal.signal(signal.SIGUSR1, on_signal)
while n < total_frames:
    frame = os.path.join(wd, "frames", f"f{n:03d}.txt")
    with open(frame, "w") as fh:
        fh.write(f"{n * n} {os.environ.get('SALT', '')}")
    print("openjd_checkpoint_files: " + json.dumps({"files": [frame]}), flush=True)
    n += 1
    ckpt = os.path.join(wd, "ckpt.txt")
    with open(ckpt + ".tmp", "w") as fh:
        fh.write(str(n))
    os.replace(ckpt + ".tmp", ckpt)
    print("openjd_checkpoint_save: " + json.dumps({"file": ckpt}), flush=True)
    print(f"SAVED {n}", flush=True)
    if stopping:
        sys.exit(1)
    time.sleep(delay)
total = sum(
    int(open(os.path.join(wd, "frames", f)).read().split()[0]) for f in os.listdir("frames")
)
print(f"RESULT {total}", flush=True)
"""


def frames_job(frames: int = 6, delay: float = 0.3):
    notify = {
        "mode": "NOTIFY_THEN_TERMINATE",
        "notifyPeriodInSeconds": 20,
        "signalToNotify": "SIGUSR1",
    }
    args = ["{{Task.File.Worker}}", str(frames), str(delay)]
    doc: dict[str, Any] = {
        "specificationVersion": "jobtemplate-2023-09",
        "extensions": ["CHECKPOINT"],
        "name": "managed files test",
        "steps": [
            {
                "name": "S",
                "script": {
                    "actions": {
                        "onRun": {
                            "command": "python3",
                            "args": args,
                            "checkpointCancelation": notify,
                        },
                        "onCheckpointResume": {
                            "command": "python3",
                            "args": [*args, "{{Task.Checkpoint.File}}"],
                            "checkpointCancelation": notify,
                        },
                    },
                    "embeddedFiles": [
                        {"name": "Worker", "type": "TEXT", "data": textwrap.dedent(WORKER)}
                    ],
                },
            }
        ],
    }
    return prepare_job(parse_template(doc))


@pytest.fixture
def managed_store(store_url: str):
    """A managed store of each backend (local folder, ``memory://``, ``s3://`` on moto)."""
    return CheckpointStore(store_url, files="managed")


def get(store, key: str) -> bytes:
    """The bytes of ``key`` below the store's root, whatever the backend."""
    return bytes(store.fs.fsspec.cat_file(posixpath.join(store.root, key)))


def put(store, key: str, data: bytes) -> None:
    path = posixpath.join(store.root, key)
    store.fs.fsspec.makedirs(posixpath.dirname(path), exist_ok=True)
    store.fs.fsspec.pipe_file(path, data)


def blob_key(name: str, algo: str = "blake3") -> str:
    """Where the store keeps the content named ``name`` (new content: by its BLAKE3)."""
    return f"blobs/{algo}/{name[:2]}/{name}"


def entry_blob(entry: dict) -> str:
    """The store key of a manifest entry's content: its one hash field names the algorithm
    (``blake3`` now, ``sha256`` in entries of earlier versions)."""
    [(algo, name)] = [(a, entry[a]) for a in ("blake3", "sha256") if entry.get(a)]
    return blob_key(name, algo)


def blob_names(store, folder: str = "blobs/blake3") -> list[str]:
    base = posixpath.join(store.root, folder)
    try:
        store.fs.fsspec.invalidate_cache()
        return sorted(posixpath.basename(p) for p in store.fs.fsspec.find(base))
    except FileNotFoundError:
        return []


class Run:
    """A TaskExecution on a worker thread, with its output lines and warnings."""

    def __init__(self, job, store, working_root: Path, record=None, resume=None) -> None:
        spec = next(iter(plan_tasks(job, "S")))
        if resume is not None:
            spec = TaskSpec(spec.step_name, spec.task_key, spec.parameters, spec.parameters, resume)
        self.lines: list[str] = []
        working_root.mkdir(parents=True, exist_ok=True)
        self.ex = TaskExecution(
            job,
            spec,
            run_id=RUN_ID,
            store=store,
            record=record,
            working_root=str(working_root),
            on_output=lambda _ex, lines: self.lines.extend(lines),
        )
        self.result = None
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        self.result = self.ex.run()

    def wait_line(self, text: str, timeout: float = 30) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if any(text in line for line in self.lines):
                return
            time.sleep(0.02)
        raise AssertionError(f"no {text!r} in {self.lines}")

    def join(self, timeout: float = 120):
        self.thread.join(timeout)
        assert not self.thread.is_alive()
        return self.result


# A task waits for a gate file the test creates once the runner got far enough (``open_gate``).
WAIT_GATE = """
import os, time


def wait_gate(path):
    end = time.monotonic() + 60
    while not os.path.exists(path):
        if time.monotonic() > end:
            raise SystemExit(f"no gate {path}")
        time.sleep(0.01)
"""


def open_gate(run: Run, gate: Path, ready, what: str, timeout: float = 60) -> None:
    """Create ``gate`` once ``ready()`` is true: the task waiting for it goes on only after
    the runner did what ``ready`` checks."""
    end = time.monotonic() + timeout
    while not ready():
        assert run.thread.is_alive(), f"the task ended before {what}: {run.lines}"
        assert time.monotonic() < end, f"timed out waiting for {what}: {run.lines}"
        time.sleep(0.02)
    gate.touch()


def stored_generation(store, job) -> int:
    """The checkpoint generation the task's record holds (0: none)."""
    records = store.read_tasks(job.job_key, RUN_ID)[0]
    return max((r.checkpoint.generation for r in records if r.checkpoint), default=0)


def expected(frames: int) -> int:
    return sum(k * k for k in range(frames))


def test_interrupted_task_resumes_in_another_session_folder_with_its_files(
    managed_store, tmp_path: Path
) -> None:
    job = frames_job(frames=6)
    first = Run(job, managed_store, tmp_path / "host-a")
    first.wait_line("SAVED 2")
    first.ex.stop(StopIntent.CHECKPOINT)
    result = first.join()
    assert result.outcome == TaskOutcome.INTERRUPTED_WITH_CHECKPOINT, result.message
    cp = result.record.checkpoint
    assert cp is not None and cp.manifest, cp
    assert not list((tmp_path / "host-a").iterdir())  # the session folder is gone
    done = int(Path(cp.file).name == "ckpt.txt") and cp.generation
    assert done >= 2

    second = Run(job, managed_store, tmp_path / "host-b", record=result.record, resume=cp)
    result2 = second.join()
    assert result2.outcome == TaskOutcome.SUCCEEDED, (result2.message, second.ex.warnings)
    resumed = next(line for line in second.lines if line.startswith("RESUMED AT"))
    # Task.Checkpoint.File points into the new session folder, on "host-b".
    assert str(tmp_path / "host-b") in resumed, resumed
    assert f"RESULT {expected(6)}" in second.lines, second.lines


def test_an_unchanged_200_mb_file_is_uploaded_once(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "store", files="managed")
    big = tmp_path / "big.bin"
    with open(big, "wb") as fh:
        block = os.urandom(1 << 20)
        for _ in range(200):
            fh.write(block)
    code = f"""
import json
big = {str(big)!r}
for n in (1, 2):
    print("openjd_checkpoint_files: " + json.dumps({{"files": [big]}}), flush=True)
    print("openjd_checkpoint_save: " + json.dumps({{"state": str(n)}}), flush=True)
"""
    doc = {
        "specificationVersion": "jobtemplate-2023-09",
        "extensions": ["CHECKPOINT"],
        "name": "big file",
        "steps": [
            {
                "name": "S",
                "script": {"actions": {"onRun": {"command": "python3", "args": ["-c", code]}}},
            }
        ],
    }
    job = prepare_job(parse_template(doc))
    store.file_roots = [str(tmp_path)]
    run = Run(job, store, tmp_path / "work")
    result = run.join()
    assert result.outcome == TaskOutcome.SUCCEEDED, (result.message, run.ex.warnings)
    assert result.record.checkpoint is not None
    assert run.ex.file_stats.uploaded_bytes == 200 << 20
    assert run.ex.file_stats.uploaded_files == 1
    blobs = list((tmp_path / "store" / "blobs").rglob("*"))
    assert [b.relative_to(tmp_path / "store").parts[:2] for b in blobs if b.is_file()] == [
        ("blobs", "blake3")
    ]


def _save_after(change: str, tmp_path: Path) -> str:
    """A task that saves generation 1 properly, then declares a file, changes or deletes it,
    and saves again; it waits for the gates ``saved-one``, ``declared`` and ``checked`` in
    ``tmp_path`` (the test opens them as the runner gets there)."""
    return (
        WAIT_GATE
        + f"""
import json, os
gates = {str(tmp_path)!r}
wd = os.getcwd()
good = os.path.join(wd, "good.txt")
open(good, "w").write("good")
print("openjd_checkpoint_files: " + json.dumps({{"files": [good]}}), flush=True)
print("openjd_checkpoint_save: " + json.dumps({{"state": "one"}}), flush=True)
wait_gate(os.path.join(gates, "saved-one"))
bad = os.path.join(wd, "bad.txt")
open(bad, "w").write("first")
print("openjd_checkpoint_files: " + json.dumps({{"files": [bad]}}), flush=True)
wait_gate(os.path.join(gates, "declared"))
if {change!r} == "delete":
    os.unlink(bad)
else:
    open(bad, "w").write("second, longer")
print("openjd_checkpoint_save: " + json.dumps({{"state": "two"}}), flush=True)
wait_gate(os.path.join(gates, "checked"))
"""
    )


@pytest.mark.parametrize("change", ["delete", "change"])
def test_a_file_deleted_or_changed_before_the_commit_fails_that_save(
    change: str, managed_store, tmp_path: Path
) -> None:
    store = managed_store
    doc = {
        "specificationVersion": "jobtemplate-2023-09",
        "extensions": ["CHECKPOINT"],
        "name": "changed file",
        "steps": [
            {
                "name": "S",
                "script": {
                    "actions": {
                        "onRun": {
                            "command": "python3",
                            "args": ["-c", _save_after(change, tmp_path)],
                        }
                    }
                },
            }
        ],
    }
    job = prepare_job(parse_template(doc))
    run = Run(job, store, tmp_path / "work")
    word = "vanished" if change == "delete" else "changed"

    first = blake3.blake3(b"first").hexdigest()  # bad.txt as it was declared
    open_gate(run, tmp_path / "saved-one", lambda: stored_generation(store, job) >= 1, "save one")
    open_gate(run, tmp_path / "declared", lambda: first in blob_names(store), "bad.txt stored")
    open_gate(run, tmp_path / "checked", lambda: any(word in w for w in run.ex.warnings),
              "the second save checked")  # fmt: skip
    result = run.join()
    cp = result.record.checkpoint
    assert cp is not None and cp.generation == 1 and cp.state == "one", cp
    assert any(word in w and "bad.txt" in w for w in run.ex.warnings), run.ex.warnings


SHARED_IN_SESSION = """
import json, os
path = os.path.join(os.getcwd(), "lost.txt")
open(path, "w").write("x")
print("openjd_checkpoint_files: " + json.dumps({"files": [path]}), flush=True)
print("openjd_checkpoint_save: " + json.dumps({"state": "s"}), flush=True)
"""


def test_shared_mode_refuses_files_in_the_session_folder(tmp_path: Path) -> None:
    from conftest import one_step_template

    store = CheckpointStore(tmp_path / "store", files="shared")
    template = one_step_template(tmp_path / "t.yaml", "shared honest", SHARED_IN_SESSION)
    run = Run(prepare_job(template), store, tmp_path / "work")
    result = run.join()
    cp = result.record.checkpoint
    assert cp is not None and cp.files == [] and cp.manifest is None
    assert any("session working directory" in w and "lost.txt" in w for w in run.ex.warnings)


def _hostile_task(outside: Path) -> str:
    return f"""
import json, os
wd = os.getcwd()
os.symlink("/etc/passwd", os.path.join(wd, "link-out"))
os.makedirs(os.path.join(wd, "d"))
os.symlink("/etc", os.path.join(wd, "d", "etc-link"))
os.symlink("/etc/hostname", os.path.join(wd, "d", "host-link"))
open(os.path.join(wd, "d", "ok.txt"), "w").write("ok")
os.mkfifo(os.path.join(wd, "fifo"))
os.mkfifo(os.path.join(wd, "d", "fifo"))
for files in (["/etc/passwd"], [wd + "/../../etc/passwd"], [os.path.join(wd, "link-out")],
              [os.path.join(wd, "fifo")], [{str(outside)!r}]):
    print("openjd_checkpoint_files: " + json.dumps({{"files": files}}), flush=True)
print("openjd_checkpoint_files: " + json.dumps({{"dirs": [os.path.join(wd, "d")]}}), flush=True)
print("openjd_checkpoint_save: " + json.dumps({{"file": os.path.join(wd, "link-out")}}),
      flush=True)
print("openjd_checkpoint_save: " + json.dumps({{"state": "after"}}), flush=True)
"""


def test_hostile_declarations_capture_nothing_outside_the_roots(
    managed_store, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("secret outside the roots")
    store = managed_store
    doc = {
        "specificationVersion": "jobtemplate-2023-09",
        "extensions": ["CHECKPOINT"],
        "name": "hostile",
        "steps": [
            {
                "name": "S",
                "script": {
                    "actions": {
                        "onRun": {"command": "python3", "args": ["-c", _hostile_task(outside)]}
                    }
                },
            }
        ],
    }
    run = Run(prepare_job(parse_template(doc)), store, tmp_path / "work")
    result = run.join(60)
    assert result.outcome == TaskOutcome.SUCCEEDED, (result.message, run.ex.warnings)
    text = "\n".join(run.ex.warnings)
    for needle in ("/etc/passwd", "'..'", "link-out", "fifo", "outside.txt", "etc-link"):
        assert needle in text, (needle, text)
    cp = result.record.checkpoint
    assert cp is not None and cp.state == "after" and cp.manifest
    # Only d/ok.txt (and the folder d) made it into the store.
    secrets = {Path("/etc/passwd").read_bytes(), outside.read_bytes()}
    contents = [get(store, blob_key(name)) for name in blob_names(store)]
    assert contents == [b"ok"]
    assert not secrets & set(contents)
    assert blob_names(store, "blobs/tmp") == []
    manifest = json.loads(get(store, manifest_key(cp.manifest)))
    assert sorted(e["path"] for e in manifest["entries"]) == ["d", "d/ok.txt"]


def _first_run(store, tmp_path: Path, frames: int = 4, stop_at: int = 2):
    job = frames_job(frames=frames)
    first = Run(job, store, tmp_path / "host-a")
    first.wait_line(f"SAVED {stop_at}")
    first.ex.stop(StopIntent.CHECKPOINT)
    result = first.join()
    assert result.record.checkpoint is not None
    return job, result


def _rewrite_manifest(store, digest: str, edit) -> str:
    data = json.loads(get(store, manifest_key(digest)))
    edit(data)
    raw = (json.dumps(data, sort_keys=True) + "\n").encode()
    new = hashlib.sha256(raw).hexdigest()
    put(store, manifest_key(new), raw)
    return new


@pytest.mark.parametrize(
    "evil", ["../../escaped.txt", "/tmp/escaped-abs.txt", "frames/../../escaped.txt"]
)
def test_a_manifest_edited_to_point_outside_is_refused_whole(
    evil: str, managed_store, tmp_path: Path
) -> None:
    store = managed_store
    job, result = _first_run(store, tmp_path)
    cp = result.record.checkpoint

    def edit(data: dict) -> None:
        data["entries"][0]["path"] = evil

    tampered = cp.model_copy(update={"manifest": _rewrite_manifest(store, cp.manifest, edit)})
    # Every generation is tampered: nothing can be restored, the task runs from the top.
    for gen in store.list_generations(result.record):
        path = store.layout.gen_path(job.job_key, RUN_ID, *_tid(result.record), gen.generation)
        data = json.loads(store.fs.fsspec.cat_file(path))
        data["manifest"] = tampered.manifest
        store.fs.fsspec.pipe_file(path, json.dumps(data).encode())
    second = Run(job, store, tmp_path / "host-b", record=result.record, resume=tampered)
    assert second.join().outcome == TaskOutcome.SUCCEEDED
    assert any("refused whole" in w for w in second.ex.warnings), second.ex.warnings
    assert not (tmp_path / "escaped.txt").exists()
    assert not Path("/tmp/escaped-abs.txt").exists()
    assert not any(line.startswith("RESUMED AT") for line in second.lines)
    assert f"RESULT {expected(4)}" in second.lines  # from the top, correctly


def _tid(record) -> tuple[str]:
    from core.store._layout import task_id_for

    return (task_id_for(record.step, record.task_key),)


def test_a_blob_that_does_not_match_its_hash_fails_that_generation_only(
    managed_store, tmp_path: Path
) -> None:
    store = managed_store
    job, result = _first_run(store, tmp_path, frames=5, stop_at=3)
    cp = result.record.checkpoint
    manifest = json.loads(get(store, manifest_key(cp.manifest)))
    # Damage the content of the newest checkpoint file (ckpt.txt holds a new number each save).
    entry = next(e for e in manifest["entries"] if e["path"] == "ckpt.txt")
    put(store, entry_blob(entry), b"9" * entry["size"])
    # the generation before: what its own ckpt.txt holds (saves that came faster than the store
    # committed them were coalesced, so a generation's number is not always the task's count)
    [before] = [
        g for g in store.list_generations(result.record) if g.generation == cp.generation - 1
    ]
    previous = json.loads(get(store, manifest_key(before.manifest)))
    kept = next(e for e in previous["entries"] if e["path"] == "ckpt.txt")
    count = get(store, entry_blob(kept)).decode()
    second = Run(job, store, tmp_path / "host-b", record=result.record, resume=cp)
    result2 = second.join()
    assert result2.outcome == TaskOutcome.SUCCEEDED, (result2.message, second.ex.warnings)
    assert any(
        f"generation {cp.generation} cannot be restored" in w and "does not match its hash" in w
        for w in second.ex.warnings
    ), second.ex.warnings
    resumed = next(line for line in second.lines if line.startswith("RESUMED AT"))
    assert resumed.startswith(f"RESUMED AT {count} "), (resumed, count)
    assert f"RESULT {expected(5)}" in second.lines


def test_restoring_twice_gives_the_same_tree(managed_store, tmp_path: Path) -> None:
    from core.files import restore_checkpoint

    store = managed_store
    _job, result = _first_run(store, tmp_path)
    cp = result.record.checkpoint
    target = tmp_path / "restore"
    target.mkdir()

    def tree() -> dict[str, bytes]:
        return {
            str(p.relative_to(target)): p.read_bytes() for p in target.rglob("*") if p.is_file()
        }

    first = restore_checkpoint(store.fs, cp.manifest, str(target), [])
    once = tree()
    second = restore_checkpoint(store.fs, cp.manifest, str(target), [])
    assert tree() == once and first.file == second.file == str(target / "ckpt.txt")
    saved = int(once["ckpt.txt"])
    assert saved >= 2
    assert sorted(once) == ["ckpt.txt", *(f"frames/f{k:03d}.txt" for k in range(saved))]


def test_restore_never_writes_through_a_link_in_the_restore_root(tmp_path: Path) -> None:
    from core.files import RestoreError, restore_checkpoint

    store = CheckpointStore(tmp_path / "store", files="managed")
    _job, result = _first_run(store, tmp_path)
    target = tmp_path / "restore"
    target.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (target / "frames").symlink_to(elsewhere)
    with pytest.raises(RestoreError, match="not a folder"):
        restore_checkpoint(store.fs, result.record.checkpoint.manifest, str(target), [])
    assert list(elsewhere.iterdir()) == []


def test_gc_frees_exactly_what_no_kept_generation_references(managed_store, tmp_path: Path) -> None:
    store = managed_store
    # Three runs of the job, each interrupted (three kept runs of checkpoints).
    job = frames_job(frames=4)
    records = []
    for n, run_id in enumerate(
        ["20260101-000000-00000a", "20260101-000000-00000b", "20260101-000000-00000c"]
    ):
        spec = next(iter(plan_tasks(job, "S")))
        lines: list[str] = []
        ex = TaskExecution(
            job,
            spec,
            run_id=run_id,
            store=store,
            working_root=str(tmp_path / f"w{n}"),
            os_env=dict(os.environ, SALT=run_id),
            on_output=lambda _e, ls, lines=lines: lines.extend(ls),
        )
        (tmp_path / f"w{n}").mkdir()
        t = threading.Thread(target=lambda ex=ex: records.append(ex.run()))
        t.start()
        end = time.monotonic() + 30
        while not any("SAVED 2" in line for line in lines) and time.monotonic() < end:
            time.sleep(0.02)
        ex.stop(StopIntent.CHECKPOINT)
        t.join(60)
    from core._records import RunRecord

    for rec in records:
        store.write_run(
            RunRecord(
                job_key=rec.record.job_key,
                run_id=rec.record.run_id,
                job_name="managed files test",
                template_hash="x",
            )
        )

    def live() -> set[str]:
        keep: set[str] = set()
        for rec in records:
            for gen in store.list_generations(rec.record):
                data = json.loads(get(store, manifest_key(gen.manifest)))
                keep |= {e["blake3"] for e in data["entries"] if e["kind"] == "file"}
        return keep

    all_blobs = set(blob_names(store))
    # Nothing is collected within the grace period.
    assert collect_file_garbage(store).blobs_removed == 0
    # Forget the second run: only content the others do not share goes.
    store.removal.delete(job.job_key, "20260101-000000-00000b", this_process())
    records = [r for r in records if r.record.run_id != "20260101-000000-00000b"]
    keep = live()
    report = collect_file_garbage(store, grace_seconds=0)
    left = set(blob_names(store))
    assert left == keep
    # Run b's frames were its own (salted); the checkpoint files' content is shared by all.
    assert report.blobs_removed == len(all_blobs - keep) >= 2
    assert report.bytes_freed > 0
    # Every kept generation still restores.
    from core.files import restore_checkpoint

    for rec in records:
        for gen in store.list_generations(rec.record):
            out = tmp_path / f"check-{rec.record.run_id}-{gen.generation}"
            out.mkdir()
            restore_checkpoint(store.fs, gen.manifest, str(out), [])


def _cli_env(tmp: Path, host: str, files: str | None = "managed") -> dict[str, str]:
    tmp.mkdir(parents=True, exist_ok=True)
    env = dict(
        os.environ,
        PYTHONUNBUFFERED="1",
        TMPDIR=str(tmp),  # another session folder root: another "host"
        OPENJD_CHECKPOINT_HOST_ID=host,
    )
    env.pop("OPENJD_CHECKPOINT_FILES", None)
    if files:
        env["OPENJD_CHECKPOINT_FILES"] = files
    return env


def _interrupt_at(args: list[str], env: dict[str, str], epoch: int) -> str:
    """Run the CLI, SIGINT it once it printed ``epoch N/``; its whole output."""
    import signal
    import subprocess

    from conftest import ROOT, rest_of_output

    proc = subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    seen: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if f"epoch {epoch}/" in line:
            proc.send_signal(signal.SIGINT)
            break
    rest = rest_of_output(proc, 60)
    out = "".join(seen) + rest
    assert proc.returncode == 75, out
    return out


def test_a_run_keeps_its_files_mode_on_resume_and_retry(tmp_path: Path) -> None:
    """Started managed, the run stays managed when resumed or retried without --files."""
    import subprocess
    import sys

    from conftest import EXAMPLES, ROOT

    store = str(tmp_path / "store")
    template = str(EXAMPLES / "managed-files" / "training.yaml")
    params = ["-p", "Epochs=9", "-p", "EpochSeconds=0.3", "--store", store]
    cli = [sys.executable, "-m", "core.cli"]
    _interrupt_at([*cli, "run", template, *params], _cli_env(tmp_path / "a", "a"), 2)
    (run,) = CheckpointStore(store).list_runs()[0]
    assert run.files_mode == "managed"
    out = _interrupt_at(
        [*cli, "resume", run.run_id, "--store", store], _cli_env(tmp_path / "b", "b", None), 6
    )
    assert "keeps its checkpoint files managed" in out, out
    assert "session working directory" not in out, out  # nothing refused: still managed
    third = subprocess.run(
        [*cli, "run", template, *params],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=_cli_env(tmp_path / "c", "c", "shared"),
    )
    out3 = third.stdout + third.stderr
    assert third.returncode == 0, out3
    resumed = re.search(r"resumed at epoch (\d+)", out3)
    assert resumed and int(resumed.group(1)) >= 6, out3
    assert f"result: {expected(9)}" in out3


def run_training_example(store: str, tmp_path: Path) -> None:
    """The CLI runs the managed-files example, is interrupted with SIGINT, and the same
    command on another "host" (temp folder, host id) resumes from the restored files."""
    import signal
    import subprocess
    import sys

    from conftest import EXAMPLES, ROOT, rest_of_output

    epochs = 8
    args = [
        sys.executable,
        "-m",
        "core.cli",
        "run",
        str(EXAMPLES / "managed-files" / "training.yaml"),
        "-p",
        f"Epochs={epochs}",
        "-p",
        "EpochSeconds=0.3",
        "--store",
        store,
    ]
    first = subprocess.Popen(
        args,
        cwd=ROOT,
        env=_cli_env(tmp_path / "host-a", "host-a"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen: list[str] = []
    assert first.stdout is not None
    for line in first.stdout:
        seen.append(line)
        if "epoch 3/" in line:
            first.send_signal(signal.SIGINT)
            break
    rest = rest_of_output(first, 60)
    assert first.returncode == 75, "".join(seen) + rest
    second = subprocess.run(
        args,
        cwd=ROOT,
        env=_cli_env(tmp_path / "host-b", "host-b"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = second.stdout + second.stderr
    assert second.returncode == 0, out
    resumed = re.search(r"resumed at epoch (\d+) from (\S+)", out)
    assert resumed, out
    assert int(resumed.group(1)) >= 3
    assert resumed.group(2).startswith(str(tmp_path / "host-b")), resumed.group(2)
    assert f"result: {expected(epochs)}" in out, out
    # The run's outputs name every sample file, those of the first attempt (restored on
    # host-b) included, and gc keeps their content once the run's checkpoints are gone.
    st = CheckpointStore(store, files="managed")
    [run] = st.list_runs()[0]
    [index] = st.outputs.read_outputs(run.job_key, run.run_id)
    samples = sorted(posixpath.basename(p) for p in index["files"] if "/samples/" in p)
    assert samples == [f"epoch-{k:04d}.txt" for k in range(epochs)], sorted(index["files"])
    collect_file_garbage(st, grace_seconds=0)
    for entry in index["files"].values():
        assert get(st, entry["blob"]) is not None, entry


def test_cli_example_resumes_on_another_host_from_a_managed_store(tmp_path: Path) -> None:
    run_training_example(str(tmp_path / "store"), tmp_path)


RENAMED_AGAIN = """
import json, os, time
wd = os.getcwd()
path = os.path.join(wd, "weights.bin")
for n, byte in enumerate((b"x", b"y")):
    with open(path + ".tmp", "wb") as fh:
        fh.write(byte * ((30 << 20) + n))
    os.replace(path + ".tmp", path)
    print("openjd_checkpoint_files: " + json.dumps({"files": [path]}), flush=True)
print("openjd_checkpoint_save: " + json.dumps({"state": "s"}), flush=True)
"""


def test_a_file_named_again_while_uploading_ends_up_with_the_newer_content(
    managed_store, tmp_path: Path
) -> None:
    store = managed_store
    doc = {
        "specificationVersion": "jobtemplate-2023-09",
        "extensions": ["CHECKPOINT"],
        "name": "named again",
        "steps": [
            {
                "name": "S",
                "script": {
                    "actions": {"onRun": {"command": "python3", "args": ["-c", RENAMED_AGAIN]}}
                },
            }
        ],
    }
    run = Run(prepare_job(parse_template(doc)), store, tmp_path / "work")
    result = run.join()
    cp = result.record.checkpoint
    assert cp is not None and cp.manifest, run.ex.warnings
    manifest = json.loads(get(store, manifest_key(cp.manifest)))
    (entry,) = [e for e in manifest["entries"] if e["path"] == "weights.bin"]
    newer = blake3.blake3(b"y" * ((30 << 20) + 1)).hexdigest()
    assert entry["blake3"] == newer and entry["size"] == (30 << 20) + 1


EARLY = """
import json, os, sys, time
path = os.path.join(os.getcwd(), "frame-0001.exr")
open(path, "w").write("pixels")
print("openjd_checkpoint_files: " + json.dumps({"files": [path]}), flush=True)
go_on = sys.argv[1]
while not os.path.exists(go_on):
    time.sleep(0.05)
"""


def test_declared_files_are_in_the_store_while_the_task_runs(managed_store, tmp_path: Path) -> None:
    store = managed_store
    go_on = tmp_path / "go-on"
    doc = {
        "specificationVersion": "jobtemplate-2023-09",
        "extensions": ["CHECKPOINT"],
        "name": "early outputs",
        "steps": [
            {
                "name": "S",
                "script": {
                    "actions": {"onRun": {"command": "python3", "args": ["-c", EARLY, str(go_on)]}}
                },
            }
        ],
    }
    job = prepare_job(parse_template(doc))
    run = Run(job, store, tmp_path / "work")
    try:
        end = time.monotonic() + 20
        indexes: list = []
        while time.monotonic() < end and not indexes:
            indexes = store.outputs.read_outputs(job.job_key, RUN_ID)
            time.sleep(0.1)
        assert run.thread.is_alive()  # still running
        (index,) = indexes
        ((name, item),) = index["files"].items()
        assert name.endswith("/frame-0001.exr")
        assert get(store, item["blob"]) == b"pixels"
    finally:
        go_on.touch()
    assert run.join().outcome == TaskOutcome.SUCCEEDED


SLOW_SAVE = (
    WAIT_GATE
    + """
import json, os, sys, time
wd = os.getcwd()
small = os.path.join(wd, "small.txt")
open(small, "w").write("one")
print("openjd_checkpoint_save: " + json.dumps({"file": small, "state": "one"}), flush=True)
wait_gate(sys.argv[1])  # the test opens it once "one" is stored
big = os.path.join(wd, "big.bin")
with open(big, "wb") as fh:
    block = os.urandom(1 << 20)
    for _ in range(400):
        fh.write(block)
print("openjd_checkpoint_save: " + json.dumps({"file": big, "state": "two"}), flush=True)
print("SAVING BIG", flush=True)
time.sleep(60)
"""
)


def test_a_save_still_uploading_at_the_stop_deadline_is_dropped(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "store", files="managed")
    doc = {
        "specificationVersion": "jobtemplate-2023-09",
        "extensions": ["CHECKPOINT"],
        "name": "slow save",
        "steps": [
            {
                "name": "S",
                "script": {
                    "actions": {
                        "onRun": {
                            "command": "python3",
                            "args": ["-c", SLOW_SAVE, str(tmp_path / "saved-one")],
                        }
                    }
                },
            }
        ],
    }
    job = prepare_job(parse_template(doc))
    run = Run(job, store, tmp_path / "work")
    open_gate(run, tmp_path / "saved-one", lambda: stored_generation(store, job) >= 1, "save one")
    run.wait_line("SAVING BIG")
    started = time.monotonic()
    # The capture gives up 0.5 s before the deadline (STOP_KILL_MARGIN_SECONDS), 0.1 s from
    # now: the 400 MiB save needs longer than that (a copy and an fsync of 400 MiB) however
    # fast the store copies and hashes it (with 1.0 s here it sometimes committed in time).
    run.ex.stop(StopIntent.CHECKPOINT, deadline=time.time() + 0.6)
    result = run.join()
    assert time.monotonic() - started < 5
    cp = result.record.checkpoint
    assert cp is not None and cp.state == "one", cp
    assert any("stop deadline came" in w for w in run.ex.warnings), run.ex.warnings


def test_cli_example_resumes_on_another_host_from_an_s3_store(s3_store: str, tmp_path: Path):
    run_training_example(s3_store, tmp_path)


LAGGING = """
import json, os
wd = os.getcwd()
model = os.path.join(wd, "model.txt")
for n in range(1, 5):
    sample = os.path.join(wd, f"sample-{n}.bin")
    with open(sample, "wb") as fh:
        fh.write(bytes([n]) * (16 << 20))  # uploads lag behind the saves
    print("openjd_checkpoint_files: " + json.dumps({"files": [sample]}), flush=True)
    with open(model + ".tmp", "w") as fh:
        fh.write(str(n))
    os.replace(model + ".tmp", model)
    print("openjd_checkpoint_save: " + json.dumps({"file": model, "state": str(n)}), flush=True)
"""


def test_every_generation_is_consistent_when_uploads_lag(managed_store, tmp_path: Path) -> None:
    """The save's file is taken as it was when the save was printed, whatever the task wrote
    after it: each generation's file matches its state and its file list."""
    from core.files import restore_checkpoint

    doc = {
        "specificationVersion": "jobtemplate-2023-09",
        "extensions": ["CHECKPOINT"],
        "name": "lagging",
        "steps": [
            {
                "name": "S",
                "script": {"actions": {"onRun": {"command": "python3", "args": ["-c", LAGGING]}}},
            }
        ],
    }
    run = Run(prepare_job(parse_template(doc)), managed_store, tmp_path / "work")
    result = run.join()
    assert result.record.checkpoint is not None and result.record.checkpoint.state == "4"
    gens = managed_store.list_generations(result.record)
    assert gens
    for gen in gens:
        out = tmp_path / f"check-{gen.generation}"
        out.mkdir()
        restored = restore_checkpoint(managed_store.fs, gen.manifest, str(out), [])
        assert Path(restored.file).read_text() == gen.state
        names = sorted(Path(f).name for f in restored.files)
        assert names == [f"sample-{k}.bin" for k in range(1, int(gen.state) + 1)]
        # the generation records the bytes of the files the store keeps for it
        paths = {str(Path(f).resolve()) for f in [*restored.files, restored.file]}
        assert gen.file_bytes == sum(Path(f).stat().st_size for f in paths) > 0, gen
        assert report.summarize_checkpoint(gen).file_bytes == gen.file_bytes


DECLARE_THEN_FAIL = """
import json, os, sys
wd = os.getcwd()
data = os.path.join(wd, "data.txt")
open(data, "w").write("d")
print("openjd_checkpoint_files: " + json.dumps({"files": [data]}), flush=True)
if not os.path.exists(sys.argv[1]):
    open(sys.argv[1], "w").close()
    sys.exit(1)
print("openjd_checkpoint_save: " + json.dumps({"state": "saved"}), flush=True)
"""


def test_a_task_run_again_from_the_top_starts_a_fresh_file_list(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "store", files="managed")
    marker = tmp_path / "failed-once"
    doc = {
        "specificationVersion": "jobtemplate-2023-09",
        "extensions": ["CHECKPOINT"],
        "name": "declare then fail",
        "steps": [
            {
                "name": "S",
                "script": {
                    "actions": {
                        "onRun": {
                            "command": "python3",
                            "args": ["-c", DECLARE_THEN_FAIL, str(marker)],
                        }
                    }
                },
            }
        ],
    }
    job = prepare_job(parse_template(doc))
    first = Run(job, store, tmp_path / "a")
    assert first.join().outcome == TaskOutcome.FAILED
    second = Run(job, store, tmp_path / "b", record=first.result.record)
    result = second.join()
    assert result.outcome == TaskOutcome.SUCCEEDED, second.ex.warnings
    cp = result.record.checkpoint
    assert cp is not None and cp.state == "saved", second.ex.warnings
    assert [Path(f).parent.parent for f in cp.files] == [tmp_path / "b"]
    assert not any("resume_status" in w for w in second.ex.warnings)


def test_a_session_folder_of_any_depth_is_removed(tmp_path: Path) -> None:
    from core.task._session import remove_tree

    top = str(tmp_path / "deep")
    os.mkdir(top)
    os.chdir(top)  # build it relatively: absolute paths this deep are too long
    try:
        for _ in range(1200):
            os.mkdir("d")
            os.chdir("d")
        with open("leaf", "w") as fh:
            fh.write("x")
    finally:
        os.chdir(tmp_path)
    remove_tree(top)
    assert not os.path.exists(top)


def test_a_record_too_large_to_read_back_is_never_written(tmp_path: Path, monkeypatch) -> None:
    import core.fs._storefs as fs_module
    from core import StoreError
    from core._records import TaskRecord

    store = CheckpointStore(tmp_path / "store")
    rec = TaskRecord(job_key="0" * 16, run_id=RUN_ID, step="S", task_key="k", parameters={})
    store.write_task(rec)
    monkeypatch.setattr(fs_module, "MAX_RECORD_BYTES", 2000)
    rec.pending_files = [f"/data/{n:05d}" for n in range(200)]
    with pytest.raises(StoreError, match="could never be read back"):
        store.write_task(rec)
    assert store.read_task("0" * 16, RUN_ID, "S", "k").pending_files == []


def test_a_generation_that_cannot_be_restored_leaves_the_files_there_as_they_were(
    tmp_path: Path,
) -> None:
    """All or nothing: a file already in the restore root (a --file-root holds the user's own)
    is neither overwritten nor deleted when a later file of the generation turns out damaged;
    what a restore killed part-way on this host left is swept, another live one's is not."""
    from core.files import RestoreError, restore_checkpoint
    from core.files._restore import _restore_prefix

    store = CheckpointStore(tmp_path / "store", files="managed")
    _job, result = _first_run(store, tmp_path)
    cp = result.record.checkpoint
    manifest = json.loads(get(store, manifest_key(cp.manifest)))
    target = tmp_path / "restore"
    (target / "frames").mkdir(parents=True)
    (target / "frames" / "f000.txt").write_text("the user's own")
    last = [e for e in manifest["entries"] if e["kind"] == "file"][-1]
    assert last["path"] != "frames/f000.txt"
    original = get(store, entry_blob(last))
    put(store, entry_blob(last), b"9" * last["size"])
    dead = target / "frames" / f"{_restore_prefix()}999999999-left"
    dead.write_text("a killed restore's")
    live = target / "frames" / f"{_restore_prefix()}{os.getpid()}-running"
    live.write_text("a running restore's")
    with pytest.raises(RestoreError, match="does not match its hash"):
        restore_checkpoint(store.fs, cp.manifest, str(target), [])
    assert (target / "frames" / "f000.txt").read_text() == "the user's own"
    left = sorted(p.name for p in (target / "frames").iterdir())
    assert left == sorted(["f000.txt", live.name]), left
    # A folder where a later file goes is found before any file is renamed in.
    put(store, entry_blob(last), original)
    restore_checkpoint(store.fs, cp.manifest, str(target), [])  # content mended: restores
    (target / "frames" / "f000.txt").write_text("the user's own")
    (target / last["path"]).unlink()
    (target / last["path"]).mkdir()
    with pytest.raises(RestoreError, match="a folder is in its place"):
        restore_checkpoint(store.fs, cp.manifest, str(target), [])
    assert (target / "frames" / "f000.txt").read_text() == "the user's own"


SAVE_THEN_RENAME = (
    WAIT_GATE
    + """
import json, os, time
gates = GATES
wd = os.getcwd()
model = os.path.join(wd, "model.bin")
for n in (1, 2):
    with open(model + ".tmp", "wb") as fh:
        fh.write(bytes([n]) * (64 << 20))
    os.replace(model + ".tmp", model)
    print("openjd_checkpoint_save: " + json.dumps({"state": str(n), "file": model}), flush=True)
    time.sleep(0.1)  # the next version goes in while the saved one is still being copied
    with open(model + ".tmp", "wb") as fh:
        fh.write(b"next")
    os.replace(model + ".tmp", model)
    wait_gate(os.path.join(gates, f"stored-{n}"))  # the test opens it once n is stored
"""
)


def test_a_save_survives_the_file_being_renamed_over_while_it_is_copied(tmp_path: Path) -> None:
    """The save-then-rename pattern: the save's file is taken as it was when the save was
    printed, even when the task renames a newer file over it while it is being copied (the
    old inode's ctime changes then, its content does not)."""
    from conftest import one_step_template

    store = CheckpointStore(tmp_path / "store", files="managed")
    code = SAVE_THEN_RENAME.replace("GATES", repr(str(tmp_path)))
    job = prepare_job(one_step_template(tmp_path / "t.yaml", "save then rename", code))
    run = Run(job, store, tmp_path / "work")
    for n in (1, 2):  # (a warning opens the gate too: the assertions below tell it)
        open_gate(run, tmp_path / f"stored-{n}",
                  lambda n=n: stored_generation(store, job) >= n or run.ex.warnings,
                  f"save {n} stored")  # fmt: skip
    result = run.join()
    assert result.outcome == TaskOutcome.SUCCEEDED, (result.message, run.ex.warnings)
    assert not [w for w in run.ex.warnings if "changed" in w], run.ex.warnings
    cp = result.record.checkpoint
    assert cp is not None and cp.state == "2", (cp, run.ex.warnings)
    manifest = json.loads(get(store, manifest_key(cp.manifest)))
    [entry] = [e for e in manifest["entries"] if e["path"] == "model.bin"]
    assert get(store, entry_blob(entry))[:1] == b"\x02" and entry["size"] == 64 << 20


def test_file_roots_that_overlap_the_store_or_are_no_folders_are_refused(tmp_path: Path) -> None:
    """A file root holding the store (or inside it) would let a restore write over the store's
    records: refused, naming both. On the CLI a root that is not an absolute path of a folder
    exits 2 naming --file-root; $OPENJD_CHECKPOINT_FILE_ROOTS is named when it is wrong."""
    import subprocess
    import sys

    from conftest import EXAMPLES, ROOT

    from core import StoreError

    store = tmp_path / "store"
    for root in (tmp_path, store, store / "jobs"):
        with pytest.raises(StoreError, match="overlap"):
            CheckpointStore(store, files="managed", file_roots=[str(root)])
    beside = tmp_path / "beside"
    beside.mkdir()
    CheckpointStore(store, files="managed", file_roots=[str(beside)])  # fine
    example = str(EXAMPLES / "fibonacci" / "fibonacci-fast.yaml")
    for bad in ("", "relative/dir", str(tmp_path / "missing")):
        done = subprocess.run(
            [sys.executable, "-m", "core.cli", "run", example, "-p", "N=1",
             "--store", str(store), "--files", "managed", "--file-root", bad],
            capture_output=True, text=True, cwd=ROOT, timeout=60,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert "--file-root" in done.stderr, done.stderr
    done = subprocess.run(
        [sys.executable, "-m", "core.cli", "run", example, "-p", "N=1", "--store", str(store)],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
        env=dict(os.environ, OPENJD_CHECKPOINT_FILE_ROOTS="relative"),
    )  # fmt: skip
    assert done.returncode != 0 and "$OPENJD_CHECKPOINT_FILE_ROOTS" in done.stderr, done.stderr


LONG_TASK = """
import json, time
for n in range(150):  # 300 s unless stopped
    print("openjd_checkpoint_save: " + json.dumps({"state": str(n)}), flush=True)
    print(f"STEP {n}", flush=True)
    time.sleep(2)
print("result: all steps", flush=True)
"""


def _run_while_s3_goes_away(tmp_path: Path, args: list[str], kill_after: str) -> str:
    """Run the CLI with ``args`` on an S3 store of a moto server of its own; kill the server
    once the CLI printed ``kill_after``; the CLI's whole output (it must end within 4 minutes:
    a hang guard, not a speed goal)."""
    import signal
    import subprocess
    import sys

    import s3server
    from conftest import ROOT, rest_of_output

    port = s3server._free_port()
    server = subprocess.Popen(
        [sys.executable, s3server.__file__, "127.0.0.1", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        end = time.monotonic() + 60
        while not s3server._answers(f"http://127.0.0.1:{port}/"):
            assert server.poll() is None and time.monotonic() < end, "moto did not start"
            time.sleep(0.1)
        s3server._put(f"http://127.0.0.1:{port}/going-away")
        env = dict(
            _cli_env(tmp_path / "host", "host"),
            FSSPEC_S3_ENDPOINT_URL=f"http://127.0.0.1:{port}",
            AWS_ACCESS_KEY_ID=s3server.ACCESS_KEY,
            AWS_SECRET_ACCESS_KEY=s3server.SECRET_KEY,
            AWS_DEFAULT_REGION="us-east-1",
        )
        cli = subprocess.Popen(
            [sys.executable, "-m", "core.cli", "run", *args, "--store", "s3://going-away/p"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        seen: list[str] = []
        assert cli.stdout is not None
        for line in cli.stdout:
            seen.append(line)
            if kill_after in line:
                os.killpg(server.pid, signal.SIGKILL)
                break
        try:
            rest = rest_of_output(cli, 240)
        except subprocess.TimeoutExpired:
            raise AssertionError("the run still waited on the store 4 minutes later") from None
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
        server.wait(10)
    out = "".join(seen) + rest
    assert cli.returncode == 3, out
    return out


def test_an_s3_store_that_goes_away_mid_run_ends_the_run_in_seconds(tmp_path: Path) -> None:
    """The S3 service dies while a task declares a file a step: the run ends with exit 3 and
    the store's error, within its timeouts (a call fails in seconds, and files queued after a
    failure are not tried for a while), instead of waiting out every queued file (it took
    about 8 minutes)."""
    from conftest import EXAMPLES

    training = str(EXAMPLES / "managed-files" / "training.yaml")
    out = _run_while_s3_goes_away(
        tmp_path, [training, "-p", "Epochs=40", "-p", "EpochSeconds=0.2"], "epoch 3/"
    )
    assert "EndpointConnectionError" in out and "result: " in out, out
    assert "not tried: the store could not be written a moment ago" in out, out


def test_a_long_task_stops_once_its_lease_on_an_unreachable_store_expires(
    tmp_path: Path,
) -> None:
    """The S3 service dies under a task of 5 minutes: once the run's lease could not be
    renewed for its ttl (60 s), another process may take the run over, so this one cancels
    its task instead of running it to its end (nothing it does can be stored), and writes
    nothing more."""
    from conftest import one_step_template

    template = one_step_template(tmp_path / "long.yaml", "long task", LONG_TASK)
    out = _run_while_s3_goes_away(tmp_path, [str(template)], "STEP 2")
    assert "could not be renewed for its whole ttl" in out, out
    assert "stops its tasks" in out and "result: all steps" not in out, out


def test_an_unreadable_outputs_index_is_named_and_gc_then_removes_no_content(
    tmp_path: Path,
) -> None:
    """After a run has ended its outputs index is the only record of its files: one that
    cannot be read is named by checkpoints show, and gc keeps every stored file until it is
    mended or deleted (it would have freed the files it named)."""
    import subprocess
    import sys

    from conftest import EXAMPLES, ROOT

    store = tmp_path / "store"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "core.cli", *args, "--store", str(store)],
                              capture_output=True, text=True, cwd=ROOT, timeout=120)  # fmt: skip

    done = cli("run", str(EXAMPLES / "managed-files" / "training.yaml"), "--files", "managed",
               "-p", "Epochs=3", "-p", "EpochSeconds=0.05", "-q")  # fmt: skip
    assert done.returncode == 0, done.stderr
    [index] = store.glob("jobs/*/runs/*/outputs/*.json")
    index.write_text("[1, 2")
    blobs = sorted(store.glob("blobs/blake3/*/*"))
    assert len(blobs) >= 3
    run_id = index.parents[1].name
    shown = cli("checkpoints", "show", run_id, "--json")
    assert shown.returncode == 0, shown.stderr
    [warning] = json.loads(shown.stdout)["warnings"]
    assert index.name in warning and "unreadable early-outputs index" in warning
    gc = cli("gc", "--grace-seconds", "0")
    assert gc.returncode == 0, gc.stderr
    assert "no stored file content was removed" in gc.stderr and index.name in gc.stderr
    assert sorted(store.glob("blobs/blake3/*/*")) == blobs


def test_the_printed_resume_command_restores_files_kept_under_a_file_root(tmp_path: Path) -> None:
    """The "to resume:" line of a suspended run repeats its ``--files`` and ``--file-root``
    options: run as printed, the task resumes with its file restored under that root (without
    them the root is not allowed there, and the task would run from the top)."""
    import shlex
    import signal
    import subprocess

    from conftest import ROOT, CliProcess

    root = tmp_path / "outside"
    root.mkdir()
    template = tmp_path / "root.yaml"
    template.write_text(
        textwrap.dedent(
            f"""\
            specificationVersion: jobtemplate-2023-09
            extensions: [CHECKPOINT]
            name: Root
            steps:
            - name: S
              script:
                actions:
                  onRun:
                    command: python3
                    args:
                    - -c
                    - |
                      import json, time
                      open({str(root / "w.bin")!r}, "wb").write(b"weights")
                      print("openjd_checkpoint_save: " + json.dumps(
                          {{"state": "1", "file": {str(root / "w.bin")!r}}}), flush=True)
                      time.sleep(60)
                  onCheckpointResume:
                    command: python3
                    args: [-c, "import sys; print('GOT', open(sys.argv[1], 'rb').read())",
                           "{{{{Task.Checkpoint.File}}}}"]
            """
        )
    )
    store = str(tmp_path / "store")
    run = CliProcess(
        "run", str(template), "--store", store, "--files", "managed", "--file-root", str(root)
    )
    run.wait_for("checkpoint generation 1 stored", timeout=60, stream="err")
    run.proc.send_signal(signal.SIGINT)
    assert run.wait(60) == 75, run.stderr
    [hint] = [ln for ln in run.stderr.splitlines() if "to resume: " in ln]
    cmd = shlex.split(hint.split("to resume: ", 1)[1].split("  (or", 1)[0])
    assert cmd[-4:] == ["--files", "managed", "--file-root", str(root)], cmd
    (root / "w.bin").unlink()  # as on another host: restored from the store
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "GOT b'weights'" in done.stdout + done.stderr


def test_a_small_file_that_grows_while_it_is_read_is_read_no_further_than_one_byte_more(
    tmp_path: Path,
) -> None:
    """A file read whole into memory (under ``STAGE_BYTES``) that a writer appends to after
    its size was taken is read to one byte past that size, no more (it grew: the capture
    refuses it), in a few reads, not one byte at a time to wherever the writer got to."""
    from core.files._capture import _read_all

    path = tmp_path / "growing.bin"
    path.write_bytes(os.urandom(1 << 20))
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        with open(path, "ab") as out:
            out.write(os.urandom(4 << 20))  # appended after the size was taken
        started = time.monotonic()
        got = _read_all(fd, size)
        assert len(got) == size + 1
        assert time.monotonic() - started < 1.0
        assert _read_all(fd, 5 << 20) == path.read_bytes()  # the whole file: all of it
    finally:
        os.close(fd)
