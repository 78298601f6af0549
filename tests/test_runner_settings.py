"""The settings every runner reads the same way (the CLI, an Airflow task instance, a Prefect
task run): ``NoticeSettings`` (interruption notices) and ``FileSettings`` (file data flow and
roots). Each is the first of the argument, a framework's configuration, the environment; a bad
value is refused naming where it came from."""

from __future__ import annotations

from typing import Any

import pytest

from core import FileDataFlow, FileSettings, NoticeSettings
from core.run._notices import AwsSource, FileSource, GcpSource

NOTICES, POLL = "OPENJD_CHECKPOINT_INTERRUPTION_NOTICES", "OPENJD_CHECKPOINT_NOTICE_POLL_SECONDS"


def _config(values: dict[str, Any]) -> Any:
    """A framework's configuration (``[openjd_checkpoint]`` of Airflow, say)."""

    def configured(key: str) -> tuple[Any, str] | None:
        return (values[key], f"[section] {key}") if key in values else None

    return configured


def test_notice_settings_take_the_argument_then_the_configuration_then_the_environment() -> None:
    env = {NOTICES: "gcp", POLL: "3"}
    config = _config({"interruption_notices": "aws,file:/tmp/n", "notice_poll_seconds": "2"})
    given = NoticeSettings.from_env("gcp", 0.5, configured=config, environ=env)
    assert [type(s) for s in given.sources] == [GcpSource] and given.poll_seconds == 0.5
    configured = NoticeSettings.from_env(configured=config, environ=env)
    assert [type(s) for s in configured.sources] == [AwsSource, FileSource]
    assert configured.poll_seconds == 2.0
    blank = _config({"interruption_notices": "  ", "notice_poll_seconds": None})
    from_env = NoticeSettings.from_env(configured=blank, environ=env)  # blank: not set
    assert [type(s) for s in from_env.sources] == [GcpSource] and from_env.poll_seconds == 3.0
    none = NoticeSettings.from_env(environ={})
    assert none == NoticeSettings() and none.sources == () and none.poll_seconds == 5.0
    assert NoticeSettings.given("aws").describe() == "aws (http://169.254.169.254)"


def test_notice_settings_name_where_a_bad_value_came_from() -> None:
    with pytest.raises(ValueError, match=r"^--interruption-notices: unknown"):
        NoticeSettings.from_env("ec2", where="--interruption-notices", environ={})
    with pytest.raises(ValueError, match=r"^\[section\] interruption_notices: unknown"):
        NoticeSettings.from_env(configured=_config({"interruption_notices": "ec2"}), environ={})
    with pytest.raises(ValueError, match=rf"^\${POLL}"):
        NoticeSettings.from_env(environ={POLL: "nan"})
    with pytest.raises(ValueError, match=r"^notice_poll_seconds="):
        NoticeSettings.given(poll_seconds=0)
    with pytest.raises(ValueError, match=r"signal:SIGUSR2: not available to worker threads"):
        NoticeSettings.from_env("signal:USR2", environ={}, signals_refused="worker threads")
    assert NoticeSettings.given("signal:USR2").sources  # taken where signals may be


def test_file_settings_take_the_argument_then_the_configuration() -> None:
    config = _config({"files": "Managed", "file_roots": "/a:/b"})
    assert FileSettings.resolve(configured=config) == FileSettings(
        FileDataFlow.MANAGED, ("/a", "/b")
    )
    given = FileSettings.resolve("shared", [" /c ", ""], configured=config)
    assert given.files == FileDataFlow.SHARED and given.mode == "shared"
    assert given.roots == ("/c",)
    assert FileSettings.resolve(file_roots=[], configured=config).roots == ()  # given: none
    unset = FileSettings.resolve(configured=_config({"files": None, "file_roots": ""}))
    assert unset == FileSettings() and unset.mode is None  # the store's process decides


def test_file_settings_name_where_a_bad_value_came_from() -> None:
    with pytest.raises(ValueError, match=r"^files='copied' is not one of shared, managed$"):
        FileSettings.resolve("copied")
    with pytest.raises(ValueError, match=r"^\[section\] files = 'copied' is not one of"):
        FileSettings.resolve(configured=_config({"files": "copied"}))
    with pytest.raises(ValueError, match=r"^file_roots: 'rel' is not an absolute path$"):
        FileSettings.resolve(file_roots=["/a", "rel"])
    with pytest.raises(ValueError, match=r"^\[section\] file_roots: 'rel/x'"):
        FileSettings.resolve(configured=_config({"file_roots": "rel/x"}))
