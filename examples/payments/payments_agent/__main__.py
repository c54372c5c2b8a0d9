"""The payments agent of the example: sagas over a stand-in bank, driven over HTTP.

    python -m payments_agent          (the agent image's entrypoint)

A payment is one saga: ``payments.charge`` (undone by ``payments.refund``, from the
``payments_compensators`` package), then ``wire.send``. ``examples/k8s/killswitch.yaml``
halts ``wire.send``: every payment is then refused at that step and its charge refunded.
A payout is IRREVERSIBLE: it waits for a human (``kubectl get approvals``). Every
payment names its customer (``customer_id``): the background payments go round
``CUSTOMERS`` customers, so the example BudgetLimits (``examples/k8s/budget.yaml``: a
daily budget per customer) let them through and refuse a charge over one customer's budget.

Environment (examples/payments/deployment.yaml sets it, as the chart's NOTES print it):
  AGENT_SAGA_REDIS_URL      the policy plane: kill switch, budgets, approvals, SagaPolicies
  AGENT_SAGA_NAMESPACE      whose KillSwitches, BudgetLimits and SagaPolicies apply
  AGENT_SAGA_AGENT          the agent's name (payments-agent)
  AGENT_SAGA_WAL_STREAM     this agent's WAL: a RedisWAL stream recoveryd sweeps
                            (agent-saga:wal), which also holds the bank's books
  POD_NAME                  names this process in status and in its Approvals
  PAYMENTS_PORT             HTTP port (8080)
  PAYMENTS_INTERVAL         seconds between background payments (1; 0: none)
  PAYMENTS_LEASE_SECONDS    an orphaned saga is taken over this long after its agent died (10)

HTTP (JSON bodies and answers):
  GET  /healthz   200 while the process serves HTTP (liveness)
  GET  /readyz    200 while the WAL accepts records (``AgentKit.status()``) and the bank
                  answers, else 503 with the reason: the readiness probe. A WAL that
                  failed (Redis restarted) is reopened once Redis is back and no record
                  is in doubt; the pod is not Ready meanwhile
  GET  /stats     {"ok": n, "refused": n, "failed": n, "last": {...}}: the payments so far
  POST /pay       {"amount": 5, "customer_id": "cus-0001", "hold": false}
                  -> {"saga", "ok", "error", "kind", "refund_key"}
                  hold=true answers once the charge is committed and leaves the saga open:
                  delete the pod then, and recoveryd refunds the charge
  POST /wire      {"amount": 1} -> {"saga", "ok", "error", "kind"}: a saga of one wire.send
                  (nothing to undo: the cheapest way to ask "would a wire go out now?")
  POST /payout    {"amount": 500} -> {"saga"} at once; the saga waits for its approval
  GET  /payouts   {saga: {"state": "waiting" | "done" | "refused" | "failed", "error"}}
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import payments_compensators as books
from agent_saga import (
    ActionSemantics,
    AgentKit,
    Compensation,
    PreFlightGate,
    RedisWAL,
    SagaRefused,
    current_step_id,
    get_default_wal,
    idempotency_key,
    saga_scope,
)

log = logging.getLogger("payments_agent")

#: How many customers the background payments go round (cus-0000 ... cus-0999).
CUSTOMERS = 1000


def _env_float(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip()
    try:
        return float(text) if text else default
    except ValueError:
        raise SystemExit(f"{name}={text!r} is not a number of seconds") from None


class Agent:
    """The sagas, run on one asyncio loop; the HTTP threads submit to it."""

    def __init__(self) -> None:
        if not os.environ.get("AGENT_SAGA_REDIS_URL", "").strip():
            raise SystemExit("set AGENT_SAGA_REDIS_URL (redis://[:password@]host:6379/0): the policy-plane Redis")
        self.lease = _env_float("PAYMENTS_LEASE_SECONDS", 10.0)
        # Every control from the environment (the policy plane); the process-wide WAL is
        # the plane's RedisWAL (AGENT_SAGA_WAL_STREAM), which the approval records share.
        self.gate = PreFlightGate()
        self.kit = AgentKit("payments-agent", gate=self.gate)
        if not isinstance(self.wal, RedisWAL):
            raise SystemExit("set AGENT_SAGA_WAL_STREAM (agent-saga:wal): recoveryd sweeps that stream, and the "
                             "root filesystem is read-only")
        self.stats: Counter[str] = Counter()
        self.last: dict[str, Any] = {}
        self.payouts: dict[str, dict[str, Any]] = {}
        self.held: list[asyncio.Future[None]] = []
        self.tasks: set[asyncio.Task[Any]] = set()
        self.loop = asyncio.new_event_loop()

    @property
    def wal(self) -> Any:
        """The process-wide WAL, looked up per saga: a RedisWAL that failed is replaced
        by a new writer once Redis is back, and the next saga writes to that one."""
        return get_default_wal()

    # ------------------------------------------------------------------ sagas
    async def pay(self, amount: int, customer: str = "cus-0000", hold: bool = False,
                  ready: asyncio.Future[dict[str, Any]] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"saga": None, "ok": False, "error": "", "kind": "", "refund_key": None}

        async def charge() -> dict[str, Any]:
            step = current_step_id()
            out["refund_key"] = idempotency_key(out["saga"], step, "compensate") if step else None
            return await asyncio.to_thread(books.charge, f"ch-{secrets.token_hex(6)}", amount)

        try:
            async with saga_scope(self.wal, self.gate, name="payment", lease_seconds=self.lease) as saga:
                out["saga"] = saga.saga_id
                await saga.execute("payments.charge", ActionSemantics.COMPENSABLE, charge,
                                   lambda r: Compensation(handler="payments.refund", kwargs={"charge_id": r["id"]}),
                                   policy_args={"amount": amount, "customer_id": customer})
                if hold and ready is not None:
                    ready.set_result(dict(out, ok=True))
                    never: asyncio.Future[None] = self.loop.create_future()
                    self.held.append(never)
                    await never  # until the pod is killed
                await saga.execute("wire.send", ActionSemantics.COMPENSABLE,
                                   lambda: {"wire": f"w-{secrets.token_hex(4)}", "amount": amount},
                                   lambda r: Compensation(handler="payments.wire_recall", kwargs={"wire": r["wire"]}),
                                   policy_args={"amount": amount})
            out["ok"] = True
            self.stats["ok"] += 1
        except SagaRefused as e:
            out.update(error=str(e), kind=type(e).__name__)
            self.stats["refused"] += 1
        except Exception as e:  # noqa: BLE001 - reported over HTTP and in /stats
            out.update(error=str(e), kind=type(e).__name__)
            self.stats["failed"] += 1
            log.exception("payment failed")
        self.last = out
        if ready is not None and not ready.done():
            ready.set_result(out)
        return out

    async def wire(self, amount: int) -> dict[str, Any]:
        out: dict[str, Any] = {"saga": None, "ok": False, "error": "", "kind": ""}
        try:
            async with saga_scope(self.wal, self.gate, name="wire", lease_seconds=self.lease) as saga:
                out["saga"] = saga.saga_id
                await saga.execute("wire.send", ActionSemantics.REVERSIBLE,
                                   lambda: {"wire": f"w-{secrets.token_hex(4)}"}, policy_args={"amount": amount})
            out["ok"] = True
        except SagaRefused as e:
            out.update(error=str(e), kind=type(e).__name__)
        except Exception as e:  # noqa: BLE001
            out.update(error=str(e), kind=type(e).__name__)
        return out

    async def payout(self, amount: int, started: asyncio.Future[str]) -> None:
        saga_id = ""
        try:
            async with saga_scope(self.wal, self.gate, name="payout", lease_seconds=self.lease) as saga:
                saga_id = saga.saga_id
                self.payouts[saga_id] = {"state": "waiting", "error": ""}
                started.set_result(saga_id)
                await saga.execute("payout.send", ActionSemantics.IRREVERSIBLE,
                                   lambda: {"payout": f"po-{secrets.token_hex(4)}"}, policy_args={"amount": amount})
            self.payouts[saga_id] = {"state": "done", "error": ""}
        except SagaRefused as e:
            self.payouts[saga_id] = {"state": "refused", "error": str(e)}
        except Exception as e:  # noqa: BLE001
            self.payouts[saga_id] = {"state": "failed", "error": f"{type(e).__name__}: {e}"}
        if not started.done():
            started.set_result(saga_id)

    async def background(self, interval: float) -> None:
        n = 0
        while interval > 0:
            await self.pay(1, f"cus-{n % CUSTOMERS:04d}")
            n += 1
            await asyncio.sleep(interval)

    # ------------------------------------------------------------------ from HTTP threads
    def call(self, coro: Any, timeout: float = 120.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def pay_sync(self, amount: int, customer: str, hold: bool) -> dict[str, Any]:
        async def go() -> dict[str, Any]:
            ready: asyncio.Future[dict[str, Any]] = self.loop.create_future()
            self._keep(self.loop.create_task(self.pay(amount, customer, hold, ready)))
            return await ready
        return dict(self.call(go()))

    def payout_sync(self, amount: int) -> str:
        async def go() -> str:
            started: asyncio.Future[str] = self.loop.create_future()
            self._keep(self.loop.create_task(self.payout(amount, started)))
            return await started
        return str(self.call(go()))

    def _keep(self, task: asyncio.Task[Any]) -> None:
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def ready(self) -> tuple[bool, str]:
        """(ready, why not): the WAL accepts records and the bank answers."""
        wal = self.kit.status()["signals"]["wal"]
        if not wal["ok"]:
            return False, f"WAL failed: {wal.get('failed') or wal.get('error')}; {wal.get('recovery', '')}"
        try:
            return (True, "") if books.bank().ping() else (False, "the bank does not answer")
        except Exception as e:  # noqa: BLE001
            return False, f"the bank does not answer: {type(e).__name__}"


def handler(agent: Agent) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict[str, Any]:
            if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                data = b""
                while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                    data += self.rfile.read(size)
                    self.rfile.readline()
                self.rfile.readline()  # the empty line after the last chunk
            else:
                data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            return dict(json.loads(data or b"{}"))

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path == "/healthz":
                self._send(200, {"ok": True})
            elif self.path == "/readyz":
                ok, why = agent.ready()
                self._send(200 if ok else 503, {"ok": ok, "reason": why})
            elif self.path == "/stats":
                self._send(200, {**{k: agent.stats[k] for k in ("ok", "refused", "failed")}, "last": agent.last})
            elif self.path == "/payouts":
                self._send(200, agent.payouts)
            else:
                self._send(404, {"error": f"no such path {self.path}"})

        def do_POST(self) -> None:  # noqa: N802
            try:
                body = self._body()
                amount = int(body.get("amount", 1))
            except (ValueError, TypeError) as e:
                self._send(400, {"error": f"bad request body: {e}"})
                return
            if self.path == "/pay":
                customer = str(body.get("customer_id") or "cus-0000")
                self._send(200, agent.pay_sync(amount, customer, bool(body.get("hold", False))))
            elif self.path == "/wire":
                self._send(200, agent.call(agent.wire(amount)))
            elif self.path == "/payout":
                self._send(200, {"saga": agent.payout_sync(amount)})
            else:
                self._send(404, {"error": f"no such path {self.path}"})

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            log.debug(format, *args)

    return Handler


def main() -> None:
    logging.basicConfig(level=os.environ.get("PAYMENTS_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    agent = Agent()
    server = ThreadingHTTPServer(("", int(os.environ.get("PAYMENTS_PORT", "8080"))), handler(agent))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    log.info("payments agent listening on :%d", server.server_address[1])
    asyncio.set_event_loop(agent.loop)
    agent.loop.run_until_complete(agent.background(_env_float("PAYMENTS_INTERVAL", 1.0)))
    agent.loop.run_forever()


if __name__ == "__main__":
    main()
