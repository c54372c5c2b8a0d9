"""What every adapter test shares: the tools, a real WAL and kill switch, and checks.

The same three plain functions are turned into each framework's own tool:
``charge`` (COMPENSABLE, refunded on rollback), ``ship`` (raises: the failing tool) and
``wire_transfer`` (halted by a real kill switch: refused in-band). A ``World`` holds a
real FileWAL and an ``AgentKit`` whose gate consults a ``KillSwitch`` over an in-memory
``FileSwitchStore`` with ``tool:wire_transfer`` halted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from agent_saga import AgentKit, Compensation, FileSwitchStore, KillSwitch, PreFlightGate
from agent_saga.records import Record
from agent_saga.wal.file import FileWAL
from fixtures.wal import records as wal_records


@dataclass
class World:
    wal: FileWAL
    kit: AgentKit
    switch: KillSwitch
    ran: list[str] = field(default_factory=list)
    refunded: list[str] = field(default_factory=list)

    def records(self, saga: str | None = None) -> list[Record]:
        self.wal.barrier_sync()
        return wal_records(self.wal.path, saga=saga)

    def sagas(self) -> list[str]:
        return list(dict.fromkeys(r.saga for r in self.records() if r.type == "SAGA_STARTED"))

    def last_saga(self) -> list[Record]:
        return self.records(self.sagas()[-1])

    def reset(self) -> None:
        self.ran.clear()
        self.refunded.clear()


def make_world(tmp: Path, framework: str) -> World:
    wal = FileWAL(tmp / f"{framework}.wal")
    switch = KillSwitch(FileSwitchStore(warn=False), wal=wal)
    switch.halt("tool:wire_transfer", reason="fraud pattern on wires", by="soc@corp")
    kit = AgentKit(name=framework, wal=wal, gate=PreFlightGate(checks=[switch]))
    return World(wal, kit, switch)


def tools_for(world: World):
    """The three plain functions (each framework wraps them its own way)."""

    def charge(amount: int, customer: str) -> dict:
        """Charge a customer's card; returns the charge."""
        world.ran.append(f"charge:{amount}")
        return {"id": f"ch_{amount}", "amount": amount, "customer": customer}

    def ship(order: str) -> str:
        """Ship an order to the customer."""
        world.ran.append(f"ship:{order}")
        raise RuntimeError(f"carrier rejected {order}")

    def wire_transfer(iban: str, amount: int) -> str:
        """Send a bank wire."""
        world.ran.append(f"wire:{iban}")
        return "sent"

    def refund(id: str) -> None:
        world.refunded.append(id)

    def compensate(r: dict) -> Compensation:
        return Compensation(fn=refund, handler="adapters-test.refund", kwargs={"id": r["id"]})

    return charge, ship, wire_transfer, compensate


def assert_rolled_back_lifo(world: World, charged: list[str]) -> None:
    """Both charges ran, the failing tool ran once, and the charges were undone newest first."""
    assert world.refunded == list(reversed(charged))
    types = [r.type for r in world.last_saga()]
    assert types[0] == "SAGA_STARTED" and types[-1] == "SAGA_ROLLED_BACK", types
    assert "STEP_FAILED" in types


def assert_refused_in_band(world: World, seen_by_model: str) -> None:
    """The halted tool never ran; the model read the refusal; the saga still completed."""
    assert not any(r.startswith("wire:") for r in world.ran)
    assert "agent-saga refused wire_transfer" in seen_by_model
    assert "fraud pattern on wires" in seen_by_model and "nothing was executed" in seen_by_model.lower()
    types = [r.type for r in world.last_saga()]
    assert "STEP_REFUSED" in types and types[-1] == "SAGA_COMPLETED", types
