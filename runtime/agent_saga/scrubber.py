"""The secret scrubber: one detector for what looks like a credential, and what becomes of it.

Two uses of the same detector (docs/secrets.md is the user-facing policy):

- REFUSED at authoring time. Values the code hands over for the WAL (compensation kwargs,
  policy arguments: ``credentials.assert_no_secrets``) and ids that become record headers
  (saga ids and names, writer ids: ``records.validate_id``) raise ``SecretDetected`` naming
  the key path, never the value.
- REDACTED at the record codec boundary. ``scrub_payload`` runs on every payload as it is
  sealed into the chain (``chain.seal``, whatever wrote the record and whichever backend
  stores it) and before an ``EncryptedWAL`` encrypts one. A secret becomes ``[REDACTED]``
  and a warning names the record type, the saga and the key path (never the value).
  ``scrub_id`` does the same for a header id that slipped past authoring. Free text (keys
  in ``FREE_TEXT_KEYS``: descriptions, reasons, notes, messages, errors, tags) is scanned
  more widely, for ``password=...`` phrases and passwords in URLs too (``redact_text``,
  also applied to exception text before it is recorded).

What is a secret:

- a non-empty string under a key whose words (``apiKey``, ``X-Api-Key``, ``db_password``
  are split into words) include a STRONG word (password, pass, pwd, secret, token, auth,
  authorization, credentials, pin, cvv, otp, cookie ...) or pair (api key, private key,
  access key, signing key, card number ...); a last word from ``REFERENCE_SUFFIXES`` makes
  the key a reference or metadata instead (``credential_ref``, ``token_count``,
  ``auth_method``, ``password_hint``);
- a random-looking string (``looks_random``) under a key with a WEAK word (key, session,
  sig, hmac): ``{"key": "customer-42"}`` is not a secret, ``{"key": "q8Zr...T1w"}`` is;
- a string anywhere containing a well-known credential format (``VALUE_SHAPES``);
- everything under a STRONG key: ``{"password": {"new": "..."}}`` or
  ``{"tokens": [{"value": "..."}]}`` are secrets all the way down, except a string under a
  key that itself names a reference or metadata (``{"auth": {"method": "oauth"}}``);
- a mapping KEY that is itself a secret: one with a credential format
  (``{"sk_live_...": 1}``, an MCP argument named like a key), or a random-looking one under
  a key that names a credential or key material. The key becomes ``[REDACTED]``
  (``[REDACTED-2]``... if a payload has several), and the error or warning that names its
  path never shows it.

Invariants:
- Precise rather than greedy: idempotency keys, SHA-256 hex digests, UUIDs, charge ids,
  ISO timestamps and ordinary words are never flagged, under any key.
- ``scrub_payload`` never mutates its input: it returns the same object when nothing was
  found, else a copy with the secrets replaced (the caller may still hold the original).
- A payload that is an encryption envelope is left alone: it is ciphertext.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import re
from collections import Counter
from typing import Any

__all__ = [
    "FREE_TEXT_KEYS",
    "REDACTED",
    "key_is_reference",
    "key_looks_sensitive",
    "key_secret",
    "looks_random",
    "redact_text",
    "scrub_id",
    "scrub_payload",
    "secret_kind",
    "shown_key",
    "why_secret",
]

log = logging.getLogger("agent_saga.secrets")

REDACTED = "[REDACTED]"

_STRONG_WORDS = frozenset(
    {
        "password", "passwords", "passwd", "pwd", "pass", "passphrase", "passcode",
        "secret", "secrets", "token", "tokens", "authorization", "auth", "apikey", "apikeys",
        "credential", "credentials", "creds", "cred", "pin", "cvv", "cvv2", "cvc", "cvc2",
        "otp", "totp", "mfa", "cookie", "cookies", "bearer", "jwt", "privatekey",
    }
)
_STRONG_PAIRS = frozenset(
    {
        ("api", "key"), ("private", "key"), ("access", "key"), ("signing", "key"),
        ("encryption", "key"), ("master", "key"), ("account", "key"), ("session", "key"),
        ("card", "number"), ("security", "code"),
    }
)
_WEAK_WORDS = frozenset({"key", "keys", "session", "sig", "hmac"})
# A last word that turns the key into a reference to a credential, or metadata about one.
REFERENCE_SUFFIXES = frozenset(
    {
        "ref", "reference", "name", "id", "ids", "type", "kind", "path", "file", "url", "uri",
        "hint", "count", "length", "len", "ttl", "expiry", "expires", "at", "version",
        "env", "var", "field", "label", "arn", "method", "mode", "scheme", "provider",
        "required", "enabled", "status", "hash", "digest", "fingerprint", "algorithm",
        "alg", "policy", "strategy", "flow", "scope", "scopes", "realm", "domain", "user",
        "username", "email", "rotated", "used", "source", "store", "prefix", "suffix",
    }
)
#: Payload keys whose strings are free text, scanned for phrases as well as shapes.
FREE_TEXT_KEYS = frozenset(
    {
        "description", "reason", "reasons", "note", "notes", "message", "error", "comment", "detail",
        "details", "summary", "text", "title", "tags", "cause", "why",
    }
)
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")

#: Well-known credential formats: (what it is, pattern). Each is anchored on a prefix or
#: structure specific enough that ordinary values never match.
VALUE_SHAPES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("a Stripe secret key", re.compile(r"\b(?:sk|rk)_(?:live|test)_[0-9A-Za-z]{8,}")),
    ("an AWS access key id", re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA)[0-9A-Z]{16}\b")),
    ("a GitHub token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{36}\b|github_pat_[A-Za-z0-9_]{22,})")),
    ("a GitLab token", re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}")),
    ("a Slack token", re.compile(r"\bxox[a-z]-[A-Za-z0-9-]{10,}")),
    ("a Google API key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}")),
    ("an OpenAI or Anthropic key", re.compile(r"\bsk-(?:proj-|ant-|svcacct-)?[A-Za-z0-9_-]{32,}")),
    ("an npm token", re.compile(r"\bnpm_[A-Za-z0-9]{36}\b")),
    ("a PyPI token", re.compile(r"\bpypi-AgE[A-Za-z0-9_-]{50,}")),
    ("a SendGrid key", re.compile(r"\bSG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}")),
    ("a PEM private key", re.compile(
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----(?:[\s\S]*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----|[\s\S]*)")),
    ("a bearer token", re.compile(r"\b(?i:bearer)\s+[A-Za-z0-9._~+/=-]{16,}")),
    ("a basic-auth credential", re.compile(r"\b(?i:basic)\s+[A-Za-z0-9+/]{16,}={0,2}")),
    # Starts only where a run of its segment alphabet starts (not just at a word boundary,
    # which "-" also makes): otherwise "eyJ-eyJ-eyJ-..." starts a scan to the run's end at
    # every "eyJ", quadratic in the run's length.
    ("a JWT", re.compile(r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*")),
    # Anchored on "://" with one scheme character before it (the scheme itself is not
    # matched: a scan of "[A-Za-z0-9+.-]*" from every word start is quadratic on
    # "a.a.a.a...").
    # Not "user:***@" either: that is this library's own masked address (``_redis.Target.where``).
    ("a password in a URL", re.compile(r"(?<=[A-Za-z0-9+.-])://[^\s:/@]*:(?!\*\*\*@)[^\s@/]+@")),
)
_ANY_SHAPE = re.compile("|".join(f"(?:{p.pattern})" for _, p in VALUE_SHAPES))
# For substitution: a URL keeps all but its password (redacted by _URL_PASSWORD first).
_WHOLE_SHAPES = re.compile("|".join(f"(?:{p.pattern})" for k, p in VALUE_SHAPES if "URL" not in k))
_MIN_SHAPE = 12  # no shape matches a shorter string
# Literals one of which every shape contains: a string with none of them (almost every
# string) skips the regular expressions. ``in`` on a short string costs tens of ns.
_HINTS = (
    "sk_", "rk_", "AKIA", "ASIA", "AGPA", "AIDA", "AROA", "ghp_", "gho_", "ghu_", "ghs_",
    "ghr_", "github_pat_", "glpat-", "xox", "AIza", "sk-", "npm_", "pypi-", "SG.", "-----BEGIN",
    "eyJ", "://", "earer", "EARER", "asic", "ASIC",
)
# Free text: "password=hunter2", "api_key: abc", "token='xyz'" (the value is redacted).
_PHRASE = re.compile(
    r"(?i)\b((?:[a-z0-9]+[_-])?(?:pass(?:word|wd|phrase|code)?|pwd|secret|token|api[_-]?key|"
    r"access[_-]?key|private[_-]?key|auth(?:orization)?|credentials?|cvv|cvc|pin))"
    r"(\s*[:=]\s*)([\"']?)([^\s\"',;&]{3,})"
)
_URL_PASSWORD = re.compile(r"(?<=[A-Za-z0-9+.-])(://[^\s:/@]*:)(?!\*\*\*@)([^\s@/]+)(@)")
_TOKENISH = re.compile(r"[A-Za-z0-9+/=_.~-]+")
_HEXISH = re.compile(r"[0-9a-fA-F-]+")


@functools.lru_cache(maxsize=8192)
def _key_class(key: str) -> int:
    """2 for a key that names a credential, 1 for a weak one (key, session), else 0."""
    words = [w.lower() for w in _WORD_SPLIT.split(key) if w]
    if not words or words[-1] in REFERENCE_SUFFIXES:
        return 0
    if any(w in _STRONG_WORDS for w in words):
        return 2
    if any(pair in _STRONG_PAIRS for pair in zip(words, words[1:], strict=False)):
        return 2
    return 1 if any(w in _WEAK_WORDS for w in words) else 0


def key_looks_sensitive(key: str) -> bool:
    """True if a mapping key names a credential (see the module doc); references are not."""
    return _key_class(key) == 2


@functools.lru_cache(maxsize=8192)
def key_is_reference(key: str) -> bool:
    """True if a mapping key names a reference to a credential or metadata about one (its
    last word is in ``REFERENCE_SUFFIXES``: ``credential_ref``, ``type``, ``auth_method``)."""
    words = [w for w in _WORD_SPLIT.split(key) if w]
    return bool(words) and words[-1].lower() in REFERENCE_SUFFIXES


def _strong(key: object) -> bool:
    """Everything under ``key`` is secret (``key_looks_sensitive`` of a str key)."""
    return isinstance(key, str) and _key_class(key) == 2


def _under(key: object) -> bool:
    """Is a value under mapping key ``key`` of a secret container still secret?"""
    return not (isinstance(key, str) and key_is_reference(key))


@functools.lru_cache(maxsize=4096)
def _key_shape(key: str) -> str | None:
    return secret_kind(key)


def key_secret(key: object, parent: object = None, inside: bool = False) -> str | None:
    """Why the mapping key ``key`` is itself a secret, or ``None``: it has a credential
    format, or it looks random under ``parent`` (the key of its mapping) naming a credential
    or key material, or inside a secret container (``inside``)."""
    if not isinstance(key, str) or len(key) < _MIN_SHAPE:
        return None
    kind = _key_shape(key) if len(key) <= 256 else secret_kind(key)
    if kind is not None:
        return f"the key itself looks like {kind}"
    if (inside or (isinstance(parent, str) and _key_class(parent) > 0)) and looks_random(key):
        return "the key itself looks random under a key that names a credential or key material"
    return None


def shown_key(key: object, parent: object = None, inside: bool = False) -> object:
    """``key`` as an error message or a warning may show it: ``REDACTED`` if it is a secret."""
    return REDACTED if key_secret(key, parent, inside) is not None else key


def looks_random(value: str) -> bool:
    """True for a string that looks like key material: at least 20 characters of the
    base64/URL-safe alphabet mixing upper case, lower case and digits, not a hex digest or
    UUID, with a Shannon entropy of at least min(4.0, 0.8 * log2(length)) bits a character."""
    n = len(value)
    if n < 20 or _HEXISH.fullmatch(value) or not _TOKENISH.fullmatch(value):  # hex first: ids and keys
        return False
    if not (any(c.islower() for c in value) and any(c.isupper() for c in value)
            and any(c.isdigit() for c in value)):
        return False
    entropy = -sum(k / n * math.log2(k / n) for k in Counter(value).values())
    return entropy >= min(4.0, 0.8 * math.log2(n))


def _group_hints(hints: tuple[str, ...], gates: tuple[str, ...]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The hints grouped under a substring each of them contains (checked first: a text
    without ``"K"`` cannot contain ``"AKIA"``), each hint under the first gate it holds,
    the rest each under itself."""
    left = list(hints)
    groups = []
    for g in gates:
        members = tuple(h for h in left if g in h)
        left = [h for h in left if g not in h]
        if members:
            groups.append((g, members))
    return tuple(groups) + tuple((h, (h,)) for h in left)


