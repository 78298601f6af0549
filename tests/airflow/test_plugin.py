"""The plugin on the live stack: its endpoints refuse unauthenticated calls, end a DAG run in a
core termination mode (with the core's outcome, and the finally step only after the regular
tasks ended), and list the run's checkpoints."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

import airflow_helpers as ah
import pytest

from airflow_plugin._page import frame_ranges

ROOT = Path(__file__).resolve().parents[2]
THREE_STEPS = ROOT / "tests" / "data" / "three_steps.yaml"

DAG_FILE = """
from airflow_plugin import dag_from_template

dag = dag_from_template({template!r}, dag_id={dag_id!r}, store={store!r})
"""


def test_endpoints_refuse_unauthenticated_calls(airflow_live: ah.AirflowStack) -> None:
    client = airflow_live.client
    path = "/openjd/dags/any_dag/dagRuns/any_run"
    for method, sub, body in (
        ("POST", "/termination", {"mode": "Cancelled"}),
        ("GET", "/checkpoints", None),
        ("GET", "/page", None),
    ):
        resp = client.request(method, path + sub, auth=False, expect=None, json=body)
        assert resp.status_code == 401, resp.text
        resp = client.request(
            method,
            path + sub,
            auth=False,
            expect=None,
            json=body,
            headers={"Authorization": "Bearer not-a-token"},
        )
        assert resp.status_code == 403, resp.text
    # Authenticated, the same call reaches the endpoint (no such DAG run: 404).
    resp = client.request("GET", path + "/checkpoints", expect=None)
    assert resp.status_code == 404 and "no OpenJD job run" in resp.text
    resp = client.request("GET", path + "/page", expect=None)  # the page's fragment: says so
    assert resp.status_code == 200 and "No OpenJD job run yet" in resp.text, resp.text
    assert 'data-live="1"' in resp.text  # the page keeps polling: the run may begin
    # Bad input, authenticated: refused with a word, never a 500 (an unknown mode, a body that
    # is not JSON or has no mode, odd or long path parameters, a DAG run with no job run)
    bad = client.request("POST", path + "/termination", json={"mode": "Pause"}, expect=None)
    assert bad.status_code == 422 and "unknown termination mode 'Pause'" in bad.text, bad.text
    for body in ({"content": b"{not json"}, {"json": {}}, {"json": ["Cancelled"]}):
        bad = client.request("POST", path + "/termination", expect=None, **body)
        assert bad.status_code == 422, bad.text
    resp = client.request("POST", path + "/termination", json={"mode": "Cancelled"}, expect=None)
    assert resp.status_code == 404 and "no OpenJD job run" in resp.text, resp.text
    for odd in ("..%2F..%2Fx/dagRuns/r", "d/dagRuns/..%2Fr"):  # a %2F is a / to the router
        for sub in ("/checkpoints", "/page"):
            resp = client.request("GET", f"/openjd/dags/{odd}{sub}", expect=None)
            assert resp.status_code == 404 and resp.json() == {"detail": "Not Found"}
    odd = f"/openjd/dags/{'d' * 5000}/dagRuns/r\u202e%3Cb%3E"
    resp = client.request("GET", odd + "/checkpoints", expect=None)
    assert resp.status_code == 404 and "no OpenJD job run" in resp.text, resp.text[-300:]
    resp = client.request("GET", odd + "/page", expect=None)
    assert resp.status_code == 200 and "No OpenJD job run yet" in resp.text, resp.text[-300:]
    assert "r\u202e&lt;b&gt; has no OpenJD job run" in resp.text, resp.text[-300:]
    plugins = {p["name"]: p for p in client.get("/api/v2/plugins")["plugins"]}
    [view] = plugins["openjd_checkpoint"]["external_views"]
    assert view["href"] == "/openjd/ui/runs/{DAG_ID}/{RUN_ID}"
    assert view["destination"] == "dag_run"


def _ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


# mode -> (the core run's status, what the finally step writes to cleanup-status or None when
# it must not run, the status of the Render task that was running when the request came).
# Cancelled runs no finally step; StoppedRunFinally lets the running task finish and starts no
# new one, then runs the finally step; CancelledRunFinally cancels it, then runs the finally
# step; Suspended checkpoints it and runs no finally step (core/_termination.py, finish_attempt).
# mode -> the end buttons the page may still show once that request is in (only modes that
# could replace it: core.termination_choices).
STILL_OFFERED = {
    "Suspended": {"Cancelled"},
    "StoppedRunFinally": {"CancelledRunFinally", "Cancelled"},
    "CancelledRunFinally": {"Cancelled"},
    "Cancelled": set(),
}

MODES = {
    "Suspended": ("interrupted", None, "interrupted"),
    "StoppedRunFinally": ("stopped", "Stopped\n", "succeeded"),
    "CancelledRunFinally": ("canceled", "Cancelled\n", "canceled"),
    "Cancelled": ("canceled", None, "canceled"),
}


@pytest.mark.parametrize("mode", list(MODES))
def test_termination_mode_through_the_plugin(
    airflow_live: ah.AirflowStack, tmp_path: Path, mode: str
) -> None:
    core_status, cleanup, caught_status = MODES[mode]
    client = airflow_live.client
    dag_id = f"plugin_{mode.lower()}"
    out, store = tmp_path / "out", tmp_path / "store"
    out.mkdir()
    source = DAG_FILE.format(template=str(THREE_STEPS), dag_id=dag_id, store=str(store))
    airflow_live.add_dag(f"{dag_id}.py", source, dag_id=dag_id)
    # Each Render chunk takes 2 frames x FrameSeconds. The request is sent once a chunk has
    # finished its first frame: its script has set its signal handlers by then (a signal
    # before that kills it, with no checkpoint), and its second frame leaves the request
    # (applied within about a second) time to reach it while it runs. StoppedRunFinally
    # waits for that frame: a shorter one there.
    seconds = 2.0 if mode == "StoppedRunFinally" else 4.0
    run_id = client.trigger(dag_id, conf={"Out": str(out), "FrameSeconds": seconds})
    base = f"/openjd/dags/{dag_id}/dagRuns/{run_id}"

    def rendering() -> Path | None:
        for p in store.glob("jobs/*/runs/*/tasks/*.json"):
            if ".gen-" not in p.name:
                rec = json.loads(p.read_text())
                if rec["status"] == "running" and rec["completed_frames"]:
                    return p
        return None

    caught = ah.wait_until(rendering, timeout=120, what="a Render task to finish a frame")
    resp = client.request("POST", base + "/termination", json={"mode": mode})
    assert resp.json()["mode"] == mode
    fragment = client.request("GET", base + "/page").text
    assert set(re.findall(r'data-mode="(\w+)"', fragment)) <= STILL_OFFERED[mode], fragment
    # A less forceful mode afterwards changes nothing or is refused (the same mode again
    # would force it: docs/decisions.md, "A second request forces").
    lesser = "Suspended" if mode == "StoppedRunFinally" else "StoppedRunFinally"
    again = client.request("POST", base + "/termination", json={"mode": lesser}, expect=None)
    assert again.status_code in (200, 409)  # never more forceful: no change, or refused

    run = client.wait_dag_run(dag_id, run_id, timeout=120)
    assert run["state"] == "failed"
    tis = {(t["task_id"], t["map_index"]): t for t in client.task_instances(dag_id, run_id)}
    listing = client.request("GET", base + "/checkpoints").json()
    assert listing["status"] == core_status
    assert listing["condition"]["reason"] == mode
    assert listing["termination"] == mode
    assert listing["file_data_flow"] == "shared"  # the default: no [openjd_checkpoint] files
    renders = [t for t in listing["tasks"] if t["step"] == "Render"]
    # The page's fragment of the ended run: no end button, what happened to the checkpoints,
    # states in the CLI's words, the finished frames of the caught chunk as ranges.
    fragment = client.request("GET", base + "/page").text
    assert 'data-live="0"' in fragment and "data-mode=" not in fragment, fragment
    assert 'id="ended-note"' in fragment
    assert ('id="resume-hint"' in fragment) == (mode == "Suspended")
    words = {"interrupted": "suspended", "canceled": "canceled", "stopped": "stopped"}
    assert f'data-status="{words[core_status]}"' in fragment
    assert 'data-status="interrupted"' not in fragment
    assert renders and all(t["status"] != "running" for t in renders)
    caught_record = json.loads(caught.read_text())
    assert caught_record["status"] == caught_status, caught_record
    # No regular task starts once the request is in: Assemble (after Render) never runs.
    assert not [t for t in listing["tasks"] if t["step"] == "Assemble"], listing
    assert all(t["state"] != "success" for k, t in tis.items() if k[0] == "Assemble"), tis
    frames = caught_record["completed_frames"]
    if frames:
        assert f"frames done {frame_ranges(frames)} ({len(frames)})" in fragment, fragment
    if mode == "Suspended":
        assert caught_record["checkpoint"], caught_record  # stopped with a checkpoint
        assert caught_record["completed_frames"], caught_record  # and its finished frame
        assert any(t["checkpoints"] for t in renders), listing
        assert all(t["status"] in ("interrupted", "succeeded") for t in renders), listing
    elif mode == "StoppedRunFinally":  # let finish, not signalled: every frame of it is done
        frames = caught_record["parameters"]["Frame"]["value"]
        lo, _, hi = frames.partition("-")
        done = list(range(int(lo), int(hi or lo) + 1))
        assert caught_record["completed_frames"] == done
        assert all((out / f"frame-{f}").read_text() == "x" for f in done)
        assert all(t["status"] in ("succeeded", "pending") for t in renders), listing
    else:
        assert all(t["status"] in ("canceled", "succeeded", "pending") for t in renders), listing
    if cleanup is None:  # no finally step: its command never ran
        assert tis[("Cleanup", 0)]["state"] == "skipped"
        assert not (out / "cleanup-status").exists()
        assert not [t for t in listing["tasks"] if t["step"] == "Cleanup"], listing
        log = client.task_log(dag_id, run_id, "Cleanup", 1, map_index=0)
        assert f"(not run: {mode})" in log, log[-3000:]
        assert "CLEANUP status" not in log
    else:  # the finally step ran, with Job.Status from the mode, after every Render task ended
        assert (out / "cleanup-status").read_text() == cleanup
        assert tis[("Cleanup", 0)]["state"] == "success"
        cleanup_start = _ts(tis[("Cleanup", 0)]["start_date"])
        render_ends = [_ts(t["end_date"]) for k, t in tis.items() if k[0] == "Render"]
        assert cleanup_start >= max(render_ends)
    assert tis[("openjd_finish", -1)]["state"] == "failed"
    late = client.request("POST", base + "/termination", json={"mode": "Cancelled"}, expect=None)
    assert late.status_code == 409 and "ended" in late.text


def test_checkpoints_page_is_served(airflow_live: ah.AirflowStack) -> None:
    resp = airflow_live.client.request("GET", "/openjd/ui/runs/some_dag/some_run", auth=False)
    assert "OpenJD checkpoints" in resp.text
    assert '"/openjd/dags/some_dag/dagRuns/some_run"' in resp.text
    # the shell answers without credentials, and holds no data: its script loads the fragment
    assert 'base + "/page"' in resp.text and "chakra-ui-color-mode" in resp.text
    assert 'id="job-run"' not in resp.text


def test_frame_ranges() -> None:
    assert frame_ranges([]) == ""
    assert frame_ranges([9, 1, 2, 3, 4, 5, 6, 7]) == "1-7,9"
    assert frame_ranges([3, 5, 6, 5]) == "3,5-6"
