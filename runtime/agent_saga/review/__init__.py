"""Review before enforcement: what a proposed policy or cap would have done to recorded traffic.

    calls = recorded_calls(reader.records(), encryptor=None)        # the log, as the gate saw it
    report = replay_policies(calls, current=None, proposed=policy_set(policies, agent="payments-agent"))
    doc = replay_limits(recorded_calls(reader.records()), load_limit_file("budget.yaml"))
    changes = diff_policies(old, new)

    _calls.py    the calls a log records (tags, the code's semantics, policy arguments)
    _replay.py   policy replay: each call through the gate's evaluate_call, twice
    _limits.py   limit replay: the gate's pricing and the limit store's windows, in time order
    _diff.py     a semantic diff of two SagaPolicies
    _render.py   text and Markdown reports

Nothing here re-implements the gate: the verdicts come from
``agent_saga.controls.gate._policy.evaluate_call`` and the windows from
``InProcessLimitStore``. See docs/gitops.md.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from ._calls import RecordedCall, Unevaluable, recorded_calls
    from ._diff import Change, diff_exit_code, diff_policies
    from ._limits import LimitFileError, load_limit_file, replay_limits
    from ._render import (
        diff_markdown,
        diff_text,
        limits_markdown,
        limits_text,
        replay_markdown,
        replay_text,
    )
    from ._replay import ReplayedCall, ReplayReport, policy_set, replay_calls, replay_policies

#: Each public name -> its module, loaded on first use (``agent_saga._lazy``).
_SOURCES: dict[str, tuple[str, ...]] = {
    "._calls": ("RecordedCall", "Unevaluable", "recorded_calls"),
    "._diff": ("Change", "diff_exit_code", "diff_policies"),
    "._limits": ("LimitFileError", "load_limit_file", "replay_limits"),
    "._render": ("diff_markdown", "diff_text", "limits_markdown", "limits_text", "replay_markdown", "replay_text"),
    "._replay": ("ReplayedCall", "ReplayReport", "policy_set", "replay_calls", "replay_policies"),
}

__all__ = [
    "Change",
    "LimitFileError",
    "RecordedCall",
    "ReplayReport",
    "ReplayedCall",
    "Unevaluable",
    "diff_exit_code",
    "diff_markdown",
    "diff_policies",
    "diff_text",
    "limits_markdown",
    "limits_text",
    "load_limit_file",
    "policy_set",
    "recorded_calls",
    "replay_calls",
    "replay_limits",
    "replay_markdown",
    "replay_policies",
    "replay_text",
]

__getattr__, __dir__ = lazy_exports(__name__, _SOURCES, __all__)
