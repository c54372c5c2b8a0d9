"""The code a new user copies from the README and the reference, with the user's own names.

Each usage is the snippet as a user copies it (``code``), what the user's project already
defines for it (``prelude``: their tools, clients and objects, which the snippet names but
does not define) and what must hold afterwards (``check``). ``code`` runs as a notebook
runs a cell: top-level ``await`` and ``async with`` allowed.

Run by ``runner.py`` in a scratch directory with only the built wheel on the path.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Usage:
    """One copied snippet: what the user has, what they paste, what must hold."""

    prelude: str
    code: str
    check: str = ""
    #: a substring of the error the snippet must fail with (a message naming the fix)
    fails_with: str = ""


AGENTKIT = '''
from agent_saga import AgentKit

kit = AgentKit(name="my-agent")

charge = kit.safe_tool(stripe_charge, semantics="COMPENSABLE",
                       compensate=lambda r: {"handler": "refund", "kwargs": {"id": r["id"]}})

async with kit.transaction():        # a saga boundary
    await charge(amount=4200)        # gated, logged, refunded on any failure
    await ship_order(...)            # if this throws, the charge is rolled back

kit.guarantees()   # machine-readable manifest: exactly what is enforced, versioned
kit.status()       # live posture - fail-closed if a safety signal can't be read
'''

USER_STRIPE = '''
CHARGES = []
def stripe_charge(amount):
    CHARGES.append(amount)
    return {"id": f"ch_{len(CHARGES)}", "amount": amount}
'''

USAGES: dict[str, Usage] = {
    # The 30-second AgentKit example: it commits when nothing throws...
    "agentkit-commits": Usage(
        prelude=USER_STRIPE + "async def ship_order(order):\n    return 'shipped'\n",
        code=AGENTKIT,
        check="assert CHARGES == [4200]\n"
              "assert kit.guarantees()['not_claimed'] and kit.status()\n"
              "assert charge.sync(amount=10)['id'] == 'ch_2'   # the sync twin, for scripts",
    ),
    # ... and when the order fails, the rollback names the unregistered handler and its fix.
    "agentkit-rollback-names-the-handler": Usage(
        prelude=USER_STRIPE + "async def ship_order(order):\n    raise RuntimeError('warehouse down')\n",
        code=AGENTKIT,
        fails_with="@compensator('refund')` on `def refund(*, id, idempotency_key=None)",
    ),
    # The same tool, awaited outside any transaction (a script, a notebook, a test).
    "safe-tool-outside-a-transaction": Usage(
        prelude=USER_STRIPE,
        code='''
from agent_saga import AgentKit
kit = AgentKit(name="my-agent")
charge = kit.safe_tool(stripe_charge, semantics="COMPENSABLE",
                       compensate=lambda r: {"handler": "refund", "kwargs": {"id": r["id"]}})
result = await charge(amount=4200)
''',
        check="assert result == {'id': 'ch_1', 'amount': 4200}",
    ),
    # Five systems, one transaction: saga_scope with runtime-derived compensations.
    "saga-scope-multi-system": Usage(
        prelude='''
UNDONE = []
class EC2:
    def run_instances(self, **kw): return {"Instances": [{"InstanceId": "i-0abc"}]}
class Index:
    def create_namespace(self, name): return {"namespace": name}
class Jira:
    def create_issue(self, **kw): return {"key": "ONB-1"}
ec2, index, jira, ami = EC2(), Index(), Jira(), "ami-123"
def terminate(instance_id): UNDONE.append(instance_id)
def drop_ns(namespace): UNDONE.append(namespace)
def close(issue_key): UNDONE.append(issue_key)
''',
        code='''
from agent_saga import saga_scope, ActionSemantics, Compensation

C = ActionSemantics.COMPENSABLE

async with saga_scope() as saga:
    # 1. infrastructure
    box = await saga.execute(
        tool="aws.run_instances", semantics=C,
        forward=lambda: ec2.run_instances(ImageId=ami, InstanceType="m6i.large"),
        compensate=lambda r: Compensation(
            fn=terminate, handler="aws.terminate_instance",
            kwargs={"instance_id": r["Instances"][0]["InstanceId"]}))

    # 2. vector store
    await saga.execute(
        tool="pinecone.create_namespace", semantics=C,
        forward=lambda: index.create_namespace("acme"),
        compensate=lambda r: Compensation(
            fn=drop_ns, handler="pinecone.delete_namespace",
            kwargs={"namespace": r["namespace"]}))

    # 3. ticket
    await saga.execute(
        tool="jira.create_issue", semantics=C,
        forward=lambda: jira.create_issue(project="ONB", summary="Onboard acme"),
        compensate=lambda r: Compensation(
            fn=close, handler="jira.close_issue",
            kwargs={"issue_key": r["key"]}))
    raise ValueError("the agent hallucinated a region")
''',
        check="assert UNDONE == ['ONB-1', 'acme', 'i-0abc'], UNDONE   # LIFO",
        fails_with="the agent hallucinated a region",
    ),
    "spend-and-rate-limits": Usage(
        prelude="",
        code='''
from agent_saga import PreFlightGate, BudgetLimit, RateLimit, by_arg, combine, by_tool

gate = PreFlightGate(limits=[
    BudgetLimit("daily-spend", arg="amount", max_total=50_000, window=86_400),
    BudgetLimit("per-customer", arg="amount", max_total=1_000, window=86_400,
                scope=by_arg("customer_id")),
    RateLimit("velocity", max_calls=20, window=60, scope=by_tool),
    # Over budget doesn't have to mean refused - it can mean "ask a director".
    BudgetLimit("wire-ceiling", arg="amount", max_total=250_000, window=86_400,
                escalate_to_human=True),
])
''',
        check="assert callable(combine) and gate is not None",
    ),
    "credential-resolver": Usage(
        prelude='''
class Vault:
    def read(self, path): return {"api_key": "sk_test_" + path.replace("/", "_")}
vault = Vault()
''',
        code='''
from agent_saga.connectors import set_credential_resolver
set_credential_resolver(lambda ref: vault.read(f"agents/{ref}"))
''',
        check="from agent_saga.connectors import resolve_credential\n"
              "assert resolve_credential('stripe_prod') == {'api_key': 'sk_test_agents_stripe_prod'}",
    ),
    "langgraph-adapter": Usage(
        prelude='''
from langchain_core.tools import tool
from langgraph.graph import StateGraph, START, END
from typing import TypedDict
UNDONE = []
@tool
def k8s_scale_deployment(name: str, replicas: int) -> dict:
    """Scale a deployment."""
    return {"name": name, "previous_replicas": 2}
@tool
def qdrant_upsert_points(collection: str) -> dict:
    """Upsert points."""
    return {"collection": collection, "ids": [1, 2]}
@tool
def zendesk_create_ticket(subject: str) -> dict:
    """Open a ticket."""
    return {"id": 77}
def scale_back(deploy, replicas): UNDONE.append(("scale", deploy, replicas))
def delete_points(collection, ids): UNDONE.append(("points", collection))
def close_ticket(ticket_id): UNDONE.append(("ticket", ticket_id))
''',
        code='''
from agent_saga.adapters.langgraph import wrap_tool, saga_run
from agent_saga import ActionSemantics, Compensation

C = ActionSemantics.COMPENSABLE

# a DevOps agent: cluster + index + ticket, each with its inverse
safe_scale = wrap_tool(
    k8s_scale_deployment,                     # your existing @tool
    semantics=C,
    compensate=lambda r: Compensation(
        fn=scale_back, handler="k8s.scale_deployment",
        kwargs={"deploy": r["name"], "replicas": r["previous_replicas"]}))

safe_upsert = wrap_tool(
    qdrant_upsert_points, semantics=C,
    compensate=lambda r: Compensation(
        fn=delete_points, handler="qdrant.delete_points",
        kwargs={"collection": r["collection"], "ids": r["ids"]}))

safe_ticket = wrap_tool(
    zendesk_create_ticket, semantics=C,
    compensate=lambda r: Compensation(
        fn=close_ticket, handler="zendesk.close_ticket",
        kwargs={"ticket_id": r["id"]}))

# (the user's graph, built with the wrapped tools)
class State(TypedDict):
    messages: list
async def devops(state):
    await safe_scale.ainvoke({"name": "api", "replicas": 5})
    await safe_upsert.ainvoke({"collection": "docs"})
    await safe_ticket.ainvoke({"subject": "scaled api"})
    raise RuntimeError("the next node failed")
builder = StateGraph(State)
builder.add_node("devops", devops)
builder.add_edge(START, "devops")
builder.add_edge("devops", END)
graph = builder.compile()

result = await saga_run(graph, {"messages": [...]})
''',
        check="assert [u[0] for u in UNDONE] == ['ticket', 'points', 'scale'], UNDONE   # LIFO",
        fails_with="the next node failed",
    ),
    # The other adapters, with their frameworks installed (extras autogen, llamaindex).
    "adapters-autogen-llamaindex": Usage(
        prelude="",
        code="from agent_saga.adapters.autogen  import wrap_tool as autogen_tool\n"
             "from agent_saga.adapters.llamaindex import wrap_tool as llama_tool\n",
        check="assert callable(autogen_tool) and callable(llama_tool)",
    ),
    # A framework that is not installed: the import names the extra to install.
    "adapter-without-its-framework": Usage(
        prelude="",
        code="from agent_saga.adapters.crewai   import wrap_tool as crew_tool\n",
        fails_with="pip install 'agent-saga[crewai]'",
    ),
    "fastapi-lifespan": Usage(
        prelude="import os\nos.makedirs('path/to', exist_ok=True)   # the directory the app writes its log in\n",
        code='''
from fastapi import FastAPI
from agent_saga import saga_lifespan, saga

app = FastAPI(lifespan=saga_lifespan("path/to/wal.jsonl"))

@app.post("/checkout")
async def checkout():
    # Sagas inside routes will automatically use the default WAL
    @saga
    async def process_payment():
        ...
    return await process_payment()
''',
        check='''
import asyncio, json, urllib.request, uvicorn
server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
task = asyncio.ensure_future(server.serve())
while not server.started:
    await asyncio.sleep(0.02)
port = server.servers[0].sockets[0].getsockname()[1]
def post():
    req = urllib.request.Request(f"http://127.0.0.1:{port}/checkout", method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status, resp.read()
status, body = await asyncio.to_thread(post)
server.should_exit = True
await task
import os
assert status == 200 and json.loads(body) is None and os.path.getsize("path/to/wal.jsonl") > 0
''',
    ),
    # The placeholder path as copied: its directory does not exist, and startup says so.
    "fastapi-lifespan-missing-directory": Usage(
        prelude="from fastapi import FastAPI\nfrom agent_saga import saga_lifespan\n",
        code='''
app = FastAPI(lifespan=saga_lifespan("no/such/dir/wal.jsonl"))
async with app.router.lifespan_context(app):
    pass
''',
        fails_with="its directory 'no/such/dir' does not exist. Create it (mkdir -p no/such/dir)",
    ),
    "circuit-breaker": Usage(
        prelude='from agent_saga import FileWAL\nwal = FileWAL("agent-saga.wal")\n',
        code='''
from agent_saga import CircuitBreaker, BreakerPolicy, set_breaker

set_breaker(CircuitBreaker(BreakerPolicy(
    failure_threshold=5,      # consecutive failures, or...
    failure_rate=0.5,         # ...50% of calls failing,
    min_volume=10,            #    once there's enough volume to mean anything
    window=60,
    cool_down=30,             # then one trial call
), wal=wal))
''',
        check="from agent_saga import get_breaker\nassert get_breaker() is not None\nset_breaker(None)\nwal.close()",
    ),
    "reconciler": Usage(
        prelude='''
class _Charge:
    @staticmethod
    async def retrieve(charge_id):
        class C: refunded, status, amount = True, "succeeded", 4200
        return C()
class stripe: Charge = _Charge
''',
        code='''
from agent_saga import reconciler, Observation

@reconciler("stripe.refund")            # same name as @compensator("stripe.refund")
async def observe_refund(*, charge_id, credential_ref=None, **kw):
    charge = await stripe.Charge.retrieve(charge_id)
    return Observation(reversed_=charge.refunded, exists=True,
                       detail=charge.status, amount=charge.amount)
''',
        check="obs = await observe_refund(charge_id='ch_1')\nassert obs.reversed_ is True and obs.amount == 4200",
    ),
    "approvals": Usage(
        prelude='import os\nos.environ["SLACK_WEBHOOK"] = "https://hooks.slack.invalid/T000"\n'
                'from agent_saga import FileWAL\nwal = FileWAL("agent-saga.wal")\n',
        code='''
from agent_saga import (PreFlightGate, ApprovalGateway, ApprovalPolicy,
                        EscalationLevel, FileApprovalStore, WebhookNotifier)

gate = PreFlightGate(approval_provider=ApprovalGateway(
    store=FileApprovalStore(),                       # RedisApprovalStore for a fleet
    notifier=WebhookNotifier(os.environ["SLACK_WEBHOOK"]),
    wal=wal,
    policy=ApprovalPolicy(timeout=900, levels=(
        EscalationLevel(targets=("@oncall",)),
        EscalationLevel(targets=("@head-of-risk",), after_seconds=300))),
))
''',
        check="assert gate is not None\nwal.close()",
    ),
    "selective-disclosure": Usage(
        prelude='''
from agent_saga import FileWAL, saga_scope, ActionSemantics, read_log
wal = FileWAL("disclosure.wal")
for n in (401, 402, 403):
    async with saga_scope(wal, saga_id=f"checkout_{n}") as s:
        await s.execute("cart.reserve", ActionSemantics.REVERSIBLE, lambda: {"n": n}, lambda r: None)
wal.close()
all_records = [rec for _, rec in read_log("disclosure.wal")]
''',
        code='''
from agent_saga import audit_root, build_disclosure, verify_disclosure

root  = audit_root(all_records)                        # publish once
proof = build_disclosure(all_records, saga_id="checkout_402")
verify_disclosure(proof, root)                         # -> valid, and only 402 is revealed
''',
        check="import json\nassert verify_disclosure(proof, root)\n"
              "assert 'checkout_401' not in json.dumps(proof) and 'checkout_403' not in json.dumps(proof)",
    ),
    # The records as read_log yields them, (location, record) pairs, are taken as they come.
    "selective-disclosure-from-read-log": Usage(
        prelude='''
from agent_saga import FileWAL, saga_scope, ActionSemantics, read_log
wal = FileWAL("disclosure2.wal")
async with saga_scope(wal, saga_id="checkout_402") as s:
    await s.execute("cart.reserve", ActionSemantics.REVERSIBLE, lambda: {"n": 1}, lambda r: None)
wal.close()
all_records = list(read_log("disclosure2.wal"))
''',
        code="from agent_saga import audit_root, build_disclosure, verify_disclosure\n"
             "root = audit_root(all_records)\n"
             "proof = build_disclosure(all_records, saga_id='checkout_402')\n",
        check="assert verify_disclosure(proof, root)",
    ),
    # Anything else is refused naming what it takes.
    "selective-disclosure-wrong-input": Usage(
        prelude="all_records = [{'seq': 1}]\n",
        code="from agent_saga import audit_root\nroot = audit_root(all_records)\n",
        fails_with="audit_root takes the log's records (Record objects, or the (location, record) pairs read_log(path) yields), got dict",
    ),
}
