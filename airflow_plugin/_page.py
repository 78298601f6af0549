"""The "OpenJD checkpoints" page of a DAG run: server-rendered HTML and CSS, no build step.

Two parts (``plugin.py`` serves them):

- ``shell(dag_id, dag_run_id)``: the page itself (``GET /openjd/ui/runs/{dag_id}/{run_id}``,
  shown by Airflow in an iframe, same origin). It holds no data and answers without
  credentials. A few lines of inline script fetch the fragment with the UI's ``_token``
  cookie, swap it in every 3 s while the run is live and stop once it has ended; a 401 or 403
  shows "sign in to Airflow". It follows Airflow 3's light or dark theme: the ``dark`` or
  ``light`` class of the UI page around its iframe, else the mode the UI (Chakra) keeps in
  ``localStorage["chakra-ui-color-mode"]``, else ``prefers-color-scheme``.
- ``fragment(...)``: the run as HTML (``GET .../dagRuns/{run_id}/page``, behind Airflow's
  authentication): its status in the CLI's words and condition, what happened to its
  checkpoints once it ended (and how to resume a suspended one), buttons for the termination
  modes that can still act, and per OpenJD task its state, finished frames, a timeline
  (``core.report.task_timeline``: attempts as ``.attempt`` bars, checkpoints as ``.checkpoint``
  marks)
  and its checkpoint history. A succeeded run's records are gone: what it kept until its end
  comes from its run record (``RunRecord.kept``, ``core.report.kept_timeline``).

Every value from a record is HTML-escaped; checkpoint states are never shown, only their size.
"""

from __future__ import annotations

import html
import json
import time
from collections.abc import Iterable, Sequence

import core

__all__ = (
    "BUTTON_WORDS",
    "fragment",
    "frame_ranges",
    "problem_fragment",
    "shell",
    "waiting_fragment",
)

BUTTON_WORDS = {
    "Suspended": "Suspend: checkpoint running tasks and stop (resumable)",
    "StoppedRunFinally": "Stop, then run finally steps: running tasks finish, no new ones start",
    "CancelledRunFinally": "Cancel, then run finally steps: running tasks are canceled",
    "Cancelled": "Cancel now (no finally steps)",
}
"""What each termination mode's button says it will do."""

MAX_HISTORY_ROWS = 100
"""Checkpoint generations a task's history table lists and its timeline marks (the newest): a
store keeping thousands (a large ``keep_generations``) makes no page of thousands of rows,
polled every 3 s; given more, the table says that older ones are not shown (the plugin reads
one more than this for that)."""

_STATE_CLASS = {
    "running": "running",
    "succeeded": "success",
    "finished": "success",
    "failed": "failed",
    "suspended": "suspended",
    "interrupted": "suspended",
    "canceled": "canceled",
    "stopped": "canceled",
    "pending": "pending",
}
"""A status word -> the CSS class of its colour (Airflow's state colours)."""