# Gates of one character are searched with ``memchr`` (a scan of several characters is
# several times slower per byte), and most are characters JSON payloads seldom hold (a
# capital, "-", "/"): a payload's text without them skips their hints' scans. Same answer
# as scanning for every hint (a text without the gate cannot hold a hint that contains it).
_HINT_GROUPS = _group_hints(_HINTS, ("K", "I", "G", "R", "J", "-", "/", "x", "gh", "k_"))


def _hinted(value: str) -> bool:
    if len(value) < _MIN_SHAPE:
        return False
    contains = value.__contains__
    for gate, members in _HINT_GROUPS:
        if contains(gate) and any(map(contains, members)):
            return True
    return False


def texts_hinted(texts: list[str]) -> bool:
    """False only if none of ``texts`` holds a credential-format hint: one scan of their
    newline-joined text instead of one per text. Every text holding a hint makes the
    joined text hold it; a hint cannot span two texts, because none contains a newline
    (checked at import). For canonical JSON, which never holds a raw newline."""
    return _hinted("\n".join(texts))


if any("\n" in h for h in _HINTS):
    raise RuntimeError("scrubber: a credential hint contains a newline: revise texts_hinted")


def secret_kind(value: str) -> str | None:
    """Name the well-known credential format ``value`` contains, or ``None``."""
    if not _hinted(value) or _ANY_SHAPE.search(value) is None:
        return None
    for kind, pattern in VALUE_SHAPES:
        if pattern.search(value):
            return kind
    return "a credential"  # pragma: no cover - the combined pattern is the union


