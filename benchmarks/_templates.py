"""Job templates the benchmarks share."""

from __future__ import annotations

STEP = """\
specificationVersion: 'jobtemplate-2023-09'
{extensions}name: Bench
parameterDefinitions:
- {{name: Frames, type: INT, default: {frames}}}
steps:
- name: Render
  parameterSpace:
    taskParameterDefinitions:
    - {{name: Frame, type: INT, range: "1-{{{{Param.Frames}}}}"}}
  script:
    actions:
      onRun: {{command: bash, args: ["-c", "true"]}}
"""

TRIVIAL = """\
specificationVersion: 'jobtemplate-2023-09'
name: Trivial
parameterDefinitions:
- {name: Frames, type: INT, default: 1}
steps:
- name: Render
  parameterSpace:
    taskParameterDefinitions:
    - {name: Frame, type: INT, range: "1-{{Param.Frames}}"}
  script:
    actions:
      onRun: {command: "true"}
"""
"""A step of ``Frames`` tasks (default 1) that each run ``true``, with no shell: the
per-task benchmarks' (``run_all``, ``cli_phases``)."""

FINALLY = """\
finally:
- name: Cleanup
  script:
    actions:
      onRun: {command: bash, args: ["-c", "true"]}
"""


def trivial_template(frames: int, *, with_finally: bool = False) -> str:
    """A step of ``frames`` tasks that each run ``bash -c true`` (and a finally step that does
    the same, with ``with_finally``)."""
    text = STEP.format(frames=frames, extensions="extensions: [FINALLY]\n" if with_finally else "")
    return text + (FINALLY if with_finally else "")


def python_step_document(code: str, *, extensions: tuple[str, ...] = ("CHECKPOINT",)) -> dict:
    """A job template (as a document) of one step ``S`` whose task runs ``python -c code``
    with this interpreter."""
    import sys

    return {
        "specificationVersion": "jobtemplate-2023-09",
        "extensions": list(extensions),
        "name": "bench",
        "steps": [
            {
                "name": "S",
                "script": {"actions": {"onRun": {"command": sys.executable, "args": ["-c", code]}}},
            }
        ],
    }
