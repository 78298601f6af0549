"""Named kill points inside the store's write paths, for the crash tests.

``kill_point(name)`` does nothing unless the environment variable ``OPENJD_CHECKPOINT_KILL_AT``
names that point: ``NAME`` (the first time the process passes it) or ``NAME@N`` (the N-th time,
1-based). The process then SIGKILLs itself at once, as a crash would stop it there: no clean-up,
no flush of Python's buffers (what the kernel was already given stays in the page cache). With
``:stop`` after it (``NAME@N:stop``) the process SIGSTOPs itself there instead, as a holder
stalled at that moment (a paused VM, a long pause): the fencing tests wake it with SIGCONT.

The points (each a place where a crash must leave the store readable and resumable):

- ``record.reused``: a file to be deleted anyway (a checkpoint generation past those kept)
  renamed to a record's temporary name, to be rewritten as the new record (the new
  generation); not yet written;
- ``record.tmp-written``: a record's temporary file written, not yet fsynced;
- ``record.fsynced``: its data fsynced, not yet renamed over the record;
- ``record.joined``: a record's new version fsynced and the file written beside it on another
  thread meanwhile (a checkpoint's generation file, ``core.fs._replace.replace_local_pair``)
  in place; the record not yet renamed over;
- ``record.renamed``: renamed over the record, its folder not yet fsynced;
- ``record.stored``: the folder fsynced (a durable record), before the caller goes on;
- ``commit.generation-written``: a checkpoint's generation file written, its record not yet (on
  a local store passed on the thread that writes it, while the record's new version is being
  written and fsynced);
- ``commit.stored``: a checkpoint committed, before the runner reports it stored;
- ``task.process-started``: a task's action process started, its record not yet naming it
  (but by its marker, or, where it became a spare action process, by its pid too);
- ``task.process-recorded``: a task's process recorded, the action running;
- ``task.ended-recorded``: a task's end recorded, before the runner reports it finished.
- ``task.next-starting``: the next task of a session claimed and about to start while the end
  of the task before it is still being stored (its outcome decided, not yet reported).

A delete (``core.run._delete``: ``checkpoints delete``, ``gc``; no run passes them, so the crash
harness, which kills runs at each point of the list above, leaves them out) has its own, where
a crash must leave the run whole or gone: ``delete.marking`` (the run checked and its lease
held, not marked as being deleted yet), ``delete.marked`` (marked, none of its files removed
yet) and ``delete.removing`` (one more of its files removed; a batch of up to 50 objects on a
store other than a local folder).

Two more are for the fencing tests' stalls only (a crash there loses nothing, so the crash
harness leaves them out too): ``task.claiming`` (a task about to be claimed, this process's
run lease just found held) and ``task.claimed`` (its lease taken, the run lease not yet looked
at again).

The variable is read once, at the first kill point a process passes; with it unset a kill
point costs one comparison.
"""

from __future__ import annotations

import os
import signal
import time

__all__ = ("KILL_AT_ENV", "kill_point")

KILL_AT_ENV = "OPENJD_CHECKPOINT_KILL_AT"


def _parse(value: str | None) -> tuple[str, int, signal.Signals] | None:
    if not value:
        return None
    value, _, how = value.partition(":")
    sig = signal.SIGSTOP if how.strip().lower() == "stop" else signal.SIGKILL
    name, _, count = value.partition("@")
    try:
        return name, max(1, int(count)) if count else 1, sig
    except ValueError:
        return name, 1, sig


_UNREAD = ("", 0, signal.SIGKILL)
_TARGET: tuple[str, int, signal.Signals] | None = _UNREAD
_PASSED: dict[str, int] = {}


def kill_point(name: str) -> None:
    """SIGKILL (or, with ``:stop``, SIGSTOP) this process here if ``OPENJD_CHECKPOINT_KILL_AT``
    names this point and this is the pass it counts (once: a process stopped here and woken
    goes on past later passes); otherwise nothing."""
    global _TARGET
    target = _TARGET
    if target is _UNREAD:
        target = _TARGET = _parse(os.environ.get(KILL_AT_ENV))
    if target is None or target[0] != name:
        return
    passed = _PASSED[name] = _PASSED.get(name, 0) + 1
    if passed == target[1]:
        os.kill(os.getpid(), target[2])
        if target[2] == signal.SIGSTOP:
            # A stop sent to the process may take effect a little later than the call returns
            # (seen: the next few lines ran first); this sleep is cut short by it, so the
            # stall is here and not a few lines further on.
            time.sleep(0.2)
