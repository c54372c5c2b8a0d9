"""Spend and rate limits: every semantic the brief lists, each test named after it.

All tests here use the in-process store with a fake clock (time never sleeps); the same
semantics against a real Redis are in tests/integration/test_limits_redis.py.
"""

from __future__ import annotations

import asyncio
import json
import math

import pytest
from agent_saga.controls import (
    ApprovalOutcome,
    BudgetLimit,
    InProcessLimitStore,
    LimitStoreUnavailable,
    PreFlightGate,
    RateLimit,
    by_arg,
    by_tool,
    combine,
    rule,
)
from agent_saga.controls.limits import Charge
from agent_saga.errors import ConfigurationError
from agent_saga.gates import StepRequest
from agent_saga.semantics import ActionSemantics
from fixtures.steps import req as step_request

C = ActionSemantics.COMPENSABLE
I = ActionSemantics.IRREVERSIBLE  # noqa: E741
DAY = 86_400


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


class Approver:
    """A test approval provider: answers from a script and remembers what it was asked."""

    def __init__(self, approved: bool = True, approver: str | None = "risk@corp", note: str = "") -> None:
        self.approved = approved
        self.approver = approver
        self.note = note
        self.asked: list[tuple[StepRequest, object]] = []

    async def request_approval(self, request, verdict):
        self.asked.append((request, verdict))
        return ApprovalOutcome(self.approved, self.approver, self.note)


def req(amount: object = 100, tool: str = "stripe.charge", sem=C, tags=(), **args) -> StepRequest:
    policy = dict(args)
    if amount is not _MISSING:
        policy["amount"] = amount
    return step_request(tool, sem, tags, **policy)


_MISSING = object()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> InProcessLimitStore:
    return InProcessLimitStore(clock=clock)


def used(store: InProcessLimitStore, name: str, key: str = "*") -> float:
    for w in store._windows.items():
        (n, k), win = w
        if n == name and k == key:
            return win.total
    return 0.0


# --------------------------------------------------------------------------- windows
async def test_budget_limit_bounds_the_sum_over_the_window(store):
    gate = PreFlightGate(limits=[BudgetLimit("daily-spend", arg="amount", max_total=1000, window=DAY)], store=store)
    verdicts = [(await gate.decide(req(999))).verdict, (await gate.decide(req(1))).verdict]
    assert verdicts == ["ALLOW", "ALLOW"]
    d = await gate.decide(req(1))
    assert d.verdict == "BLOCK" and not d.allowed
    assert d.decided_by == "limit:daily-spend"
    assert "1,000 of 1,000 used" in d.reason and "needs 1" in d.reason
    assert used(store, "daily-spend") == 1000


async def test_a_per_call_threshold_is_not_a_spending_control(store):
    # 1,000 charges of 999 each pass arg_exceeds("amount", 1000); the budget stops them.
    from agent_saga.controls import arg_exceeds

    gate = PreFlightGate(
        rules=[arg_exceeds("amount", 1000, "BLOCK")],
        limits=[BudgetLimit("daily-spend", arg="amount", max_total=50_000, window=DAY)],
        store=store,
    )
    allowed = 0
    for _ in range(1000):
        allowed += (await gate.decide(req(999))).allowed
    assert allowed == 50  # 50 x 999 = 49,950; the 51st would be 50,949
    assert used(store, "daily-spend") == 49_950


async def test_window_slides_debits_leave_exactly_window_seconds_later(store, clock):
    gate = PreFlightGate(limits=[BudgetLimit("hourly", arg="amount", max_total=100, window=3600)], store=store)
    assert (await gate.decide(req(60))).allowed
    clock.now += 1800
    assert (await gate.decide(req(40))).allowed
    assert not (await gate.decide(req(1))).allowed
    clock.now += 1799.999
    assert not (await gate.decide(req(1))).allowed, "the first debit is still inside its window"
    clock.now += 0.001  # exactly one window after the first debit: it has left
    assert (await gate.decide(req(60))).allowed
    assert not (await gate.decide(req(1))).allowed


