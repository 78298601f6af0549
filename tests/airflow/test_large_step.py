"""A step larger than Airflow's ``[core] max_map_length`` (default 1024) under ``dag.test()``
with Airflow's default configuration: its 3,000 OpenJD tasks run in groups, each mapped
instance running its share in one session; an instance that fails part-way is retried and runs
again only its unfinished tasks.

The DAG asks for at most ``MAPPED`` (100) mapped instances, not the default 1,024, to keep
CI inside its budget: ``dag.test()`` costs about 0.3 s of Airflow's own work per task
instance on a quiet 2-core machine, so 1,024 instances of 2 or 3 tasks take about 6 minutes (set
``OPENJD_LARGE_STEP_DEFAULT_GROUPS=1`` to run the test that way; it passed in 1,313 s on a
machine loaded to 8). That the default gives 1,024 groups is checked by
``test_the_default_plan_of_3000_tasks_fits_max_map_length``, which plans without running."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import airflow_helpers as ah

HERE = Path(__file__).resolve().parent
LARGE = HERE / "data" / "large_step.yaml"
FRAMES = 3000
FAIL_FRAME = 1502

DAG_FILE = """
from airflow_plugin import dag_from_template

dag = dag_from_template(
    {template!r}, dag_id={dag_id!r}, store={store!r}, max_map_length={mapped!r}
)
"""
MAPPED = None if os.environ.get("OPENJD_LARGE_STEP_DEFAULT_GROUPS") == "1" else 100


def test_a_step_of_3000_tasks_runs_and_a_failed_instance_resumes_its_unfinished_tasks(
    dag_tester: ah.DagTester, tmp_path: Path
) -> None:
    from airflow.sdk import conf

    limit = conf.getint("core", "max_map_length")
    assert limit == 1024, "the test is about Airflow's default configuration"
    log, fail_once = tmp_path / "frames.log", tmp_path / "fail-once"
    fail_once.touch()
    result = dag_tester.run(
        "large_step.py",
        source=DAG_FILE.format(
            template=str(LARGE), dag_id="large_step", store=str(tmp_path / "store"), mapped=MAPPED
        ),
        run_conf={
            "Frames": FRAMES,
            "Log": str(log),
            "FailFrame": FAIL_FRAME,
            "FailOnce": str(fail_once),
        },
    )
    print(f"\n{FRAMES} tasks under dag.test() in {result.seconds:.0f} s")
    assert result.state == "success", {k: v for k, v in result.states().items() if v != "success"}

    indexes = result.map_indexes("Render")
    assert 1 < len(indexes) <= (MAPPED or limit)
    assert indexes == list(range(len(indexes)))
    per = -(-FRAMES // len(indexes))
    labels = {t.map_index: t.rendered_map_index for t in result.tis if t.task_id == "Render"}
    assert labels[0] == f"Render[Frame=1-{per}] ({per} tasks)", labels[0]

    # Every frame ran once, but the failing one: its instance's retry ran it again and then
    # the rest of its group, never the frames of the group that had finished.
    counts = Counter(int(line) for line in log.read_text().split())
    assert set(counts) == set(range(1, FRAMES + 1))
    assert {f: n for f, n in counts.items() if n != 1} == {FAIL_FRAME: 2}
    assert not fail_once.exists()
    failed_index = (FAIL_FRAME - 1) // per
    tries = [h for h in result.history if h.task_id == "Render" and h.map_index == failed_index]
    assert [h.state for h in tries] == ["failed"], tries  # the first try, then the retry won
    assert result.ti("Render", failed_index).try_number == 2


def test_the_default_plan_of_3000_tasks_fits_max_map_length(
    dag_tester: ah.DagTester, tmp_path: Path
) -> None:
    """With no ``max_map_length`` given, the plan task groups the 3,000 tasks into at most
    Airflow's ``[core] max_map_length`` (1,024) mapped instances: 952 of 3, then 72 of 2.
    Only the setup and plan tasks run (``dag.partial_subset``; and the finish teardown), and
    the plan's XCom stays small."""
    import json

    from airflow.models.xcom import XComModel
    from airflow.sdk import conf
    from airflow.utils.session import create_session

    assert conf.getint("core", "max_map_length") == 1024
    path = dag_tester.write(
        "large_step_plan.py",
        DAG_FILE.format(
            template=str(LARGE), dag_id="large_step_plan", store=str(tmp_path / "store"),
            mapped=None,
        ),
    )  # fmt: skip
    dag = dag_tester.load(path)["large_step_plan"]
    subset = dag.partial_subset(task_ids=["plan_Render"], include_upstream=True)
    # (with the setup's teardown, openjd_finish, which partial_subset keeps)
    assert set(subset.task_dict) == {"openjd_begin", "plan_Render", "openjd_finish"}
    dag_tester.warm_up()
    with ah.real_std_streams():
        dr = subset.test(run_conf={"Frames": FRAMES, "Log": str(tmp_path / "frames.log")})
    with create_session() as session:
        row = session.scalars(
            XComModel.get_many(
                run_id=dr.run_id, key="return_value", task_ids="plan_Render",
                dag_ids="large_step_plan",
            )
        ).one()  # fmt: skip
        groups = XComModel.deserialize_value(row)
    assert len(groups) == 1024
    assert [g["stop"] - g["start"] for g in groups] == [3] * 952 + [2] * 72
    assert groups[0] == {
        "step": "Render", "label": "Render[Frame=1-3] (3 tasks)", "start": 0, "stop": 3
    }  # fmt: skip
    assert groups[-1]["stop"] == FRAMES
    size = len(json.dumps(groups))
    print(f"\nplan XCom of 3,000 tasks in 1,024 groups: {size:,} bytes")
    assert size < 100_000
    assert not (tmp_path / "frames.log").exists()  # nothing ran
