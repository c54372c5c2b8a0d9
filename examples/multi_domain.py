"""Five systems, one transaction, no network: AWS, Pinecone, Jira, GitHub and Twilio.

An onboarding agent provisions an instance, creates a vector namespace, opens a ticket and
a pull request — then hallucinates a region and raises. Every effect already standing is
undone newest first, from compensations derived at runtime from each forward result
(you cannot terminate an instance id you have not seen yet). The SMS, which no API can
take back, is refused up front: no gate was configured to let a human approve it.

Run: python examples/multi_domain.py   (or `make demo`)
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import tempfile
from pathlib import Path

from agent_saga import (
    ActionSemantics,
    Compensation,
    FileWAL,
    GateBlocked,
    compensator,
    read_log,
    saga_scope,
    saga_states,
    verify_records,
)

C = ActionSemantics.COMPENSABLE
IRREVERSIBLE = ActionSemantics.IRREVERSIBLE
_ids = itertools.count(1)


def say(text: str) -> None:
    print(text, flush=True)


class World:
    """Five simulated external systems: what is standing in each, right now."""

    def __init__(self) -> None:
        self.instances: set[str] = set()
        self.namespaces: set[str] = set()
        self.open_tickets: set[str] = set()
        self.open_prs: set[int] = set()
        self.sms_sent: list[str] = []

    def standing(self) -> int:
        return len(self.instances) + len(self.namespaces) + len(self.open_tickets) + len(self.open_prs)


world = World()


# -- forward calls (what the agent's tools do) ------------------------------------------

async def run_instances(image: str, kind: str) -> dict:
    iid = f"i-0{next(_ids):07x}"
    world.instances.add(iid)
    say(f"  [aws]      launched {iid} ({kind}, {image})")
    return {"Instances": [{"InstanceId": iid}]}


async def create_namespace(name: str) -> dict:
    world.namespaces.add(name)
    say(f"  [pinecone] created namespace {name!r}")
    return {"namespace": name}


def create_issue(project: str, summary: str) -> dict:  # a sync SDK: runs on the tool executor
    key = f"{project}-{next(_ids)}"
    world.open_tickets.add(key)
    say(f"  [jira]     opened {key}: {summary}")
    return {"key": key}


async def open_pr(repo: str, title: str) -> dict:
    number = 100 + next(_ids)
    world.open_prs.add(number)
    say(f"  [github]   opened {repo}#{number}: {title}")
    return {"number": number, "repo": repo}


async def send_sms(to: str, body: str) -> dict:
    world.sms_sent.append(to)
    say(f"  [twilio]   SMS to {to}: {body}")
    return {"sid": "SM1"}


# -- compensations: named, so a recovery daemon in another process can replay them ------

@compensator("aws.terminate_instance")
async def terminate(instance_id: str, idempotency_key: str) -> None:
    world.instances.discard(instance_id)
    say(f"  [aws]      terminated {instance_id}   (idempotency key {idempotency_key[:12]}…)")


@compensator("pinecone.delete_namespace")
async def drop_namespace(namespace: str) -> None:
    world.namespaces.discard(namespace)
    say(f"  [pinecone] deleted namespace {namespace!r}")


@compensator("jira.close_issue")
def close_issue(issue_key: str) -> None:
    world.open_tickets.discard(issue_key)
    say(f"  [jira]     closed {issue_key}")


@compensator("github.close_pr")
async def close_pr(repo: str, number: int) -> None:
    world.open_prs.discard(number)
    say(f"  [github]   closed {repo}#{number}")


class HallucinatedRegion(Exception):
    pass


async def onboard(wal: FileWAL) -> None:
    async with saga_scope(wal, name="onboard-acme") as saga:
        box = await saga.execute(
            "aws.run_instances", C,
            forward=lambda: run_instances("ami-0abc", "m6i.large"),
            compensate=lambda r: Compensation(
                fn=terminate, handler="aws.terminate_instance",
                kwargs={"instance_id": r["Instances"][0]["InstanceId"]}))
        await saga.execute(
            "pinecone.create_namespace", C,
            forward=lambda: create_namespace("acme"),
            compensate=lambda r: Compensation(
                fn=drop_namespace, handler="pinecone.delete_namespace",
                kwargs={"namespace": r["namespace"]}))
        await saga.execute(
            "jira.create_issue", C,
            forward=lambda: create_issue("ONB", "Onboard acme"),
            compensate=lambda r: Compensation(
                handler="jira.close_issue", kwargs={"issue_key": r["key"]}))  # resolved by name
        await saga.execute(
            "github.open_pr", C,
            forward=lambda: open_pr("acme/infra", "Add acme tenant"),
            compensate=lambda r: {"handler": "github.close_pr",
                                  "kwargs": {"repo": r["repo"], "number": r["number"]}})
        say(f"  [agent]    4 effects standing; instance {box['Instances'][0]['InstanceId']} is up")
        say("  [agent]    configuring the load balancer in region 'us-moon-1' …")
        raise HallucinatedRegion("region 'us-moon-1' does not exist")


async def notify(wal: FileWAL) -> None:
    async with saga_scope(wal, name="notify-acme") as saga:
        await saga.execute(
            "twilio.send_sms", IRREVERSIBLE,
            forward=lambda: send_sms("+15550100", "Your tenant is ready"))


async def main() -> int:
    wal_path = Path(tempfile.mkdtemp(prefix="agent-saga-demo-")) / "multi_domain.wal"
    wal = FileWAL(wal_path)
    say("== one transaction across five systems ==")
    try:
        await onboard(wal)
    except HallucinatedRegion as exc:
        say(f"  [agent]    failed: {exc}")
        say("  -> rolled back newest first (LIFO) from compensations derived at runtime")

    say("\n== an IRREVERSIBLE step with no human on the hook ==")
    try:
        await notify(wal)
    except GateBlocked as exc:
        say(f"  refused before anything happened: {exc.reason or exc}")

    wal.close()
    sagas = saga_states(item for _, item in read_log(wal_path) if not isinstance(item, Exception))
    chain = verify_records(read_log(wal_path))
    say("\n== what the write-ahead log says ==")
    for s in sagas.values():
        say(f"  {s.saga_id:32} {s.status:12} {len(s.steps)} step(s)")
    say(f"  chain: {chain.describe()}")
    say(f"  log:   {wal_path}   (try: agent-saga inspect --wal-path {wal_path})")

    onboard_state = next(s for s in sagas.values() if s.saga_id.startswith("onboard-acme"))
    clean = (
        world.standing() == 0
        and not world.sms_sent
        and onboard_state.status == "ROLLED_BACK"
        and chain.ok
    )
    say(f"\nresult: {world.standing()} effects left standing, {len(world.sms_sent)} SMS sent -> "
        + ("clean" if clean else "NOT CLEAN"))
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