async def test_rate_limit_counts_calls_per_scope_by_tool(store, clock):
    gate = PreFlightGate(limits=[RateLimit("velocity", max_calls=3, window=60, scope=by_tool)], store=store)
    for _ in range(3):
        assert (await gate.decide(req(tool="stripe.charge"))).allowed
    d = await gate.decide(req(tool="stripe.charge"))
    assert d.verdict == "BLOCK" and d.decided_by == "limit:velocity"
    assert "3 of 3 calls" in d.reason and "tool=stripe.charge" in d.reason
    assert (await gate.decide(req(tool="sendgrid.send"))).allowed, "another tool has its own window"
    clock.now += 60
    assert (await gate.decide(req(tool="stripe.charge"))).allowed


async def test_rate_limit_is_exact_no_burst_beyond_max_calls_in_any_window(store, clock):
    # A token bucket would allow ~2x max_calls across a window boundary; a sliding log never does.
    gate = PreFlightGate(limits=[RateLimit("velocity", max_calls=20, window=60)], store=store)
    times: list[float] = []
    for step in range(600):
        clock.now = 1000.0 + step * 0.5
        if (await gate.decide(req())).allowed:
            times.append(clock.now)
    for i, t in enumerate(times):
        assert sum(1 for u in times[i:] if u < t + 60) <= 20


async def test_by_arg_scope_keeps_one_window_per_customer(store):
    gate = PreFlightGate(
        limits=[BudgetLimit("per-customer", arg="amount", max_total=1000, window=DAY, scope=by_arg("customer_id"))],
        store=store,
    )
    assert (await gate.decide(req(1000, customer_id="c_1"))).allowed
    d = await gate.decide(req(1, customer_id="c_1"))
    assert not d.allowed and "customer_id=c_1" in d.reason
    assert (await gate.decide(req(1000, customer_id="c_2"))).allowed
    assert (await gate.decide(req(1000, customer_id=7))).allowed, "integer ids are ids too"


async def test_combine_scope_keeps_one_window_per_tool_and_customer(store):
    gate = PreFlightGate(
        limits=[BudgetLimit("pair", arg="amount", max_total=10, window=DAY, scope=combine(by_tool, by_arg("customer_id")))],
        store=store,
    )
    assert (await gate.decide(req(10, tool="a", customer_id="c"))).allowed
    assert not (await gate.decide(req(1, tool="a", customer_id="c"))).allowed
    assert (await gate.decide(req(10, tool="b", customer_id="c"))).allowed
    assert (await gate.decide(req(10, tool="a", customer_id="d"))).allowed
    assert used(store, "pair", "tool=a|customer_id=c") == 10


async def test_global_scope_is_the_default_and_one_window_for_every_tool(store):
    gate = PreFlightGate(limits=[BudgetLimit("all", arg="amount", max_total=10, window=DAY)], store=store)
    assert (await gate.decide(req(6, tool="a"))).allowed
    assert not (await gate.decide(req(6, tool="b"))).allowed


async def test_tools_filter_restricts_what_a_limit_polices(store):
    gate = PreFlightGate(
        limits=[BudgetLimit("stripe-only", arg="amount", max_total=10, window=DAY, tools=["stripe.*"])],
        store=store,
    )
    assert (await gate.decide(req(_MISSING, tool="jira.create_issue"))).allowed, "not policed: no amount needed"
    assert (await gate.decide(req(10, tool="stripe.charge"))).allowed
    assert not (await gate.decide(req(1, tool="stripe.refund"))).allowed


# --------------------------------------------------------------------------- the brief's semantics
async def test_limits_are_checked_before_rules_an_over_budget_call_never_reaches_a_human(store):
    approver = Approver()
    gate = PreFlightGate(
        limits=[BudgetLimit("daily-spend", arg="amount", max_total=100, window=DAY)],
        approval_provider=approver, store=store,
    )
    assert (await gate.decide(req(100))).allowed
    d = await gate.decide(req(50, tool="wire.send", sem=I))
    assert d.verdict == "BLOCK" and d.decided_by == "limit:daily-spend" and d.stage == "limits"
    assert approver.asked == [], "a call that cannot proceed must not spend a human's attention"


