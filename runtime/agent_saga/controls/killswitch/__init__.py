"""The kill switch: HALT, DRAIN and QUARANTINE levers, each with an optional TTL.

    switch = KillSwitch(RedisSwitchStore(url, grace=30), wal=wal)
    set_kill_switch(switch)                      # or PreFlightGate(checks=[switch])
    switch.halt("tool:wire.send", reason="fraud pattern", by="soc@corp", ttl=600)

The layout every control shares (``agent_saga.controls``):

    _model.py    Lever, LeverAction, scopes and tool globs (the policy-plane document)
    _store.py    the SwitchStore protocol, SwitchView (what a store knows now), the error
    _local.py    FileSwitchStore: this process, or a JSON file on this host
    _redis.py    RedisSwitchStore: the policy plane, watched (a policy-plane reader)
    _switch.py   KillSwitch: the PreCheck the gate consults, from memory
    _default.py  open_switch_store(url or path) and the process-wide switch

Only this module is public.
"""

from typing import TYPE_CHECKING

from ..._lazy import lazy_exports

if TYPE_CHECKING:
    from ._default import (
        DEFAULT_SWITCH_FILE,
        ENV_SWITCH_GRACE,
        ENV_SWITCH_STORE,
        SWITCH_STORES,
        default_switch_path,
        get_kill_switch,
        is_zero_setup,
        open_switch_store,
        set_kill_switch,
    )
    from ._local import FileSwitchStore
    from ._model import (
        Lever,
        LeverAction,
        LeverUnreadable,
        cli_lever_id,
        compile_glob,
        format_scope,
        parse_scope,
    )
    from ._redis import RedisSwitchStore
    from ._store import SwitchStore, SwitchStoreUnavailable, SwitchView
    from ._switch import DEGRADED, ENGAGED, FAILED_CLOSED, LIFTED, RESTORED, SWITCH_SAGA, KillSwitch

#: Each public name -> its module, loaded on first use (``agent_saga._lazy``).
_SOURCES: dict[str, tuple[str, ...]] = {
    "._default": (
        "DEFAULT_SWITCH_FILE", "ENV_SWITCH_GRACE", "ENV_SWITCH_STORE", "SWITCH_STORES",
        "default_switch_path", "get_kill_switch", "is_zero_setup", "open_switch_store", "set_kill_switch",
    ),
    "._local": ("FileSwitchStore",),
    "._model": (
        "Lever", "LeverAction", "LeverUnreadable", "cli_lever_id", "compile_glob",
        "format_scope", "parse_scope",
    ),
    "._redis": ("RedisSwitchStore",),
    "._store": ("SwitchStore", "SwitchStoreUnavailable", "SwitchView"),
    "._switch": (
        "DEGRADED", "ENGAGED", "FAILED_CLOSED", "LIFTED", "RESTORED", "SWITCH_SAGA",
        "KillSwitch",
    ),
}

__all__ = [
    "DEFAULT_SWITCH_FILE",
    "SWITCH_STORES",
    "DEGRADED",
    "ENGAGED",
    "ENV_SWITCH_GRACE",
    "ENV_SWITCH_STORE",
    "FAILED_CLOSED",
    "LIFTED",
    "RESTORED",
    "SWITCH_SAGA",
    "FileSwitchStore",
    "KillSwitch",
    "Lever",
    "LeverAction",
    "LeverUnreadable",
    "RedisSwitchStore",
    "SwitchStore",
    "SwitchStoreUnavailable",
    "SwitchView",
    "cli_lever_id",
    "compile_glob",
    "format_scope",
    "default_switch_path",
    "get_kill_switch",
    "is_zero_setup",
    "open_switch_store",
    "parse_scope",
    "set_kill_switch",
]

__getattr__, __dir__ = lazy_exports(__name__, _SOURCES, __all__)
