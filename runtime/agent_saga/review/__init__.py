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
    from ._calls import RecordedCall as RecordedCall
    from ._calls import Unevaluable as Unevaluable
    from ._calls import recorded_calls as recorded_calls
    from ._diff import Change as Change
    from ._diff import diff_exit_code as diff_exit_code
    from ._diff import diff_policies as diff_policies
    from ._limits import LimitFileError as LimitFileError
    from ._limits import load_limit_file as load_limit_file
    from ._limits import replay_limits as replay_limits
    from ._render import diff_markdown as diff_markdown
    from ._render import diff_text as diff_text
    from ._render import limits_markdown as limits_markdown
    from ._render import limits_text as limits_text
    from ._render import replay_markdown as replay_markdown
    from ._render import replay_text as replay_text
    from ._replay import ReplayedCall as ReplayedCall
    from ._replay import ReplayReport as ReplayReport
    from ._replay import policy_set as policy_set
    from ._replay import replay_calls as replay_calls
    from ._replay import replay_policies as replay_policies

#: The public names, by module: the one list (``agent_saga._lazy``); __all__ derives from it.
_SOURCES: dict[str, tuple[str, ...]] = {
    "._calls": ("RecordedCall", "Unevaluable", "recorded_calls"),
    "._diff": ("Change", "diff_exit_code", "diff_policies"),
    "._limits": ("LimitFileError", "load_limit_file", "replay_limits"),
    "._render": ("diff_markdown", "diff_text", "limits_markdown", "limits_text", "replay_markdown", "replay_text"),
    "._replay": ("ReplayedCall", "ReplayReport", "policy_set", "replay_calls", "replay_policies"),
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
