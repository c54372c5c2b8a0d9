"""``process_identity()``: one reading of host, pid and pod, and the formats derived from it
exactly as they were written before there was one (each is persisted or compared: records'
``seen_by``, agent identities and their writer ids, service writer and daemon ids)."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

import pytest
from agent_saga._identity import ProcessIdentity, process_identity, safe_name
from agent_saga.heartbeat._writer import pod_name
from agent_saga.recovery.claims import FileClaimLock
from agent_saga.recovery.daemon import default_daemon_id
from agent_saga.wal.batching import default_writer_id
from agent_saga.wal.writers import identity_writer, local_identity

HOSTS = ["agent-7f9c-xk2p", "node-1.cluster.local", "with space/and:colon", "x" * 150, "", "émigré-ü"]


def test_it_reads_the_host_name_the_pid_and_the_pod_in_that_order_of_precedence() -> None:
    me = process_identity(env={})
    assert (me.host, me.pid, me.pod) == (socket.gethostname(), os.getpid(), socket.gethostname())
    assert process_identity(env={"POD_NAME": "from-env"}).pod == "from-env"
    assert process_identity("given", env={"POD_NAME": "from-env"}).pod == "given"
    assert process_identity("", env={"POD_NAME": ""}).pod == socket.gethostname()


def test_the_environment_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "pod-from-downward-api")
    assert process_identity().pod == "pod-from-downward-api"


@pytest.mark.parametrize("host", HOSTS)
def test_seen_by_and_short_host_are_as_before(host: str) -> None:
    me = ProcessIdentity(host, 4242, host)
    assert me.seen_by == f"{host}:{4242}"
    assert me.short_host == host.split(".")[0]


@pytest.mark.parametrize("pod", HOSTS)
def test_an_identitys_pod_is_as_before(pod: str) -> None:
    assert ProcessIdentity("h", 1, pod).pod_name == re.sub(r"[^A-Za-z0-9._-]", "-", pod) == safe_name(pod)


@pytest.mark.parametrize("host", HOSTS)
def test_a_service_writer_id_is_as_before(host: str) -> None:
    before = re.sub(r"[^A-Za-z0-9._-]", "-", host)[:100] or "host"
    assert re.fullmatch(re.escape(f"{before}-4242-") + "[0-9a-f]{6}", ProcessIdentity(host, 4242, host).unique_id())


@pytest.mark.parametrize("host", [h for h in HOSTS if h.isascii()])
def test_a_daemon_id_is_as_before_for_every_ascii_host_name(host: str) -> None:
    before = "".join(c if c.isalnum() or c in "._-" else "-" for c in host)[:60] or "host"
    got = ProcessIdentity(host, 4242, host).unique_id("recovery-", host_chars=60)
    assert re.fullmatch(re.escape(f"recovery-{before}-4242-") + "[0-9a-f]{6}", got)


def test_a_non_ascii_host_name_gives_a_daemon_id_a_writer_id_can_hold() -> None:
    # Before, letters such as "é" stayed in a daemon id; ids carry fresh randomness, so no
    # one recomputes one to compare it, and now every one matches the WAL's id pattern.
    got = ProcessIdentity("émigré", 1, "p").unique_id("recovery-", host_chars=60)
    assert re.fullmatch(r"recovery--migr--1-[0-9a-f]{6}", got)


def test_two_instances_of_one_process_differ() -> None:
    me = process_identity()
    assert me.instance() != me.instance()
    assert re.fullmatch(rf"{os.getpid()}-[0-9a-f]{{6}}", me.instance())


def test_the_callers_derive_their_names_from_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("POD_NAME", "agent-0/x")
    host, pid = socket.gethostname(), os.getpid()
    assert local_identity("ns") == "ns/agent-0-x"
    assert local_identity("ns", "given") == "ns/given"
    assert pod_name() == "agent-0-x" and pod_name("given") == "given"
    assert re.fullmatch(rf"ns/p@{pid}-[0-9a-f]{{6}}", identity_writer("ns/p"))
    assert identity_writer("ns/p", "fixed") == "ns/p@fixed"
    safe = re.escape(re.sub(r"[^A-Za-z0-9._-]", "-", host)[:100] or "host")
    assert re.fullmatch(rf"{safe}-{pid}-[0-9a-f]{{6}}", default_writer_id())
    assert re.fullmatch(rf"recovery-.+-{pid}-[0-9a-f]{{6}}", default_daemon_id())
    assert FileClaimLock(str(tmp_path)).owner == f"pid{pid}"


def test_an_approval_gateway_and_the_policy_plane_give_an_agent_the_same_default_name(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # A SagaPolicy's appliesTo.agents and an Approval's agent must name the same agent: on
    # a host whose name has dots, both default to the part before the first one.
    from agent_saga.controls import ApprovalGateway, ApprovalPolicy, FileApprovalStore
    from agent_saga.plane import PlaneSettings
    from agent_saga.wal.file import FileWAL

    monkeypatch.setattr(socket, "gethostname", lambda: "node-1.cluster.local")
    monkeypatch.delenv("AGENT_SAGA_AGENT", raising=False)
    settings = PlaneSettings.from_env({"AGENT_SAGA_REDIS_URL": "redis://127.0.0.1:6379/0",
                                       "AGENT_SAGA_NAMESPACE": "payments"})
    wal = FileWAL(tmp_path / "wal.jsonl")
    try:
        gateway = ApprovalGateway(FileApprovalStore(tmp_path / "approvals"), None, wal, ApprovalPolicy(timeout=60))
    finally:
        wal.close()
    assert settings is not None and settings.agent == gateway.agent == "node-1"
