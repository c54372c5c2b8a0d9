"""A 2k-token host works a 440k-character document, and every answer carries its receipts.

The document (an operations handbook, generated here deterministically: nothing is
downloaded, nothing is committed) is ~110k tokens, fifty times the host's window. Sent
whole, the router refuses it and says why. Instead the ContextBroker holds it in tiers:

    HOT    the instructions, served on every call
    WARM   the chunks the model has paged in (``recall``), while the budget allows
    COLD   every chunk of the document, each captured with its SHA-256 receipt

and an AgentLoop drives the small model: it searches, pages in a chunk (a saga step:
paging in is undone if the goal is not reached), reads it, and answers citing the chunk
and its digest. A question the document cannot answer makes the model thrash: the loop
stops it (STALLED) and unwinds what it paged in. A chunk edited after its receipt is
evicted, never served. Last, every answer is traced from the WAL alone: the loop's step
names the routing decision, the decision names the served context, and the served
context's digests match the document.

The "model" is a small deterministic function (offline, no weights): the point is the
harness around it, which is the same for a local 7B behind an OpenAI-compatible server.

Run: python examples/small_model_big_docs.py   (or `make demo-docs`)
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import re
import tempfile
from pathlib import Path

from agent_saga import AgentLoop, Compensation, FileWAL, LoopTool, read_log
from agent_saga.contextbroker import ContextBroker, Tier
from agent_saga.routing import (
    CallableHost,
    Capabilities,
    HostAnswer,
    Message,
    ModelRequest,
    Route,
    Router,
    RoutingRefused,
    ToolCall,
    Usage,
    estimate_tokens,
)

DOC_CHARS = 440_000
WINDOW = 2048
SERVICES = ["lumen-api", "quartz-queue", "heron-auth", "basalt-db", "cobalt-cdn", "ember-billing",
            "fjord-search", "garnet-mail", "indigo-ml", "juniper-ui", "krill-cache", "larch-etl"]
WORDS = ("the service restarts cleanly after a deploy and drains its connections first while operators "
         "watch the dashboards for latency error budget saturation and queue depth before paging anyone "
         "during business hours or weekends according to the rota agreed with the platform group").split()

# ---------------------------------------------------------------------------- the document


def make_document(seed: int = 4711) -> list[tuple[str, str]]:
    """Sections of an operations handbook, ~2k characters each, 440,000 characters in all.
    Exactly one section per service states its escalation code."""
    rng = random.Random(seed)
    sections: list[tuple[str, str]] = []
    stated = set()
    total, n = 0, 0
    while total < DOC_CHARS:
        n += 1
        service = SERVICES[n % len(SERVICES)]
        title = f"Section {n}: {service} runbook, part {n // len(SERVICES) + 1}"
        body = [title]
        while sum(len(line) + 1 for line in body) < 1900:
            body.append(" ".join(rng.choice(WORDS) for _ in range(14)).capitalize() + ".")
        if n > 60 and service not in stated and rng.random() < 0.2:
            stated.add(service)
            body.insert(rng.randrange(2, len(body)), f"The escalation code for {service} is ESC-{rng.randrange(1000, 9999)}.")
        text = "\n".join(body) + "\n"
        sections.append((f"chunk-{n:03d}", text))
        total += len(text)
    last_id, last = sections[-1]
    sections[-1] = (last_id, last[: len(last) - (total - DOC_CHARS)])  # exactly DOC_CHARS
    return sections


# ---------------------------------------------------------------------------- the small model

FACT = re.compile(r"The escalation code for ([a-z-]+) is (ESC-\d{4})\.")
HEAD = re.compile(r"^\[source (chunk-\d{3}) sha256:([0-9a-f]{12})\]")


def small_model(request: ModelRequest) -> HostAnswer:
    """A deterministic stand-in for a small instruct model: search, page in, read, answer."""
    question = next(m.content for m in request.messages if m.role == "user")
    asked = re.search(r"for ([a-z0-9-]+)\?", question)
    wanted = asked.group(1) if asked else ""
    for m in request.messages:  # what the broker served (system messages headed by receipts)
        head = HEAD.match(m.content) if m.role == "system" else None
        fact = FACT.search(m.content) if head else None
        if head and fact and fact.group(1) == wanted:
            text = f"The escalation code for {wanted} is {fact.group(2)} [{head.group(1)} sha256:{head.group(2)}]."
            return HostAnswer(content=text, usage=Usage(request.prompt_tokens(), estimate_tokens(text)))
    tool_results = [m.content for m in request.messages if m.role == "tool"]
    recalled = {json.loads(t).get("recalled") for t in tool_results if t.startswith("{") and "recalled" in t}
    hits = [h for t in tool_results if t.startswith("[") for h in json.loads(t)]
    fresh = [h["chunk"] for h in hits if h["chunk"] not in recalled]
    if fresh:
        call = ToolCall(f"call-{len(tool_results)}", "recall", json.dumps({"chunk": fresh[0]}))
    else:  # nothing found under its name: widen the search (and, if that fails too, repeat it)
        term = "escalation code" if "[]" in tool_results else f"escalation code for {wanted}"
        call = ToolCall(f"call-{len(tool_results)}", "search", json.dumps({"term": term}))
    return HostAnswer(tool_calls=(call,), usage=Usage(request.prompt_tokens(), 12))


# ---------------------------------------------------------------------------- the tools


class Library:
    """The document behind the broker: a search index, and paging chunks in and out."""

    def __init__(self, broker: ContextBroker, sections: list[tuple[str, str]]) -> None:
        self.broker = broker
        self.text = dict(sections)
        for cid in self.text:
            broker.add(cid, lambda cid=cid: self.text[cid], tier=Tier.COLD)

    def search(self, term: str) -> list[dict[str, str]]:
        found = [cid for cid, text in self.text.items() if term in text]
        return [{"chunk": cid, "title": self.text[cid].split("\n", 1)[0]} for cid in found[:3]]

    def recall(self, chunk: str) -> dict[str, str]:
        self.broker.set_tier(chunk, Tier.WARM)
        return {"recalled": chunk}

    def page_out(self, chunk: str) -> None:
        if chunk in self.broker:
            self.broker.set_tier(chunk, Tier.COLD)

    def tools(self) -> list[LoopTool]:
        term = {"type": "object", "properties": {"term": {"type": "string"}}, "required": ["term"]}
        chunk = {"type": "object", "properties": {"chunk": {"type": "string"}}, "required": ["chunk"]}
        return [
            LoopTool("search", self.search, description="find chunks containing a phrase", parameters=term),
            LoopTool("recall", self.recall, "COMPENSABLE",
                     lambda r: Compensation(fn=self.page_out, kwargs={"chunk": r["recalled"]},
                                            description=f"page {r['recalled']} out"),
                     "page a chunk into the context", chunk),
        ]


# ---------------------------------------------------------------------------- the run


async def main() -> None:
    sections = make_document()
    document = "".join(text for _, text in sections)
    print(f"document: {len(document):,} characters, ~{estimate_tokens(document):,} tokens, {len(sections)} chunks, "
          f"sha256 {hashlib.sha256(document.encode()).hexdigest()[:16]}")
    with tempfile.TemporaryDirectory() as tmp:
        wal = FileWAL(Path(tmp) / "agent.wal")
        host = CallableHost("small-2k", small_model, Capabilities(context_tokens=WINDOW, tools=True, cost_class="Free"),
                            model="tiny-instruct")
        router = Router(Route([host]), wal=wal)

        try:  # the naive way: the whole document in one prompt
            router.complete(ModelRequest((Message("user", document),)))
        except RoutingRefused as refused:
            print(f"whole document in one call: refused: {refused.decision.candidates[0].reason}")

        broker = ContextBroker(wal=wal, budget_tokens=1100)
        broker.add_text("instructions", "Answer from the served chunks only and cite the chunk and its sha256.")
        library = Library(broker, sections)
        loop = AgentLoop(router, tools=library.tools(), context=broker, wal=wal, max_steps=8, token_budget=12_000,
                         max_tokens=96, stall_repeats=3)

        answered: list[tuple[str, str]] = []
        questions = [f"What is the escalation code for {s}?" for s in ("heron-auth", "basalt-db", "lumen-api")]
        questions.append("What is the escalation code for zephyr-gpu?")  # not in the document
        for n, q in enumerate(questions, 1):
            result = await loop.run(q, saga_id=f"question-{n}")
            paged = sorted(i.id for i in broker.items() if i.tier == Tier.WARM)
            print(f"\nQ: {q}\n   {result.stop.value} after {result.steps} steps, {result.tokens:,} tokens: "
                  f"{result.answer or result.detail}")
            if result.done:
                answered.append((result.saga_id, result.answer or ""))
                for cid in paged:
                    library.page_out(cid)  # the next question starts from a cold context
            else:
                report = result.rollback
                print(f"   unfinished, rolled back: {report.summary() if report else 'nothing to undo'}; "
                      f"paged in now: {paged or 'nothing'}")

        # A chunk edited after its receipt is evicted, never served.
        cid = re.search(r"\[(chunk-\d{3})", answered[0][1]).group(1)  # type: ignore[union-attr]
        library.text[cid] = library.text[cid].replace("ESC-", "ESC-9")
        library.recall(cid)
        served = broker.serve()
        print(f"\n{cid} edited after its receipt: evicted={[e.source for e in served.evicted]}, "
              f"served now: {[i.id for i in served.items]}")
        library.text[cid] = dict(sections)[cid]

        # From the WAL alone: answer -> loop step -> routing decision -> served context -> digests.
        wal.close()
        records = [r for _, r in read_log(wal.path)]
        decisions = {r.payload["call"]: r.payload for r in records if r.type == "ROUTING_DECISION"}
        served_docs = {r.payload["served"]: r.payload for r in records if r.type == "CONTEXT_SERVED"}
        truth = {cid: hashlib.sha256(text.encode()).hexdigest() for cid, text in sections}
        ok = 0
        for saga_id, answer_text in answered:
            last = [r.payload for r in records if r.type == "LOOP_STEP" and r.saga == saga_id][-1]
            context = served_docs[decisions[last["decision"]]["context"]]
            cited = re.search(r"\[(chunk-\d{3}) sha256:([0-9a-f]{12})\]", answer_text)
            assert cited is not None
            item = next(i for i in context["items"] if i["id"] == cited.group(1))
            assert item["sha256"].startswith(cited.group(2)) and item["sha256"] == truth[item["id"]]
            ok += 1
            print(f"receipt: {saga_id}: {decisions[last['decision']]['chosen']} saw {item['id']} "
                  f"sha256 {item['sha256'][:16]} (matches the document)")
        stops = [r.payload["reason"] for r in records if r.type == "LOOP_STOPPED"]
        print(f"\nLOOP_STOPPED reasons in the log: {stops}")
        verdict = "clean" if ok == len(answered) == 3 and stops == ["DONE", "DONE", "DONE", "STALLED"] else "NOT CLEAN"
        print(f"{ok} answers traced from the log alone to the exact chunks the 2k-token host saw: {verdict}")


if __name__ == "__main__":
    asyncio.run(main())
