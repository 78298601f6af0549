"""A store written by an earlier version is read, resumed and collected by this one.

``tests/data/store_v1/store`` was made by the product before the core was split into layers,
``tests/data/store_v2/store`` before issue 25 changed which writes are durable and how
checkpoint files are hashed (each ``make_store.py`` says how and holds what): in each, three
suspended runs (a
state-only checkpoint, a chunk with finished frames, managed checkpoint files with sample
outputs) and a finished run whose early outputs are kept. Every kind of record in it is read
through the CLI, ``gc`` deletes none of its live files, and every suspended run resumes from
what it kept to the right answer.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import ROOT, run_cli

FIXTURES = ROOT / "tests" / "data"
TEMPLATES = FIXTURES / "store_v1" / "templates"
"""The templates of both fixtures (the same files)."""


@pytest.fixture(params=["store_v1", "store_v2"])
def store(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    copy = tmp_path / request.param / "store"  # the fixture's name: store.parent.name
    shutil.copytree(FIXTURES / request.param / "store", copy)
    return copy


STATE_SUSPENDED = {"store_v1": (13, 91, [12, 13, 14]), "store_v2": (14, 105, [13, 14, 15])}
"""Each fixture's state-only run: the step it was suspended after, the sum so far, and the
checkpoint generations kept."""


def test_the_fixtures_share_their_templates() -> None:
    for name in ("state.yaml", "frames.yaml", "training.yaml"):
        assert (TEMPLATES / name).read_bytes() == (
            FIXTURES / "store_v2" / "templates" / name
        ).read_bytes()


def _files(store: Path) -> set[str]:
    return {str(p.relative_to(store)) for p in store.rglob("*") if p.is_file()}


def _runs(store: Path) -> dict[str, dict]:
    """Runs by their fixture name (the template's file stem; ``finished`` for the training
    run of two epochs)."""
    done = run_cli("runs", "--json", "--store", store)
    assert done.returncode == 0, done.stderr
    out: dict[str, dict] = {}
    for run in json.loads(done.stdout)["runs"]:
        name = Path(run["template"]).stem
        out["finished" if run["parameters"].get("Epochs") == "2" else name] = run
    assert set(out) == {"state", "frames", "training", "finished"}, out
    return out


def test_every_record_of_the_old_store_is_read(store: Path) -> None:
    runs = _runs(store)
    assert {name: r["stored_status"] for name, r in runs.items()} == {
        "state": "interrupted",
        "frames": "interrupted",
        "training": "interrupted",
        "finished": "succeeded",
    }
    assert runs["state"]["tasks_with_checkpoints"] == 1
    assert runs["training"]["tasks_with_checkpoints"] == 1
    assert runs["frames"]["tasks_resumable"] == 1
    for name, run in runs.items():
        shown = run_cli("checkpoints", "show", run["run_id"], "--json", "--store", store)
        assert shown.returncode == 0, (name, shown.stderr)
        assert "warning" not in shown.stderr, (name, shown.stderr)
        doc = json.loads(shown.stdout)
        logs = run_cli("logs", run["run_id"], "--store", store)
        assert logs.returncode == 0, (name, logs.stderr)
        if name == "state":
            step, total, generations = STATE_SUSPENDED[store.parent.name]
            [task] = doc["tasks"]
            assert task["checkpoint"]["state"] == f"{step},{total}"
            assert task["generations"] == generations
            assert f"COUNTER-STEP {step}" in logs.stdout
        if name == "frames":
            [task] = doc["tasks"]
            assert task["completed_frames"] == [1, 2, 3]
            assert "FRAME 3" in logs.stdout and "FRAME 4" not in logs.stdout
        if name == "training":
            [task] = doc["tasks"]
            assert task["checkpoint"]["files"], task
            assert "epoch 4/12 done" in logs.stdout
        if name == "finished":
            assert "result: 1" in logs.stdout  # 0*0 + 1*1
    listed = run_cli("checkpoints", "list", "--json", "--store", store)
    assert listed.returncode == 0, listed.stderr
    assert "warning" not in listed.stderr


def _live_files(store: Path) -> set[str]:
    """What the records of ``store`` reference, read from the files themselves (not through the
    code under test): the manifest of each kept checkpoint generation (a task record's latest
    and every ``*.gen-<N>.json``), the blobs those manifests list, and the blobs of every
    early-outputs index."""
    live: set[str] = set()
    for path in store.glob("jobs/*/runs/*/tasks/*.json"):
        doc = json.loads(path.read_text())
        digest = (doc.get("checkpoint") or doc).get("manifest")
        if digest:
            manifest = f"manifests/{digest[:2]}/{digest}.json"
            live.add(manifest)
            for entry in json.loads((store / manifest).read_text())["entries"]:
                if entry["kind"] == "file":  # named by sha256 (this store), blake3 (after it)
                    [(algo, h)] = [(a, entry[a]) for a in ("blake3", "sha256") if entry.get(a)]
                    live.add(f"blobs/{algo}/{h[:2]}/{h}")
    for path in store.glob("jobs/*/runs/*/outputs/*.json"):
        live |= {e["blob"] for e in json.loads(path.read_text())["files"].values()}
    return live


def _gc(store: Path) -> None:
    done = run_cli("gc", "--retention-days", "36500", "--grace-seconds", "0", "--store", store)
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr, done.stderr
    assert "0 run(s) removed" in done.stdout, done.stdout


def test_gc_deletes_none_of_the_old_store_s_live_files(store: Path) -> None:
    before = _files(store)
    live = _live_files(store)
    assert len([f for f in live if f.startswith("blobs/")]) >= 6  # model files and samples
    _gc(store)
    after = _files(store)
    assert live <= after, live - after
    # what went was only files no kept generation or output references (superseded ones)
    assert all(f.startswith(("blobs/", "manifests/")) for f in before - after), before - after
    assert not (before - after) & live


@pytest.mark.parametrize(
    ("name", "template", "answer", "not_again"),
    [
        ("state", "state.yaml", f"COUNTER-DONE n=40 sum={sum(range(1, 41))}", "COUNTER-STEP {}\n"),
        ("frames", "frames.yaml", "FRAME 6", "FRAME 3\n"),
        ("training", "training.yaml", f"result: {sum(k * k for k in range(12))}", "epoch 4/12"),
    ],
)
def test_every_suspended_run_of_the_old_store_resumes(
    store: Path, tmp_path: Path, name: str, template: str, answer: str, not_again: str
) -> None:
    _gc(store)  # what a resume needs survives a collection first
    run = _runs(store)[name]
    env = {"OPENJD_CHECKPOINT_FILES": "managed" if name == "training" else "shared"}
    done = run_cli(
        "resume",
        run["run_id"],
        "--template",
        TEMPLATES / template,
        "--store",
        store,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    logs = run_cli("logs", run["run_id"], "--attempt", "2", "--store", store).stdout
    assert answer in logs, logs
    not_again = not_again.format(STATE_SUSPENDED[store.parent.name][0])
    assert not_again not in logs, logs  # continued from what was kept, not from the top
    after = _runs(store)[name]
    assert after["stored_status"] == "succeeded" and after["attempts"] == 2, after
    if name == "training":
        # The resumed attempt's outputs name the restored files unchanged since by their
        # sha256 blobs and its new files by blake3 ones: gc keeps both.
        live = _live_files(store)
        assert {k.split("/")[1] for k in live if k.startswith("blobs/")} == {"sha256", "blake3"}
        _gc(store)
        assert live <= _files(store), live - _files(store)
