"""Predictive pre-execution (``Speculator``): properties over random intents, tools,
arguments and lease tampering (hypothesis), plus the roll-back of what nobody redeemed
and the WAL's record of it (a real FileWAL). A forged, altered, stale, cross-intent,
other-action or spent lease never yields a result; a non-REVERSIBLE step never runs."""

from __future__ import annotations

import asyncio
import base64
import json
from dataclasses import replace
from pathlib import Path

import pytest
from agent_saga.clocks import ManualClock
from agent_saga.errors import ConfigurationError, SagaRefused
from agent_saga.speculation import Lease, SpeculationRefused, Speculator, arguments_digest
from agent_saga.wal.file import FileWAL
from engine_support import read
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

names = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF), min_size=1, max_size=12)
values = st.one_of(st.integers(-10**6, 10**6), st.text(max_size=8), st.booleans(), st.none())
arg_maps = st.dictionaries(st.text(st.characters(min_codepoint=97, max_codepoint=122), min_size=1, max_size=6),
                           values, max_size=4)
FIELDS = ("lease_id", "intent", "tool", "args_digest", "expires_at", "tag")
PROPS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def run(coro):
    return asyncio.run(coro)


def echo(**kw):
    return {"ran_with": kw}


async def _refusal(spec: Speculator, lease, **ask) -> str:
    with pytest.raises(SpeculationRefused) as info:
        await spec.redeem(lease, **ask)
    return info.value.code


def _tamper(lease: Lease, field: str, salt: str) -> Lease:
    if field == "expires_at":
        return replace(lease, expires_at=lease.expires_at + 1 + len(salt))
    value = getattr(lease, field)
    return replace(lease, **{field: value[:-1] + ("0" if value[-1:] != "0" else "1") if field == "tag"
                             else value + salt})


@PROPS
@given(intent=names, tool=names, args=arg_maps, field=st.sampled_from(FIELDS), salt=names,
       as_token=st.booleans())
def test_an_altered_lease_never_redeems_and_the_genuine_one_redeems_exactly_once(
        intent, tool, args, field, salt, as_token):
    async def go() -> None:
        clock = ManualClock()
        spec = Speculator(ttl=30, clock=clock)
        lease = await spec.speculate(intent, tool, echo, args, semantics="REVERSIBLE")
        forged = _tamper(lease, field, salt)
        assert await _refusal(spec, forged.token if as_token else forged,
                              intent=intent, tool=tool, args=args) == "forged"
        assert await spec.redeem(lease.token if as_token else lease, intent=intent, tool=tool, args=args) == {
            "ran_with": args}
        assert await _refusal(spec, lease, intent=intent, tool=tool, args=args) == "spent"
        assert spec.pending == 0
    run(go())


@PROPS
@given(intent=names, other=names, tool=names, args=arg_maps, extra=values)
def test_a_lease_serves_only_its_own_intent_tool_and_arguments(intent, other, tool, args, extra):
    async def go() -> None:
        spec = Speculator(ttl=30, clock=ManualClock())
        lease = await spec.speculate(intent, tool, echo, args, semantics="REVERSIBLE")
        if other != intent:
            assert await _refusal(spec, lease, intent=other, tool=tool, args=args) == "cross-intent"
        changed = {**args, "zz_extra": extra}
        assert await _refusal(spec, lease, intent=intent, tool=tool, args=changed) == "other-action"
        assert await _refusal(spec, lease, intent=intent, tool=tool + "x", args=args) == "other-action"
        assert spec.pending == 1, "a refused redemption leaves the result held (for its own intent)"
        assert await spec.redeem(lease, intent=intent, tool=tool, args=args) == {"ran_with": args}
    run(go())


@PROPS
@given(intent=names, tool=names, args=arg_maps, late=st.floats(0, 10_000, allow_nan=False))
def test_a_stale_lease_never_redeems_and_its_result_is_rolled_back(intent, tool, args, late):
    async def go() -> None:
        clock = ManualClock()
        undone: list = []
        spec = Speculator(ttl=5, clock=clock)
        lease = await spec.speculate(intent, tool, echo, args, semantics="REVERSIBLE", undo=undone.append)
        clock.advance(5 + late)
        assert await _refusal(spec, lease, intent=intent, tool=tool, args=args) == "stale"
        assert undone == [{"ran_with": args}] and spec.pending == 0
        assert await _refusal(spec, lease, intent=intent, tool=tool, args=args) == "spent"
    run(go())