async def test_all_or_nothing_a_call_refused_by_the_third_limit_leaves_the_first_two_undebited(store):
    gate = PreFlightGate(
        limits=[
            BudgetLimit("first", arg="amount", max_total=1000, window=DAY),
            BudgetLimit("second", arg="amount", max_total=1000, window=DAY, scope=by_arg("customer_id")),
            RateLimit("third", max_calls=1, window=60),
        ],
        store=store,
    )
    assert (await gate.decide(req(10, customer_id="c"))).allowed
    d = await gate.decide(req(20, customer_id="c"))
    assert d.verdict == "BLOCK" and d.decided_by == "limit:third"
    assert used(store, "first") == 10
    assert used(store, "second", "customer_id=c") == 10
    assert used(store, "third") == 1
    assert d.detail["debited"] is False
    assert [c["over"] for c in d.detail["charges"]] == [False, False, True]


async def test_a_refusal_by_a_rule_hands_the_budget_back(store):
    gate = PreFlightGate(
        rules=[rule("no-wires", lambda r: r.tool == "wire.send", "BLOCK", "wires are paused")],
        limits=[BudgetLimit("daily-spend", arg="amount", max_total=100, window=DAY), RateLimit("velocity", 5, 60)],
        store=store,
    )
    d = await gate.decide(req(80, tool="wire.send"))
    assert d.verdict == "BLOCK" and d.decided_by == "rule:no-wires" and d.reason == "wires are paused"
    assert used(store, "daily-spend") == 0 and used(store, "velocity") == 0
    assert d.detail["debited"] is False
    assert (await gate.decide(req(100))).allowed, "the refused call's 80 was handed back"


async def test_a_denied_approval_hands_the_budget_back(store):
    approver = Approver(approved=False, approver="risk@corp", note="not today")
    gate = PreFlightGate(
        limits=[BudgetLimit("daily-spend", arg="amount", max_total=100, window=DAY)],
        approval_provider=approver, store=store,
    )
    d = await gate.decide(req(70, tool="wire.send", sem=I))
    assert d.verdict == "REQUIRE_APPROVAL" and not d.allowed and d.stage == "approval"
    assert "denied by risk@corp: not today" in d.reason
    assert used(store, "daily-spend") == 0
    (asked_req, pending), = approver.asked
    assert pending.verdict == "REQUIRE_APPROVAL" and pending.decided_by == "rule:irreversible"


async def test_budget_is_reserved_while_a_human_decides(store):
    seen: list[float] = []

    class Watching(Approver):
        async def request_approval(self, request, verdict):
            seen.append(used(store, "daily-spend"))
            return await super().request_approval(request, verdict)

    gate = PreFlightGate(
        limits=[BudgetLimit("daily-spend", arg="amount", max_total=100, window=DAY)],
        approval_provider=Watching(), store=store,
    )
    d = await gate.decide(req(70, tool="wire.send", sem=I))
    assert d.verdict == "REQUIRE_APPROVAL" and d.allowed
    assert seen == [70], "the approved call's budget cannot be taken by another call meanwhile"
    assert used(store, "daily-spend") == 70


async def test_an_authorization_is_permanent_a_failed_step_keeps_its_budget(store, tmp_path):
    from agent_saga.scope import saga_scope
    from agent_saga.wal.file import FileWAL

    gate = PreFlightGate(limits=[BudgetLimit("daily-spend", arg="amount", max_total=100, window=DAY)], store=store)
    wal = FileWAL(tmp_path / "saga.wal")
    try:
        with pytest.raises(TimeoutError):
            async with saga_scope(wal, gate=gate) as saga:
                def charge() -> None:
                    raise TimeoutError("card network timed out")  # it may have reached the network

                await saga.execute("stripe.charge", C, charge, lambda r: {"handler": "refund", "kwargs": {}},
                                   policy_args={"amount": 60})
    finally:
        wal.close()
    assert used(store, "daily-spend") == 60
    assert not (await gate.decide(req(41))).allowed