_CSS = """
:root { color-scheme: light; --bg: #ffffff; --fg: #1a202c; --muted: #64748b;
  --border: #e2e8f0; --panel: #f8fafc; --track: #edf2f7; --link: #0369a1;
  --success: #008000; --failed: #e53e3e; --running: #32cd32; --suspended: #f0b400;
  --canceled: #a0aec0; --pending: #d2b48c; --mark: #1e3a8a; --on-state: #1a202c; }
:root[data-theme="dark"] { color-scheme: dark; --bg: #111217; --fg: #e4e4e7;
  --muted: #a1a1aa; --border: #2e3039; --panel: #18191f; --track: #27272a; --link: #7dd3fc;
  --success: #22a322; --failed: #f56565; --running: #4ade80; --suspended: #facc15;
  --canceled: #71717a; --pending: #b8976b; --mark: #93c5fd; --on-state: #111217; }
* { box-sizing: border-box; }
body { margin: 0; padding: 16px 20px; background: var(--bg); color: var(--fg);
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
h1 { font-size: 18px; margin: 0 0 4px; font-weight: 600; }
h2 { font-size: 16px; margin: 0; font-weight: 600; display: inline; }
h3 { font-size: 15px; margin: 0; font-weight: 600; display: inline; }
code { font: 12.5px ui-monospace, SFMono-Regular, Menlo, monospace; }
.muted, .facts { color: var(--muted); }
.message { padding: 10px 12px; border: 1px solid var(--border); border-radius: 6px;
  background: var(--panel); margin: 12px 0; }
.message.error { border-color: var(--failed); }
.state { display: inline-block; padding: 1px 8px; border-radius: 999px; font-size: 12px;
  font-weight: 600; color: var(--on-state); background: var(--canceled); margin-left: 6px;
  vertical-align: 1px; }
.state.success { background: var(--success); color: #fff; }
.state.failed { background: var(--failed); color: #fff; }
.state.running { background: var(--running); }
.state.suspended { background: var(--suspended); }
.state.pending { background: var(--pending); }
.run-head { margin: 8px 0 4px; }
.condition { margin-left: 8px; }
.note { margin: 12px 0; padding: 10px 12px; border-left: 4px solid var(--border);
  background: var(--panel); border-radius: 0 6px 6px 0; }
.note.success { border-left-color: var(--success); }
.note.suspended { border-left-color: var(--suspended); }
.note.failed { border-left-color: var(--failed); }
.note ul { margin: 6px 0 0; padding-left: 20px; }
.actions { display: flex; flex-wrap: wrap; gap: 8px; margin: 12px 0; }
.actions button { font: inherit; padding: 6px 12px; border-radius: 6px; cursor: pointer;
  border: 1px solid var(--border); background: var(--panel); color: var(--fg); }
.actions button:hover { border-color: var(--link); }
.actions button.danger { border-color: var(--failed); }
.task { border: 1px solid var(--border); border-radius: 8px; padding: 12px 14px;
  margin: 12px 0; background: var(--bg); }
.task .facts { margin: 4px 0 8px; }
.timeline { margin: 8px 0; }
.track { position: relative; height: 22px; background: var(--track); border-radius: 4px; }
.attempt { position: absolute; top: 3px; height: 16px; border-radius: 3px; min-width: 2px;
  background: var(--canceled); opacity: 0.9; }
.attempt.succeeded { background: var(--success); }
.attempt.failed { background: var(--failed); }
.attempt.interrupted { background: var(--suspended); }
.attempt.running { background: var(--running); }
.attempt.cut-off { background: repeating-linear-gradient(45deg, var(--canceled) 0 4px,
  transparent 4px 8px); }
.checkpoint { position: absolute; top: -3px; width: 0; height: 28px;
  border-left: 2px solid var(--mark); margin-left: -1px; }
.checkpoint::after { content: ""; position: absolute; top: -3px; left: -5px; width: 8px;
  height: 8px; background: var(--mark); transform: rotate(45deg); }
.axis { display: flex; justify-content: space-between; font-size: 12px; color: var(--muted); }
.attempts { margin: 6px 0 0; padding-left: 20px; }
.attempts .saved { color: var(--success); font-weight: 600; }
table { border-collapse: collapse; width: 100%; margin-top: 8px; font-size: 13px; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid var(--border);
  vertical-align: top; }
th { color: var(--muted); font-weight: 600; }
caption { caption-side: top; text-align: left; padding: 2px 0; font-size: 12px; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
#result:empty, #error:empty { display: none; }
"""

