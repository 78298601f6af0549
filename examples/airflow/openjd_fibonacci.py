"""The Fibonacci job as an Airflow DAG: interrupt its task (mark it failed, or let
execution_timeout hit) and the next try resumes from its last checkpoint.

Copy this file and fibonacci-fast.yaml into your dags folder (``cp examples/airflow/* DAGS/``
copies the template, not the link). See docs/airflow.md.
"""

from airflow_plugin import dag_from_template

dag = dag_from_template("fibonacci-fast.yaml", dag_id="openjd_fibonacci")
