"""Where a unit of work's wall time goes, phase by phase: functions wrapped with timers for one
measured run (the benchmarks print it beside a goal they missed).

Each phase is one function; its time is *exclusive* (a phase called inside another is taken out
of the outer one), counted only on a thread inside the root phase, so the phases add up to the
root's time. Wrapping costs a few microseconds a call: the totals are a little above an
unwrapped run's.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

Phase = tuple[str, Any, str]
"""(label, owner, attribute): ``getattr(owner, attribute)`` is the function timed."""


class PhaseTimes:
    """Exclusive wall time per label, over every call made inside ``root`` (or one of
    ``more_roots``, on threads of their own) while installed."""

    def __init__(
        self, root: Phase, phases: list[Phase], *, more_roots: Sequence[Phase] = ()
    ) -> None:
        self.root = root
        self.more_roots = list(more_roots)
        """Further roots: a thread inside any root is counted (a task's own thread)."""
        self.phases = phases
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._local = threading.local()
        self._lock = threading.Lock()

    def _wrap(self, label: str, fn: Callable[..., Any], is_root: bool) -> Callable[..., Any]:
        local = self._local

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            stack: list[list[float]] | None = getattr(local, "stack", None)
            if not is_root and not stack:
                return fn(*args, **kwargs)  # outside the root (another thread's work)
            if stack is None:
                stack = local.stack = []
            frame = [time.perf_counter(), 0.0]  # started, time of the phases inside
            stack.append(frame)
            try:
                return fn(*args, **kwargs)
            finally:
                stack.pop()
                took = time.perf_counter() - frame[0]
                if stack:
                    stack[-1][1] += took
                with self._lock:
                    self.seconds[label] = self.seconds.get(label, 0.0) + took - frame[1]
                    self.calls[label] = self.calls.get(label, 0) + 1

        return timed

    @contextmanager
    def installed(self) -> Iterator[PhaseTimes]:
        """Time the phases inside the block (the functions are restored after it)."""
        saved = []
        roots = 1 + len(self.more_roots)
        for index, (label, owner, attr) in enumerate([self.root, *self.more_roots, *self.phases]):
            fn = getattr(owner, attr)
            saved.append((owner, attr, fn))
            setattr(owner, attr, self._wrap(label, fn, index < roots))
        try:
            yield self
        finally:
            for owner, attr, fn in reversed(saved):
                setattr(owner, attr, fn)

    def lines(self, units: int, *, total: float | None = None, outside: str = "") -> list[str]:
        """The phases, largest first, in ms per unit (``units`` roots timed); with ``total``
        (seconds per unit, measured outside), the time outside the root as ``outside``."""
        rows = sorted(self.seconds.items(), key=lambda kv: -kv[1])
        out = [f"{s / units * 1000:7.2f} ms  {label}" for label, s in rows if s / units >= 5e-5]
        if total is not None:
            root = sum(self.seconds.values()) / units
            out.insert(0, f"{(total - root) * 1000:7.2f} ms  {outside}")
        return out
