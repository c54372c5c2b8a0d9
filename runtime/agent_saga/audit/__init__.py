"""Audit: what makes the log evidence — export, certify, redact, disclose, encrypt, checkpoint.

    merkle        audit_root, build_disclosure, verify_disclosure, consistency proofs (RFC 6962)
    bundles       WORM bundles (records.ndjson, manifest.json, SHA256SUMS) and their check
    certificates  rollback-safety certificates: every effect accounted for, or the step named
    redaction     erasure: payload and salt destroyed, the chain still verifies
    encryption    AES-256-GCM payload envelopes (BYOK), decrypting readers, key rotation
    keys          where a reader gets its key (key file or AGENT_SAGA_WAL_KEY): one rule
    checkpoints   Ed25519-signed heads: a truncated tail is detectable

Everything here imports only the standard library at import time; ``cryptography`` loads
when a key is used (extra ``agent-saga[encryption]``).
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from ..errors import WALDecryptFailed as WALDecryptFailed
    from ..errors import WALKeyMissing as WALKeyMissing
    from .bundles import BundleResult as BundleResult
    from .bundles import export_bundle as export_bundle
    from .bundles import verify_bundle as verify_bundle
    from .certificates import Certificate as Certificate
    from .certificates import StepFinding as StepFinding
    from .certificates import certify as certify
    from .certificates import certify_log as certify_log
    from .checkpoints import Checkpoint as Checkpoint
    from .checkpoints import CheckpointResult as CheckpointResult
    from .checkpoints import generate_signing_key as generate_signing_key
    from .checkpoints import load_private_key as load_private_key
    from .checkpoints import load_public_key as load_public_key
    from .checkpoints import make_checkpoint as make_checkpoint
    from .checkpoints import verify_checkpoint as verify_checkpoint
    from .encryption import AESGCMEncryptor as AESGCMEncryptor
    from .encryption import EncryptedWAL as EncryptedWAL
    from .encryption import Keyring as Keyring
    from .encryption import PayloadEncryptor as PayloadEncryptor
    from .encryption import decrypting as decrypting
    from .encryption import encryptor_from_env as encryptor_from_env
    from .encryption import key_usage as key_usage
    from .encryption import keyring_from_env as keyring_from_env
    from .encryption import new_wal_key as new_wal_key
    from .keys import reader_encryptor as reader_encryptor
    from .merkle import AuditRoot as AuditRoot
    from .merkle import ConsistencyResult as ConsistencyResult
    from .merkle import DisclosureResult as DisclosureResult
    from .merkle import audit_root as audit_root
    from .merkle import build_consistency as build_consistency
    from .merkle import build_disclosure as build_disclosure
    from .merkle import verify_consistency as verify_consistency
    from .merkle import verify_disclosure as verify_disclosure
    from .redaction import RedactionReport as RedactionReport
    from .redaction import redact_record as redact_record
    from .redaction import redact_records as redact_records

#: The public names, by module: the one list (``agent_saga._lazy``); __all__ derives from it.
_SOURCES: dict[str, tuple[str, ...]] = {
    ".bundles": ("BundleResult", "export_bundle", "verify_bundle"),
    ".certificates": ("Certificate", "StepFinding", "certify", "certify_log"),
    ".checkpoints": (
        "Checkpoint", "CheckpointResult", "generate_signing_key", "load_private_key",
        "load_public_key", "make_checkpoint", "verify_checkpoint",
    ),
    ".encryption": (
        "AESGCMEncryptor", "EncryptedWAL", "Keyring", "PayloadEncryptor", "decrypting",
        "encryptor_from_env", "key_usage", "keyring_from_env", "new_wal_key",
    ),
    ".keys": ("reader_encryptor",),
    ".merkle": (
        "AuditRoot", "ConsistencyResult", "DisclosureResult", "audit_root",
        "build_consistency", "build_disclosure", "verify_consistency", "verify_disclosure",
    ),
    ".redaction": ("RedactionReport", "redact_record", "redact_records"),
    "..errors": ("WALDecryptFailed", "WALKeyMissing"),
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