_SHELL = """<!doctype html>
<html><head><meta charset="utf-8"><title>OpenJD checkpoints</title>
<script>{theme}</script>
<style>{css}</style></head>
<body>
<h1>OpenJD checkpoints <span class="muted">{dag} / {run}</span></h1>
<div id="error" class="message error"></div>
<div id="openjd"><p class="muted" id="loading">Loading…</p></div>
<div id="result" class="message"></div>
<script>
const base = {base};
let timer = null;
function say(id, text) {{ document.getElementById(id).textContent = text; }}
function later() {{ clearTimeout(timer); timer = setTimeout(load, 3000); }}
async function load() {{
  let r;
  try {{ r = await fetch(base + "/page", {{credentials: "same-origin"}}); }}
  catch (e) {{ say("error", "Cannot reach Airflow: " + e); return later(); }}
  if (r.status === 401 || r.status === 403) {{
    say("error", "Sign in to Airflow to see this DAG run's checkpoints (" + r.status + " " +
      await r.text() + "). This page reloads by itself once you have.");
    return later();
  }}
  if (!r.ok) {{ say("error", r.status + " " + await r.text()); return later(); }}
  say("error", "");
  const box = document.getElementById("openjd");
  box.innerHTML = await r.text();
  for (const t of box.querySelectorAll("time[datetime]"))
    t.textContent = new Date(t.getAttribute("datetime")).toLocaleString();
  const run = box.querySelector(".run");
  if (run && run.dataset.live === "1") later();
}}
async function terminate(mode) {{
  const r = await fetch(base + "/termination", {{method: "POST", credentials: "same-origin",
    headers: {{"Content-Type": "application/json"}}, body: JSON.stringify({{mode}})}});
  const body = await r.text();
  let text = r.status + " " + body;  // a refusal (409: the run has ended) as the API said it
  if (r.ok) try {{
    const d = JSON.parse(body);
    text = "Asked the run to end: " + d.mode + (d.note ? " (" + d.note + ")" : "") + ".";
  }} catch (e) {{}}
  say("result", text);
  load();
}}
document.addEventListener("click", (e) => {{
  const b = e.target.closest("button[data-mode]");
  if (b) {{ b.disabled = true; terminate(b.dataset.mode); }}
}});
load();
</script></body></html>
"""

_THEME = """(() => {
  const root = document.documentElement;
  function apply() {
    let mode = null;
    try {  // the Airflow UI around this iframe (same origin): its <html> class, else its setting
      const up = window.parent !== window ? window.parent.document.documentElement : null;
      if (up && up.classList.contains("dark")) mode = "dark";
      else if (up && up.classList.contains("light")) mode = "light";
      else mode = (localStorage.getItem("chakra-ui-color-mode") || "").replace(/"/g, "");
    } catch (e) {}
    if (mode !== "dark" && mode !== "light")
      mode = matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light";
    root.dataset.theme = mode;
  }
  apply();
  addEventListener("storage", apply);
  matchMedia("(prefers-color-scheme: dark)").addEventListener("change", apply);
})();"""


def shell(dag_id: str, dag_run_id: str, base: str) -> str:
    """The page (no data in it), whose script reads ``base + "/page"`` (the fragment) and posts
    to ``base + "/termination"`` with the user's session cookie."""
    return _SHELL.format(
        theme=_THEME,
        css=_CSS,
        dag=html.escape(dag_id),
        run=html.escape(dag_run_id),
        base=json.dumps(base).replace("<", "\\u003c"),
    )


def frame_ranges(frames: Iterable[int]) -> str:
    """Frames as ranges: ``[1, 2, 3, 5, 7, 8]`` -> ``"1-3,5,7-8"`` (``""`` for none)."""
    out: list[str] = []
    ordered = sorted(set(frames))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _time(moment: float) -> str:
    """A moment (seconds since the epoch) as ``<time>``, in UTC until the script makes it
    local; a stored value that is not a time (``core.report.utc_moment``) as itself, said so."""
    at = core.report.utc_moment(moment)
    if at is None:
        return f'<span class="bad-time">{_e(moment)} (not a time)</span>'
    return f'<time datetime="{at.isoformat()}">{at.strftime("%Y-%m-%d %H:%M:%S")} UTC</time>'


