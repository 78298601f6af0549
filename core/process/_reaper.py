"""The runner as a child subreaper: what an action leaves behind stays its descendant.

A process that leaves its action's process group (``setsid``, a double fork) used to be found
by a walk over every process in ``/proc`` after each action (``_process.kill_process_group``).
Once the runner has called ``prctl(PR_SET_CHILD_SUBREAPER)`` (Linux 3.4), an orphan of any of
its descendants is re-parented to the runner instead of to init, so what an action started
is found by walking the runner's own descendants (``/proc/<pid>/task/<tid>/children``,
Linux 3.5 with ``CONFIG_PROC_CHILDREN``): a few reads, however many processes the machine runs.
Which of those descendants are the action's is told as before: the leader's own descendants,
its process group or session, its marker in the environment; a process that both leaves the
session and clears its environment (``setsid env -i ...``) is told by none of them and is left
running, as it was by the walk over ``/proc``, unless the action runs in a cgroup of its own
(``core.process._cgroups``, where the machine allows it: then the cgroup is killed instead, and this
module only reaps the killed orphans re-parented here). Neither the standard library nor psutil
sets the flag (psutil's ``children`` walks every process), so it is set here through libc's
``prctl``.

Where it applies (docs/decisions.md, "Escaped processes: a subreaper where the process is
ours"): the flag changes the process for all its children, so it is set only in a process the
runner owns whole: the CLI's ``run``/``resume``. An Airflow task process, a Prefect flow-run
process and a Celery or Dask worker run other code's children too, and keep the ``/proc`` walk.
The flag dies with the runner: what a killed runner left running is found by the next attempt
from the task records' markers (``_process.kill_recorded_process``), as before.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from collections.abc import Set as AbstractSet

__all__ = (
    "become_child_subreaper",
    "is_subreaper",
    "kill_action_tree",
    "reap_dead_children",
    "start_sweeper",
)

_PR_SET_CHILD_SUBREAPER = 36
_STATE = {"on": False, "pid": 0}


def become_child_subreaper() -> bool:
    """Make this process a child subreaper (Linux). Returns True if it is one now; False where
    the kernel has no subreapers or no ``children`` files (the ``/proc`` walk is used then)."""
    if is_subreaper():
        return True
    me = os.getpid()
    if not sys.platform.startswith("linux") or not os.path.exists(f"/proc/{me}/task/{me}/children"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    _STATE.update(on=True, pid=me)
    return True


def is_subreaper() -> bool:
    """True in the process that called ``become_child_subreaper`` (not in its forks)."""
    return bool(_STATE["on"]) and _STATE["pid"] == os.getpid()


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                found.extend(int(x) for x in fh.read().split())
        except (OSError, ValueError):
            continue
    return found


def _descendants(root: int) -> dict[int, int]:
    """Every descendant of ``root``: pid to parent pid."""
    tree: dict[int, int] = {}
    stack = [root]
    while stack:
        parent = stack.pop()
        for child in _children(parent):
            if child not in tree and child != root:
                tree[child] = parent
                stack.append(child)
    return tree


def _below(root: int, tree: dict[int, int]) -> set[int]:
    """The descendants of ``root`` in ``tree`` (pid to parent pid, as ``_descendants`` gives
    it): no second read of ``/proc``."""
    children: dict[int, list[int]] = {}
    for pid, parent in tree.items():
        children.setdefault(parent, []).append(pid)
    found: set[int] = set()
    stack = list(children.get(root, ()))
    while stack:
        pid = stack.pop()
        if pid not in found:
            found.add(pid)
            stack.extend(children.get(pid, ()))
    return found


def _group_and_session(pid: int) -> tuple[int, int] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        fields = stat[stat.rindex(b")") + 2 :].split()
        return int(fields[2]), int(fields[3])
    except (OSError, ValueError, IndexError):
        return None


def _carries(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return needle in fh.read().split(b"\0")
    except OSError:
        return False


def kill_action_tree(
    leader: int,
    *,
    include_leader: bool,
    needle: bytes | None,
    spare: Callable[[], AbstractSet[int]] = frozenset,
    lock: threading.RLock | None = None,
    timeout: float = 10.0,
) -> None:
    """SIGKILL an action's process group ``leader`` and everything of the action among this
    subreaper's descendants, then wait (reaping what was re-parented here) until none is left.

    Of the action: the leader's own descendants, any descendant in the leader's process group
    or session (``setpgid``), and any that carries ``needle`` (``MARKER=value``) in its
    environment (``setsid``, a double fork). The leader itself is reaped by its ``Popen``, never
    here. Then every zombie child of this process but those ``spare`` returns (the leaders whose
    ``Popen`` has yet to reap them; ``lock`` held, see ``reap_dead_children``) is reaped: an
    orphan that exited by itself (the middle process of a double fork) is re-parented here and
    would stay a zombie until the runner ends. Must be called in the subreaper
    (``is_subreaper``), which no other code shares."""
    me = os.getpid()
    tree = _descendants(me)
    under_leader = _below(leader, tree)
    victims: list[int] = []
    for pid in tree:
        if pid == leader:
            continue
        if pid in under_leader:
            victims.append(pid)
            continue
        ids = _group_and_session(pid)
        if ids is not None and leader in ids:
            victims.append(pid)
        elif needle is not None and _carries(pid, needle):
            victims.append(pid)
    try:
        os.killpg(leader, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if include_leader:
        try:
            os.kill(leader, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    _reap(victims, time.monotonic() + timeout)
    reap_dead_children(spare, lock, also_spare=leader)


def reap_dead_children(
    spare: Callable[[], AbstractSet[int]],
    lock: threading.RLock | None = None,
    *,
    also_spare: int = 0,
) -> int:
    """Reap every zombie child of this process but those ``spare`` returns (and ``also_spare``).
    Returns how many were reaped. ``lock``, held throughout, is the one held while a leader is
    started and registered: a leader that starts and exits during the sweep is never taken from
    its ``Popen`` (whose wait would then report exit code 0)."""
    reaped = 0
    if not _any_zombie():
        return 0  # (one system call, where the walk below reads a file per thread)
    with lock if lock is not None else _NO_LOCK:
        kept = spare()
        for pid in _children(os.getpid()):
            if pid not in kept and pid != also_spare and _dead(pid):
                try:
                    done, _status = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    continue
                reaped += done == pid
    return reaped


def _any_zombie() -> bool:
    """True if some child of this process has ended and is not reaped yet (looked at, left as
    it is: ``waitid`` with ``WNOWAIT``); True where that cannot be asked."""
    try:
        return os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return False  # no child at all
    except (AttributeError, OSError):  # pragma: no cover (no waitid)
        return True


_NO_LOCK = threading.RLock()
_SWEEPER: dict[str, threading.Thread] = {}


def start_sweeper(
    spare: Callable[[], AbstractSet[int]], lock: threading.RLock, interval: float = 1.0
) -> None:
    """Start (once per process) a daemon thread that reaps dead orphans re-parented to this
    subreaper every ``interval`` seconds: a long action that double-forks short helpers
    (``( cmd & )`` in a loop) would otherwise leave one zombie per helper with the runner until
    the action ends, and could exhaust the pid space. Only in the subreaper."""
    if not is_subreaper() or "t" in _SWEEPER and _SWEEPER["t"].is_alive():
        return

    def sweep() -> None:
        while True:
            time.sleep(interval)
            reap_dead_children(spare, lock)

    thread = threading.Thread(target=sweep, name="openjd-checkpoint-reaper", daemon=True)
    _SWEEPER["t"] = thread
    thread.start()


def _reap(pids: list[int], deadline: float) -> None:
    """Wait until every one of ``pids`` (killed) is gone: each becomes this subreaper's child
    once its parent is gone too, and is reaped here (so no zombie stays behind)."""
    left = set(pids)
    pause = 0.0005
    while left:
        for pid in list(left):
            try:
                done, _status = os.waitpid(pid, os.WNOHANG)
                if done == pid:
                    left.discard(pid)
                continue
            except ChildProcessError:
                pass  # not (yet) our child: its parent, being killed, still holds it
            if _dead(pid):
                left.discard(pid)  # reaped by its parent, or a zombie its parent will reap
        if not left or time.monotonic() >= deadline:
            return
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def _dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] in (b"Z", b"X")
    except (OSError, ValueError):
        return True
