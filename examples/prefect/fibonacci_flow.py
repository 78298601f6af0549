"""The Fibonacci job (``examples/fibonacci/fibonacci-fast.yaml``) as a Prefect flow.

Serve it (a long-running process that runs the deployment's flow runs)::

    python examples/prefect/fibonacci_flow.py

From another shell, start a run, cancel it, and resume it::

    prefect deployment run fibonacci/fibonacci -p N=300
    prefect flow-run cancel <FLOW RUN ID>      # the task checkpoints
    prefect deployment run fibonacci/fibonacci -p N=300 -p resume=latest

The cancelled run ends ``Cancelled`` (state name ``Suspended``) with its checkpoint stored; the
resumed run's log says ``resuming from checkpoint generation ...`` and the task prints
``RESUMED`` and the final answer. See docs/prefect.md.
"""

from prefect_integration import flow_from_template

# The template path is taken from this file's folder. Checkpoints go to
# $OPENJD_CHECKPOINT_STORE, else the per-user state directory.
fibonacci = flow_from_template("../fibonacci/fibonacci-fast.yaml", name="fibonacci")

if __name__ == "__main__":
    fibonacci.serve(name="fibonacci")