def _state(words: str) -> str:
    return f'<span class="state {_STATE_CLASS.get(words, "")}">{_e(words)}</span>'


def _n(count: int, one: str, many: str | None = None) -> str:
    return f"{count} {one if count == 1 else (many or one + 's')}"


def waiting_fragment(detail: str) -> str:
    """The fragment of a DAG run whose OpenJD job run has not begun (yet): polled again."""
    return (
        '<section class="run" data-live="1" data-status="waiting">'
        f'<p class="message">No OpenJD job run yet: {_e(detail)}. This page reloads by '
        "itself.</p></section>"
    )


def problem_fragment(detail: str, *, again: bool) -> str:
    """The fragment of a DAG run whose job run cannot be shown: ``detail`` says what and where
    (the store, the record). ``again``: it may pass (a store that cannot be reached, a record
    the next attempt sets aside), the page polls again; else (the run was deleted) it stops."""
    return (
        f'<section class="run" data-live="{1 if again else 0}" data-status="unreadable">'
        f'<p class="message error" id="problem">Cannot show the OpenJD job run: {_e(detail)}.'
        + (" This page tries again by itself." if again else "")
        + "</p></section>"
    )


# --- a task's timeline ---------------------------------------------------------------------------
def _attempt_words(bar: core.report.AttemptBar, *, last: bool, live: bool) -> tuple[str, str]:
    """(CSS class, what happened) of one attempt."""
    if not bar.ended:
        if last and live:
            return "running", "running"
        return "cut-off", "cut off (its process died before it could say how it ended)"
    outcome = bar.outcome or "ended"
    return outcome, outcome


def _timeline(timeline: core.report.TaskTimeline, *, live: bool) -> str:
    bars, lines = [], []
    for i, bar in enumerate(timeline.attempts):
        klass, what = _attempt_words(bar, last=i == len(timeline.attempts) - 1, live=live)
        left = timeline.fraction(bar.start) * 100
        width = max(0.4, timeline.fraction(bar.end) * 100 - left)
        how = (
            f"resumed from generation {bar.resumed_from}"
            if bar.resumed_from is not None
            else "from the top"
        )
        where = f" on {bar.host}" if bar.host else ""
        took = core.report.duration_words(max(0.0, bar.end - bar.start))
        bars.append(
            f'<div class="attempt {_e(klass)}" data-attempt="{bar.attempt}" '
            f'style="left:{left:.2f}%;width:{width:.2f}%" '
            f'title="#{bar.attempt}: {_e(how)}; {_e(what)}{_e(where)} ({took})"></div>'
        )
        saved = (
            f', <span class="saved">saved {core.report.duration_words(bar.saved_seconds)}</span>'
            if bar.resumed_from is not None
            else ""
        )
        lines.append(
            f'<li class="attempt-line">#{bar.attempt} {_e(how)}{saved}: {_e(what)}{_e(where)}'
            f" ({took})</li>"
        )
    for mark in timeline.checkpoints:
        at = timeline.fraction(mark.saved_at) * 100
        bars.append(
            f'<div class="checkpoint" data-generation="{mark.generation}" style="left:{at:.2f}%" '
            f'title="checkpoint generation {mark.generation}: {mark.state_bytes} bytes of '
            f'state, {_n(mark.files, "file")}"></div>'
        )
    total = timeline.saved_seconds
    summary = (
        f" Resumes saved {core.report.duration_words(total)} of work."
        if total > 0
        else (" No resume yet." if len(timeline.attempts) <= 1 else "")
    )
    problems = "".join(
        f'<p class="message error timeline-problem">{_e(p)}</p>' for p in timeline.problems
    )
    return (
        f'<div class="timeline">{problems}<div class="track">{"".join(bars)}</div>'
        f'<div class="axis"><span>{_time(timeline.start)}</span>'
        f"<span>{_n(len(timeline.attempts), 'attempt')}, "
        f"{_n(len(timeline.checkpoints), 'checkpoint')}.{summary}</span>"
        f"<span>{_time(timeline.end)}</span></div>"
        f'<ol class="attempts">{"".join(lines)}</ol></div>'
    )


