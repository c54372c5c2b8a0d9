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
from ..errors import WALDecryptFailed, WALKeyMissing

if TYPE_CHECKING:
    from .bundles import BundleResult, export_bundle, verify_bundle
    from .certificates import Certificate, StepFinding, certify, certify_log
    from .checkpoints import (
        Checkpoint,
        CheckpointResult,
        generate_signing_key,
        load_private_key,
        load_public_key,
        make_checkpoint,
        verify_checkpoint,
    )
    from .encryption import (
        AESGCMEncryptor,
        EncryptedWAL,
        Keyring,
        PayloadEncryptor,
        decrypting,
        encryptor_from_env,
        key_usage,
        keyring_from_env,
        new_wal_key,
    )
    from .keys import reader_encryptor
    from .merkle import (
        AuditRoot,
        ConsistencyResult,
        DisclosureResult,
        audit_root,
        build_consistency,
        build_disclosure,
        verify_consistency,
        verify_disclosure,
    )
    from .redaction import RedactionReport, redact_record, redact_records

#: Each public name -> its module, loaded on first use (``agent_saga._lazy``).
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
}

__all__ = [
    "AESGCMEncryptor",
    "AuditRoot",
    "BundleResult",
    "Certificate",
    "Checkpoint",
    "CheckpointResult",
    "ConsistencyResult",
    "DisclosureResult",
    "EncryptedWAL",
    "Keyring",
    "PayloadEncryptor",
    "RedactionReport",
    "StepFinding",
    "WALDecryptFailed",
    "WALKeyMissing",
    "audit_root",
    "build_consistency",
    "build_disclosure",
    "certify",
    "certify_log",
    "decrypting",
    "encryptor_from_env",
    "export_bundle",
    "generate_signing_key",
    "key_usage",
    "keyring_from_env",
    "load_private_key",
    "load_public_key",
    "make_checkpoint",
    "new_wal_key",
    "reader_encryptor",
    "redact_record",
    "redact_records",
    "verify_bundle",
    "verify_checkpoint",
    "verify_consistency",
    "verify_disclosure",
]

__getattr__, __dir__ = lazy_exports(__name__, _SOURCES, __all__)
