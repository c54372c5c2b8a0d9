"""Offline mesh sagas, properties (hypothesis): the G-Set merge of device records is
commutative, associative and idempotent, any sync order (partitions, duplicated
deliveries) converges to the same set, the merge never rewrites a record, every device's
chain verifies inside the merged view, and the display order does not depend on how the
view was reached. Then the failure paths: a tampered copy, a rewritten (forked) device
log, a deleted record, and conflicts between devices, each named with every side."""

from __future__ import annotations

import functools
from dataclasses import replace

from agent_saga.chain import seal
from agent_saga.mesh import MESH_CLAIM, MeshView, RecordSet, fingerprint
from agent_saga.records import GENESIS, Record, encode_line
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# Deterministic examples, no per-example deadline, and no timing-based health check: the
# suite runs on loaded machines, and a slow example is not a failed property.
PROPS = settings(max_examples=50, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow])


def chain(device: str, steps: list[tuple[str, str, str | None, dict]], *, clock0: int = 0,
          salt: bytes = b"\x01" * 16) -> list[Record]:
    """A sealed, stamped device chain, as MeshWAL writes it (fixed salt: reproducible)."""
    out: list[Record] = []
    prev = GENESIS
    for i, (type_, saga, step, payload) in enumerate(steps, start=1):
        p = dict(payload)
        p["mesh"] = {"device": device, "lamport": clock0 + i}
        rec = Record(type_, saga, step, p, seq=i, ts=1_764_000_000_000_000 + i)
        seal(rec, prev, salt)
        prev = rec.hash
        out.append(rec)
    return out


def own_saga(device: str, n: int) -> list[tuple[str, str, str | None, dict]]:
    s = f"{device}-s"
    body = [("SAGA_STARTED", s, None, {"name": "pay"})]
    body += [("STEP_COMMITTED", s, f"{s}/{k}", {"k": k}) for k in range(n)]
    return body + [("SAGA_COMPLETED", s, None, {})]


@functools.cache
def honest(n_devices: int, length: int) -> dict[str, list[Record]]:
    """Each device ran its own saga offline: no conflicts."""
    return {f"dev-{d}": chain(f"dev-{d}", own_saga(f"dev-{d}", length), clock0=d * 3)
            for d in range(n_devices)}


def all_records(devs: dict[str, list[Record]]) -> list[tuple[str, Record]]:
    return [(d, r) for d, recs in devs.items() for r in recs]


@st.composite
def replicas(draw: st.DrawFn, k: int = 3) -> tuple[dict[str, list[Record]], list[RecordSet]]:
    devs = honest(draw(st.integers(1, 3)), draw(st.integers(0, 4)))
    items = all_records(devs)
    sets = []
    for _ in range(k):
        picked = draw(st.lists(st.sampled_from(items), max_size=len(items) + 2)) if items else []
        sets.append(RecordSet(picked))  # any subset, with duplicates: a partition, a re-send
    return devs, sets


@PROPS
@given(replicas())
def test_merge_is_commutative_associative_and_idempotent(x) -> None:
    _devs, (a, b, c) = x
    assert a | b == b | a
    assert (a | b) | c == a | (b | c)
    assert a | a == a and (a | b) | b == a | b
    assert len(a | b) <= len(a) + len(b)
    assert (a | b).keys() == a.keys() | b.keys()


@PROPS
@given(x=replicas(k=4), data=st.data())
def test_any_sync_order_converges_and_never_rewrites_a_record(x, data: st.DataObject) -> None:
    devs, start = x
    # Every device's full log is on the replica of its own device's partition (replica i).
    origin = RecordSet(all_records(devs))
    reps = [s | (origin if i == 0 else RecordSet()) for i, s in enumerate(start)]
    # Random pairwise syncs (one-way pulls), repeated and duplicated...
    for _ in range(data.draw(st.integers(0, 12))):
        i, j = data.draw(st.integers(0, 3)), data.draw(st.integers(0, 3))
        reps[i] = reps[i] | reps[j]
    # ...then a gossip round in a random order reaches everyone twice.
    order = data.draw(st.permutations(range(4)))
    for _ in range(2):
        for i, j in zip(order, order[1:] + order[:1], strict=True):
            reps[j] = reps[j] | reps[i]
    assert all(r == origin for r in reps)
    lines = {encode_line(r) for _d, r in all_records(devs)}
    for _key, rec in reps[-1].items():
        assert encode_line(rec) in lines  # byte for byte what the device wrote
    views = [MeshView(r) for r in reps]
    assert all(v.ok for v in views), [c.describe() for c in views[0].conflicts]
    orders = [[(d, r.seq, r.hash) for d, r in v.ordered()] for v in views]
    assert all(o == orders[0] for o in orders)


