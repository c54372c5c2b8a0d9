"""FileWAL's sealer process (``FileWAL(path, sealer="process")``): a child process seals,
writes and fdatasyncs each batch, on its own interpreter lock and another CPU core.

In thread mode the flusher thread seals a batch (scrubber, canonical JSON, two SHA-256
per record, the line) while holding the one interpreter lock the caller's event loop also
needs. Here the flusher thread only hands the batch's fields to the child, C code all the
way (``operator.attrgetter`` over the batch, one ``marshal.dumps``, one ``writev``), and
sleeps without the lock until the child says the batch is on disk.

Protocol: one request and one reply per batch, over two pipes. A frame is an 8-byte
little-endian length and a ``marshal`` body.

    parent -> child   [(type, saga, step, payload, seq, ts, text), ...]   the batch, in seq
                      order; ``text`` is None, or the canonical payload text the parent
                      built itself for a record marshal cannot carry (``portable``)
    child -> parent   (0, logs, last_seq, head, [(seq, error class, message), ...])
                      written and fdatasync'ed; the records rejected as unencodable
                      (1, logs, errno, strerror)       the write or the sync failed
                      (2, logs, error class, message)  anything else failed

``logs`` are the ``agent_saga`` log records the seal emitted in the child (the scrubber's
warning that it redacted a secret), ``(logger, level, message)``: the parent logs them
through its own loggers, so they reach the handlers the application configured.

The child seals with ``chain.seal_batch``, the code thread mode runs, so the log is the
same whichever mode wrote it. It lives as long as the request pipe: on end of file (the
parent closed the WAL, or died) it exits, and the log's ``flock``, held through its copy
of the file descriptor, goes with it. After a failure it replies and exits (fail-stop).

The child imports only ``chain``, ``records``, ``scrubber`` and ``errors``: ``_BOOT``
registers empty ``agent_saga`` and ``agent_saga.wal`` packages so that neither package's
``__init__`` runs in it.
"""

from __future__ import annotations

import builtins
import logging
import marshal
import operator
import os
import signal
import sys
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from ..chain import reject_record, seal_batch
from ..errors import WALError
from ..records import Record, canonical_json
from ..scrubber import scrub_id, scrub_payload

_dumps = marshal.dumps
_loads = marshal.loads
_FIELDS = operator.attrgetter("type", "saga", "step", "payload", "seq", "ts", "encode")

#: The child's program: the package stubs, then ``child_main`` (argv: the package's
#: folder, the log fd, the request fd, the reply fd, the chain head, "1" to fdatasync).
_BOOT = (
    "import sys, types\n"
    "pkg = sys.argv[1]\n"
    "for name, path in (('agent_saga', pkg), ('agent_saga.wal', pkg + '/wal')):\n"
    "    mod = types.ModuleType(name)\n"
    "    mod.__path__ = [path]\n"
    "    sys.modules[name] = mod\n"
    "from agent_saga.wal.sealer import child_main\n"
    "child_main(sys.argv[2:])\n"
)

_READY = b"ready"


# ---------------------------------------------------------------------- framing


def _read_exact(fd: int, n: int) -> bytes | None:
    """``n`` bytes from ``fd``, or None at end of file (a frame cut short is none)."""
    data = os.read(fd, n)
    if len(data) == n:
        return data
    parts = [data]
    got = len(data)
    while got < n:
        if not data:
            return None
        data = os.read(fd, n - got)
        parts.append(data)
        got += len(data)
    return b"".join(parts)


def _read_frame(fd: int) -> bytes | None:
    head = _read_exact(fd, 8)
    if head is None:
        return None
    return _read_exact(fd, int.from_bytes(head, "little"))


def _write_frame(fd: int, body: bytes) -> None:
    head = len(body).to_bytes(8, "little")
    total = 8 + len(body)
    n = os.writev(fd, (head, body))
    if n < total:
        view = memoryview(head + body)[n:]
        while view:
            view = view[os.write(fd, view):]


# ---------------------------------------------------------------------- the child


