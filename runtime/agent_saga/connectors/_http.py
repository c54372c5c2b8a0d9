"""A small JSON-over-HTTP client on the standard library (``urllib.request``).

The Stripe and Salesforce connectors use it in production and their tests drive it
against local servers, so what is tested is what runs. It never puts a request header
(credentials) into an error message.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

__all__ = ["HTTPFailure", "request"]

DEFAULT_TIMEOUT = 30.0


class HTTPFailure(RuntimeError):
    """The server answered with an error status; ``body`` is its parsed JSON (or text)."""

    def __init__(self, method: str, url: str, status: int, body: Any) -> None:
        self.status = status
        self.body = body
        path = urllib.parse.urlsplit(url).path
        super().__init__(f"{method} {path} answered {status}: {_short(body)}")


def _short(body: Any) -> str:
    text = body if isinstance(body, str) else json.dumps(body, default=str)
    return text[:300]


def request(
    method: str,
    url: str,
    *,
    headers: Mapping[str, str],
    form: Mapping[str, Any] | None = None,
    json_body: Any = None,
    query: Mapping[str, Any] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> Any:
    """Send one request and return the parsed JSON body (``None`` for an empty one).

    ``form`` is sent ``application/x-www-form-urlencoded``, ``json_body`` as JSON. Raises
    ``HTTPFailure`` for a status >= 400, ``OSError`` (``urllib.error.URLError``,
    ``TimeoutError``) when the server cannot be reached or does not answer in time.
    """
    if query:
        url = f"{url}?{urllib.parse.urlencode(query)}"
    data: bytes | None = None
    hdrs = dict(headers)
    if form is not None:
        data = urllib.parse.urlencode(form).encode()
        hdrs["Content-Type"] = "application/x-www-form-urlencoded"
    elif json_body is not None:
        data = json.dumps(json_body).encode()
        hdrs["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, headers=hdrs, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - https/http URLs from the credential
            raw = resp.read()
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        raise HTTPFailure(method, url, exc.code, body) from None
    return json.loads(raw) if raw else None
