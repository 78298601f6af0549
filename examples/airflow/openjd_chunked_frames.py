"""The chunked-frames job as an Airflow DAG: one mapped task instance per chunk of frames
(``Render[Frame=1-10]``); an interrupted chunk renders only its unfinished frames on the next try.

Copy this file and chunked-frames.yaml into your dags folder. See docs/airflow.md.
"""

from airflow_plugin import dag_from_template

dag = dag_from_template("chunked-frames.yaml", dag_id="openjd_chunked_frames")