def _record(item: tuple[Any, ...]) -> Record:
    rec = Record(item[0], item[1], item[2], item[3], item[4], item[5])
    text = item[6]
    if text is not None:
        rec.encode = text.__str__  # the canonical text the parent built (see ``portable``)
    return rec


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def child_main(argv: Sequence[str]) -> None:
    """The sealer process: seal, write and fdatasync each batch the parent sends, reply."""
    log_fd, req_fd, rep_fd = int(argv[0]), int(argv[1]), int(argv[2])
    head, sync = argv[3], argv[4] == "1"
    # Its life is the parent's: a Ctrl-C or SIGTERM to the process group is for the parent,
    # which then closes the WAL (end of file here) after writing what is queued.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    rejected: list[tuple[int, str, str]] = []
    logs: list[tuple[str, int, str]] = []
    handler = _Collect(logs)
    root = logging.getLogger("agent_saga")
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)  # the parent's loggers decide what is kept
    root.propagate = False

    def on_error(rec: Record, exc: Exception) -> None:
        rejected.append((rec.seq, type(exc).__name__, str(exc)))
        reject_record(rec, exc)

    try:
        _write_frame(rep_fd, _READY)
    except OSError:
        return
    while True:
        try:
            body = _read_frame(req_fd)
        except OSError:
            return
        if body is None:
            return  # the parent closed the WAL or died: nothing more will come
        reply: tuple[Any, ...]
        try:
            batch = [_record(item) for item in _loads(body)]
            lines: list[str] = []
            seal_batch(batch, head, on_error, lines)
            _write_all(log_fd, "\n".join([*lines, ""]).encode())
            if sync:
                os.fdatasync(log_fd)
        except OSError as exc:
            reply = (1, logs, exc.errno, exc.strerror or str(exc))
        except Exception as exc:  # noqa: BLE001 - fail-stop: the parent gets the error
            reply = (2, logs, type(exc).__name__, str(exc))
        else:
            head = batch[-1].hash
            reply = (0, logs, batch[-1].seq, head, rejected)
        try:
            _write_frame(rep_fd, _dumps(reply))
        except OSError:
            return  # the parent is gone
        if reply[0] != 0:
            return
        rejected.clear()
        logs.clear()


class _Collect(logging.Handler):
    """Keeps the child's log records for the next reply (the parent logs them)."""

    def __init__(self, into: list[tuple[str, int, str]]) -> None:
        super().__init__(logging.DEBUG)
        self._into = into

    def emit(self, record: logging.LogRecord) -> None:
        self._into.append((record.name, record.levelno, record.getMessage()))


# ---------------------------------------------------------------------- the parent


def portable(rec: Record, reject: Callable[[Record, Exception], None]) -> tuple[Any, ...]:
    """``rec`` as the transport carries it when marshal cannot (it carries exact builtins
    only): its payload's canonical text, built and scrubbed here as the thread-mode seal
    would (``seal_batch``), or its rejection (``reject``) if it cannot be encoded. A
    header id of a ``str`` subclass (a ``StrEnum``) is taken as the seal formats it."""
    if rec.type.__class__ is not str:
        rec.type = f"{rec.type}"
    if rec.saga.__class__ is not str:
        rec.saga = f"{rec.saga}"
    if rec.step is not None and rec.step.__class__ is not str:
        rec.step = f"{rec.step}"
    text = None
    encode = rec.encode
    try:
        if encode is not None:
            rec.encode = None  # once, as in ``seal``
            text = encode()
        elif rec.payload is not None:
            try:
                _dumps(rec.payload)
            except ValueError:
                payload = rec.payload
                text = canonical_json(payload)
                scrubbed = scrub_payload(payload, rec.type, scrub_id(rec.saga), text)
                if scrubbed is not payload:
                    text = canonical_json(scrubbed)
                rec.payload = None
    except (TypeError, ValueError) as exc:
        reject(rec, exc)
        text = None
    return (rec.type, rec.saga, rec.step, rec.payload, rec.seq, rec.ts, text)


def _rebuilt(name: str, message: str) -> Exception:
    """The encoding error the child met, as the same built-in class when it has one that
    takes a message alone (else ``ValueError``): a fence's error names it as thread mode's."""
    cls = getattr(builtins, name, None)
    if isinstance(cls, type) and issubclass(cls, (TypeError, ValueError)):
        try:
            exc = cls(message)
        except Exception:  # noqa: BLE001 - a class that needs more arguments
            exc = None
        if exc is not None and str(exc) == message:
            return exc
    return ValueError(message)


_live: weakref.WeakSet[SealerProcess] = weakref.WeakSet()


