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
    from ._default import DEFAULT_SWITCH_FILE as DEFAULT_SWITCH_FILE
    from ._default import ENV_SWITCH_GRACE as ENV_SWITCH_GRACE
    from ._default import ENV_SWITCH_STORE as ENV_SWITCH_STORE
    from ._default import SWITCH_STORES as SWITCH_STORES
    from ._default import default_switch_path as default_switch_path
    from ._default import get_kill_switch as get_kill_switch
    from ._default import is_zero_setup as is_zero_setup
    from ._default import open_switch_store as open_switch_store
    from ._default import set_kill_switch as set_kill_switch
    from ._local import FileSwitchStore as FileSwitchStore
    from ._model import Lever as Lever
    from ._model import LeverAction as LeverAction
    from ._model import LeverUnreadable as LeverUnreadable
    from ._model import cli_lever_id as cli_lever_id
    from ._model import compile_glob as compile_glob
    from ._model import format_scope as format_scope
    from ._model import parse_scope as parse_scope
    from ._redis import RedisSwitchStore as RedisSwitchStore
    from ._store import SwitchStore as SwitchStore
    from ._store import SwitchStoreUnavailable as SwitchStoreUnavailable
    from ._store import SwitchView as SwitchView
    from ._switch import DEGRADED as DEGRADED
    from ._switch import ENGAGED as ENGAGED
    from ._switch import FAILED_CLOSED as FAILED_CLOSED
    from ._switch import LIFTED as LIFTED
    from ._switch import RESTORED as RESTORED
    from ._switch import SWITCH_SAGA as SWITCH_SAGA
    from ._switch import KillSwitch as KillSwitch

#: The public names, by module: the one list (``agent_saga._lazy``); __all__ derives from it.
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

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
