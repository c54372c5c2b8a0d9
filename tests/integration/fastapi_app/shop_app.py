"""A FastAPI app run by a real uvicorn process in tests/integration/test_fastapi_uvicorn.py.

Configured by environment: SHOP_WAL (the log), SHOP_DIR (where compensations and the
holding step leave marker files). The recovery daemon sweeps every 50 ms with no lease
grace, so a saga an earlier run left open is rolled back promptly.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from agent_saga import (
    Compensation,
    GateBlocked,
    RecoveryDaemon,
    compensator,
    configure_logging,
    saga,
    saga_lifespan,
)
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

WAL = os.environ["SHOP_WAL"]
DIR = Path(os.environ["SHOP_DIR"])
configure_logging()  # agent-saga's own lines (shutdown, recovery) next to uvicorn's


@compensator("shop.release")
def release(order: str, idempotency_key: str) -> None:
    with open(DIR / "released", "a") as f:
        f.write(order + "\n")


def recovery(wal):  # this host's own log: no clock skew to allow for
    return RecoveryDaemon(wal, imports=["shop_app"], lease_grace=0.0)


app = FastAPI(lifespan=saga_lifespan(WAL, recovery=recovery, interval=0.05))


def reserve_step(order: str):
    return ("shop.reserve", "COMPENSABLE", lambda: order,
            lambda r: Compensation(handler="shop.release", kwargs={"order": order}))


@app.post("/orders/{order}")
async def create_order(order: str) -> JSONResponse:
    @saga(name="order")
    async def place(saga) -> str:
        await saga.execute(*reserve_step(order))
        if order.startswith("fail"):
            raise ValueError("card declined")
        return saga.saga_id

    try:
        return JSONResponse({"saga_id": await place(), "status": "COMPLETED"})
    except ValueError as exc:
        return JSONResponse({"error": str(exc), "rolled_back": True}, status_code=402)


@app.post("/wire")
async def wire() -> JSONResponse:
    @saga(name="wire")
    async def send(saga) -> None:
        await saga.execute("bank.wire", "IRREVERSIBLE", lambda: None)

    try:
        await send()
    except GateBlocked as exc:
        return JSONResponse({"refused": exc.reason, "by": exc.decided_by}, status_code=409)
    return JSONResponse({"sent": True})


@app.post("/hold/{order}")
async def hold(order: str) -> JSONResponse:
    """Reserve, then wait inside a second step until SHOP_DIR/go-<order> exists."""

    async def wait_for_go() -> str:
        (DIR / f"holding-{order}").touch()
        while not (DIR / f"go-{order}").exists():
            await asyncio.sleep(0.01)
        return "went"

    @saga(name="hold")
    async def run(saga) -> str:
        await saga.execute(*reserve_step(order))
        await saga.execute("shop.wait", "COMPENSABLE", wait_for_go,
                           lambda r: Compensation(handler="shop.release", kwargs={"order": order + "-wait"}))
        return saga.saga_id

    return JSONResponse({"saga_id": await run(), "status": "COMPLETED"})


@app.get("/health")
async def health(request: Request) -> JSONResponse:
    status = request.state.agent_saga.status()
    return JSONResponse(status, status_code=200 if status["healthy"] else 503)
