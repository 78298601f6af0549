"""Action processes: starting them, reading their output, killing and sweeping their trees
(``_process``), the CLI runner as a child subreaper (``_reaper``), and a cgroup v2 per action
where the machine allows it (``_cgroups``).
"""

from core.process._process import (
    MARKER_VARIABLE,
    ActionProcess,
    OutputLine,
    ProcessIdentity,
    action_containment,
    kill_marked,
    kill_recorded_process,
    marked_spare,
    new_marker,
    recorded_name,
    release_marker,
)
from core.process._reaper import become_child_subreaper

__all__ = (
    "action_containment",
    "ActionProcess",
    "become_child_subreaper",
    "kill_marked",
    "kill_recorded_process",
    "marked_spare",
    "MARKER_VARIABLE",
    "new_marker",
    "OutputLine",
    "ProcessIdentity",
    "recorded_name",
    "release_marker",
)
