"""The chunked job (``examples/chunked-frames/chunked-frames.yaml``) with its task runs spread
over a Dask cluster: ``DaskTaskRunner`` (the ``[dask]`` extra), managed checkpoint files, and a
table of which machine ran each task at the end.

Start a Dask scheduler and workers first (docs/prefect.md, "One flow run over many machines:
Dask"), each worker with its own ``OPENJD_CHECKPOINT_HOST_ID``, then::

    python examples/prefect/dask_flow.py [FRAMES [RESUME]]

``$DASK_SCHEDULER_ADDRESS`` names the scheduler (default ``tcp://127.0.0.1:8786``) and
``$OPENJD_CHECKPOINT_STORE`` the store every machine reaches (default the per-user folder,
which is fine when the workers run on this machine). ``RESUME`` is the flow's ``resume``
parameter: after a cancel (``prefect flow-run cancel <id>``), run it again with the same frames
and ``latest`` to resume each task on whichever worker gets it.
"""

import json
import os
import sys
from pathlib import Path

from prefect import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
from prefect_dask import DaskTaskRunner

from prefect_integration import flow_from_template

ADDRESS = os.environ.get("DASK_SCHEDULER_ADDRESS", "tcp://127.0.0.1:8786")
TEMPLATE = Path(__file__).resolve().parents[1] / "chunked-frames" / "chunked-frames.yaml"

chunked_on_dask = flow_from_template(
    TEMPLATE,
    name="chunked-frames-on-dask",
    files="managed",
    max_task_runs_per_step=8,
    task_runner=DaskTaskRunner(address=ADDRESS),
)


def print_hosts(flow_run_id: object) -> None:
    """Print the flow run's table artifact: each task, its status and the host that ran it."""
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    for artifact in found:
        if artifact.type != "table":  # the progress and timeline artifacts
            continue
        data = json.loads(artifact.data) if isinstance(artifact.data, str) else artifact.data
        if isinstance(data, list):
            for row in data:
                print(f"{row['task']:<28} {row['status']:<12} host={row['host']}")


if __name__ == "__main__":
    frames = sys.argv[1] if len(sys.argv) > 1 else "1-40"
    resume = sys.argv[2] if len(sys.argv) > 2 else None
    state = chunked_on_dask(
        Frames=frames, FramesPerChunk=5, FrameSeconds=0.2, resume=resume, return_state=True
    )
    print(f"flow run {state.state_details.flow_run_id}: {state.name}")
    print_hosts(state.state_details.flow_run_id)
