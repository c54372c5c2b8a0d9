"""ModelRoute: the hosts a router may send work to, what each can do, and in what order.

Declared capabilities (context tokens, tool calling, JSON mode, cost class) are what the
runtime's router reasons over when it names every candidate and every reason it
refused one. Credentials are references (a Secret name), never values. ``Ready`` is True
once an agent's router routes by the route (its heartbeat lists it).

Rules the API server enforces: host names are unique; every ``preference`` entry names
a declared host; endpoints are http(s) URLs; context windows are positive.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, StringConstraints

from ._base import (
    AgentGlob,
    AgentsStatus,
    BaseStatus,
    CRDModel,
    Explained,
    KindInfo,
    PrinterColumn,
    Resource,
    cel_explained,
    ready_columns,
    validations,
)

CostClass = Literal["Free", "Low", "Medium", "High"]
HOST_NAME_PATTERN = r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$"
HostName = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=HOST_NAME_PATTERN),
                    Explained(HOST_NAME_PATTERN, "a host name of lowercase letters, digits, . and -, "
                              "e.g. local-7b")]
ENDPOINT_PATTERN = r"^https?://[^\s]+$"
Endpoint = Annotated[str, StringConstraints(min_length=8, max_length=2048, pattern=ENDPOINT_PATTERN),
                    Explained(ENDPOINT_PATTERN, "an http:// or https:// base URL without spaces, "
                              "e.g. http://127.0.0.1:8080/v1")]
MODEL_NAME_PATTERN = r"^\S+$"
ModelName = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=MODEL_NAME_PATTERN),
                     Explained(MODEL_NAME_PATTERN, "the model id the endpoint serves, without spaces, "
                               "e.g. llama-3.1-8b-instruct")]
SECRET_NAME_PATTERN = r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$"
SecretName = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=SECRET_NAME_PATTERN),
                      Explained(SECRET_NAME_PATTERN, "the name of a Secret in this namespace (lowercase "
                                "letters, digits, . and -), e.g. openai-api-key; never the key itself")]


class Capabilities(CRDModel):
    """What a host can do, as declared (the router never guesses)."""

    context_tokens: int = Field(ge=1, le=100_000_000, description="The context window, in tokens.")
    tools: bool = Field(default=False, description="Native tool calling.")
    json_mode: bool = Field(default=False, description="Constrained JSON output.")
    cost_class: CostClass = Field(default="Medium", description="Free, Low, Medium or High.")


class ModelHost(CRDModel):
    """One model behind one endpoint."""

    name: HostName = Field(description="The host's name in preference and in routing decisions.")
    endpoint: Endpoint = Field(description="Base URL (http://127.0.0.1:8080/v1 for a local 7B).")
    model: ModelName = Field(description="The model id the endpoint serves.")
    capabilities: Capabilities
    credential_ref: SecretName | None = Field(
        default=None, description="Name of the Secret holding the API key (a reference, never the key)."
    )


class RouteConstraints(CRDModel):
    """What every routed call requires; hosts that fall short are refused with a reason."""

    min_context_tokens: int | None = Field(default=None, ge=1)
    require_tools: bool = False
    require_json_mode: bool = False
    max_cost_class: CostClass | None = None


class AgentSelector(CRDModel):
    """Which agents use this route; absent: every agent in the namespace."""

    agents: list[AgentGlob] = Field(min_length=1, max_length=64)


class ModelRouteSpec(CRDModel):
    """Hosts, the order to prefer them in, and the constraints every call must meet."""

    model_config = CRDModel.model_config | {
        "json_schema_extra": validations(
            cel_explained(
                "!has(self.preference) || self.preference.all(p, self.hosts.exists(h, h.name == p))",
                "'preference names ' + self.preference.filter(p, !self.hosts.exists(h, h.name == p))[0]"
                " + ', which is not the name of a host in hosts: add that host, or remove it from preference'",
                field_path=".preference"),
        )
    }

    hosts: list[ModelHost] = Field(
        min_length=1,
        max_length=32,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    preference: list[HostName] | None = Field(
        default=None,
        max_length=32,
        description="Host names, most preferred first; absent: the order of hosts.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    constraints: RouteConstraints | None = None
    applies_to: AgentSelector | None = None


class ModelRouteStatus(BaseStatus):
    """How many hosts the router may use, and which agents' routers route by it."""

    hosts: int | None = Field(default=None, ge=0)
    preferred: str | None = Field(default=None, max_length=63, description="The first host in preference order.")
    agents: AgentsStatus | None = Field(default=None, description="Which agents route by it (their heartbeats).")
    acked: str | None = Field(default=None, max_length=32, description="routing/matched, e.g. 3/3.")


class ModelRoute(Resource):
    """Where an agent's model calls may go, for the runtime's router."""

    info: ClassVar[KindInfo] = KindInfo(
        kind="ModelRoute",
        plural="modelroutes",
        short_names=("mr",),
        description="Model hosts, declared capabilities and preference order for the router.",
        columns=(
            PrinterColumn("Hosts", "integer", ".status.hosts"),
            PrinterColumn("Preferred", "string", ".status.preferred"),
            PrinterColumn("Acked", "string", ".status.acked", "Agents routing by it / agents it governs"),
            *ready_columns(),
        ),
    )

    spec: ModelRouteSpec
    status: ModelRouteStatus | None = None
