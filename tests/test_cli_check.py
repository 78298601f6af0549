"""``openjd-checkpoint check`` says how each step resumes, as text and as ``--json``."""

from __future__ import annotations

import json
import subprocess

from conftest import EXAMPLES, ROOT, run_cli


def check(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("check", *args, cwd=ROOT, timeout=60)


def test_check_tells_how_each_example_step_resumes() -> None:
    chunked = check(str(EXAMPLES / "chunked-frames" / "chunked-frames.yaml"))
    assert chunked.returncode == 0, chunked.stderr
    assert "resumable steps: Render" in chunked.stdout
    assert "Render: by finished frames" in chunked.stdout
    assert "suspending sends SIGTERM (cancelation; no checkpointCancelation)" in chunked.stdout
    fib = check(str(EXAMPLES / "fibonacci" / "fibonacci.yaml"))
    assert "ResumableFibonacci: from its last checkpoint, through onCheckpointResume" in fib.stdout
    assert "suspending sends SIGUSR1 (checkpointCancelation), then terminates it after 300 s" in (
        fib.stdout
    )


def test_check_json(tmp_path) -> None:
    doc = json.loads(
        check(str(EXAMPLES / "chunked-frames" / "chunked-frames.yaml"), "--json").stdout
    )
    assert doc["schema"] == 1 and doc["name"] == "Chunked frames job"
    (step,) = doc["steps"]
    assert step == {
        "step": "Render", "path": "steps[0]", "finally": False, "resumes": "frames",
        "on_suspend": step["on_suspend"],
    }  # fmt: skip
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({
        "specificationVersion": "jobtemplate-2023-09", "extensions": ["FINALLY"], "name": "p",
        "steps": [{"name": "A", "script": {"actions": {"onRun": {"command": "true"}}}}],
        "finally": [{"name": "F", "script": {"actions": {"onRun": {"command": "true"}}}}],
    }))  # fmt: skip
    doc = json.loads(check(str(plain), "--json").stdout)
    assert [(s["step"], s["path"], s["finally"], s["resumes"]) for s in doc["steps"]] == [
        ("A", "steps[0]", False, "none"), ("F", "finally[0]", True, "none"),
    ]  # fmt: skip
    bad = check(str(tmp_path / "missing.yaml"), "--json")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    # A refused template is one document on stdout too: its problems, each with its field.
    broken = tmp_path / "broken.yaml"
    broken.write_text(json.dumps({
        "specificationVersion": "jobtemplate-2023-09", "name": "b",
        "steps": [{"name": "A", "script": {"actions": {"onRun": {"command": "{{Param.X}}"}}}}],
    }))  # fmt: skip
    refused = check(str(broken), "--json")
    assert refused.returncode == 2, refused.stderr
    doc = json.loads(refused.stdout)
    assert doc["valid"] is False and doc["template"] == str(broken)
    assert [p.split(":")[0] for p in doc["problems"]] == ["steps[0].script.actions.onRun.command"]
    assert "onRun.command" not in refused.stderr, refused.stderr  # one copy: the document
