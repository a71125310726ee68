"""The E2B control plane's JSON shapes (``e2b`` 2.63's API), as pydantic models.

Field names are E2B's (camelCase, except ``allow_internet_access``). Request bodies ignore
fields forkpoint does not use; responses carry exactly what the SDK's parsers need.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ApiError",
    "ConnectBody",
    "ForkBody",
    "ForkResult",
    "Lifecycle",
    "ListedSandbox",
    "NetworkBody",
    "NetworkUpdateBody",
    "NewSandbox",
    "PauseBody",
    "RollbackBody",
    "SandboxDetail",
    "SandboxOut",
    "SnapshotBody",
    "SnapshotInfo",
    "TimeoutBody",
]

E2bState = Literal["running", "paused"]
# E2B's own cap: a sandbox may live at most 24 h on the Pro tier; forkpoint allows the same.
MAX_TIMEOUT_S = 86_400


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


_Destinations = list[str] | None  # addresses, CIDRs or host names


class NetworkUpdateBody(_Body):
    """``PUT /sandboxes/{id}/network``: replaces the rules; an omitted field is cleared."""

    allowOut: _Destinations = Field(default=None, max_length=1000)
    denyOut: _Destinations = Field(default=None, max_length=1000)
    allow_internet_access: bool | None = None
    #: Header transforms per host (``{host: [{"transform": {"headers": {...}}}]}``).
    rules: dict[str, object] | None = Field(default=None, max_length=64)


class NetworkBody(NetworkUpdateBody):
    """``network`` in a create."""

    allowPublicTraffic: bool | None = None
    maskRequestHost: str | None = Field(default=None, max_length=1000)


class AutoResumeBody(_Body):
    enabled: bool = False


class VolumeMountBody(_Body):
    name: str = Field(max_length=200)
    path: str = Field(max_length=4096)


class NewSandbox(_Body):
    templateID: str | None = Field(default=None, max_length=200)
    timeout: int | None = Field(default=None, ge=0, le=MAX_TIMEOUT_S)
    autoPause: bool = False
    autoPauseMemory: bool | None = None
    autoResume: AutoResumeBody | None = None
    allow_internet_access: bool | None = None
    network: NetworkBody | None = None
    metadata: dict[str, str] | None = None
    envVars: dict[str, str] | None = None
    volumeMounts: list[VolumeMountBody] | None = None


class ConnectBody(_Body):
    timeout: int | None = Field(default=None, ge=0, le=MAX_TIMEOUT_S)


class TimeoutBody(_Body):
    timeout: int = Field(ge=0, le=MAX_TIMEOUT_S)


class PauseBody(_Body):
    memory: bool | None = None


class ForkBody(_Body):
    timeout: int | None = Field(default=None, ge=0, le=MAX_TIMEOUT_S)
    count: int = Field(default=1, ge=1, le=20)


class SnapshotBody(_Body):
    name: str | None = None
    memory: bool | None = None


class RollbackBody(_Body):
    """forkpoint's extension: ``POST /sandboxes/{id}/rollback``."""

    snapshotID: str = Field(min_length=1)


class SandboxOut(BaseModel):
    templateID: str
    sandboxID: str
    clientID: str
    envdVersion: str
    alias: str | None = None
    envdAccessToken: str | None = None
    trafficAccessToken: str | None = None
    domain: str | None = None


class Lifecycle(BaseModel):
    autoResume: bool
    onTimeout: Literal["kill", "pause"]


class ListedSandbox(BaseModel):
    templateID: str
    sandboxID: str
    clientID: str
    startedAt: str
    endAt: str
    cpuCount: int
    memoryMB: int
    diskSizeMB: int
    state: E2bState
    envdVersion: str
    alias: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    volumeMounts: list[dict[str, str]] = Field(default_factory=list)


class NetworkOut(BaseModel):
    allowOut: list[str]
    denyOut: list[str]
    allowPublicTraffic: bool
    maskRequestHost: str | None = None


class SandboxDetail(ListedSandbox):
    envdAccessToken: str | None = None
    domain: str | None = None
    allowInternetAccess: bool | None = None
    lifecycle: Lifecycle | None = None
    network: NetworkOut | None = None
    pauseMode: Literal["full", "filesystem"] = "full"


class ApiError(BaseModel):
    code: int
    message: str
    error_code: str | None = None


class ForkResult(BaseModel):
    sandbox: SandboxOut | None = None
    error: ApiError | None = None


class SnapshotInfo(BaseModel):
    snapshotID: str
    names: list[str]
