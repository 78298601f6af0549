"""The chunked job (``examples/chunked-frames/chunked-frames.yaml``) as a Prefect flow, made
with the ``@openjd_flow`` decorator, whose function checks the job parameters first.

Serve it::

    python examples/prefect/chunked_flow.py

and run it with ``prefect deployment run chunked-frames/chunked-frames -p Frames=1-40 -p
FrameSeconds=2`` (slow enough to cancel by hand). Each
chunk of ``FramesPerChunk`` frames is an OpenJD task; the step's tasks are grouped into at most
4 Prefect task runs (``Render[Frame=1-10] (5 tasks)``, ...). Cancelled and run again with the
same parameters and ``-p resume=latest``, it renders only the frames not reported complete.
"""

from typing import Any

from openjd.model import IntRangeExpr
from prefect import get_run_logger

from prefect_integration import openjd_flow


@openjd_flow(
    "../chunked-frames/chunked-frames.yaml", name="chunked-frames", max_task_runs_per_step=4
)
def chunked_frames(parameters: dict[str, Any]) -> dict[str, Any]:
    """Render frames in chunks; refuses more than 10,000 frames."""
    count = len(IntRangeExpr.from_str(str(parameters["Frames"])))
    if count > 10_000:
        raise ValueError(f"{count} frames: this flow renders at most 10,000 at once")
    get_run_logger().info("rendering %s frames", count)
    return parameters


if __name__ == "__main__":
    chunked_frames.serve(name="chunked-frames")
