"""The plugin's page and endpoints on stored records that are damaged or odd, written straight
into a store folder (no Airflow stack: ``plugin.fragment_of`` and ``plugin.read_job_run`` are
what the endpoints call once the setup task's XCom is read). A damaged record, a run deleted
while the page polls, a store that cannot be read: a fragment that names what and where, never
an error page, and never a stored file set aside or rewritten (a viewer changes nothing)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from fastapi import HTTPException

import core
from airflow_plugin.plugin import fragment_of, read_job_run
from core.store._layout import task_id_for

JK = "0" * 16
WHERE = "DAG run d/r"


def _store(tmp_path: Path) -> tuple[dict[str, str], Path]:
    st = core.CheckpointStore(tmp_path / "store")
    st.write_run(core.RunRecord(job_key=JK, run_id="r1", job_name="J", template_hash="h"))
    rec = core.TaskRecord(job_key=JK, run_id="r1", step="S", task_key="{}", parameters={})
    st.commit_checkpoint(rec, core.CheckpointData(generation=1, saved_at=time.time(), attempt=1))
    attempt = {"job_key": JK, "run_id": "r1", "store": str(tmp_path / "store")}
    return attempt, tmp_path / "store" / "jobs" / JK / "runs" / "r1"


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_odd_times_and_markup_in_records_are_shown_escaped_and_said(tmp_path: Path) -> None:
    attempt, run_dir = _store(tmp_path)
    path = run_dir / "tasks" / f"{task_id_for('S', '{}')}.json"
    raw = json.loads(path.read_text())
    raw["history"] = [
        {"attempt": 1, "started_at": float("nan"), "host": "<b>h</b>"},
        {"attempt": 2, "started_at": time.time(), "ended_at": 0.0, "host": "<b>h</b>"},
    ]
    raw["message"] = '<script>alert("x")</script> & \u202eעברית'
    raw["checkpoint"]["saved_at"] = float("inf")
    path.write_text(json.dumps(raw))
    [gen] = path.parent.glob("*.gen-*.json")  # its stored generation: the same time
    gen.write_text(json.dumps({**json.loads(gen.read_text()), "saved_at": float("inf")}))
    run_path = run_dir / "run.json"
    run = json.loads(run_path.read_text())
    run["created_at"] = -1e300
    run_path.write_text(json.dumps(run))
    before = _files(run_dir)

    page = fragment_of(attempt, WHERE)
    assert "<script>" not in page and "&lt;script&gt;alert(&quot;x&quot;)" in page
    assert "history[0] (attempt 1): started_at nan is not a time" in page
    assert "checkpoint generation 1: saved_at inf is not a time" in page
    assert "-1e+300 (not a time)" in page and "inf (not a time)" in page  # the table's time
    styles = re.findall(r'style="([^"]*)"', page)
    assert styles and not any("nan" in s or "inf" in s or "-" in s for s in styles)
    assert "<b>" not in page and "on &lt;b&gt;h&lt;/b&gt;" in page
    assert _files(run_dir) == before


def test_a_damaged_or_deleted_run_or_an_unreadable_store_gets_a_message(tmp_path: Path) -> None:
    attempt, run_dir = _store(tmp_path)
    tasks = run_dir / "tasks"
    record = tasks / f"{task_id_for('S', '{}')}.json"
    record.write_text("{not json")  # a damaged task record: a warning, left as it is
    before = _files(run_dir)
    page = fragment_of(attempt, WHERE)
    assert f"{record} is unreadable" in page and "left as it is" in page
    assert 'data-live="1"' in page
    assert _files(run_dir) == before  # not set aside, not rebuilt from its generation
    with pytest.raises(HTTPException) as caught:  # the JSON endpoints' reading: the same
        read_job_run({**attempt, "store": str(tmp_path / "elsewhere")}, WHERE)
    assert caught.value.status_code == 404

    run_path = run_dir / "run.json"
    run = json.loads(run_path.read_text())
    run["kept"] = {"at": "not a time"}  # a run record that is not of the schema
    run_path.write_text(json.dumps(run))
    before = _files(run_dir)
    page = fragment_of(attempt, WHERE)
    assert f"Cannot show the OpenJD job run: {WHERE}: " in page
    assert f"{run_path} is unreadable (kept.at: " in page and 'data-live="1"' in page
    assert _files(run_dir) == before  # the run record is not set aside by a viewer

    run_path.write_text("[]" * 10)  # ...or not even a record
    assert "is unreadable" in fragment_of(attempt, WHERE)
    (tmp_path / "blocked").write_text("")  # a store whose location is a file
    page = fragment_of({**attempt, "store": str(tmp_path / "blocked")}, WHERE)
    assert "Cannot show the OpenJD job run" in page and str(tmp_path / "blocked") in page

    for p in sorted(run_dir.rglob("*"), reverse=True):  # deleted while the page polls
        p.unlink() if p.is_file() else p.rmdir()
    page = fragment_of(attempt, WHERE)
    assert "its job run r1 is not in the checkpoint store" in page and "deleted" in page
    assert 'data-live="0"' in page  # the page stops polling


def test_a_task_with_hundreds_of_stored_generations_lists_the_newest(tmp_path: Path) -> None:
    attempt, run_dir = _store(tmp_path)
    tid = task_id_for("S", "{}")
    for n in range(2, 301):  # a store kept 300 generations (a large keep_generations)
        body = {"generation": n, "saved_at": time.time(), "attempt": 1, "state": "x" * n}
        (run_dir / "tasks" / f"{tid}.gen-{n:06d}.json").write_text(json.dumps(body))
    page = fragment_of(attempt, WHERE)
    rows = re.findall(r'<tr class="generation" data-generation="(\d+)"', page)
    assert rows == [str(n) for n in range(300, 200, -1)]  # the newest 100, newest first
    assert "the newest 100 generations; older ones stored are not shown" in page
    marks = re.findall(r'class="checkpoint" data-generation="(\d+)"', page)
    assert marks == [str(n) for n in range(201, 301)]