def _resumes(timeline: core.report.TaskTimeline, resume_status: str | None) -> dict[int, str]:
    """Generation -> which attempts resumed from it (the latest with the task's resume
    status)."""
    out: dict[int, list[str]] = {}
    resumed = [b for b in timeline.attempts if b.resumed_from is not None]
    for bar in resumed:
        text = f"#{bar.attempt} resumed from it"
        if bar is resumed[-1] and resume_status:
            text += f" ({resume_status})"
        out.setdefault(bar.resumed_from or 0, []).append(text)
    return {g: "; ".join(t) for g, t in out.items()}


def _files(names: Sequence[str], count: int) -> str:
    if not names:
        return _e(count) if count else '<span class="muted">none</span>'
    shown = ", ".join(f"<code>{_e(n)}</code>" for n in names[:4])
    more = f" and {len(names) - 4} more" if len(names) > 4 else ""
    return shown + more


def _history(
    rows: Sequence[tuple[int, float, int, int, Sequence[str], int, str | None, int | None]],
    resumes: dict[int, str],
    keep: int | None,
) -> str:
    """The checkpoint history table: (generation, saved at, attempt, state bytes, file names,
    file count, files mode, bytes of the files the store keeps) per generation, newest first;
    ``keep``: how many generations of a task the store keeps (the caption says so when older
    ones were pruned)."""
    if not rows:
        return '<p class="muted history-empty">No checkpoint stored.</p>'
    body = []
    shown = sorted(rows, reverse=True)[:MAX_HISTORY_ROWS]
    for gen, saved, attempt, size, names, count, mode, file_bytes in shown:
        kept = {"managed": "kept by the store", "shared": "paths on a shared file system"}
        if mode == "managed" and file_bytes is not None:
            kept["managed"] = f"{file_bytes:,} bytes kept by the store"
        body.append(
            f'<tr class="generation" data-generation="{gen}"><td class="num">{gen}</td>'
            f'<td>{_time(saved)}</td><td class="num">{attempt}</td>'
            f'<td class="num">{size}</td><td>{_files(names, count)}'
            + (f' <span class="muted">({kept[mode]})</span>' if mode in kept and count else "")
            + f"</td><td>{_e(resumes.get(gen, ''))}</td></tr>"
        )
    newest = max(r[0] for r in rows)
    if len(shown) < len(rows):  # given more than it lists: older generations are stored
        caption = (
            f'<caption class="muted">Checkpoint history: the newest {len(shown)} '
            "generations; older ones stored are not shown.</caption>"
        )
    elif keep and newest > len(rows):
        caption = (
            f'<caption class="muted">Checkpoint history: the store keeps the latest {keep} '
            f"generations of each task; {newest - len(rows)} older ones were pruned.</caption>"
        )
    else:
        caption = '<caption class="muted">Checkpoint history</caption>'
    return (
        f'<table class="history">{caption}<thead><tr><th class="num">generation</th>'
        "<th>saved</th>"
        '<th class="num">run attempt</th><th class="num">state bytes</th><th>files</th>'
        f"<th>resume</th></tr></thead><tbody>{''.join(body)}</tbody></table>"
    )


def _facts(
    attempts: int,
    frames: str | None,
    resume_status: str | None,
    host: str | None,
    *more: str | None,
) -> list[str]:
    """A task's facts line: attempts, frames done, resume status, host, then ``more``."""
    facts = [_n(attempts, "attempt"), frames]
    facts += [f"resume status {resume_status}" if resume_status else None]
    facts += [f"host {host}" if host else None, *more]
    return [f for f in facts if f]


