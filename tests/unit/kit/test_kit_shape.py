"""A wrapped tool has one shape everywhere: ``await tool(...)`` in and out of
``kit.transaction()``, sync or async ``fn``, in a running loop (an async test, a
notebook's loop) and in a script under ``asyncio.run``; ``tool.sync(...)`` is the twin
for sync code outside a transaction and says to ``await`` where it cannot run."""

from __future__ import annotations

import asyncio
import inspect
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from agent_saga import AgentKit, ConfigurationError
from engine_support import read, types, wal_fixture  # noqa: F401


def sync_charge(amount: int) -> dict:
    return {"id": f"ch_{amount}", "amount": amount}


async def async_charge(amount: int) -> dict:
    return {"id": f"ch_{amount}", "amount": amount}


@pytest.mark.parametrize("fn", [sync_charge, async_charge])
async def test_awaited_the_same_in_and_out_of_a_transaction(wal, fn) -> None:
    kit = AgentKit(name="shop", wal=wal)
    charge = kit.safe_tool(fn, semantics="REVERSIBLE", name="charge")
    assert inspect.iscoroutinefunction(charge) and charge.__name__ == fn.__name__
    assert await charge(amount=5) == {"id": "ch_5", "amount": 5}  # outside: untouched
    assert read(wal) == []
    async with kit.transaction() as saga:
        assert await charge(amount=6) == {"id": "ch_6", "amount": 6}  # inside: a step
    assert "STEP_COMMITTED" in types(wal, saga.saga_id)


@pytest.mark.parametrize("fn", [sync_charge, async_charge])
async def test_the_sync_twin_refuses_inside_a_transaction_naming_await(wal, fn) -> None:
    kit = AgentKit(name="shop", wal=wal)
    charge = kit.safe_tool(fn, semantics="REVERSIBLE", name="charge")
    async with kit.transaction():
        with pytest.raises(ConfigurationError, match=r"await " + fn.__name__):
            charge.sync(amount=1)
    assert await asyncio.to_thread(charge.sync, amount=2) == {"id": "ch_2", "amount": 2}  # no loop there


async def test_the_sync_twin_of_an_async_tool_in_a_running_loop_names_await(wal) -> None:
    charge = AgentKit(name="shop", wal=wal).safe_tool(async_charge, semantics="REVERSIBLE")
    with pytest.raises(ConfigurationError, match="running event loop.*await async_charge"):
        charge.sync(amount=1)
    assert AgentKit(name="shop", wal=wal).safe_tool(sync_charge, semantics="REVERSIBLE").sync(3)["id"] == "ch_3"


SCRIPT = textwrap.dedent('''
    import asyncio
    from agent_saga import AgentKit, compensator

    @compensator("refund")
    def refund(id, idempotency_key=None):
        print("refunded", id)

    def stripe_charge(amount):
        return {"id": f"ch_{amount}"}

    async def ship_order(order):
        return order

    kit = AgentKit(name="my-agent")

    charge = kit.safe_tool(stripe_charge, semantics="COMPENSABLE",
                           compensate=lambda r: {"handler": "refund", "kwargs": {"id": r["id"]}})

    print("script", charge.sync(amount=1))            # sync code, no transaction

    async def main():
        print("loop", await charge(amount=2))         # a running loop, no transaction
        async with kit.transaction():        # a saga boundary
            print("saga", await charge(amount=4200))
            await ship_order("o-1")

    asyncio.run(main())
''')


def test_the_readme_snippet_runs_as_a_script(tmp_path: Path) -> None:
    env = {**os.environ, "AGENT_SAGA_WAL_PATH": str(tmp_path / "agent.wal")}
    env.pop("AGENT_SAGA_REDIS_URL", None)
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["script {'id': 'ch_1'}", "loop {'id': 'ch_2'}", "saga {'id': 'ch_4200'}"]