def why_secret(key: object, value: str) -> str | None:
    """Why ``value`` (under mapping key ``key``, or None) is a secret, or ``None``."""
    if not value:
        return None
    if isinstance(key, str):
        cls = _key_class(key)
        if cls == 2:
            return f"its key {key!r} names a credential"
        if cls == 1 and looks_random(value):
            return f"its key {key!r} names key material and the value looks random"
    kind = secret_kind(value)
    return None if kind is None else f"the value looks like {kind}"


def _redact_shapes(text: str) -> str:
    text = _URL_PASSWORD.sub(lambda m: f"{m.group(1)}{REDACTED}{m.group(3)}", text)
    return _WHOLE_SHAPES.sub(REDACTED, text)


def redact_text(text: str) -> str:
    """``text`` with every credential format, ``password=...`` phrase value and URL
    password replaced by ``[REDACTED]``. For free text (messages, notes, errors): it cannot
    know secrets that have no recognisable form, so never put secrets in errors."""
    if _hinted(text):
        text = _redact_shapes(text)
    if ":" not in text and "=" not in text:
        return text
    return _PHRASE.sub(lambda m: f"{m.group(1)}{m.group(2)}{m.group(3)}{REDACTED}", text)


def _scrub_str(key: object, value: str, free: bool, shapes: bool) -> str:
    cls = _key_class(key) if isinstance(key, str) else 0
    if cls == 2 or (cls == 1 and looks_random(value)):
        return REDACTED
    if free:
        return redact_text(value) if shapes or ":" in value or "=" in value else value
    return _redact_shapes(value) if shapes and secret_kind(value) else value


