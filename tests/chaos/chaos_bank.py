"""A file-backed payment ledger with real, durable effects, shared by processes.

Layout (a directory, so every operation costs O(1) whatever the history):

    <bank>/charges/<forward key>.json     one charge, created atomically (link of a fsync'ed
                                          temp file: it exists whole or not at all, once)
    <bank>/refunds/<charge id>.log        "attempt <key> <pid>" / "applied <key> <pid>" lines,
                                          appended under an exclusive flock and fsync'ed

Refund *attempts* are recorded separately from refunds *applied*. A real processor absorbs
a duplicate refund through its idempotency key, and so does this one (a second call with a
key already applied is recorded as an attempt, never applied twice), so a test that only
checked balances would pass whether the guarantee lived in agent-saga or here. Counting
attempts lets the crash suite assert the strong claim: the second call was never made.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ChargeState:
    id: str
    account: str
    amount: int
    key: str
    attempts: list[str] = field(default_factory=list)  # refund keys, one per call
    applied: list[str] = field(default_factory=list)  # refund keys actually applied


class Bank:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._charges = os.path.join(self.path, "charges")
        self._refunds = os.path.join(self.path, "refunds")

    def _dirs(self) -> None:
        os.makedirs(self._charges, exist_ok=True)
        os.makedirs(self._refunds, exist_ok=True)

    def charge(self, account: str, amount: int, key: str) -> dict[str, Any]:
        """Charge once per ``key`` (the forward idempotency key)."""
        self._dirs()
        final = os.path.join(self._charges, f"{key}.json")
        e = {"id": f"ch_{key[:16]}", "account": account, "amount": amount, "key": key}
        tmp = f"{final}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(e, f)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, final)  # atomic and exclusive: a second charge under the key loses
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
        return self.find_charge(key) or e

    def find_charge(self, key: str) -> dict[str, Any] | None:
        try:
            with open(os.path.join(self._charges, f"{key}.json")) as f:
                return dict(json.load(f))
        except FileNotFoundError:
            return None

    def _charge_by_id(self, charge_id: str) -> bool:
        prefix = charge_id.removeprefix("ch_")
        with contextlib.suppress(FileNotFoundError):
            return any(name.startswith(prefix) for name in os.listdir(self._charges))
        return False

    def refund(self, charge_id: str, key: str) -> str:
        """Record the attempt, then apply it unless ``key`` was applied already."""
        if not self._charge_by_id(charge_id):
            raise LookupError(f"no such charge {charge_id}")
        self._dirs()
        fd = os.open(os.path.join(self._refunds, f"{charge_id}.log"), os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            lines = os.pread(fd, size, 0).decode().splitlines() if size else []
            os.write(fd, f"attempt {key} {os.getpid()}\n".encode())
            os.fsync(fd)
            if f"applied {key}" in {" ".join(line.split()[:2]) for line in lines}:
                return "duplicate"
            os.write(fd, f"applied {key} {os.getpid()}\n".encode())
            os.fsync(fd)
            return "applied"
        finally:
            os.close(fd)

    def state(self) -> dict[str, ChargeState]:
        """charge id -> its state."""
        out: dict[str, ChargeState] = {}
        try:
            names = sorted(os.listdir(self._charges))
        except FileNotFoundError:
            return out
        for name in names:
            if not name.endswith(".json"):
                continue
            with open(os.path.join(self._charges, name)) as f:
                e = json.load(f)
            c = out[e["id"]] = ChargeState(e["id"], e["account"], e["amount"], e["key"])
            with contextlib.suppress(FileNotFoundError), open(os.path.join(self._refunds, f"{c.id}.log")) as f:
                for line in f:
                    if not line.endswith("\n"):
                        continue
                    op, key, _pid = line.split()
                    (c.attempts if op == "attempt" else c.applied).append(key)
        return out

    def balance(self, account: str) -> int:
        """Money taken from ``account`` and not given back."""
        return sum(c.amount * (1 - len(c.applied)) for c in self.state().values() if c.account == account)
