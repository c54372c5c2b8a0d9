"""Every command that reads an encrypted log takes the key the same way: ``--wal-key-file``,
``AGENT_SAGA_WAL_KEY_FILE`` or ``AGENT_SAGA_WAL_KEY`` (one helper: ``audit.keys``), and says
what is really wrong when the key is missing or is not the right one."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_saga import FileWAL
from agent_saga.audit import EncryptedWAL, new_wal_key
from agent_saga.audit.encryption import AESGCMEncryptor, Keyring
from verified_support import Env, write_orphan

KEY = new_wal_key("k1")


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


def encrypted_orphan(path: Path, key: str = KEY) -> Path:
    wal = EncryptedWAL(FileWAL(path), AESGCMEncryptor(Keyring.parse(key)))
    try:
        write_orphan(wal, "s1", "ch_secret")
    finally:
        wal.close()
    assert b"ch_secret" not in path.read_bytes()  # the kwargs are sealed on disk
    return path


def key_file(env: Env, text: str = KEY, name: str = "wal.key") -> Path:
    p = env.dir / name
    p.write_text(text + "\n")
    return p


@pytest.mark.parametrize("how", ["variable", "key file", "key file variable"])
def test_recover_reads_the_key_like_certify(env: Env, how: str) -> None:
    wal = encrypted_orphan(env.dir / "a.wal")
    args: list[str] = []
    extra: dict[str, str] = {}
    if how == "variable":
        extra["AGENT_SAGA_WAL_KEY"] = KEY
    elif how == "key file":
        args = ["--wal-key-file", str(key_file(env))]
    else:
        extra["AGENT_SAGA_WAL_KEY_FILE"] = str(key_file(env))
    r = env.recover("--wal-path", str(wal), *args, extra_env=extra)
    assert r.returncode == 0, r.stdout + r.stderr
    assert [c["charge_id"] for c in env.calls()] == ["ch_secret"]
    # The daemon's own records went in encrypted, and certify reads them with the same key.
    r = env.cli("certify", "--wal-path", str(wal), *args, extra_env=extra)
    assert r.returncode == 0 and r.stdout.startswith("CERTIFIED"), r.stdout + r.stderr
    assert b"ch_secret" not in wal.read_bytes()


@pytest.mark.parametrize("how", ["variable", "key file"])
def test_recoveryd_once_reads_the_key(env: Env, how: str) -> None:
    wal = encrypted_orphan(env.dir / "a.wal")
    args = ["--wal-key-file", str(key_file(env))] if how == "key file" else []
    extra = {"AGENT_SAGA_WAL_KEY": KEY} if how == "variable" else {}
    r = env.recoveryd_once("--wal-path", str(wal), *args, extra_env=extra)
    assert r.returncode == 0, r.stdout + r.stderr
    assert [c["charge_id"] for c in env.calls()] == ["ch_secret"]


def test_no_key_names_every_way_to_give_one(env: Env) -> None:
    wal = encrypted_orphan(env.dir / "a.wal")
    r = env.recover("--wal-path", str(wal))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no key was given: set AGENT_SAGA_WAL_KEY, or name a key file (--wal-key-file or AGENT_SAGA_WAL_KEY_FILE)" in r.stdout
    r = env.recoveryd_once("--wal-path", str(wal))
    assert r.returncode == 2 and "no key was given" in r.stdout + r.stderr
    assert env.calls() == []


def test_a_key_with_another_id_says_which_keys_were_read_and_from_where(env: Env) -> None:
    wal = encrypted_orphan(env.dir / "a.wal")
    r = env.recover("--wal-path", str(wal), extra_env={"AGENT_SAGA_WAL_KEY": new_wal_key("k2")})
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no key with id 'k1': the keys read from AGENT_SAGA_WAL_KEY are ['k2']" in r.stdout
    assert env.calls() == []


def test_a_wrong_key_under_the_right_id_says_the_key_is_not_the_one_written_with(env: Env) -> None:
    wal = encrypted_orphan(env.dir / "a.wal")
    wrong = key_file(env, new_wal_key("k1"), "wrong.key")
    r = env.recover("--wal-path", str(wal), "--wal-key-file", str(wrong))
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"the key 'k1' read from key file '{wrong}' is not the one it was written with" in r.stdout
    assert env.calls() == []


def test_a_key_file_that_cannot_be_read_or_holds_no_key_is_a_usage_error(env: Env) -> None:
    wal = encrypted_orphan(env.dir / "a.wal")
    missing = env.dir / "nope.key"
    for cmd in (["recover", "--wal-path", str(wal)], ["certify", "--wal-path", str(wal)], ["inspect", "--wal-path", str(wal)]):
        r = env.cli(*cmd, "--wal-key-file", str(missing))
        assert r.returncode == 2, r.stdout + r.stderr
        assert f"cannot read the WAL key file '{missing}': No such file or directory" in r.stderr
    r = env.cli("recover", "--wal-path", str(wal), "--wal-key-file", str(key_file(env, "", "empty.key")))
    assert r.returncode == 2 and "is empty" in r.stderr
    r = env.cli("recover", "--wal-path", str(wal), "--wal-key-file", str(key_file(env, "k1:not base64!", "bad.key")))
    assert r.returncode == 2 and "entry 1 is not base64" in r.stderr and "bad.key" in r.stderr
    r = env.recoveryd_once("--wal-path", str(wal), "--wal-key-file", str(missing))
    assert r.returncode == 2 and "cannot read the WAL key file" in r.stdout + r.stderr
    assert env.calls() == []


def test_inspect_reads_the_key_or_says_what_it_could_not_show(env: Env) -> None:
    wal = encrypted_orphan(env.dir / "a.wal")
    r = env.cli("inspect", "--wal-path", str(wal), "--saga", "s1")
    assert r.returncode == 0
    assert "records are encrypted and no key was given" in r.stdout and "pay.charge" not in r.stdout
    r = env.cli("inspect", "--wal-path", str(wal), "--saga", "s1", "--wal-key-file", str(key_file(env)))
    assert r.returncode == 0 and "pay.charge" in r.stdout and "undo: ledger.refund" in r.stdout
    assert "encrypted" not in r.stdout