async def test_an_authorization_is_permanent_a_compensated_step_does_not_earn_its_budget_back(store, tmp_path):
    from agent_saga.compensation import Compensation
    from agent_saga.scope import saga_scope
    from agent_saga.wal.file import FileWAL

    refunds: list[str] = []
    gate = PreFlightGate(limits=[BudgetLimit("daily-spend", arg="amount", max_total=100, window=DAY)], store=store)
    wal = FileWAL(tmp_path / "saga.wal")

    class Later(Exception):
        pass

    try:
        for _ in range(3):  # charge -> refund -> charge ... is what a limit exists to stop
            try:
                async with saga_scope(wal, gate=gate) as saga:
                    await saga.execute(
                        "stripe.charge", C, lambda: {"id": "ch_1"},
                        lambda r: Compensation(fn=lambda: refunds.append(r["id"]), handler="stripe.refund"),
                        policy_args={"amount": 40},
                    )
                    raise Later()
            except Later:
                pass
            except Exception as exc:  # the third charge is refused before anything happens
                assert type(exc).__name__ == "GateBlocked"
    finally:
        wal.close()
    assert refunds == ["ch_1", "ch_1"]
    assert used(store, "daily-spend") == 80, "gross authorised outflow, not net balance"


async def test_fails_closed_when_the_store_is_unreachable():
    class DownStore(InProcessLimitStore):
        def describe(self) -> str:
            return "RedisLimitStore(redis://10.0.0.9:6379/0)"

        async def debit(self, charges, debit_id, force=frozenset()):
            raise LimitStoreUnavailable(
                "limit store RedisLimitStore(redis://10.0.0.9:6379/0) is unreachable during debit (ConnectionError)",
                store=self.describe(),
            )

    gate = PreFlightGate(limits=[BudgetLimit("daily-spend", arg="amount", max_total=100, window=DAY)], store=DownStore())
    d = await gate.decide(req(1))
    assert d.verdict == "BLOCK" and not d.allowed and d.decided_by == "limit-store"
    assert "RedisLimitStore(redis://10.0.0.9:6379/0) is unreachable" in d.reason
    assert "fail closed" in d.reason and "nothing was debited" in d.reason


async def test_fails_closed_when_the_store_fails_in_any_other_way():
    class BrokenStore(InProcessLimitStore):
        async def declare(self, specs):
            raise RuntimeError("disk on fire")

    gate = PreFlightGate(limits=[RateLimit("velocity", 5, 60)], store=BrokenStore())
    d = await gate.decide(req())
    assert d.verdict == "BLOCK" and "InProcessLimitStore failed (RuntimeError: disk on fire)" in d.reason


@pytest.mark.parametrize(
    ("amount", "why"),
    [
        (_MISSING, "is missing"),
        ("4200", "not a number"),
        (None, "not a number"),
        (True, "not a number"),
        (-5, "negative"),
        (math.nan, "not a finite number"),
        (math.inf, "not a finite number"),
    ],
    ids=["missing", "string", "null", "bool", "negative", "nan", "infinite"],
)
async def test_fails_closed_when_the_amount_cannot_be_read_naming_the_arg_and_the_limit(store, amount, why):
    gate = PreFlightGate(limits=[BudgetLimit("daily-spend", arg="amount", max_total=100, window=DAY)], store=store)
    d = await gate.decide(req(amount))
    assert d.verdict == "BLOCK" and d.decided_by == "limit:daily-spend"
    assert "limit daily-spend cannot read policy argument 'amount'" in d.reason and why in d.reason
    assert used(store, "daily-spend") == 0


async def test_fails_closed_when_a_scope_cannot_read_its_key(store):
    gate = PreFlightGate(
        limits=[BudgetLimit("per-customer", arg="amount", max_total=100, window=DAY, scope=by_arg("customer_id"))],
        store=store,
    )
    d = await gate.decide(req(1))
    assert d.verdict == "BLOCK" and d.decided_by == "limit:per-customer"
    assert "'customer_id'" in d.reason and "missing" in d.reason


async def test_fails_closed_when_an_escalation_has_no_approver(store):
    gate = PreFlightGate(
        limits=[BudgetLimit("wire-ceiling", arg="amount", max_total=100, window=DAY, escalate_to_human=True)],
        store=store,
    )
    assert (await gate.decide(req(100))).allowed
    d = await gate.decide(req(1))
    assert d.verdict == "BLOCK" and d.decided_by == "limit:wire-ceiling"
    assert "an exhausted budget with no approver" in d.reason
    assert used(store, "wire-ceiling") == 100


