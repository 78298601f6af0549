"""The interruption notice settings of a runner, read once the same way by every one (the CLI,
an Airflow task instance, a Prefect task run): ``NoticeSettings``.

Each of the two settings, the sources (``parse_notice_sources``) and the poll interval
(``parse_poll_seconds``), is the first of: the runner's own argument (an option, an operator or
flow argument), a framework's configuration (Airflow's ``[openjd_checkpoint]`` section, say),
the environment (``$OPENJD_CHECKPOINT_INTERRUPTION_NOTICES``,
``$OPENJD_CHECKPOINT_NOTICE_POLL_SECONDS``); else no source, and 5 s.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from core._host import Configured, first_setting
from core.run._notices import (
    DEFAULT_POLL_SECONDS,
    NOTICE_POLL_ENV,
    NOTICES_ENV,
    NoticeSource,
    SignalSource,
    parse_notice_sources,
    parse_poll_seconds,
)

__all__ = ("NoticeSettings",)


@dataclass(frozen=True)
class NoticeSettings:
    """Where a runner's interruption notices come from, and how often each source is asked.

    Attributes:
        sources: the notice sources (none: no notice is watched for).
        poll_seconds: at most one request per source this often, in seconds.
    """

    sources: tuple[NoticeSource, ...] = ()
    poll_seconds: float = DEFAULT_POLL_SECONDS

    @classmethod
    def from_env(
        cls,
        sources: str | Sequence[str] | None = None,
        poll_seconds: str | float | None = None,
        *,
        where: str = "interruption_notices=",
        poll_where: str = "notice_poll_seconds=",
        configured: Configured | None = None,
        environ: Mapping[str, str] | None = None,
        signals_refused: str | None = None,
    ) -> NoticeSettings:
        """The settings of a runner: for the sources and the poll interval each, the first
        given of the argument (``sources``: ``aws,gcp,azure,file:PATH,signal:NAME``;
        ``poll_seconds``), ``configured`` (a framework's configuration: ``core._host.Configured``),
        and ``environ`` (default: this process's environment) at ``$NOTICES_ENV`` and
        ``$NOTICE_POLL_ENV``; else no source and ``DEFAULT_POLL_SECONDS``.

        Args:
            where / poll_where: how messages name the arguments (``--interruption-notices``).
            signals_refused: None: ``signal:`` sources are taken; else who cannot take them
                and what to do instead, for the message (a runner in worker threads, where no
                signal handler can be installed).

        Raises:
            ValueError: a bad setting, the message naming where it came from; a ``signal:``
                source with ``signals_refused``.
        """
        env = os.environ if environ is None else environ
        text, text_where = first_setting(
            sources, where, configured, "interruption_notices", env, NOTICES_ENV
        )
        poll, poll_from = first_setting(
            poll_seconds, poll_where, configured, "notice_poll_seconds", env, NOTICE_POLL_ENV
        )
        found = parse_notice_sources(text, where=text_where)
        if signals_refused is not None:
            for source in found:
                if isinstance(source, SignalSource):
                    raise ValueError(
                        f"{source.where}: signal:{source.signal.name}: not available to "
                        f"{signals_refused}"
                    )
        return cls(tuple(found), parse_poll_seconds(poll, where=poll_from))

    @classmethod
    def given(
        cls,
        sources: str | Sequence[str] | None = None,
        poll_seconds: str | float | None = None,
        *,
        where: str = "interruption_notices=",
        poll_where: str = "notice_poll_seconds=",
    ) -> NoticeSettings:
        """The settings the arguments alone give (no configuration, no environment): a DAG or
        flow checks its arguments when it is made, not when its tasks run.

        Raises:
            ValueError: a bad setting, naming ``where`` or ``poll_where``.
        """
        return cls.from_env(sources, poll_seconds, where=where, poll_where=poll_where, environ={})

    def describe(self) -> str:
        """The sources for people: ``aws (http://169.254.169.254), file /tmp/notice``."""
        return ", ".join(source.describe() for source in self.sources)

    def install_signals(self) -> None:
        """Install the handler of every ``signal:`` source. Call it from the main thread (where
        Python runs signal handlers) before the run starts in another thread."""
        for source in self.sources:
            if isinstance(source, SignalSource):
                source.install()