def _task(
    rec: core.TaskRecord,
    generations: Sequence[core.CheckpointData],
    *,
    live: bool,
    keep: int | None,
    note: str | None = None,
) -> str:
    """One task's article; ``note``: what continued it (``core.report.continuations``), if any."""
    task = core.report.summarize_task(rec)
    words = core.report.task_status_words(task.status)
    shown = generations[-MAX_HISTORY_ROWS:]  # the timeline marks what the table lists
    timeline = core.report.task_timeline(rec, shown, now=time.time() if live else None)
    frames = (
        f"frames done {frame_ranges(task.frames_done)} ({len(task.frames_done)})"
        if task.frames_done
        else None
    )
    facts = _facts(task.attempts, frames, task.resume_status, task.host, task.message, note)
    summaries = [core.report.summarize_checkpoint(g) for g in generations]
    if task.checkpoint is not None and all(
        s.generation != task.checkpoint.generation for s in summaries
    ):
        summaries.append(task.checkpoint)
    rows = [
        (s.generation, s.saved_at, s.attempt, s.state_bytes, (*s.files, *s.dirs), s.named,
         s.files_mode, s.file_bytes)
        for s in summaries
    ]  # fmt: skip
    return (
        f'<article class="task" data-status="{_e(words)}" data-label="{_e(task.label)}">'
        f"<h3>{_e(task.label)}</h3>{_state(words)}"
        f'<p class="facts">{_e(" · ".join(facts))}</p>'
        f"{_timeline(timeline, live=live)}"
        f"{_history(rows, _resumes(timeline, task.resume_status), keep)}</article>"
    )


def _kept_task(task: core.report.KeptTask, keep: int | None) -> str:
    timeline = core.report.kept_timeline(task)
    frames = f"{_n(task.frames_done, 'frame')} done" if task.frames_done else None
    facts = _facts(task.attempts, frames, task.resume_status, task.host)
    rows = [
        (c.generation, c.saved_at, c.attempt, c.state_bytes, (), c.files, None, None)
        for c in task.checkpoints
    ]
    return (
        f'<article class="task" data-status="succeeded" data-label="{_e(task.label)}">'
        f"<h3>{_e(task.label)}</h3>{_state('succeeded')}"
        f'<p class="facts">{_e(" · ".join(facts))}</p>'
        f"{_timeline(timeline, live=False)}"
        f"{_history(rows, _resumes(timeline, task.resume_status), keep)}</article>"
    )


# --- what happened to the checkpoints, and what to do ---------------------------------------------
def _resume_hint(run: core.RunRecord) -> str:
    return (
        '<div class="note suspended" id="resume-hint"><b>Its checkpoints are kept. To resume '
        "the run:</b><ul>"
        "<li>clear the task instances that did not finish (Airflow UI: the task instance → "
        "<b>Clear</b>): the same DAG run goes on from the checkpoints;</li>"
        "<li>or trigger a new DAG run of this DAG with <code>resume</code> set to "
        "<code>latest</code> in its conf (or to this job run's id, "
        f"<code>{_e(run.run_id)}</code>).</li></ul></div>"
    )


def _ended_note(run: core.RunRecord, words: str) -> str:
    status = run.status.value
    if status == "succeeded":
        kept = run.kept
        if kept is None:
            return (
                '<div class="note success" id="ended-note">Every task succeeded. A run that '
                "succeeds deletes its checkpoints at its end; this one kept no summary of "
                "them.</div>"
            )
        left = (
            f" Details of {_n(len(kept.tasks), 'task')} of {kept.task_count} below."
            if kept.left_out
            else ""
        )
        return (
            '<div class="note success" id="ended-note">Every task succeeded, and the run '
            f"deleted its checkpoints at its end ({_time(kept.at)}), as a run that succeeds "
            f"does. Until then it {_e(core.report.kept_sentence(kept))}.{left}</div>"
        )
    if status == "interrupted":
        return (
            f'<div class="note suspended" id="ended-note">The run is {_e(words)}: running '
            "tasks stored a checkpoint (or their finished frames) and stopped; tasks not "
            "started were skipped.</div>" + _resume_hint(run)
        )
    if status == "failed":
        return (
            f'<div class="note failed" id="ended-note">The run {_e(words)}. Its checkpoints '
            "are kept: fix what failed, then clear the failed task instances, or trigger a "
            "new DAG run with <code>resume</code> set to <code>latest</code>.</div>"
        )
    return (
        f'<div class="note" id="ended-note">The run was {_e(words)} '
        f"({_e(run.termination or run.condition.reason)}). Its checkpoints are kept in the "
        "store until <code>openjd-checkpoint gc</code> or <code>checkpoints delete</code> "
        "removes them.</div>"
    )