async def test_over_budget_with_escalate_to_human_requires_approval_and_an_approved_call_is_debited(store):
    approver = Approver(approved=True, approver="director@corp", note="quarter end")
    gate = PreFlightGate(
        limits=[BudgetLimit("wire-ceiling", arg="amount", max_total=250_000, window=DAY, escalate_to_human=True)],
        approval_provider=approver, store=store,
    )
    assert (await gate.decide(req(200_000))).allowed
    assert approver.asked == []
    d = await gate.decide(req(80_000))
    assert d.verdict == "REQUIRE_APPROVAL" and d.allowed
    assert d.decided_by == "limit:wire-ceiling" and "approved by director@corp" in d.reason
    assert d.approval is not None and d.approval.approver == "director@corp"
    (_, pending), = approver.asked
    assert pending.decided_by == "limit:wire-ceiling" and "escalates to a human" in pending.reason
    assert used(store, "wire-ceiling") == 280_000, "approved spend is authorised spend"
    assert d.detail["charges"][0]["forced"] is True


async def test_over_budget_with_escalate_to_human_denied_is_not_debited(store):
    approver = Approver(approved=False)
    gate = PreFlightGate(
        limits=[BudgetLimit("wire-ceiling", arg="amount", max_total=100, window=DAY, escalate_to_human=True)],
        approval_provider=approver, store=store,
    )
    assert (await gate.decide(req(90))).allowed
    d = await gate.decide(req(20))
    assert d.verdict == "REQUIRE_APPROVAL" and not d.allowed
    assert used(store, "wire-ceiling") == 90


async def test_an_approved_escalation_still_respects_limits_that_do_not_escalate(store):
    gate = PreFlightGate(
        limits=[
            BudgetLimit("ceiling", arg="amount", max_total=100, window=DAY, escalate_to_human=True),
            RateLimit("velocity", max_calls=1, window=60),
        ],
        approval_provider=Approver(), store=store,
    )
    assert (await gate.decide(req(100))).allowed
    d = await gate.decide(req(5))
    assert d.verdict == "BLOCK" and d.decided_by == "limit:velocity"
    assert used(store, "ceiling") == 100


async def test_a_hard_limit_refuses_even_when_another_limit_would_escalate(store):
    approver = Approver()
    gate = PreFlightGate(
        limits=[
            BudgetLimit("ceiling", arg="amount", max_total=10, window=DAY, escalate_to_human=True),
            BudgetLimit("hard", arg="amount", max_total=10, window=DAY),
        ],
        approval_provider=approver, store=store,
    )
    d = await gate.decide(req(11))
    assert d.verdict == "BLOCK" and d.decided_by == "limit:hard" and approver.asked == []


async def test_the_verdict_detail_is_plain_json_for_the_wal(store):
    gate = PreFlightGate(
        limits=[BudgetLimit("daily-spend", arg="amount", max_total=100, window=DAY), RateLimit("v", 9, 60, scope=by_tool)],
        approval_provider=Approver(), store=store,
    )
    d = await gate.decide(req(12.5, tool="wire.send", sem=I))
    text = json.dumps(d.wal_fields(), allow_nan=False)
    doc = json.loads(text)
    assert doc["stage"] == "approval" and doc["detail"]["debited"] is True
    assert doc["detail"]["approval"]["approver"] == "risk@corp"
    assert [c["limit"] for c in doc["detail"]["charges"]] == ["daily-spend", "v"]


# --------------------------------------------------------------------------- stores
async def test_in_process_store_refund_is_exact_and_idempotent(store):
    charges = [Charge("a", "*", 5, 10, 60), Charge("b", "*", 1, 3, 60, kind="rate")]
    assert (await store.debit(charges, "d1")).ok
    await store.refund(charges, "d1")
    await store.refund(charges, "d1")
    await store.refund(charges, "never-debited")
    assert used(store, "a") == 0 and used(store, "b") == 0


async def test_in_process_store_a_repeated_debit_id_is_not_debited_twice(store):
    charges = [Charge("a", "*", 5, 10, 60)]
    assert (await store.debit(charges, "d1")).ok
    again = await store.debit(charges, "d1")
    assert again.ok and again.replayed
    assert used(store, "a") == 5


