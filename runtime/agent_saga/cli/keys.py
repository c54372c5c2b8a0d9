"""The key option of every command that reads payloads of a possibly encrypted log.

    agent-saga certify|recover|inspect ... [--wal-key-file FILE]

The key is found the same way everywhere (``agent_saga.audit.keys``): ``--wal-key-file``,
else ``AGENT_SAGA_WAL_KEY_FILE``, else ``AGENT_SAGA_WAL_KEY``. No key is fine for a
plaintext log; an encrypted record then stops the command with a message naming both.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..audit.encryption import PayloadEncryptor
from ..audit.keys import reader_encryptor

__all__ = ["add_key_option", "encryptor_from_args"]


def add_key_option(p: Any) -> None:
    p.add_argument(
        "--wal-key-file", metavar="FILE",
        help="a file holding the log's encryption key(s), [kid:]base64 entries as made by "
        "`agent-saga keygen wal` (default: $AGENT_SAGA_WAL_KEY_FILE, else the key itself "
        "in $AGENT_SAGA_WAL_KEY)",
    )


def encryptor_from_args(args: argparse.Namespace) -> PayloadEncryptor | None:
    """The reader's key for ``args`` (None: no key given). Raises ``ConfigurationError``."""
    return reader_encryptor(getattr(args, "wal_key_file", None))
