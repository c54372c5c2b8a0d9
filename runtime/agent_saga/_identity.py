"""Who this process is: the host name, the pid and the pod name, read in one place.

Every name the runtime gives itself is derived from ``process_identity()``. The formats
below are persisted or compared (in records, Redis documents, stream and ACL names), so
each stays exactly as it is:

    seen_by            host:pid                   who saw or asked, in kill switch and
                                                  approval records and documents
    short_host         host up to its first "."   the policy plane's default agent name
    pod_name           pod, every character but   the POD of an agent identity NS/POD
                       [A-Za-z0-9._-] as "-"      (its WAL writer ids, its Redis ACL user)
    instance()         pid-<6 random hex>         one process of an identity: NS/POD@...
    unique_id(p, n)    p + host[:n] + "-" +       a service writer (WAL) or a recovery
                       instance()                 daemon: unique per process

Invariants:
- ``host`` is ``socket.gethostname()``; ``pod`` is the pod name given, else
  ``$POD_NAME``, else the host name (a pod's host name is its name); ``pid`` is
  ``os.getpid()``. Nothing else is read.
- Each call reads them again: a forked child is another process. A module that keeps
  one in a constant (read at import) says so.
- ``instance()`` and ``unique_id()`` carry fresh randomness: two processes never share
  one, and no one computes one again to compare it.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["ENV_POD_NAME", "ProcessIdentity", "process_identity", "safe_name"]

#: The environment variable holding the pod's name (the Downward API's ``metadata.name``).
ENV_POD_NAME = "POD_NAME"

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def safe_name(text: str) -> str:
    """``text`` with every character but ``[A-Za-z0-9._-]`` replaced by ``-``."""
    return _UNSAFE.sub("-", text)


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    """This process as the runtime names it (see the module doc for each format)."""

    host: str
    pid: int
    pod: str

    @property
    def seen_by(self) -> str:
        """``host:pid``."""
        return f"{self.host}:{self.pid}"

    @property
    def short_host(self) -> str:
        """The host name up to its first ``.``."""
        return self.host.split(".")[0]

    @property
    def pod_name(self) -> str:
        """The pod name as an identity's POD (``safe_name``)."""
        return safe_name(self.pod)

    def instance(self) -> str:
        """``<pid>-<6 random hex>``: this process among those of one identity."""
        return f"{self.pid}-{secrets.token_hex(3)}"

    def unique_id(self, prefix: str = "", host_chars: int = 100) -> str:
        """``<prefix><host>-<pid>-<6 random hex>``, the host made safe and cut to
        ``host_chars`` characters (``host`` if nothing is left)."""
        return f"{prefix}{safe_name(self.host)[:host_chars] or 'host'}-{self.instance()}"


def process_identity(pod: str | None = None, env: Mapping[str, str] | None = None) -> ProcessIdentity:
    """This process: its host name, its pid, and its pod (``pod``, else ``$POD_NAME`` in
    ``env`` (default: the environment), else the host name)."""
    host = socket.gethostname()
    environ = os.environ if env is None else env
    return ProcessIdentity(host, os.getpid(), pod or environ.get(ENV_POD_NAME) or host)
