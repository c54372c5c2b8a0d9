"""Which compensations recovery may run, for whom: an allow-list keyed on the saga's writer.

Recovery calls handlers with the daemon's own rights, and takes the handler's name and
keyword arguments from the log. Whoever can write the log must not be able to make it
call a handler, or use a credential reference, its own agent was never given (a confused
deputy). So before each call the daemon asks ``Grants.refuses(writer, handler, kwargs)``:

    writer    the saga's owner (``SagaView.owner``: an agent identity ``NS/POD@...`` in
              a fleet log, see ``wal.writers``), or the file's path for a file log
    handler   the compensation's registered name
    refs      every ``credential_ref`` in its kwargs (keys ``credential_ref`` and
              ``*_credential_ref``)

A rule grants when its writer glob matches the writer, one of its handler globs matches
the handler, and each ref matches one of its ref globs. Nothing granted: the step is
escalated (``NOT_ALLOWED``), naming the writer, the handler and the ref.

    Grants.parse(["payments/* stripe.refund,stripe.void stripe_payments",
                  "search/* cache.*"])

One rule is ``WRITERS HANDLERS [REFS]``: three fields separated by spaces, each a
comma-separated list of ``fnmatch`` globs (``*`` also matches ``/`` and ``@``).

Invariants:
- Without an allow-list (``DEFAULT_GRANTS``) every writer may run any registered handler
  with no credential reference; a compensation that names one is escalated (fail closed:
  the reference would be used with recovery's rights, not its agent's).
- An allow-list, once given, is the whole truth: the default rule no longer applies.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigurationError

__all__ = ["DEFAULT_GRANTS", "Grant", "Grants", "credential_refs"]


def credential_refs(kwargs: Mapping[str, Any]) -> list[str]:
    """The credential references a compensation's kwargs name (any value that is not a
    string is turned into one: it is refused unless a glob matches it)."""
    return [
        v if isinstance(v, str) else repr(v)
        for k, v in kwargs.items()
        if k == "credential_ref" or k.endswith("_credential_ref")
    ]


@dataclass(frozen=True, slots=True)
class Grant:
    """One rule: writers matching ``writers`` may run ``handlers`` with ``refs``."""

    writers: tuple[str, ...]
    handlers: tuple[str, ...]
    refs: tuple[str, ...] = ()

    def allows(self, writer: str, handler: str, refs: Iterable[str]) -> bool:
        """True if this rule grants ``handler`` with every one of ``refs`` to ``writer``."""
        return (
            any(fnmatch.fnmatchcase(writer, g) for g in self.writers)
            and any(fnmatch.fnmatchcase(handler, g) for g in self.handlers)
            and all(any(fnmatch.fnmatchcase(r, g) for g in self.refs) for r in refs)
        )

    def describe(self) -> str:
        """The rule as it is written on a command line."""
        return " ".join([",".join(self.writers), ",".join(self.handlers), *([",".join(self.refs)] if self.refs else [])])


@dataclass(frozen=True, slots=True)
class Grants:
    """The allow-list (see the module doc). ``configured``: False for the default."""

    rules: tuple[Grant, ...]
    configured: bool = True

    @classmethod
    def parse(cls, rules: Iterable[str] | None) -> Grants:
        """The allow-list of ``rules`` (``WRITERS HANDLERS [REFS]`` each), or the default
        when ``rules`` is None. Raises ``ConfigurationError`` naming a bad rule."""
        if rules is None:
            return DEFAULT_GRANTS
        out: list[Grant] = []
        for text in rules:
            fields = text.split()
            if len(fields) not in (2, 3) or any(not f.strip(",") for f in fields):
                raise ConfigurationError(
                    f"allow rule {text!r}: write 'WRITERS HANDLERS [CREDENTIAL_REFS]', three fields separated "
                    f"by spaces, each a comma-separated list of globs, e.g. 'payments/* stripe.refund "
                    f"stripe_payments'")
            parts = [tuple(g for g in f.split(",") if g) for f in fields]
            out.append(Grant(parts[0], parts[1], parts[2] if len(parts) == 3 else ()))
        return cls(tuple(out))

    def refuses(self, writer: str, handler: str, kwargs: Mapping[str, Any]) -> str | None:
        """None if a rule grants ``handler`` (with the credential references in
        ``kwargs``) to ``writer``; else why not, naming all three."""
        refs = credential_refs(kwargs)
        if any(g.allows(writer, handler, refs) for g in self.rules):
            return None
        ref_text = f" with credential_ref {', '.join(map(repr, refs))}" if refs else ""
        if not self.configured:
            return (
                f"writer {writer!r} may not run {handler!r}{ref_text}: no recovery allow-list is configured, "
                f"and without one recovery never uses a credential reference on a writer's behalf. Allow it "
                f"with --allow '<writer glob> {handler} <ref>' (recoveryd: AGENT_SAGA_RECOVERYD_ALLOW, chart: "
                f"recoveryd.allow) if that writer's agent holds it")
        return (
            f"writer {writer!r} may not run {handler!r}{ref_text}: no rule of the recovery allow-list grants it "
            f"({'; '.join(g.describe() for g in self.rules) or 'no rules'}). If that writer's agent holds it, "
            f"add a rule; else this record asks recovery for rights its writer never had")


#: Without an allow-list: any writer, any registered handler, no credential reference.
DEFAULT_GRANTS = Grants((Grant(("*",), ("*",), ()),), configured=False)