async def test_usage_reports_each_window_with_its_use(store, clock):
    gate = PreFlightGate(
        limits=[BudgetLimit("per-customer", arg="amount", max_total=100, window=60, scope=by_arg("customer_id"))],
        store=store,
    )
    await gate.decide(req(30, customer_id="a"))
    clock.now += 10
    await gate.decide(req(20, customer_id="a"))
    await gate.decide(req(5, customer_id="b"))
    rows = {u.key: u for u in await gate.usage()}
    assert set(rows) == {"customer_id=a", "customer_id=b"}
    assert rows["customer_id=a"].used == 50 and rows["customer_id=a"].entries == 2
    assert rows["customer_id=a"].remaining == 50 and rows["customer_id=a"].frees_in == pytest.approx(50)
    clock.now += 60  # every debit of a and b is now a full window old
    assert [u.key for u in await gate.usage()] == []


# --------------------------------------------------------------------------- misuse
def test_limits_validate_eagerly_with_messages_that_say_what_to_do():
    with pytest.raises(ConfigurationError, match="positive finite number"):
        BudgetLimit("x", arg="amount", max_total=0, window=60)
    with pytest.raises(ConfigurationError, match="max_calls must be a positive integer"):
        RateLimit("x", max_calls=0, window=60)
    with pytest.raises(ConfigurationError, match="limit name"):
        BudgetLimit("daily spend", arg="amount", max_total=1, window=60)
    with pytest.raises(ConfigurationError, match="by_tool is used without parentheses"):
        combine(by_tool, "customer_id")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="two limits are named 'a'"):
        PreFlightGate(limits=[RateLimit("a", 1, 1), RateLimit("a", 2, 2)])


async def test_in_process_store_forgets_idle_windows(store, clock):
    gate = PreFlightGate(
        limits=[BudgetLimit("per-customer", arg="amount", max_total=10, window=60, scope=by_arg("customer_id"))],
        store=store,
    )
    for i in range(4000):
        assert (await gate.decide(req(1, customer_id=f"c{i}"))).allowed
    assert len(store._windows) == 4000
    clock.now += 60
    for i in range(100):
        assert (await gate.decide(req(1, customer_id=f"new{i}"))).allowed
    assert len(store._windows) < 200, "a million one-off customers must not stay in memory forever"
    assert (await gate.decide(req(10, customer_id="c1"))).allowed, "and an expired window is simply empty"


async def test_a_burst_of_first_calls_declares_the_limits_once():
    class CountingStore(InProcessLimitStore):
        declared = 0

        async def declare(self, specs):
            CountingStore.declared += 1
            await asyncio.sleep(0)  # in flight while the other calls arrive
            await super().declare(specs)

    store = CountingStore()
    gate = PreFlightGate(limits=[BudgetLimit("daily-spend", arg="amount", max_total=1_000, window=DAY)], store=store)
    decisions = await asyncio.gather(*(gate.decide(req(1)) for _ in range(50)))
    assert all(d.allowed for d in decisions) and CountingStore.declared == 1
    assert used(store, "daily-spend") == 50


async def test_a_failed_declaration_refuses_every_call_that_waited_for_it_and_the_next_call_declares_again():
    class FlakyStore(InProcessLimitStore):
        attempts = 0

        async def declare(self, specs):
            FlakyStore.attempts += 1
            await asyncio.sleep(0)
            if FlakyStore.attempts == 1:
                raise RuntimeError("disk on fire")
            await super().declare(specs)

    store = FlakyStore()
    gate = PreFlightGate(limits=[BudgetLimit("daily-spend", arg="amount", max_total=1_000, window=DAY)], store=store)
    first = await asyncio.gather(*(gate.decide(req(1)) for _ in range(5)))
    assert FlakyStore.attempts == 1
    assert all(d.verdict == "BLOCK" and "disk on fire" in d.reason for d in first)
    assert used(store, "daily-spend") == 0  # nothing debited for a refused call
    again = await gate.decide(req(1))
    assert again.allowed and FlakyStore.attempts == 2 and used(store, "daily-spend") == 1
