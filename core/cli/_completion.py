"""Shell completion for ``openjd-checkpoint``, from the parser itself: commands, options and
their choices, run ids from the store, and step names (``resume --from``, ``logs --step``).

``openjd-checkpoint completion bash|zsh`` prints a script to ``source`` (or to put in the
shell's completion folder); the script calls the hidden ``openjd-checkpoint __complete WORD...``
with the words typed so far, the last one being completed (possibly empty). Files complete as
the shell does by default.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ("SCRIPTS", "add_completion_parser", "complete")

_BASH = r"""# openjd-checkpoint completion for bash (and zsh with bashcompinit)
_openjd_checkpoint() {
    local IFS=$'\n'
    COMPREPLY=($("${COMP_WORDS[0]}" __complete "${COMP_WORDS[@]:1:COMP_CWORD}" 2>/dev/null))
}
complete -o default -o nospace -F _openjd_checkpoint openjd-checkpoint
"""

_ZSH = "autoload -U +X bashcompinit && bashcompinit\n" + _BASH

SCRIPTS = {"bash": _BASH, "zsh": _ZSH}
"""The completion script per shell."""


def add_completion_parser(sub: Any) -> None:
    """Add ``completion SHELL``, which prints the shell's completion script."""
    p = sub.add_parser(
        "completion",
        help="print a shell completion script (source it: "
        "'source <(openjd-checkpoint completion bash)')",
    )
    p.add_argument("shell", choices=sorted(SCRIPTS))
    p.set_defaults(func=lambda args: _print(SCRIPTS[args.shell]))


def _print(text: str) -> int:
    sys.stdout.write(text)
    return 0


def _sub(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _option(parser: argparse.ArgumentParser, word: str) -> argparse.Action | None:
    for action in parser._actions:
        if word in action.option_strings:
            return action
    return None


def _store_arg(words: list[str]) -> str | None:
    for i, w in enumerate(words):
        if w == "--store" and i + 1 < len(words):
            return words[i + 1]
        if w.startswith("--store="):
            return w.split("=", 1)[1]
    return None


def _run_ids(words: list[str]) -> list[str]:
    from core import CheckpointStore

    try:
        runs, _ = CheckpointStore(_store_arg(words), create=False).list_runs()
    except Exception:  # completion never fails loudly
        return []
    return [r.run_id for r in runs]


def _steps(words: list[str], command: list[str], positionals: list[str]) -> list[str]:
    from pathlib import Path

    from core import CheckpointStore, load_template

    try:
        path: str | None = None
        if command[:1] == ["run"] and positionals:
            path = positionals[0]
        elif positionals:
            run = CheckpointStore(_store_arg(words), create=False).find_run(positionals[0])
            path = run.template_path if run is not None else None
        if path is None:
            return []
        tmpl = load_template(Path(path))
        return list(tmpl.regular_steps) + list(tmpl.finally_steps)
    except Exception:
        return []


def complete(parser: argparse.ArgumentParser, words: list[str]) -> list[str]:
    """The completions of the last of ``words`` (the command line after the program name)."""
    if not words:
        words = [""]
    *done, current = words
    level = parser
    positionals: list[str] = []
    command: list[str] = []
    expect: argparse.Action | None = None
    for w in done:
        if expect is not None:
            expect = None
            continue
        if w.startswith("-"):
            act = _option(level, w.split("=", 1)[0]) or _option(parser, w.split("=", 1)[0])
            if act is not None and act.nargs != 0 and "=" not in w:
                expect = act
            continue
        subs = _sub(level)
        if w in subs:
            level = subs[w]
            command.append(w)
            continue
        positionals.append(w)
    if expect is not None:
        if expect.choices:
            return [c for c in map(str, expect.choices) if c.startswith(current)]
        if expect.dest in ("from_step", "step"):
            return [s for s in _steps(done, command, positionals) if s.startswith(current)]
        if expect.dest == "task":
            return []
        return []  # a path or a number: the shell's default
    if current.startswith("-"):
        opts = [o for a in level._actions for o in a.option_strings if o.startswith("--")]
        return sorted(o for o in set(opts) if o.startswith(current))
    subs = _sub(level)
    if subs:
        return sorted(c for c in subs if c.startswith(current) and not c.startswith("_"))
    wants_run = any(a.dest == "run_id" for a in level._actions)
    if wants_run and not positionals:
        return [r for r in _run_ids(done) if r.startswith(current)]
    return []