def _buttons(run: core.RunRecord, choices: Sequence[core.TerminationMode]) -> str:
    if not choices:
        return ""
    danger = ' class="danger"'
    buttons = "".join(
        f'<button type="button" data-mode="{_e(m.value)}"'
        f"{danger if m.value.startswith('Cancel') else ''}>"
        f"{_e(BUTTON_WORDS[m.value])}</button>"
        for m in choices
    )
    finally_note = (
        "" if run.finally_steps else '<span class="muted">This job has no finally steps.</span>'
    )
    return f'<div class="actions" id="actions">{buttons}{finally_note}</div>'


def fragment(
    run: core.RunRecord,
    tasks: Sequence[tuple[core.TaskRecord, Sequence[core.CheckpointData]]],
    *,
    file_data_flow: str,
    choices: Sequence[core.TerminationMode],
    warnings: Sequence[str] = (),
    keep_generations: int | None = None,
) -> str:
    """The job run as HTML: its status and condition, the note on its checkpoints once it has
    ended, the buttons of ``choices`` (``core.termination_choices``), and each task (its
    record and stored generations, in the order given; ``keep_generations``: how many of a
    task's generations the store keeps, ``CheckpointStore.keep_generations``).
    ``data-live="1"`` on the ``.run`` section while the run has not ended: the shell polls
    again."""
    live = run.status == core.RunStatus.RUNNING and run.phase != core.RunPhase.ENDED
    words = core.report.run_status_words(run.status.value)
    stopping = run.condition.reason == "Stopping"
    condition = run.condition.reason + (
        f": {run.condition.message}" if run.condition.message else ""
    )
    facts = [
        f"attempt {run.attempt}",
        f"checkpoint files: {file_data_flow}",
        _n(len(tasks), "task record") if tasks or live else "",
    ]
    head = (
        f'<section class="run" data-live="{1 if live else 0}" data-status="{_e(words)}">'
        f'<div class="run-head"><h2>Job run <code id="job-run">{_e(run.run_id)}</code></h2>'
        f'<span id="status">{_state("stopping" if stopping else words)}</span>'
        f'<span class="condition muted" id="condition">{_e(condition)}</span></div>'
        f'<p class="facts">{_e(" · ".join(f for f in facts if f))} · started '
        f"{_time(run.created_at)} · last change {_time(run.updated_at)}</p>"
    )
    parts = [head]
    if not live:
        parts.append(_ended_note(run, words))
    parts.append(_buttons(run, choices))
    continued = core.report.continuations(rec for rec, _ in tasks)
    for rec, generations in tasks:
        note = continued.get((rec.step, rec.task_key))
        parts.append(_task(rec, generations, live=live, keep=keep_generations, note=note))
    if not tasks and run.status.value == "succeeded" and run.kept is not None:
        parts.extend(_kept_task(t, keep_generations) for t in run.kept.tasks)
    elif not tasks and live:
        parts.append('<p class="muted">No task has started yet.</p>')
    for w in warnings:
        parts.append(f'<p class="message error warning">{_e(w)}</p>')
    parts.append("</section>")
    return "".join(parts)