@PROPS
@given(intent=names, tool=names, args=arg_maps)
def test_a_lease_from_another_speculator_is_forged(intent, tool, args):
    async def go() -> None:
        mine, theirs = Speculator(clock=ManualClock()), Speculator(clock=ManualClock())
        lease = await theirs.speculate(intent, tool, echo, args, semantics="REVERSIBLE")
        await mine.speculate(intent, tool, echo, args, semantics="REVERSIBLE")
        assert await _refusal(mine, lease, intent=intent, tool=tool, args=args) == "forged"
    run(go())


@pytest.mark.parametrize("semantics", ["COMPENSABLE", "IRREVERSIBLE", "irreversible", "bogus"])
async def test_a_step_that_is_not_reversible_is_refused_before_it_runs(semantics):
    ran: list = []
    spec = Speculator()
    with pytest.raises(SpeculationRefused) as info:
        await spec.speculate("i", "stripe.charge", lambda **kw: ran.append(kw), {"amount": 1}, semantics=semantics)
    assert info.value.code == "not-reversible" and "only REVERSIBLE" in info.value.message
    assert isinstance(info.value, SagaRefused) and ran == [] and spec.pending == 0


async def test_unredeemed_speculations_roll_back_once_and_the_wal_records_all_without_the_key(tmp_path: Path):
    key = b"k" * 16 + bytes(range(16))
    wal = FileWAL(tmp_path / "spec.wal")
    clock = ManualClock()
    undone: list = []

    async def async_undo(result) -> None:
        undone.append(result)

    try:
        spec = Speculator(key=key, ttl=10, wal=wal, clock=clock)
        kept = await spec.speculate("i-1", "search", echo, {"q": "a"}, semantics="REVERSIBLE", undo=undone.append)
        dropped = await spec.speculate("i-1", "search", echo, {"q": "b"}, semantics="REVERSIBLE", undo=async_undo)
        late = await spec.speculate("i-2", "quote", echo, {"sku": 1}, semantics="REVERSIBLE", undo=undone.append)
        left = await spec.speculate("i-3", "quote", echo, {"sku": 2}, semantics="REVERSIBLE", undo=undone.append)
        assert await spec.redeem(kept, intent="i-1", tool="search", args={"q": "a"}) == {"ran_with": {"q": "a"}}
        assert await spec.discard(dropped) and not await spec.discard(dropped)
        clock.advance(10)
        spec2 = await spec.sweep()
        assert spec2 == 2 and spec.pending == 0
        await spec.close()
        assert undone == [{"ran_with": {"q": "b"}}, {"ran_with": {"sku": 1}}, {"ran_with": {"sku": 2}}]
        with pytest.raises(SpeculationRefused):
            await spec.redeem(late, intent="i-2", tool="quote", args={"sku": 1})
        records = read(wal)
        kinds = [(r.type, r.payload.get("lease_id")) for r in records]
        assert kinds[:4] == [("SPECULATION_STARTED", x.lease_id) for x in (kept, dropped, late, left)]
        assert ("SPECULATION_REDEEMED", kept.lease_id) in kinds
        rolled = {r.payload["lease_id"]: r.payload["why"] for r in records if r.type == "SPECULATION_ROLLED_BACK"}
        assert rolled == {dropped.lease_id: "discarded", late.lease_id: "expired", left.lease_id: "expired"}
        text = json.dumps([r.payload for r in records])
        for form in (key.hex(), base64.b64encode(key).decode(), key.decode("latin-1")):
            assert form not in text
        assert "tag" not in text and kept.tag not in text, "the lease tag is not logged either"
        assert records[0].payload["args_digest"] == arguments_digest("search", {"q": "a"})
        assert "k" * 16 not in repr(spec)
    finally:
        wal.close()


async def test_a_failing_undo_is_recorded_not_hidden(tmp_path: Path):
    wal = FileWAL(tmp_path / "spec.wal")
    try:
        spec = Speculator(wal=wal)

        def boom(_):
            raise RuntimeError("cache gone")

        lease = await spec.speculate("i", "search", echo, {}, semantics="REVERSIBLE", undo=boom)
        await spec.close()
        (rb,) = [r.payload for r in read(wal) if r.type == "SPECULATION_ROLLED_BACK"]
        assert rb["lease_id"] == lease.lease_id and rb["undo_error"] == "RuntimeError: cache gone"
    finally:
        wal.close()


def test_bad_configuration_names_the_field():
    with pytest.raises(ConfigurationError, match="ttl"):
        Speculator(ttl=0)
    with pytest.raises(ConfigurationError, match="16 bytes"):
        Speculator(key=b"short")
    with pytest.raises(SpeculationRefused, match="cannot be read"):
        Lease.from_token("not-a-token")
