"""The five agent-saga kinds (group ``agentsaga.dev``, version ``v1alpha1``, namespaced).

Each kind is a pydantic model (``spec`` + ``status``) that ``crdgen`` turns into a
CustomResourceDefinition, and that the operator uses to read an object's spec.
"""

from ._base import (
    API_VERSION,
    CATEGORY,
    GROUP,
    VERSION,
    Condition,
    KindInfo,
    PrinterColumn,
    Resource,
)
from .approval import Approval, ApprovalSpec, ApprovalStatus
from .budgetlimit import BudgetLimit, BudgetLimitSpec, BudgetLimitStatus, LimitScope
from .killswitch import KillSwitch, KillSwitchScope, KillSwitchSpec, KillSwitchStatus
from .modelroute import ModelRoute, ModelRouteSpec, ModelRouteStatus
from .sagapolicy import SagaPolicy, SagaPolicySpec, SagaPolicyStatus

#: Every kind, in the order the CRDs are generated and documented.
KINDS: tuple[type[Resource], ...] = (KillSwitch, BudgetLimit, SagaPolicy, Approval, ModelRoute)

__all__ = [
    "API_VERSION",
    "CATEGORY",
    "GROUP",
    "KINDS",
    "VERSION",
    "Approval",
    "ApprovalSpec",
    "ApprovalStatus",
    "BudgetLimit",
    "BudgetLimitSpec",
    "BudgetLimitStatus",
    "Condition",
    "KillSwitch",
    "KillSwitchScope",
    "KillSwitchSpec",
    "KillSwitchStatus",
    "KindInfo",
    "LimitScope",
    "ModelRoute",
    "ModelRouteSpec",
    "ModelRouteStatus",
    "PrinterColumn",
    "Resource",
    "SagaPolicy",
    "SagaPolicySpec",
    "SagaPolicyStatus",
]
