"""Action semantics: what kind of undo a side effect admits.

Every step declares one of three classes, and the engine's behaviour follows from it:

    REVERSIBLE    restored exactly, no observer can tell (a scratch file, a cache entry).
                  Records are written but the engine never waits for the disk.
    COMPENSABLE   offset by an inverse, the trace is permanent (a refund, a terminated
                  instance). The intent is durable before the call, the compensation
                  descriptor is durable before ``execute`` returns.
    IRREVERSIBLE  no automated undo exists (an SMS, a wire). Refused unless a gate allowed
                  it, and reported NOT_UNDOABLE by every rollback that reaches it.

Invariants:
- The enum values are the on-disk names in WAL records; they never change.
- Users may pass the names as strings; ``coerce_semantics`` is the single place that turns
  them into members, and it refuses anything else (no guessing a class from a typo).
"""

from __future__ import annotations

import enum

from .errors import ConfigurationError

__all__ = ["ActionSemantics", "coerce_semantics"]


class ActionSemantics(enum.StrEnum):
    """The undo class of a side effect: REVERSIBLE, COMPENSABLE or IRREVERSIBLE.

    Guarantee: the value is the stable on-disk name. Members compare equal to their name
    (``ActionSemantics.COMPENSABLE == "COMPENSABLE"``).
    """

    REVERSIBLE = "REVERSIBLE"
    COMPENSABLE = "COMPENSABLE"
    IRREVERSIBLE = "IRREVERSIBLE"


_BY_NAME = {m.value: m for m in ActionSemantics}


def coerce_semantics(value: ActionSemantics | str) -> ActionSemantics:
    """Return the ``ActionSemantics`` member named by ``value`` (a member or its name).

    Names are matched case-insensitively, surrounding whitespace ignored.
    Raises ``ConfigurationError`` naming the three valid classes for anything else.
    """
    if isinstance(value, ActionSemantics):
        return value
    if isinstance(value, str):
        member = _BY_NAME.get(value.strip().upper())
        if member is not None:
            return member
    raise ConfigurationError(
        f"semantics {value!r} is not one of REVERSIBLE, COMPENSABLE, IRREVERSIBLE: declare "
        f"what undo the side effect admits (ActionSemantics.COMPENSABLE or the string "
        f"'COMPENSABLE'); when in doubt, IRREVERSIBLE"
    )