def _after_fork() -> None:
    # A forked copy of the parent must not hold the request pipe open: the child would
    # never see end of file when the parent dies, and would keep the log's lock.
    for sealer in list(_live):
        sealer._forget()


os.register_at_fork(after_in_child=_after_fork)


class SealerProcess:
    """The parent's end of a sealer process (called on the flusher thread, one batch at
    a time, except ``close``)."""

    def __init__(self, log_fd: int, head: str, *, sync: bool, start_timeout: float) -> None:
        import select
        import subprocess

        if not sys.executable:
            raise WALError(
                "the sealer process cannot start: this Python does not know its own program "
                "(sys.executable is empty, as in some embedded interpreters); use sealer='thread'"
            )
        pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _BOOT, pkg, str(log_fd), str(req_r), str(rep_w),
                 head, "1" if sync else "0"],
                pass_fds=(log_fd, req_r, rep_w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            )
        except BaseException:
            for fd in (req_r, req_w, rep_r, rep_w):
                os.close(fd)
            raise
        os.close(req_r)
        os.close(rep_w)
        self._req, self._rep = req_w, rep_r
        self.pid = self._proc.pid
        _live.add(self)
        try:
            ready, _, _ = select.select([rep_r], [], [], start_timeout)
            hello = _read_frame(rep_r) if ready else None
            if hello != _READY:
                why = f"it {self._how_it_ended()}" if ready else f"it did not answer within {start_timeout}s"
                raise WALError(
                    f"the sealer process (pid {self.pid}) did not start: {why} (its error, if any, "
                    f"is on standard error). Use sealer='thread' (the default) if this program "
                    f"cannot run {sys.executable!r} as a child process"
                )
        except BaseException:
            self.close(timeout=1.0)
            raise

    def commit(self, batch: Sequence[Record], reject: Callable[[Record, Exception], None]
               ) -> tuple[str, list[tuple[int, Exception]]]:
        """Have the child seal, write and fdatasync ``batch`` onto the chain's head; return
        the new head and the ``(seq, error)`` of each record rejected as unencodable.
        Raises the child's write error (``OSError``), or ``WALError`` if it died."""
        try:
            body = _dumps(list(map(_FIELDS, batch)))
        except ValueError:  # a payload of a type marshal cannot carry, or a prepared one
            body = _dumps([portable(rec, reject) for rec in batch])
        try:
            _write_frame(self._req, body)
            reply_body = _read_frame(self._rep)
        except OSError:
            reply_body = None  # the pipe broke: the child is gone
        if reply_body is None:
            raise WALError(
                f"the sealer process (pid {self.pid}) {self._how_it_ended()} before it acknowledged "
                f"seq {batch[0].seq}..{batch[-1].seq}; whether they reached the disk is unknown"
            )
        reply = _loads(reply_body)
        for name, level, message in reply[1]:
            logging.getLogger(name).log(level, "%s", message)
        if reply[0] == 0:
            _, _, last, head, rejected = reply
            if last != batch[-1].seq:
                raise WALError(
                    f"the sealer process (pid {self.pid}) acknowledged seq {last} for the batch "
                    f"ending at seq {batch[-1].seq}; the protocol is out of step"
                )
            return head, [(seq, _rebuilt(name, msg)) for seq, name, msg in rejected]
        if reply[0] == 1:
            raise OSError(reply[3]) if reply[2] is None else OSError(reply[2], reply[3])
        raise WALError(f"the sealer process (pid {self.pid}) failed: {reply[2]}: {reply[3]}")

    def _how_it_ended(self) -> str:
        import subprocess

        try:
            code = self._proc.wait(1.0)
        except subprocess.TimeoutExpired:
            return "closed its pipe"
        if code < 0:
            try:
                return f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with status {code}"

    def close(self, *, timeout: float = 5.0) -> None:
        """End of file to the child (it exits, releasing its copy of the log's fd), then
        wait for it; one that has not exited within ``timeout`` is killed."""
        import subprocess

        _live.discard(self)
        if self._req >= 0:
            os.close(self._req)
            self._req = -1
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        finally:
            if self._rep >= 0:
                os.close(self._rep)
                self._rep = -1

    def _forget(self) -> None:
        # In a forked copy of the parent: close its copies of the pipes, touch nothing else.
        for fd in (self._req, self._rep):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._req = self._rep = -1
        _live.discard(self)
