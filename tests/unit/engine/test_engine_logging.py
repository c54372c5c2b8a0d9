"""Logging: saga/step ids from context on every record; configure_logging is opt-in."""

from __future__ import annotations

import asyncio
import io
import json
import logging

from agent_saga.context import (
    SagaContextFilter,
    configure_logging,
    current_saga_id,
    current_step_id,
)
from agent_saga.scope import saga_scope
from agent_saga.semantics import ActionSemantics
from engine_support import wal_fixture  # noqa: F401 - provides the `wal` fixture

R = ActionSemantics.REVERSIBLE
tool_log = logging.getLogger("agent_saga.test.tool")


async def test_concurrent_sagas_never_bleed_ids(wal):
    stream = io.StringIO()
    handler = configure_logging(logging.INFO, json=True, stream=stream)
    root_handlers = list(logging.getLogger().handlers)
    try:
        async def agent(name: str) -> tuple[str, list[str]]:
            seen: list[str] = []
            async with saga_scope(wal, name=name) as saga:
                for _ in range(3):
                    async def fwd() -> None:
                        seen.append(current_step_id() or "")
                        tool_log.info("tool ran for %s", name)
                        await asyncio.sleep(0)

                    def sync_fwd() -> None:
                        tool_log.info("sync tool ran for %s", name)

                    await saga.execute("t", R, fwd)
                    await saga.execute("s", R, sync_fwd)
            return saga.saga_id, seen

        results = await asyncio.gather(agent("a"), agent("b"))
    finally:
        logging.getLogger("agent_saga").removeHandler(handler)
    assert logging.getLogger().handlers == root_handlers  # the root logger was not touched
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    by_saga = {saga_id: seen for saga_id, seen in results}
    assert len(lines) == 12
    for line in lines:
        name = line["message"].rsplit(" ", 1)[-1]
        saga_id = line["saga_id"]
        assert saga_id.startswith(f"{name}-")
        assert line["step_id"].startswith(f"{saga_id}/")
    for saga_id, seen in by_saga.items():
        assert seen == [f"{saga_id}/{i}" for i in (0, 2, 4)]
    assert current_saga_id() is None and current_step_id() is None


def test_configure_logging_is_idempotent_and_text_by_default():
    logger = logging.getLogger("agent_saga")
    before = list(logger.handlers)
    stream = io.StringIO()
    first = configure_logging(stream=stream)
    second = configure_logging(logging.DEBUG, stream=stream)
    try:
        assert first not in logger.handlers and second in logger.handlers
        logging.getLogger("agent_saga.x").warning("hello")
        assert "[saga=- step=-] hello" in stream.getvalue()
    finally:
        logger.removeHandler(second)
        logger.setLevel(logging.NOTSET)
    assert logger.handlers == before


def test_the_filter_keeps_explicit_ids():
    rec = logging.LogRecord("agent_saga", logging.INFO, __file__, 1, "m", None, None)
    rec.saga_id = "given"
    assert SagaContextFilter().filter(rec) and rec.saga_id == "given" and rec.step_id == "-"
