"""What ``agent-saga COMMAND --help`` says beyond the flags: a description and examples.

Kept in one table so every subcommand has both (``tests/unit/cli/test_cli_help.py`` fails
for a command without them, or a flag without help). ``document(parser)`` applies the
table to the parser ``build_parser`` made; the examples are printed as written.
"""

from __future__ import annotations

import argparse
import textwrap

__all__ = ["COMMANDS", "document"]

#: command path -> (description, examples). Examples are shell lines; a "# ..." suffix says
#: what it does.
COMMANDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "verify": (
        "Check a write-ahead log's hash chain. Exit 0 only if every record links to the one "
        "before it (nothing altered, removed or reordered).",
        ("agent-saga verify --wal-path ./agent-saga.wal",
         "agent-saga verify --wal-url 'redis://:PASSWORD@redis:6379/0?key=agent-saga:wal' --json"),
    ),
    "inspect": (
        "List the sagas in a log with their status and dangling steps (a step started but "
        "never finished: what recovery would act on).",
        ("agent-saga inspect --wal-path ./agent-saga.wal",
         "agent-saga inspect --wal-path ./agent-saga.wal --saga checkout_402   # one saga, its steps"),
    ),
    "ui": (
        "The time-travel debugger: a read-only web view of a log. A sidebar of runs "
        "(filter by status, search by saga id, tool or tag), each run's steps colour-coded "
        "by outcome with the compensations in the order they ran, an inspector (semantics, "
        "arguments, the gate's verdict, approvals, the compensation and its idempotency key), "
        "the chain's state with the first broken record, a disclosure proof per saga, and "
        "the state of every saga as of any record. Nothing is executed. Binds 127.0.0.1; "
        "any other address needs --token, and then every API request needs it.",
        ("agent-saga ui --wal-path ./agent-saga.wal --port 8080   # open http://127.0.0.1:8080/",
         "agent-saga ui --wal-url 'redis://:PASSWORD@localhost:6379/0?key=agent-saga:wal'",
         "agent-saga ui --wal-path ./agent-saga.wal --host 0.0.0.0 --token-file ui.token   # shared: a token"),
    ),
    "status": (
        "The live posture of the controls, read from their stores: the kill switch's engaged "
        "levers, each limit's use in its window, and the agents on the policy plane. Exit 1 "
        "if a store cannot be read. The circuit breaker's state lives in each agent process "
        "(AgentKit.status()), so it has no section here.",
        ("agent-saga status                      # the stores AGENT_SAGA_REDIS_URL names",
         "agent-saga status --redis-url redis://redis:6379/0 --json"),
    ),
    "export": (
        "Write a WORM audit bundle of a log: the records, a manifest and SHA256SUMS.",
        ("agent-saga export --wal-path ./agent-saga.wal --out ./audit-2026-07",),
    ),
    "verify-bundle": (
        "Re-check an exported audit bundle: checksums, the hash chain and the manifest.",
        ("agent-saga verify-bundle ./audit-2026-07",),
    ),
    "certify": (
        "Prove every committed effect in a log was compensated or is terminal. Exit 1 otherwise.",
        ("agent-saga certify --wal-path ./agent-saga.wal || exit 1",),
    ),
    "redact": (
        "Erase records' payloads (a GDPR erasure); the hash chain still verifies.",
        ("agent-saga redact --wal-path ./agent-saga.wal --seq 1234 --reason ERASURE-77",
         "agent-saga redact --wal-path ./agent-saga.wal --saga checkout_402 --reason ERASURE-78"),
    ),
    "audit-root": (
        "The Merkle root over a log, to publish (a later disclosure proof is checked against it).",
        ("agent-saga audit-root --wal-path ./agent-saga.wal --out root.json",),
    ),
    "prove": (
        "A disclosure proof for one saga's records, or a consistency proof that the log "
        "extends an earlier root.",
        ("agent-saga prove --wal-path ./agent-saga.wal --saga checkout_402 --out proof.json",
         "agent-saga prove --wal-path ./agent-saga.wal --from-size 1200 --out cons.json"),
    ),
    "verify-proof": (
        "Check a disclosure or consistency proof against published roots.",
        ("agent-saga verify-proof proof.json --root root.json",
         "agent-saga verify-proof cons.json --old-root root-june.json --root root-july.json"),
    ),
    "checkpoint": (
        "Sign the log's current head with Ed25519, so a later truncation is detectable.",
        ("agent-saga checkpoint --wal-path ./agent-saga.wal --key ./checkpoint.key --out cp-0042.json",),
    ),
    "verify-checkpoint": (
        "Check that a log still extends a signed checkpoint: nothing was cut off, and every record it "
        "signed is still there, unchanged (a compaction after the checkpoint fails it: take a new one).",
        ("agent-saga verify-checkpoint --wal-path ./agent-saga.wal --checkpoint cp-0042.json "
         "--pubkey ./checkpoint.key.pub",),
    ),
    "keygen": (
        "Make a checkpoint or approver signing key pair, or a WAL encryption key (printed for "
        "AGENT_SAGA_WAL_KEY). An approver key names the approver(s) it approves as (--approver).",
        ("agent-saga keygen checkpoint --out ./checkpoint.key   # and ./checkpoint.key.pub",
         "agent-saga keygen approver --approver risk@corp --out risk.pem   # risk.pem.pub names risk@corp",
         "agent-saga keygen wal --kid 2026-07"),
    ),
    "recover": (
        "Run one recovery sweep over a log (finish or compensate what a dead process left "
        "half done, from verified records only), or read and close the human escalation queue.",
        ("agent-saga recover --wal-path ./agent-saga.wal --import myapp.handlers --dry-run",
         "agent-saga recover --wal-path ./agent-saga.wal --escalations",
         "agent-saga recover --wal-path ./agent-saga.wal --resolve-escalation ID --by ops@corp "
         "--note 'refunded by hand'"),
    ),
    "halt": (
        "Engage a HALT (refuse new side effects) or, with --drain, a DRAIN (start no new "
        "sagas) on a scope, in the kill switch store agents read.",
        ("agent-saga halt --scope tool:wire.send --reason 'fraud pattern' --by soc@corp",
         "agent-saga halt --drain --reason 'deploying' --by ci@corp --ttl 10m"),
    ),
    "quarantine": (
        "Freeze one saga: its next step is refused and it is never rolled back automatically "
        "(a human decides).",
        ("agent-saga quarantine saga-8f3c --reason 'suspected duplicate charges' --by soc@corp",),
    ),
    "resume": (
        "Lift the levers engaged on a scope, or one lever by its id.",
        ("agent-saga resume --scope tool:wire.send --by soc@corp",
         "agent-saga resume --id payments/halt-wire-send --by soc@corp"),
    ),
    "mesh": (
        "Offline devices each keep their own log (<device>.wal); replicas exchange them as a "
        "grow-only set. Merge replicas in any order, any number of times: every replica that "
        "saw the same records holds the same set. Verify checks each device's chain in the "
        "union and names every conflict with all its sides; nothing is resolved for you.",
        ("agent-saga mesh merge ./laptop ./tablet --out ./merged",
         "agent-saga mesh verify ./merged --order"),
    ),
    "mesh merge": (
        "Union the replicas (and what --out already holds) into --out, one <device>.wal per "
        "device, each line exactly as its device wrote it. Refuses to overwrite a device's "
        "live log. Exits 1 if the merged view has a broken chain or a conflict (it is still "
        "written).",
        ("agent-saga mesh merge ./laptop ./tablet --out ./merged",
         "agent-saga mesh merge ./merged ./phone/phone.wal --out ./merged --json"),
    ),
    "mesh verify": (
        "Check every device's hash chain inside the union of the replicas, and list every "
        "conflict: a forked or tampered device log, a saga started or a step acted on by two "
        "devices, two outcomes of one saga, an entity claimed twice. Exits 1 on any of them.",
        ("agent-saga mesh verify ./merged",
         "agent-saga mesh verify ./laptop ./tablet --order --json"),
    ),
    "approvals": (
        "List the approval requests agents are waiting on, and approve or deny one. The "
        "decision lands in the approval store, where the waiting agent sees it. A request marked "
        "'passkey required' is approved with the approver's enrolled key (approvals sign); the "
        "keyring of those keys is managed with approvals keys.",
        ("agent-saga approvals list",
         "agent-saga approvals approve af83c011 --approver risk@corp --note 'verified by phone'"),
    ),
    "approvals list": (
        "The requests waiting for a human (--all: decided and expired ones too).",
        ("agent-saga approvals list",
         "agent-saga approvals list --all --json --store redis://redis:6379/0"),
    ),
    "approvals show": (
        "One request and the action it asks to run, rendered from its exact arguments (escaped; checked "
        "against its digest: a request that fails the check is shown as NOT APPROVABLE). --show-all prints "
        "every field and every character: approving an action larger than the default view needs it.",
        ("agent-saga approvals show af83c011",
         "agent-saga approvals show af83c011 --show-all --store redis://redis:6379/0"),
    ),
    "acl": (
        "Print the least-privilege Redis ACL user of a component (agent, approver, operator) as an "
        "ACL SETUSER command: key patterns and commands it may use, nothing more (what each credential can do: the threat model in the docs).",
        ("agent-saga acl agent --agent payments/payments-agent-0 --wal-key agent-saga:wal   # its own WAL streams",
         "agent-saga acl agent --agent payments/payments-agent-0 --user payments-agent-0 --json",
         "agent-saga acl approver"),
    ),
    "wal": (
        "Administer a fleet log: set a RedisWAL writer aside (quarantine) so recovery and "
        "certify skip it while saying so.",
        ("agent-saga wal quarantine --wal-url 'redis://op:PASSWORD@redis:6379/0?key=agent-saga:wal' --list",),
    ),
    "wal quarantine": (
        "Quarantine an agent identity writer of a RedisWAL (or --lift it, or --list them): verify "
        "prints it QUARANTINED and does not count it, certify and recovery skip its sagas and say so. "
        "Recorded in the log's quarantine journal (who, why, when). Needs the operator's Redis "
        "credential (agent-saga acl operator --wal-key KEY). Restart recoveryd after a lift.",
        ("agent-saga wal quarantine --wal-url 'redis://op:PASSWORD@redis:6379/0?key=agent-saga:wal' "
         "--writer payments/payments-7@4242-a1b2c3 --by oncall@corp --reason 'poisoned entry, INC-1234'",
         "agent-saga wal quarantine --wal-url URL --writer payments/payments-7@4242-a1b2c3 --by oncall@corp "
         "--reason 'stream repaired' --lift"),
    ),
    "approvals approve": (
        "Approve one request, as a named approver. Refused once it is decided or past its deadline. "
        "With --signing-key (an approver key the operator publishes, bound to that approver) agents accept "
        "the decision; where keys are published, an approval they would ignore (unsigned, another "
        "approver's key) is refused, and a signed one replaces one they ignore. An action larger than the "
        "default view needs --show-all (see it first with approvals show ID --show-all); the approval "
        "prints it in full. A credential in --note is stored as [REDACTED].",
        ("agent-saga approvals approve af83c011 --approver risk@corp --signing-key risk.pem --note 'verified by phone'",
         "agent-saga approvals approve af83c011 --approver cfo@corp --break-glass --note 'system down'"),
    ),
    "approvals deny": (
        "Deny one request, as a named approver: the waiting step is refused.",
        ("agent-saga approvals deny af83c011 --approver risk@corp --note 'not this one'",),
    ),
    "approvals challenge": (
        "Print a passkey request's challenge: the exact action (tool, arguments digest, saga, step, "
        "deadline, nonce) and the 32-byte digest the approver's key signs. --out writes the bytes for a "
        "hardware key's signing tool; the base64url form is the challenge of a WebAuthn assertion.",
        ("agent-saga approvals challenge af83c011",
         "agent-saga approvals challenge af83c011 --out challenge.bin --json"),
    ),
    "approvals sign": (
        "Approve a passkey request with the approver's own enrolled key: a software key (--key), a "
        "WebAuthn assertion (--assertion) or a hardware key's raw signature over the challenge "
        "(--signature with --key-id). Agents check it against their approver keyring before the call.",
        ("agent-saga approvals sign af83c011 --approver risk@corp --key risk.pem --note 'verified by phone'",
         "agent-saga approvals sign af83c011 --approver risk@corp --key-id 3f2a9c0d1e2f3a4b --signature sig.bin"),
    ),
    "approvals keys": (
        "The approver keyring (a JSON file agents read): enrol an approver's public key, list keys, "
        "revoke one. A key approves only as the approver it is enrolled for; revocation is final.",
        ("agent-saga approvals keys list --keyring keyring.json",
         "agent-saga approvals keys enrol --keyring keyring.json --approver risk@corp --public-key risk.pem.pub --by soc@corp"),
    ),
    "approvals keys enrol": (
        "Enrol an Ed25519 public key (PEM, or a WebAuthn credential's 32 raw bytes with --raw) for one approver.",
        ("agent-saga approvals keys enrol --keyring keyring.json --approver risk@corp --public-key risk.pem.pub --by soc@corp --label 'yubikey 5c'",
         "agent-saga approvals keys enrol --keyring keyring.json --approver cfo@corp --raw 11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo --rp-id approve.corp --by soc@corp"),
    ),
    "approvals keys list": (
        "Every key in the approver keyring: who it belongs to, who enrolled it, whether it is revoked.",
        ("agent-saga approvals keys list --keyring keyring.json", "agent-saga approvals keys list --json"),
    ),
    "approvals keys revoke": (
        "Revoke an approver key (by a unique id prefix): agents refuse its signatures from their next check.",
        ("agent-saga approvals keys revoke 3f2a9c --keyring keyring.json --by soc@corp",),
    ),
    "reconcile": (
        "Ask each effect's @reconciler what the external system says, ignoring what the log "
        "concluded: compensated steps really undone, in-doubt steps landed or not. Exit 0 clean, "
        "1 drift, 3 something could not be verified (never counted as clean), 2 bad usage.",
        ("agent-saga reconcile --wal-path ./agent-saga.wal --import agent_saga.connectors.stripe",
         "agent-saga reconcile --wal-url 'redis://:PASSWORD@redis:6379/0?key=agent-saga:wal' "
         "--import agent_saga.connectors.postgres --since 24h --rate 5 --json"),
    ),
    "mcp": (
        "Run an MCP server behind the gate and the WAL, for an agent you cannot change: every "
        "tools/call passes the kill switch, breaker, limits, rules and approvals and is a saga "
        "step; undeclared tools are refused; COMPENSABLE calls are undone when the session "
        "fails. Everything else is forwarded verbatim.",
        ("agent-saga mcp --policy saga-policy.json --name payments -- python -m my_mcp_server",
         "agent-saga mcp --observe --emit-policy payments-policy.yaml -- python -m my_mcp_server",
         "agent-saga mcp --listen 127.0.0.1:8931 --upstream http://127.0.0.1:9000/mcp "
         "--policy-from-plane payments/payments-mcp"),
    ),
    "policy": (
        "Check a SagaPolicy file, diff it against the one in force, replay it over a recorded "
        "log, or write a skeleton from the tool surface agents recorded.",
        ("agent-saga policy check examples/k8s/policy.yaml",
         "agent-saga policy skeleton -n payments --agent payments-agent -o payments-policy.yaml"),
    ),
    "policy check": (
        "Validate a policy file (JSON, or a SagaPolicy manifest) as agents and the operator "
        "would; exit 1 with the field and the fix if it is refused.",
        ("agent-saga policy check examples/k8s/policy.yaml",
         "agent-saga policy check saga-policy.json"),
    ),
    "policy skeleton": (
        "Write a SagaPolicy listing every tool agents were seen calling, each IRREVERSIBLE "
        "with a TODO: the safe start for a review.",
        ("agent-saga policy skeleton -n payments --agent payments-agent -o payments-policy.yaml",),
    ),
    "policy replay": (
        "Evaluate every call a log records under the policies in force (--current, --from-plane; "
        "default: none) and the proposed ones, with the gate's own evaluation. Reports, overall "
        "and per tool, the verdicts under each, the calls that become stricter or looser, with "
        "example sagas, and every call it could not evaluate (redacted, encrypted without the "
        "key) and why. Exit 0 nothing changes, 1 stricter only, 3 something looser, 2 bad input.",
        ("agent-saga policy replay proposed.yaml --current policy.yaml --agent payments-agent "
         "--wal-path audit/records.ndjson",
         "agent-saga policy replay proposed.yaml --from-plane agent-saga/payments-agent --agent payments-agent "
         "--wal-url 'redis://:PASSWORD@redis:6379/0?key=agent-saga:wal' --since 7d --markdown"),
    ),
    "policy diff": (
        "A semantic diff of two SagaPolicy files: per tool and per rule, what became stricter "
        "or looser (semantics, inverse, approvals, policy arguments, undeclared tools, rules, "
        "appliesTo). Exit 0 nothing the gate does changes, 1 stricter only, 3 something looser "
        "(or a change that cannot be ordered), 2 an invalid file.",
        ("agent-saga policy diff policy.yaml proposed.yaml",
         "agent-saga policy diff policy.yaml proposed.yaml --markdown   # a pull-request comment"),
    ),
    "limits": (
        "Replay proposed BudgetLimits over a recorded log.",
        ("agent-saga limits replay examples/k8s/budget.yaml --wal-path ./agent-saga.wal",),
    ),
    "limits replay": (
        "Charge the calls a log records, in time order, against BudgetLimit manifests (Budget "
        "and Rate), with the gate's pricing and the limit store's sliding windows: on which "
        "windows the cap would have refused calls or asked a human, how many and how much. "
        "Exit 0 nothing refused, 1 some calls refused or sent to a human, 2 bad input.",
        ("agent-saga limits replay examples/k8s/budget.yaml --wal-path ./agent-saga.wal",
         "agent-saga limits replay budget.yaml --wal-path audit/records.ndjson --since 7d --json"),
    ),
}

#: Help of flags many subcommands share, where a subcommand gives none.
_SHARED_FLAG_HELP = {"--json": "print JSON instead of text"}


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and examples printed as written."""


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    out: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            out.update(action.choices)
    return out


def document(parser: argparse.ArgumentParser, path: str = "") -> None:
    """Give every subcommand of ``parser`` its description and examples (``COMMANDS``)."""
    for name, sub in _subparsers(parser).items():
        key = f"{path} {name}".strip()
        if key in COMMANDS:
            description, examples = COMMANDS[key]
            sub.description = textwrap.fill(description, 88)
            sub.epilog = "examples:\n" + "\n".join("  " + e for e in examples)
            sub.formatter_class = _Formatter
        for action in sub._actions:
            if action.help is None:
                for flag in action.option_strings:
                    if flag in _SHARED_FLAG_HELP:
                        action.help = _SHARED_FLAG_HELP[flag]
        document(sub, key)