@PROPS
@given(replicas())
def test_each_device_chain_verifies_in_the_merged_view_and_the_order_is_causal(x) -> None:
    devs, _ = x
    merged = RecordSet(all_records(devs))
    view = MeshView(merged)
    assert set(view.chains) == set(devs)
    for d, recs in devs.items():
        res = view.chains[d]
        assert res.ok and res.records == len(recs) and res.head == recs[-1].hash, res
    order = view.ordered()
    clocks = [r.payload["mesh"]["lamport"] for _d, r in order]
    assert clocks == sorted(clocks)
    for d in devs:
        assert [r.seq for dd, r in order if dd == d] == sorted(r.seq for r in devs[d])


def test_a_tampered_copy_is_kept_beside_the_original_and_named() -> None:
    recs = chain("dev-a", own_saga("dev-a", 3))
    forged = replace(recs[2], payload={**recs[2].payload, "k": 999})
    view = MeshView(RecordSet(("dev-a", r) for r in recs) | RecordSet([("dev-a", forged)]))
    assert not view.ok
    (fork,) = [c for c in view.conflicts if c.kind == "fork"]
    assert fork.subject == "device dev-a has 2 versions of seq 3"
    problems = sorted((s.problem or "") for s in fork.sides)
    assert problems[0] == "" and "payload does not match its digest" in problems[1]
    res = view.chains["dev-a"]
    assert not res.ok and res.first_bad_seq == 3 and "a copy was tampered with" in (res.reason or "")
    assert res.location == "device dev-a seq 3"


def test_a_rewritten_device_log_is_a_fork_with_both_sides_intact() -> None:
    a = chain("dev-a", own_saga("dev-a", 3))
    b = chain("dev-a", own_saga("dev-a", 1) + [("STEP_COMMITTED", "x", "x/0", {})], salt=b"\x02" * 16)
    view = MeshView(RecordSet(("dev-a", r) for r in a + b))
    forks = [c for c in view.conflicts if c.kind == "fork"]
    assert forks and all(s.problem is None for c in forks for s in c.sides)
    assert {len(c.sides) for c in forks} == {2}
    res = view.chains["dev-a"]
    assert res.first_bad_seq == 1 and "two writers used its id" in (res.reason or ""), res


def test_a_record_missing_from_a_device_chain_is_named() -> None:
    recs = chain("dev-a", own_saga("dev-a", 3))
    view = MeshView(RecordSet(("dev-a", r) for r in recs if r.seq != 2))
    res = view.chains["dev-a"]
    assert not res.ok and res.first_bad_seq == 3 and "records 2 are missing" in (res.reason or "")


def test_conflicts_between_devices_surface_with_every_side() -> None:
    a = chain("dev-a", [
        ("SAGA_STARTED", "trip", None, {}),
        (MESH_CLAIM, "trip", None, {"entity": "seat-12A"}),
        ("STEP_COMMITTED", "trip", "trip/0", {"tool": "book"}),
        ("SAGA_COMPLETED", "trip", None, {}),
    ])
    b = chain("dev-b", [
        ("SAGA_STARTED", "trip", None, {}),
        (MESH_CLAIM, "other", None, {"entity": "seat-12A"}),
        ("STEP_COMMITTED", "trip", "trip/0", {"tool": "book"}),
        ("SAGA_ROLLED_BACK", "trip", None, {}),
    ])
    view = MeshView(RecordSet([("dev-a", r) for r in a] + [("dev-b", r) for r in b]))
    assert all(r.ok for r in view.chains.values())  # the chains are fine: the sagas clash
    kinds = {c.kind: c for c in view.conflicts}
    assert set(kinds) == {"saga", "step", "outcome", "entity"}
    assert kinds["step"].subject == "saga trip step trip/0 was acted on by 2 devices"
    assert [s.device for s in kinds["step"].sides] == ["dev-a", "dev-b"]
    assert {s.type for s in kinds["outcome"].sides} == {"SAGA_COMPLETED", "SAGA_ROLLED_BACK"}
    assert {(s.device, s.saga) for s in kinds["entity"].sides} == {("dev-a", "trip"), ("dev-b", "other")}
    assert not view.ok
    text = "\n".join(c.describe() for c in view.conflicts)
    assert "CONFLICT entity: entity seat-12A was claimed 2 times" in text


def test_identity_ignores_backend_stamps_but_not_content() -> None:
    (rec,) = chain("dev-a", [("X", "s", None, {})])
    stamped = replace(rec, extra={"gseq": 7, "writer": "w"})
    assert fingerprint(rec) == fingerprint(stamped)
    assert RecordSet([("dev-a", rec)]) == RecordSet([("dev-a", stamped)])
    other = replace(rec, ts=rec.ts + 1)
    assert fingerprint(rec) != fingerprint(other)
