"""The circuit breaker: stop calling a dependency that keeps failing, then probe it.

    set_breaker(CircuitBreaker(BreakerPolicy(failure_threshold=5, cool_down=30), wal=wal))

The layout every control shares (``agent_saga.controls``), without a store: the
breaker's state lives in the process by design (it fails open).

    _model.py    BreakerPolicy, the circuit keys, what counts as a failure
    _breaker.py  CircuitBreaker: the PreCheck the gate consults, fed by step outcomes
    _default.py  the process-wide breaker (set_breaker / get_breaker)

Only this module is public.
"""

from typing import TYPE_CHECKING

from ..._lazy import lazy_exports

if TYPE_CHECKING:
    from ._breaker import CircuitBreaker as CircuitBreaker
    from ._default import get_breaker as get_breaker
    from ._default import set_breaker as set_breaker
    from ._model import BreakerPolicy as BreakerPolicy
    from ._model import State as State
    from ._model import by_service as by_service
    from ._model import by_tool_name as by_tool_name
    from ._model import counts_as_failure as counts_as_failure

#: The public names, by module: the one list (``agent_saga._lazy``); __all__ derives from it.
_SOURCES: dict[str, tuple[str, ...]] = {
    "._breaker": ("CircuitBreaker",),
    "._default": ("get_breaker", "set_breaker"),
    "._model": ("BreakerPolicy", "State", "by_service", "by_tool_name", "counts_as_failure"),
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
