"""What a person installing the package meets: the license file the metadata names, and an
adapter imported without its extra, which must say which extra to install."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from conftest import ROOT


def test_the_license_file_matches_the_metadata() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["license"] == "Apache-2.0"
    assert meta["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text


def _installed(name: str) -> bool:
    spec = importlib.util.find_spec(name)
    return spec is not None and spec.origin is not None  # not tests/prefect, a namespace


@pytest.mark.parametrize(
    ("package", "framework", "extra"),
    [("prefect_integration", "prefect", "prefect"), ("airflow_plugin", "airflow", "airflow")],
)
def test_an_adapter_without_its_extra_names_the_extra(
    package: str, framework: str, extra: str
) -> None:
    if _installed(framework):
        pytest.skip(f"{framework} is installed in this environment (the core one has neither)")
    done = subprocess.run(
        [sys.executable, "-c", f"import {package}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: ") and f"openjd-checkpoint[{extra}]" in last, last
    assert f"No module named '{framework}'" in done.stderr  # the cause, chained