def _walk(obj: Any, key: object, free: bool, shapes: bool) -> Any:
    """``obj`` with its secrets replaced: the same object where nothing changed (the hot
    path allocates nothing). ``shapes`` is False when the whole payload's text holds no
    hint of a credential format, so strings are then checked by key name only (a dict
    by ``_walk_keys``)."""
    t = obj.__class__
    if t is str:
        return _scrub_str(key, obj, free, shapes) if obj else obj
    if (t is dict or t is list or t is tuple) and obj and key is not None and _strong(key):
        return _secret_tree(obj, free, shapes)  # everything under a credential's key is secret
    if t is dict:
        if not shapes:
            out = _walk_keys(obj, free)
            return _renamed(out, key, False) if isinstance(key, str) and _key_class(key) else out
        new: dict[str, Any] | None = None
        for k, v in obj.items():
            tv = v.__class__
            if tv is str:
                if not v:
                    continue
                sub = _scrub_str(k, v, free or k in FREE_TEXT_KEYS, True)
            elif tv is dict or tv is list or tv is tuple:
                sub = _walk(v, k, free or k in FREE_TEXT_KEYS, shapes)
            elif tv is int or tv is float or tv is bool or v is None or not isinstance(v, dict | list | tuple | str):
                continue
            else:  # a subclass of one of them
                sub = _walk(v, k, free or k in FREE_TEXT_KEYS, shapes)
            if sub is not v:
                if new is None:
                    new = dict(obj)
                new[k] = sub
        return _renamed(obj if new is None else new, key, False)
    if t is list or t is tuple:
        items: list[Any] | None = None
        # Strings that _scrub_str would return unchanged whatever they say (checked once).
        inert = not (shapes or free) and (not isinstance(key, str) or _key_class(key) == 0)
        for i, v in enumerate(obj):
            if inert and v.__class__ is str:
                continue
            # A list inherits its key: {"tokens": ["..."]} is still a list of tokens.
            sub = _walk(v, key, free, shapes)
            if sub is not v:
                if items is None:
                    items = list(obj)
                items[i] = sub
        return obj if items is None else items
    # A subclass (OrderedDict, defaultdict, a StrEnum member) is encoded like its base,
    # so it is scrubbed as one; unchanged, it is returned as it was.
    if isinstance(obj, dict):
        plain: Any = dict(obj)
    elif isinstance(obj, list | tuple):
        plain = list(obj)
    elif isinstance(obj, str):
        plain = str(obj)
    else:
        return obj
    sub = _walk(plain, key, free, shapes)
    return obj if sub is plain else sub


