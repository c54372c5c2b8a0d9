"""Approver names that could pass for another are refused, at enrolment (the real CLI:
``keygen approver --approver``, ``approvals keys enrol``) and by the check itself."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_saga.controls.approvals import TrustedKeys
from agent_saga.controls.approvals._names import name_problem
from fixtures.cli import cli_module as cli


@pytest.mark.parametrize(("name", "why"), [
    ("\u0441fo@corp", "Cyrillic Small Letter Es (U+0441), which looks like the Latin 'c'"),
    ("risk@c\u03bfrp", "Greek Small Letter Omicron (U+03BF), which looks like the Latin 'o'"),
    ("\uff43fo@corp", "not in Unicode normal form NFKC (it would read as 'cfo@corp')"),
    ("cfo\u200b@corp", "invisible or control character U+200B"),
    ("\u0436\u0438\u043b@corp", "mixes letters of the Cyrillic and Latin scripts"),
    ("\u5f20\u0436", "mixes letters of the Cyrillic and Han scripts"),
    ("\u3042\ud55c", "mixes letters of the Hangul and Hiragana scripts"),  # no language writes both
    ("", "it is empty"),
])
def test_look_alike_names_are_refused_saying_why(name: str, why: str) -> None:
    assert why in (name_problem(name) or ""), name_problem(name)


@pytest.mark.parametrize("name", ["risk@corp", "Risk Team", "o'brien@corp.example", "\u0436\u0438\u043b", "\u5f20\u4f1f",
                                  # the scripts a language writes together, with a Latin address
                                  "\u7530\u4e2d\u3055\u3093@corp", "\u30bf\u30ca\u30ab\u592a\u90ce",
                                  "\u5f20\u4f1f@corp", "\uae40\u6c11\uc218@corp"])
def test_plain_names_in_one_script_are_accepted(name: str) -> None:
    assert name_problem(name) is None


def test_keygen_binds_the_key_to_its_approver_and_refuses_a_look_alike(tmp_path: Path) -> None:
    out = cli("keygen", "approver", "--approver", "\u0441fo@corp", "--out", str(tmp_path / "bad.pem"))
    assert out.returncode == 2 and "Cyrillic Small Letter Es" in out.stderr, out
    assert not (tmp_path / "bad.pem").exists()
    out = cli("keygen", "approver", "--approver", "risk@corp", "--out", str(tmp_path / "risk.pem"))
    assert out.returncode == 0 and "it approves as risk@corp" in out.stdout, out
    pub = (tmp_path / "risk.pem.pub").read_text()
    assert pub.startswith("Approver: risk@corp\n-----BEGIN PUBLIC KEY-----")
    keys = TrustedKeys.from_path(tmp_path / "risk.pem.pub")
    (kid,) = keys.key_ids
    assert keys.approvers(kid) == ("risk@corp",)


def test_enrolling_a_passkey_for_a_look_alike_name_is_refused(tmp_path: Path) -> None:
    assert cli("keygen", "approver", "--out", str(tmp_path / "k.pem")).returncode == 0
    ring = tmp_path / "keyring.json"
    out = cli("approvals", "keys", "enrol", "--keyring", str(ring), "--approver", "\u0441fo@corp",
              "--public-key", str(tmp_path / "k.pem.pub"), "--by", "soc@corp")
    assert out.returncode == 2 and "Cyrillic Small Letter Es" in out.stderr, out
    assert not ring.exists()
