"""`helm upgrade` rolls the operator while agents wait for humans: no approval request is
lost or mirrored twice, and decisions made during the roll land.

Agents ask for four payouts (IRREVERSIBLE: an Approval each). The upgrade changes the
operator's pod template; while the new pod exists next to the old one (maxSurge 1, both
paused by kopf peering until the old one exits), two requests are decided with
`kubectl patch` (the operator must carry them into Redis once it runs again), one with the
CLI (straight into Redis), and an agent asks for a fifth payout. After the roll: exactly
one Approval per request, each showing its decision, and each agent's payout went the way
it was decided.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from node_support import DEADLINE, Agents, Release, poll


def approvals(rel: Release, sagas: set[str]) -> dict[str, dict[str, Any]]:
    """Approval objects of these sagas, by saga id (a second one for a saga fails)."""
    out: dict[str, dict[str, Any]] = {}
    for a in json.loads(rel.kubectl("get", "approvals", "-o", "json").stdout)["items"]:
        saga = a.get("spec", {}).get("sagaId")
        if saga in sagas:
            assert saga not in out, f"two Approvals for saga {saga}: {out[saga]['metadata']['name']}, " \
                                    f"{a['metadata']['name']}"
            out[saga] = a
    return out


def decide(rel: Release, name: str, decision: str) -> None:
    # As ourselves: the approver admission policy admits a decision only in the requester's name.
    rel.kubectl("patch", "approval", name, "--type", "merge", "-p", json.dumps(
        {"spec": {"decision": decision, "approver": rel.whoami(), "note": "decided during the roll"}}))


def operator_pods(rel: Release) -> list[dict[str, Any]]:
    pods = json.loads(rel.kubectl("get", "pods", "-l", f"app.kubernetes.io/instance={rel.name},"
                                  "app.kubernetes.io/component=operator", "-o", "json").stdout)["items"]
    return [p for p in pods if p["status"].get("phase") in ("Pending", "Running")]


def test_upgrade_rolls_the_operator_without_losing_approvals(agents: Agents) -> None:
    rel = agents.release
    pods = agents.pods()
    sagas = [agents.http(pods[i % 2], "/payout", {"amount": 100 + i})["saga"] for i in range(4)]
    mirrored = poll(lambda: (a := approvals(rel, set(sagas))) and len(a) == 4 and a, what="four Approvals mirrored")
    (old,) = operator_pods(rel)
    old_name = old["metadata"]["name"]

    upgrade = rel.start_upgrade("operator.logLevel=DEBUG")  # the decisions happen during the roll
    try:
        poll(lambda: len(operator_pods(rel)) == 2 and any(p["metadata"]["name"] == old_name for p in operator_pods(rel)),
             what="a new operator pod next to the old one")
        decide(rel, mirrored[sagas[0]]["metadata"]["name"], "Approved")
        decide(rel, mirrored[sagas[1]]["metadata"]["name"], "Denied")
        with rel.redis() as (_, url):
            cli = subprocess.run(
                [str(Path(sys.executable).parent / "agent-saga"), "approvals", "approve",
                 mirrored[sagas[2]]["metadata"]["name"], "--approver", "cli@example.com", "--store", url,
                 "--signing-key", str(rel.signing_key(Path(rel.helm.env["HOME"]) / "approver.pem"))],
                capture_output=True, text=True, timeout=60)
        assert cli.returncode == 0, cli.stderr + cli.stdout
        sagas.append(agents.http(pods[2], "/payout", {"amount": 999})["saga"])
    finally:
        out, err = upgrade.communicate(timeout=DEADLINE)
    assert upgrade.returncode == 0, err + out
    rel.wait_ready()
    (new,) = poll(lambda: (o := operator_pods(rel)) and len(o) == 1 and o, what="the old operator pod gone")
    assert new["metadata"]["name"] != old_name
    assert "--log-level=DEBUG" in new["spec"]["containers"][0]["args"]

    after = poll(lambda: (a := approvals(rel, set(sagas))) and len(a) == 5 and a, what="the fifth request mirrored")
    decide(rel, after[sagas[4]]["metadata"]["name"], "Approved")

    def payouts() -> dict[str, str]:
        states = {}
        for p in pods:
            states.update({s: v["state"] for s, v in agents.http(p, "/payouts").items() if s in sagas})
        return states

    want = {sagas[0]: "done", sagas[1]: "refused", sagas[2]: "done", sagas[3]: "waiting", sagas[4]: "done"}
    assert poll(lambda: (p := payouts()) == want and p, what=f"the payouts decided as {want}") == want
    phases = poll(lambda: (ph := {s: a.get("status", {}).get("phase") for s, a in approvals(rel, set(sagas)).items()})
                  and ph[sagas[2]] != "Pending" and ph, what="the CLI's decision shown on its Approval")
    assert [phases[s] for s in sagas] == ["Approved", "Denied", "Approved", "Pending", "Approved"], phases
    # Every request exactly once in the policy plane too.
    with rel.redis() as (r, _):
        requests = [json.loads(r.get(k)) for k in r.scan_iter("agentsaga:v1:approval:request:*")]
    assert sorted(q["sagaId"] for q in requests if q["sagaId"] in sagas) == sorted(sagas)
    decide(rel, after[sagas[3]]["metadata"]["name"], "Denied")  # let the last agent go