# What the key-name walk does with a non-empty string under a key (``_key_action``).
_SKIP, _WEAK, _STRONG, _FREE = 0, 1, 2, 3
_ACTIONS: dict[Any, int] = {}  # key -> its action: payloads reuse a few key names
_MAX_ACTIONS = 8192


def _key_action(key: object) -> int:
    """Free text (a phrase scan), a credential's key (redact), key material's (redact if
    it looks random) or nothing to check, for a string under ``key`` outside free text."""
    if key in FREE_TEXT_KEYS:
        action = _FREE
    else:
        action = _key_class(key) if isinstance(key, str) else _SKIP
    if len(_ACTIONS) >= _MAX_ACTIONS:
        _ACTIONS.clear()
    _ACTIONS[key] = action
    return action


def _walk_keys(obj: dict[Any, Any], free: bool) -> Any:
    """``_walk`` of a ``dict`` when the payload's text holds no credential-format hint
    (``shapes`` False): strings are checked by their key's name only, and under free text
    for phrases. The same answer as ``_walk``'s general loop, one lookup per key."""
    new: dict[Any, Any] | None = None
    actions = _ACTIONS
    for k, v in obj.items():
        tv = v.__class__
        if tv is str:
            if not v:
                continue
            action = actions.get(k)
            if action is None:
                action = _key_action(k)
            if free or action == _FREE:
                sub = _scrub_str(k, v, True, False)
            elif action == _SKIP:
                continue
            elif action == _STRONG or looks_random(v):
                sub = REDACTED
            else:
                continue
        elif tv is dict:
            action = actions.get(k)
            if action is None:
                action = _key_action(k)
            if action == _STRONG:
                sub = _secret_tree(v, free, False) if v else v
            else:
                sub = _walk_keys(v, free or action == _FREE)
                if action == _WEAK:
                    sub = _renamed(sub, k, False)
        elif tv is int or v is None or tv is float or tv is bool:
            continue
        else:  # a list, a tuple, a subclass, anything else (``_walk`` sorts them out)
            sub = _walk(v, k, free or k in FREE_TEXT_KEYS, False)
        if sub is not v:
            if new is None:
                new = dict(obj)
            new[k] = sub
    return obj if new is None else new


def _secret_tree(obj: Any, free: bool, shapes: bool) -> Any:
    """``obj``, a value under a credential's key, with every non-empty string and every
    key that is a secret replaced, except under a key that names a reference or metadata
    (``{"auth": {"method": "oauth"}}``: walked as usual). Numbers, booleans and None stay."""
    if isinstance(obj, str):
        return REDACTED if obj else obj
    if isinstance(obj, dict):
        new: dict[Any, Any] | None = None
        for k, v in obj.items():
            sub = _secret_tree(v, free, shapes) if _under(k) else _walk(v, k, free or k in FREE_TEXT_KEYS, shapes)
            if sub is not v:
                if new is None:
                    new = dict(obj)
                new[k] = sub
        return _renamed(obj if new is None else new, None, True)
    if isinstance(obj, list | tuple):
        items: list[Any] | None = None
        for i, v in enumerate(obj):
            sub = _secret_tree(v, free, shapes)
            if sub is not v:
                if items is None:
                    items = list(obj)
                items[i] = sub
        return obj if items is None else items
    return obj


