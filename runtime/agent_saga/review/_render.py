"""Reports for a reviewer: plain text for a terminal, Markdown for a pull-request comment.

Both say the same things as ``--json``: the counts first, then one row per tool, then the
calls the log could not replay (never left out), then examples a reviewer can look up
with ``agent-saga inspect --saga ID``.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from typing import Any

from ._diff import Change
from ._replay import VERDICTS, ReplayReport

__all__ = ["diff_markdown", "diff_text", "limits_markdown", "limits_text", "replay_markdown", "replay_text"]

_SHORT = {"ALLOW": "allow", "REQUIRE_APPROVAL": "human", "BLOCK": "block"}


def _when(ts: int | None) -> str:
    if ts is None:
        return "-"
    return _dt.datetime.fromtimestamp(ts / 1e6, _dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _by(direction: str, example: dict[str, str]) -> str:
    """Who made the difference: the proposed policy's objection, or the current one's that goes."""
    by = example["decided_by"]
    return f"now {by}" if direction == "stricter" else f"was {by}" if by else "no objection"


def _verdicts(counts: dict[str, int]) -> str:
    return " / ".join(f"{counts[v]} {_SHORT[v]}" for v in VERDICTS)


def _headline(r: ReplayReport) -> str:
    if r.looser:
        return f"LOOSER: {r.looser} recorded call(s) would be let through more easily"
    if r.stricter:
        return f"STRICTER: {r.stricter} recorded call(s) would be refused or sent to a human"
    return "UNCHANGED: no recorded call changes its verdict"


def _unevaluable_lines(r: ReplayReport) -> list[str]:
    out = []
    for why, e in sorted(r.unevaluable.items()):
        ex = ", ".join(f"{x['saga']} ({x['step']})" for x in e["examples"])
        out.append(f"{e['count']} {why}: {e['reason']}; e.g. {ex}")
    return out


def replay_text(r: ReplayReport, meta: dict[str, Any]) -> str:
    """The replay for a terminal."""
    lines = [f"{_headline(r)}.",
             f"log {meta['log']}: {r.calls} call(s) from {_when(r.first_ts)} to {_when(r.last_ts)}; "
             f"{r.evaluated} replayed, {r.unevaluated} could not be",
             f"current  ({', '.join(meta['current']) or 'no policy'}): {_verdicts(r.current)}",
             f"proposed ({', '.join(meta['proposed'])}): {_verdicts(r.proposed)}",
             f"stricter {r.stricter}, looser {r.looser}, unchanged {r.evaluated - r.stricter - r.looser}", ""]
    width = max([len(t) for t in r.by_tool] + [4])
    lines.append(f"{'tool':{width}}  {'calls':>7}  {'current (allow/human/block)':28}  "
                 f"{'proposed (allow/human/block)':29}  stricter  looser")
    for tool, t in sorted(r.by_tool.items()):
        cur = "/".join(str(t.current[v]) for v in VERDICTS)
        pro = "/".join(str(t.proposed[v]) for v in VERDICTS)
        lines.append(f"{tool:{width}}  {t.calls:>7}  {cur:28}  {pro:29}  {t.stricter:>8}  {t.looser:>6}")
    for tool, t in sorted(r.by_tool.items()):
        for direction in ("looser", "stricter"):
            for x in t.examples[direction]:
                lines.append(f"  {direction}: {tool} in saga {x['saga']} ({x['step']}): {x['current']} -> "
                             f"{x['proposed']} ({_by(direction, x)})")
    for line in _unevaluable_lines(r):
        lines.append(f"NOT REPLAYED: {line}")
    lines += [f"note: {n}" for n in meta.get("notes", ())]
    return "\n".join(lines) + "\n"


def replay_markdown(r: ReplayReport, meta: dict[str, Any]) -> str:
    """The replay as a pull-request comment."""
    icon = ":warning:" if r.looser else ":lock:" if r.stricter else ":white_check_mark:"
    lines = [f"### {icon} SagaPolicy replay: {_headline(r)}", "",
             f"Replayed **{r.evaluated}** of **{r.calls}** recorded call(s) from `{meta['log']}` "
             f"({_when(r.first_ts)} to {_when(r.last_ts)}) under the current policy "
             f"(`{', '.join(meta['current']) or 'no policy'}`) and the proposed one (`{', '.join(meta['proposed'])}`).",
             "", "| | allow | human | block |", "|---|---:|---:|---:|",
             f"| current | {' | '.join(str(r.current[v]) for v in VERDICTS)} |",
             f"| proposed | {' | '.join(str(r.proposed[v]) for v in VERDICTS)} |", "",
             "| tool | calls | current allow/human/block | proposed allow/human/block | stricter | looser |",
             "|---|---:|---|---|---:|---:|"]
    for tool, t in sorted(r.by_tool.items()):
        cur = " / ".join(str(t.current[v]) for v in VERDICTS)
        pro = " / ".join(str(t.proposed[v]) for v in VERDICTS)
        flag = " :warning:" if t.looser else ""
        lines.append(f"| `{tool}`{flag} | {t.calls} | {cur} | {pro} | {t.stricter} | {t.looser} |")
    examples = [(tool, d, x) for tool, t in sorted(r.by_tool.items()) for d in ("looser", "stricter")
                for x in t.examples[d]]
    if examples:
        lines += ["", "<details><summary>Examples</summary>", ""]
        lines += [f"- {d}: `{tool}` in saga `{x['saga']}`: {x['current']} → {x['proposed']} "
                  f"({_by(d, x)})" for tool, d, x in examples]
        lines += ["", "</details>"]
    if r.unevaluable:
        lines += ["", f"**Not replayed: {r.unevaluated} call(s).**", ""]
        lines += [f"- {line}" for line in _unevaluable_lines(r)]
    lines += ["", *(f"> {n}" for n in meta.get("notes", ()))] if meta.get("notes") else []
    return "\n".join(lines) + "\n"


def _diff_headline(changes: Sequence[Change]) -> str:
    looser = sum(c.direction == "looser" for c in changes)
    stricter = sum(c.direction == "stricter" for c in changes)
    if looser:
        return f"LOOSER: {looser} change(s) loosen or cannot be ordered, {stricter} tighten"
    if stricter:
        return f"STRICTER: {stricter} change(s), none looser"
    return "UNCHANGED: nothing the gate does changes"


def diff_text(changes: Sequence[Change], old: str, new: str) -> str:
    """The diff for a terminal."""
    lines = [f"{_diff_headline(changes)} ({old} -> {new})."]
    lines += [f"  {c.describe()}" for c in changes]
    return "\n".join(lines) + "\n"


def diff_markdown(changes: Sequence[Change], old: str, new: str) -> str:
    """The diff as a pull-request comment."""
    lines = [f"### SagaPolicy diff: {_diff_headline(changes)}", "", f"`{old}` → `{new}`", ""]
    if changes:
        lines += ["| where | what | old | new | |", "|---|---|---|---|---|"]
        for c in changes:
            flag = ":warning: looser" if c.direction == "looser" else c.direction
            lines.append(f"| `{c.scope}` | {c.aspect} | `{c.old}` | `{c.new}` | {flag} |")
    return "\n".join(lines) + "\n"


def limits_text(doc: dict[str, Any]) -> str:
    """A limits replay for a terminal."""
    lines = [f"{doc['headline']}.", f"log {doc['log']}: {doc['calls']} call(s) replayed in time order"]
    for lim in doc["limits"]:
        lines.append(f"limit {lim['name']} ({lim['kind']}, max {lim['max']:g} per {lim['window']:g}s): "
                     f"{lim['charged']} call(s) charged, {lim['refused']} refused ({lim['refused_amount']:g}), "
                     f"{lim['escalated']} sent to a human ({lim['escalated_amount']:g}), "
                     f"{lim['unreadable']} refused unreadable")
        for w in lim["windows"]:
            lines.append(f"  window {w['key']}: {w['refused']} refused ({w['refused_amount']:g}), "
                         f"{w['escalated']} to a human, {_when(w['first'])} to {_when(w['last'])}, "
                         f"peak use {w['peak']:g}; e.g. saga {', '.join(w['examples'])}")
    for why, e in sorted(doc["unevaluable"].items()):
        lines.append(f"NOT REPLAYED: {e['count']} {why}: {e['reason']}")
    return "\n".join(lines) + "\n"


def limits_markdown(doc: dict[str, Any]) -> str:
    """A limits replay as a pull-request comment."""
    lines = [f"### Limit replay: {doc['headline']}", "",
             f"{doc['calls']} recorded call(s) from `{doc['log']}`, in time order.", "",
             "| limit | max / window | charged | refused | amount refused | to a human |",
             "|---|---|---:|---:|---:|---:|"]
    for lim in doc["limits"]:
        lines.append(f"| `{lim['name']}` | {lim['max']:g} / {lim['window']:g}s | {lim['charged']} | "
                     f"{lim['refused'] + lim['unreadable']} | {lim['refused_amount']:g} | {lim['escalated']} |")
    windows = [(lim["name"], w) for lim in doc["limits"] for w in lim["windows"]]
    if windows:
        lines += ["", "| limit | window | refused | to a human | from | to |", "|---|---|---:|---:|---|---|"]
        lines += [f"| `{n}` | `{w['key']}` | {w['refused']} | {w['escalated']} | {_when(w['first'])} | "
                  f"{_when(w['last'])} |" for n, w in windows]
    if doc["unevaluable"]:
        lines += ["", "**Not replayed:**", ""]
        lines += [f"- {e['count']} {why}: {e['reason']}" for why, e in sorted(doc["unevaluable"].items())]
    return "\n".join(lines) + "\n"
