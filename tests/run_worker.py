"""A stand-in for an Airflow or Prefect worker: run one task of a run in this OS process.

    python tests/run_worker.py STORE JOB_KEY RUN_ID TASK_JSON

Prints the task's output, then one JSON line: ``{"outcome", "exit_code", "message"}`` or
``{"refused": CODE, "message"}`` (exit 4).
"""

from __future__ import annotations

import json
import sys

from core import CheckpointStore, ResumeRefusedError, TaskSpec, prepare_run_job
from core.run._executor import run_task


def main() -> int:
    store_path, job_key, run_id, spec_json = sys.argv[1:5]
    store = CheckpointStore(store_path)
    job = prepare_run_job(store, job_key, run_id)
    spec = TaskSpec.from_dict(json.loads(spec_json))

    def output(ex, lines):  # noqa: ANN001
        print("".join(f"[{ex.spec.label}] {line}\n" for line in lines), end="", flush=True)

    try:
        res = run_task(
            store, job, run_id, spec, on_output=output, on_note=lambda n: print("NOTE", n)
        )
    except ResumeRefusedError as exc:
        print(json.dumps({"refused": exc.code.value, "message": str(exc)}), flush=True)
        return 4
    print(
        json.dumps(
            {"outcome": res.outcome.value, "exit_code": res.exit_code, "message": res.message}
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
