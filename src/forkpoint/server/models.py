"""Request bodies of the REST API: pydantic models with the same bounds as the runtime.

Bounds are checked here so bad input gets a 422 before anything touches a VM; the runtime
checks them again (it is also used without the server).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

__all__ = [
    "CheckpointOut",
    "ErrorOut",
    "ExecOut",
    "FileEntryOut",
    "HealthOut",
    "PortOut",
    "ProcessOut",
    "SessionOut",
    "SpawnOut",
    "MAX_FORKS",
    "CheckpointRequest",
    "CreateSessionRequest",
    "ExecRequest",
    "ForkRequest",
    "GuestPort",
    "Name",
    "PortRequest",
    "RollbackRequest",
]

MAX_FORKS = 64

GuestPort = Annotated[int, Field(ge=1, le=65535, description="A TCP port inside the guest.")]
Name = Annotated[
    str,
    StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"),
    Field(description="1-63 of [A-Za-z0-9._-], starting with a letter or digit."),
]
# Ids and names as they appear in references (a session, a checkpoint).
Ref = Annotated[str, StringConstraints(min_length=1, max_length=128)]
GuestPath = Annotated[str, StringConstraints(min_length=1, max_length=4096)]
EnvKey = Annotated[str, StringConstraints(min_length=1, max_length=256)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateSessionRequest(_Body):
    image: Name = "default"
    memory_mib: Annotated[int, Field(ge=128, le=65536, description="Guest RAM in MiB.")] = 512
    cpus: Annotated[int, Field(ge=1, le=64)] = 1
    name: Name | None = None
    ports: Annotated[list[GuestPort], Field(max_length=64)] = []
    network: Literal["user", "none"] = "user"


class ExecRequest(_Body):
    """``command``: an argv list (run directly) or a string (run by ``/bin/sh -c``)."""

    command: (
        Annotated[list[Annotated[str, StringConstraints(max_length=65536)]], Field(min_length=1)]
        | Annotated[str, StringConstraints(min_length=1, max_length=1 << 20)]
    )
    cwd: GuestPath | None = None
    env: Annotated[dict[EnvKey, Annotated[str, StringConstraints(max_length=65536)]], Field(
        max_length=1024
    )] = {}  # fmt: skip
    stdin: Annotated[str, StringConstraints(max_length=16 << 20)] | None = None
    stdin_encoding: Literal["text", "base64"] = "text"
    timeout: Annotated[float, Field(gt=0, le=7 * 86400, description="Seconds.")] | None = None
    background: bool = False
    output_encoding: Literal["text", "base64"] = Field(
        "text", description="How stdout/stderr are returned: UTF-8 text (lossy) or base64."
    )


class PortRequest(_Body):
    guest_port: GuestPort


class CheckpointRequest(_Body):
    name: Name | None = None


class ForkRequest(_Body):
    count: Annotated[int, Field(ge=1, le=MAX_FORKS)] = 1


class RollbackRequest(_Body):
    checkpoint: Ref | None = None


# -- responses (documented in the OpenAPI spec; the handlers return plain dicts) ---------


class PortOut(BaseModel):
    guest_port: int
    host_port: int
    url: str


class SessionOut(BaseModel):
    id: str
    name: str | None
    image: str
    state: str
    created_at: str
    parent_checkpoint: str | None
    ports: list[PortOut]
    memory_mib: int
    cpus: int
    network: str


class CheckpointOut(BaseModel):
    id: str
    session_id: str
    name: str | None
    kind: str
    created_at: str
    parent_checkpoint: str | None
    image: str
    size_bytes: int
    duration_ms: float
    pause_ms: float


class ErrorBody(BaseModel):
    code: str
    message: str


class ErrorOut(BaseModel):
    error: ErrorBody


class ExecOut(BaseModel):
    """A finished command. ``exit_code`` is 128+N when killed by signal N."""

    exit_code: int
    signal: int | None
    stdout: str
    stderr: str
    output_encoding: Literal["text", "base64"]
    truncated: bool
    duration_ms: float
    pid: int


class SpawnOut(BaseModel):
    """A background process: its pid and the guest file its output goes to."""

    pid: int
    log_path: str


class ProcessOut(BaseModel):
    pid: int
    ppid: int
    cmd: str


class FileEntryOut(BaseModel):
    name: str
    type: str
    size: int
    mode: int
    mtime_ns: int


class HealthOut(BaseModel):
    status: str
    version: str
