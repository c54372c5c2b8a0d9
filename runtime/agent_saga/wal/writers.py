"""Who wrote a record: writer ids bound to agent identities, and sagas bound to writers.

A fleet log (RedisWAL, PostgresWAL) holds one hash chain per writer. Two kinds of writer:

    NS/POD, NS/POD@SUFFIX   an agent identity's writer (``--agent NS/POD`` of its Redis
                            ACL user): the only streams that credential may append to
    anything else           a service writer: recovery daemons, operators' tools. No
                            agent credential may append to it (an agent's ACL names only
                            streams of its own identity, and those hold a ``/``)

Invariants:
- A saga belongs to the first agent identity writer that wrote a record of it, in the
  log's order (``gseq``). Records of that saga in another identity writer's chain are
  *foreign*: ``verify`` reports them, certify and recovery ignore them and say so.
- A saga two identity writers both started is *contested*: a writer chooses its own
  entry ids, so the first start may be a back-dated forgery. Nobody acts on it, certify
  does not certify it; a human decides.
- Service writers may write records of any saga (a recovery daemon closes another
  process's saga in its own chain); they never own one.
- A file log is one writer: the ``writer`` and ``gseq`` stamps a file line may carry are
  not covered by the chain and are never read (``wal.file.scan_file_records``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .._identity import process_identity
from ..errors import ConfigurationError
from ..records import Record, RecordType, validate_id

__all__ = [
    "ForeignRecords",
    "SagaOwners",
    "check_identity",
    "identity_of",
    "identity_writer",
    "is_identity_writer",
    "local_identity",
    "writer_of_identity",
]

_GLOB = frozenset(" *?[]\\")


def is_identity_writer(writer: str) -> bool:
    """True if ``writer`` is an agent identity's writer (``NS/POD[@SUFFIX]``)."""
    return "/" in writer


def identity_of(writer: str) -> str | None:
    """The agent identity ``NS/POD`` of an identity writer, else None (a service writer)."""
    if "/" not in writer:
        return None
    return writer.split("@", 1)[0]


def check_identity(identity: str, what: str = "agent") -> str:
    """``identity`` if it is ``<namespace>/<pod>`` (no glob characters, no ``@``), else raise
    ``ConfigurationError`` naming ``what`` and the fix."""
    if (
        not isinstance(identity, str) or identity.count("/") != 1 or "@" in identity
        or any(c in _GLOB for c in identity) or "" in identity.split("/")
    ):
        raise ConfigurationError(f"{what} {identity!r}: give <namespace>/<pod> (no glob characters, no '@')")
    validate_id(identity, what)
    return identity


def identity_writer(identity: str, suffix: str | None = None) -> str:
    """The writer id of a process of ``identity``: ``NS/POD@SUFFIX`` (default suffix
    ``<pid>-<random>``, unique per process, so two processes of one pod never fence each
    other). Its stream is one the identity's ACL user may append to."""
    check_identity(identity)
    return validate_id(f"{identity}@{suffix or process_identity().instance()}", "writer")


def writer_of_identity(writer: str, identity: str) -> bool:
    """True if ``writer`` is ``identity``'s own (``identity`` or ``identity@...``)."""
    return writer == identity or writer.startswith(identity + "@")


def local_identity(namespace: str, pod: str | None = None) -> str:
    """This process's identity ``NS/POD``: ``pod``, else ``$POD_NAME``, else the host name
    (a pod's name), as its heartbeat names it (characters a writer id cannot hold become
    ``-``)."""
    return check_identity(f"{namespace}/{process_identity(pod).pod_name}")


@dataclass(slots=True)
class ForeignRecords:
    """Records of sagas a writer does not own, per writer: how many, and the first."""

    by_writer: dict[str, tuple[int, str]] = field(default_factory=dict)

    def add(self, writer: str, saga: str, owner: str, where: str) -> None:
        """Count a record of ``saga`` (owned by ``owner``) that ``writer`` wrote at ``where``."""
        n, first = self.by_writer.get(writer, (0, ""))
        if not n:
            first = f"{where}: saga {saga} belongs to writer {owner}"
        self.by_writer[writer] = (n + 1, first)

    def describe(self) -> list[str]:
        """One line per writer that wrote records of sagas it does not own."""
        return [
            f"writer {w}: {n} record(s) of sagas it does not own (first: {first}); ignored: a "
            f"saga's records count only from its own writer and from service writers (recovery)"
            for w, (n, first) in sorted(self.by_writer.items())
        ]

    def __bool__(self) -> bool:
        return bool(self.by_writer)


class SagaOwners:
    """The binding rule over a log read in order (see the module doc): ``admit`` says
    whether a record counts, and keeps what did not in ``foreign``."""

    __slots__ = ("contested", "foreign", "owners")

    def __init__(self) -> None:
        self.owners: dict[str, str] = {}
        self.foreign = ForeignRecords()
        #: saga -> why nobody may act on it: two identity writers both started it
        self.contested: dict[str, str] = {}

    def admit(self, rec: Record) -> bool:
        """True if ``rec`` counts: its ``writer`` stamp is the saga's owner or a service
        writer (no stamp: a file log, one writer)."""
        writer = rec.extra.get("writer")
        if not isinstance(writer, str) or "/" not in writer:
            return True
        owner = self.owners.setdefault(rec.saga, writer)
        if owner == writer:
            return True
        where = f"seq {rec.seq} gseq {rec.extra.get('gseq')} type {rec.type}"
        self.foreign.add(writer, rec.saga, owner, where)
        if rec.type == RecordType.SAGA_STARTED.value:
            # An owner's first record is its start: one of the two starts is forged (a
            # writer picks its own entry ids, so the first may be the back-dated one).
            self.contested.setdefault(rec.saga, f"started by writer {owner} and by writer {writer} ({where})")
        return False
