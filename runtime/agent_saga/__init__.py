"""agent-saga: the accountable runtime for AI agents that touch real systems.

Every public name is re-exported here; everything else is internal. A test pins this list.
"""

from .chain import VerifyResult, verify_records
from .errors import (
    CompensationError,
    ConfigurationError,
    GateBlocked,
    HandlerNotRegistered,
    NotSerializable,
    RollbackIncomplete,
    SagaError,
    SagaRefused,
    SecretDetected,
    StepOutcomeUnknown,
    WALBackpressure,
    WALClosed,
    WALCorrupt,
    WALError,
    WALStalled,
)
from .records import Record, RecordType
from .wal import Backpressure, BaseWAL, FileWAL, WALStats, get_default_wal, set_default_wal

__version__ = "0.1.0"

__all__ = [
    "Backpressure",
    "BaseWAL",
    "CompensationError",
    "ConfigurationError",
    "FileWAL",
    "GateBlocked",
    "HandlerNotRegistered",
    "NotSerializable",
    "Record",
    "RecordType",
    "RollbackIncomplete",
    "SagaError",
    "SagaRefused",
    "SecretDetected",
    "StepOutcomeUnknown",
    "VerifyResult",
    "WALBackpressure",
    "WALClosed",
    "WALCorrupt",
    "WALError",
    "WALStalled",
    "WALStats",
    "get_default_wal",
    "set_default_wal",
    "verify_records",
]