def _renamed(d: Any, parent: object, inside: bool) -> Any:
    """The dict ``d`` with every key that is a secret (``key_secret``) renamed
    ``[REDACTED]``, ``[REDACTED-2]``...: the same object if none is."""
    bad = [k for k in d if key_secret(k, parent, inside) is not None]
    if not bad:
        return d
    out: dict[Any, Any] = {}
    n = 0
    for k, v in d.items():
        if k in bad:
            n += 1
            name = REDACTED if n == 1 else f"[REDACTED-{n}]"
            while name in d or name in out:
                n += 1
                name = f"[REDACTED-{n}]"
            out[name] = v
        else:
            out[k] = v
    return out


def _changed_paths(old: Any, new: Any, path: str, out: list[str]) -> None:
    """Where ``_walk`` replaced something (for the warning; only run when it did). A key
    that was renamed is named by its new name, never the secret."""
    if old is new:
        return
    if isinstance(old, dict) and isinstance(new, dict):
        for (k, a), (nk, b) in zip(old.items(), new.items(), strict=False):
            if nk is not k and nk != k:
                out.append(f"{path}[{nk!r}] (a key)")
            _changed_paths(a, b, f"{path}[{nk!r}]", out)
    elif isinstance(old, list | tuple) and isinstance(new, list | tuple):
        for i, (a, b) in enumerate(zip(old, new, strict=False)):
            _changed_paths(a, b, f"{path}[{i}]", out)
    else:
        out.append(path)


_ENVELOPE_KEYS = frozenset({"enc", "kid", "nonce", "ct"})


def _is_envelope(payload: dict[str, Any]) -> bool:
    return len(payload) == 4 and payload.keys() == _ENVELOPE_KEYS and isinstance(payload.get("ct"), str)


def scrub_payload(
    payload: dict[str, Any] | None,
    type_: str,
    saga: str,
    text: str | None = None,
    *,
    hinted: bool | None = None,
) -> dict[str, Any] | None:
    """``payload`` with every secret replaced by ``[REDACTED]`` (the same object if none).

    ``text`` is the payload's canonical JSON when the caller has it (the chain does): one
    scan of it for credential-format hints spares scanning each string. ``hinted=False``
    says the caller already found no hint in a text that contains it (``texts_hinted``
    over a whole batch); anything else scans. Logs a warning per record naming the type,
    the saga and the key paths, never a value.
    """
    if payload is None or (len(payload) == 4 and _is_envelope(payload)):
        return payload
    if hinted is False and payload.__class__ is dict:
        out = _walk_keys(payload, False)  # = _walk(payload, None, False, False)
    else:
        shapes = hinted is not False and (True if text is None else _hinted(text))
        out = _walk(payload, None, False, shapes)
    if out is not payload:
        found: list[str] = []
        _changed_paths(payload, out, "payload", found)
        log.warning(
            "a secret was redacted from a %s record of saga %s before it reached the WAL, at %s: "
            "pass a credential reference (credential_ref='...') instead of the secret",
            type_, saga, ", ".join(found),
        )
    return out  # type: ignore[no-any-return]


# A step id "<saga>/<n>" is new for every step, so the cache below never holds it. It has
# no hint (so no shape) when its saga id has none and does not end in ":": a hint inside
# "/<digits>" or across the "/" would have to contain a digit or a "/", and the only
# one that does is "://". Checked here so that a new hint cannot silently break that.
if any(c.isdigit() for h in _HINTS for c in h) or any("/" in h for h in _HINTS if h != "://"):
    raise RuntimeError("scrubber: a credential hint contains a digit or a '/': revise _plain_head")


@functools.lru_cache(maxsize=4096)
def _plain_head(head: str) -> bool:
    """True if ``head + "/" + digits`` can contain no credential hint (see above)."""
    return not head.endswith(":") and not any(map(head.__contains__, _HINTS))  # not _hinted: no length cut


def scrub_id(value: str) -> str:
    """A header id (saga, step) with a secret shape becomes ``redacted-<24 hex>``: the
    same for the same id, so a saga's records still group, and valid as an id."""
    head, sep, index = value.rpartition("/")
    if sep and index.isdigit() and index.isascii() and _plain_head(head):
        return value  # a step id of a saga id with no hint: no shape can match
    return _scrub_id(value)


@functools.lru_cache(maxsize=4096)
def _scrub_id(value: str) -> str:
    if secret_kind(value) is None:
        return value
    head, sep, index = value.rpartition("/")
    if sep and index.isdigit() and secret_kind(head) is not None:
        return f"{scrub_id(head)}/{index}"  # a step id "<saga>/<n>" keeps its saga
    return "redacted-" + hashlib.sha256(value.encode()).hexdigest()[:24]
