"""Approver names that cannot be mistaken for one another.

An approval names its approver, and a signing key is bound to the names it may approve
as. A name that merely *looks* like another (``сfo@corp`` with a Cyrillic ``с``, a
full-width ``ｃfo@corp``, a zero-width space inside) would pass a human's eye in a list,
a Slack message or an audit report. So every approver name is checked at enrolment (a
key's names, ``agent-saga keygen approver --approver``, ``approvals keys enrol``) and at
verification (the agent, before it accepts an approval):

- it is in Unicode normal form NFKC (full-width letters, ligatures and other
  compatibility forms are refused, not silently folded);
- it has no control, format (zero-width, bidirectional) or private-use characters;
- its letters come from one script (``Latin`` with ``Cyrillic`` is refused), or from one
  of the combinations a language writes with, as Unicode's "highly restrictive" level
  (UTS #39) allows: Latin with Han, Hiragana and Katakana (Japanese), with Han and
  Bopomofo (Chinese), with Han and Hangul (Korean) — so ``田中さん@corp`` is a name;
- it has no Cyrillic or Greek letter that looks like a Latin one (``а``, ``с``, ``ο``,
  ``Ρ`` ...), even in a name of that script alone (``аре`` reads as ``ape``).

Standard library only (``unicodedata``): the look-alike table below is explicit and small,
covering the scripts whose letters pass for Latin ones; names in other scripts are
accepted when they are in one script.
"""

from __future__ import annotations

import unicodedata

__all__ = ["LOOKALIKES", "name_problem"]

#: Cyrillic and Greek letters that look like Latin letters (the letter they pass for).
LOOKALIKES: dict[str, str] = {
    # Cyrillic
    "а": "a", "в": "B", "е": "e", "ё": "e", "з": "3", "і": "i", "ї": "i", "ј": "j", "к": "k", "м": "M",
    "н": "H", "о": "o", "п": "n", "р": "p", "с": "c", "т": "T", "у": "y", "х": "x", "ѕ": "s", "ԁ": "d",
    "ԛ": "q", "ԝ": "w", "һ": "h", "ӏ": "l", "ь": "b",
    "А": "A", "В": "B", "Е": "E", "Ё": "E", "З": "3", "І": "I", "Ї": "I", "Ј": "J", "К": "K", "М": "M",
    "Н": "H", "О": "O", "Р": "P", "С": "C", "Т": "T", "У": "Y", "Х": "X", "Ѕ": "S", "Ԁ": "D", "Ԛ": "Q",
    "Ԝ": "W", "Һ": "h", "Ӏ": "I",
    # Greek
    "α": "a", "β": "B", "γ": "y", "ε": "e", "ι": "i", "κ": "k", "ν": "v", "ο": "o", "ρ": "p", "τ": "t",
    "υ": "u", "χ": "x", "ϲ": "c", "ϳ": "j",
    "Α": "A", "Β": "B", "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M", "Ν": "N", "Ο": "O",
    "Ρ": "P", "Τ": "T", "Υ": "Y", "Χ": "X", "Ϲ": "C", "Ϳ": "J",
}

_SCRIPTS = ("LATIN", "CYRILLIC", "GREEK", "ARMENIAN", "HEBREW", "ARABIC", "DEVANAGARI", "THAI", "GEORGIAN",
            "HANGUL", "HIRAGANA", "KATAKANA", "CJK")


#: Scripts a name may mix: each set is a combination a language writes with (UTS #39's
#: "highly restrictive" level). Any other mix is refused.
_WRITTEN_TOGETHER = (
    frozenset({"LATIN", "HAN", "HIRAGANA", "KATAKANA"}),
    frozenset({"LATIN", "HAN", "BOPOMOFO"}),
    frozenset({"LATIN", "HAN", "HANGUL"}),
)


def _script(ch: str) -> str | None:
    """The script of a letter, from its Unicode name (``None``: not a letter)."""
    if not unicodedata.category(ch).startswith("L"):
        return None
    name = unicodedata.name(ch, "")
    for script in _SCRIPTS:
        if name.startswith(script):
            return "HAN" if script == "CJK" else script  # CJK UNIFIED IDEOGRAPH-...
    return name.split(" ", 1)[0] or "UNKNOWN"


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be an approver's name (it could pass for another), or ``None``."""
    if not isinstance(name, str) or not name.strip():
        return "it is empty"
    if name.isascii() and name.isprintable():
        return None  # plain ASCII: one script, NFKC already, nothing invisible
    if unicodedata.normalize("NFKC", name) != name:
        return (f"it is not in Unicode normal form NFKC (it would read as "
                f"{unicodedata.normalize('NFKC', name)!r}): write it with plain characters")
    for ch in name:
        if unicodedata.category(ch) in ("Cc", "Cf", "Co", "Cs", "Zl", "Zp"):
            return f"it holds the invisible or control character U+{ord(ch):04X}"
        if ch in LOOKALIKES:
            return (f"it holds {unicodedata.name(ch, 'a letter').title()} (U+{ord(ch):04X}), which looks like the "
                    f"Latin {LOOKALIKES[ch]!r}: a look-alike name could pass for another approver")
    scripts = sorted({s for s in map(_script, name) if s is not None})
    if len(scripts) > 1 and not any(together.issuperset(scripts) for together in _WRITTEN_TOGETHER):
        return (f"it mixes letters of the {' and '.join(s.title() for s in scripts)} scripts: a look-alike name "
                f"could pass for another approver")
    return None
