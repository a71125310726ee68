"""An E2B template (the SDK's ``Template()`` steps) as a Dockerfile for podman.

The SDK sends a template as a base (``fromImage`` or ``fromTemplate``), a list of steps of
five kinds — ``RUN`` (a shell command, optionally as a user), ``COPY`` (uploaded files,
named by their content hash), ``ENV``, ``WORKDIR``, ``USER`` — and a start and a ready
command. Every higher-level method (``apt_install``, ``make_symlink``, ``git_clone``…) is
already a ``RUN`` on the client. A step numbered ``i`` (1-based, the SDK's stack trace
index) becomes one or more Dockerfile instructions; :attr:`DockerfilePlan.steps` maps each
instruction back, so podman's ``STEP n/m`` line names the step that failed.

As on E2B, the build runs as ``user`` in ``/home/user`` unless a step says otherwise: a
provisioning step first makes the ``user`` account in an image that lacks it.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from forkpoint.errors import InvalidInput
from forkpoint.images.oci import READY_LABEL

__all__ = [
    "BASE_STEP",
    "FINALIZE_STEP",
    "DockerfilePlan",
    "TemplateSpec",
    "TemplateStep",
    "to_dockerfile",
]

#: The SDK's names for the base image's step and the start/ready step (its stack traces'
#: first and last).
BASE_STEP = "base"
FINALIZE_STEP = "finalize"

_USER = "user"
_HOME = "/home/user"
# E2B's base provisioning, reduced to what steps rely on: the `user` account and its home.
_PROVISION = (
    f"id -u {_USER} >/dev/null 2>&1 || useradd -m -u 1000 -s /bin/bash {_USER} 2>/dev/null "
    f"|| useradd -m -s /bin/sh {_USER} 2>/dev/null || adduser -D {_USER}; "
    f"mkdir -p {_HOME} && chown {_USER} {_HOME}"
)


class TemplateStep(BaseModel):
    """One of the SDK's steps (``TemplateStep``)."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["RUN", "COPY", "ENV", "WORKDIR", "USER"]
    args: list[str] = Field(default_factory=list, max_length=1000)
    force: bool | None = None
    filesHash: str | None = Field(default=None, max_length=128)
    forceUpload: bool | None = None


class TemplateSpec(BaseModel):
    """The body of ``POST /v2/templates/{id}/builds/{build}`` (``TemplateBuildStartV2``)."""

    model_config = ConfigDict(extra="ignore")

    steps: list[TemplateStep] = Field(default_factory=list, max_length=1000)
    force: bool = False
    fromImage: str | None = Field(default=None, max_length=1000)
    fromTemplate: str | None = Field(default=None, max_length=1000)
    fromImageRegistry: dict[str, object] | None = None
    startCmd: str | None = Field(default=None, max_length=100_000)
    readyCmd: str | None = Field(default=None, max_length=100_000)


@dataclass
class DockerfilePlan:
    """A Dockerfile and, per instruction (0-based), the SDK step it came from."""

    lines: list[str] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)

    def add(self, step: str, line: str) -> None:
        self.lines.append(line)
        self.steps.append(step)

    @property
    def text(self) -> str:
        return "\n".join(self.lines) + "\n"

    def step_of(self, instruction: int) -> str:
        """The SDK step of podman's ``STEP n`` (1-based)."""
        return self.steps[instruction - 1] if 0 < instruction <= len(self.steps) else BASE_STEP


def _json(argv: list[str]) -> str:
    return json.dumps(argv)


def to_dockerfile(
    spec: TemplateSpec, base: str, copies: dict[int, tuple[str, str]]
) -> DockerfilePlan:
    """``base``: the image to start from (a name or an image id, already resolved);
    ``copies``: each ``COPY`` step's number -> (its tar in the build context, the directory
    to unpack it in) (:func:`~.template_files.stage_copy`).

    :raises InvalidInput: a step with missing arguments or files.
    """
    plan = DockerfilePlan()
    plan.add(BASE_STEP, f"FROM {base}")
    plan.add(BASE_STEP, "USER root")
    plan.add(BASE_STEP, f"RUN {_json(['/bin/sh', '-c', _PROVISION])}")
    plan.add(BASE_STEP, f"USER {_USER}")
    plan.add(BASE_STEP, f"WORKDIR {_HOME}")
    user = _USER
    for number, step in enumerate(spec.steps, start=1):
        name = str(number)
        args = step.args
        if step.type == "RUN":
            if not args:
                raise InvalidInput(f"step {number}: RUN without a command")
            run = f"RUN {_json(['/bin/sh', '-c', args[0]])}"
            if len(args) > 1 and args[1] and args[1] != user:
                plan.add(name, f"USER {args[1]}")
                plan.add(name, run)
                plan.add(name, f"USER {user}")
            else:
                plan.add(name, run)
        elif step.type == "COPY":
            if number not in copies:
                raise InvalidInput(f"step {number}: COPY needs a source, a target and files")
            archive, target = copies[number]
            owner = args[2] if len(args) > 2 and args[2] else user
            plan.add(name, f"ADD --chown={owner} {_json([archive, target])}")
        elif step.type == "ENV":
            if not args or len(args) % 2:
                raise InvalidInput(f"step {number}: ENV needs name and value pairs")
            pairs = " ".join(
                f"{key}={json.dumps(value)}"
                for key, value in zip(args[::2], args[1::2], strict=True)
            )
            plan.add(name, f"ENV {pairs}")
        elif step.type == "WORKDIR":
            if not args:
                raise InvalidInput(f"step {number}: WORKDIR without a path")
            # podman makes a WORKDIR only once a later step writes there; the start
            # command needs it too: made now, owned by the user it is made for.
            path = shlex.quote(args[0])
            make = f"[ -d {path} ] || {{ mkdir -p {path} && chown {shlex.quote(user)} {path}; }}"
            plan.add(name, "USER root")
            plan.add(name, f"RUN {_json(['/bin/sh', '-c', make])}")
            plan.add(name, f"USER {user}")
            plan.add(name, f"WORKDIR {json.dumps(args[0])}")
        else:  # USER
            if not args or not args[0]:
                raise InvalidInput(f"step {number}: USER without a name")
            user = args[0]
            plan.add(name, f"USER {user}")
    if spec.startCmd:
        plan.add(FINALIZE_STEP, f"CMD {_json(['/bin/sh', '-c', spec.startCmd])}")
    if spec.readyCmd:
        plan.add(FINALIZE_STEP, f"LABEL {READY_LABEL}={json.dumps(spec.readyCmd)}")
    return plan
