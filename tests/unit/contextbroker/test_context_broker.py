"""The ContextBroker: receipts into every source, drifted sources evicted and never served,
and what was served answerable from the WAL alone (read back from a real FileWAL)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from agent_saga.contextbroker import ContextBroker, DriftedSource, Receipt, Tier
from agent_saga.routing import Capabilities, Message, ModelRequest, OpenAIHost, Route, Router
from engine_support import read, wal_fixture  # noqa: F401
from fixtures.openai_server import ChatServer


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def records(wal, type_: str) -> list[dict]:
    return [r.payload for r in read(wal, "wal") if r.type == type_]


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    p = tmp_path / "refund-policy.md"
    p.write_text("Refunds within 30 days of purchase.")
    return p


def test_every_summary_carries_receipts_and_the_serving_is_recorded(wal, policy: Path) -> None:
    broker = ContextBroker(wal=wal)
    receipt = broker.add_file(policy, id="refund-policy")
    assert receipt == Receipt("refund-policy", sha("Refunds within 30 days of purchase."))
    broker.add_text("ticket-4711", "Customer bought on day 1, asks on day 12.", tier=Tier.COLD)
    summary = broker.summarize("refund-summary", "Refundable: within 30 days.", ["refund-policy", "ticket-4711"])
    assert summary.receipts == (receipt, Receipt("ticket-4711", sha("Customer bought on day 1, asks on day 12.")))
    served = broker.serve()
    assert [i.id for i in served.items] == ["refund-policy", "refund-summary"]  # the COLD ticket is not served
    assert served.messages[0].content.startswith(f"[source refund-policy sha256:{receipt.sha256[:12]}]\n")
    assert f"cites refund-policy@{receipt.sha256[:12]} ticket-4711@" in served.messages[1].content
    [rec] = records(wal, "CONTEXT_SERVED")
    assert rec["served"] == served.id and rec["evicted"] == []
    assert rec["items"][1] == {"id": "refund-summary", "kind": "summary", "tier": "WARM",
                               "sha256": sha("Refundable: within 30 days."),
                               "receipts": [r.to_doc() for r in summary.receipts]}
    assert "Refunds within 30 days" not in Path(wal.path).read_text()  # digests, never contents


def test_a_drifted_source_never_reaches_a_prompt(wal, policy: Path) -> None:
    broker = ContextBroker(wal=wal)
    broker.add_file(policy, id="refund-policy")
    broker.add_text("faq", "Shipping takes 3 days.")
    broker.summarize("refund-summary", "Refunds: 30 days.", ["refund-policy"])
    policy.write_text("Refunds within 90 days of purchase.")  # edited after it was captured
    with ChatServer() as server:
        server.always(ChatServer.reply("ok"))
        router = Router(Route([OpenAIHost("m", server.url, "m", Capabilities(8192))]), wal=wal)
        served = broker.serve()
        response = router.complete(ModelRequest(served.messages + (Message("user", "Refund?"),)), context=served)
        [prompt] = server.prompts
    assert "Refunds within" not in prompt and "Refunds: 30 days." not in prompt  # neither version, nor its summary
    assert "Shipping takes 3 days." in prompt
    assert [e.source for e in served.evicted] == ["refund-policy"] and served.evicted[0].summaries == ("refund-summary",)
    assert "refund-policy" not in broker and "refund-summary" not in broker
    [ev] = records(wal, "CONTEXT_EVICTED")
    assert ev["found"] == sha("Refunds within 90 days of purchase.") and ev["summaries"] == ["refund-summary"]
    # what the model saw, from the log alone: the decision names the serving, the serving its digests
    [decision] = records(wal, "ROUTING_DECISION")
    [serving] = [s for s in records(wal, "CONTEXT_SERVED") if s["served"] == decision["context"]]
    assert response.decision.context == served.id
    assert [i["id"] for i in serving["items"]] == ["faq"]


def test_a_source_that_cannot_be_read_any_more_is_evicted(wal, policy: Path) -> None:
    broker = ContextBroker(wal=wal)
    broker.add_file(policy, id="refund-policy")
    policy.unlink()
    served = broker.serve()
    assert served.items == () and served.evicted[0].found is None


def test_a_summary_over_a_drifted_source_is_not_made(wal, policy: Path) -> None:
    broker = ContextBroker(wal=wal)
    broker.add_file(policy, id="refund-policy")
    policy.write_text("changed")
    with pytest.raises(DriftedSource, match="refund-policy drifted from its receipt and was evicted"):
        broker.summarize("s", "summary", ["refund-policy"])
    assert broker.items() == ()


def test_cold_items_are_served_on_recall_and_warm_ones_within_the_budget(wal) -> None:
    broker = ContextBroker(wal=wal, budget_tokens=10)
    broker.add_text("hot", "h" * 40)                      # 10 tokens: HOT is always served
    broker.add_text("warm", "w" * 8, tier=Tier.WARM)        # does not fit any more
    broker.add_text("cold", "c" * 4, tier=Tier.COLD)
    served = broker.serve()
    assert [i.id for i in served.items] == ["hot"] and served.left_out == ("warm",)
    broker.budget_tokens = 100
    assert [i.id for i in broker.serve(recall=["cold"]).items] == ["hot", "warm", "cold"]
    with pytest.raises(KeyError, match="recall names nope"):
        broker.serve(recall=["nope"])


def test_re_adding_a_changed_source_evicts_the_summaries_of_its_old_content(wal) -> None:
    broker = ContextBroker(wal=wal)
    broker.add_text("doc", "v1")
    broker.summarize("sum", "about v1", ["doc"])
    broker.add_text("doc", "v2")
    assert "sum" not in broker and [i.id for i in broker.serve().items] == ["doc"]
    [ev] = records(wal, "CONTEXT_EVICTED")
    assert ev["replaced"] is True and ev["summaries"] == ["sum"]
