"""Joining the Ray cluster as a client: its address, the token it demands, the store."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from forkpoint.errors import Conflict, ForkpointError, InternalError, NotConfigured

__all__ = [
    "NAMESPACE",
    "NODE_LABEL",
    "NodeLost",
    "QEMU_LABEL",
    "SLOT",
    "connect",
    "daemon_errors",
    "daemon_name",
    "require_token_auth",
    "store_url",
]

#: Ray namespace of forkpoint's actors and placement groups.
NAMESPACE = "forkpoint"
#: The custom resource a node offers per VM it may run (``forkpoint cluster join --slots``).
SLOT = "forkpoint_vm"
#: The node label naming a forkpoint node (``ls`` and ``status`` show it).
NODE_LABEL = "forkpoint.dev/node"
#: The node label of its QEMU build (sha256 prefix of the binary): a checkpoint restores
#: only under the build that took it, so forks are placed on nodes with that label.
QEMU_LABEL = "forkpoint.dev/qemu"


class NodeLost(Conflict):
    """The node holding a session is gone (``forkpoint recover`` revives its sessions)."""

    code = "node_lost"


@contextlib.contextmanager
def daemon_errors(node_name: Callable[[], str], what: str) -> Iterator[None]:
    """A node daemon's answer to ``what``: its ForkpointError raised as itself, anything
    else it raised as InternalError, the daemon gone (dead, or not restartable: its node
    is gone, though Ray may not have said so yet) as NodeLost. ``node_name`` is asked
    only for a message."""
    import ray

    try:
        yield
    except ray.exceptions.RayTaskError as error:
        if isinstance(error.cause, ForkpointError):
            raise error.cause from None
        raise InternalError(f"node {node_name()}: {error.cause!r}") from None
    except (ray.exceptions.RayActorError, ray.exceptions.ActorUnschedulableError):
        raise NodeLost(f"node {node_name()} went away during {what}") from None


def daemon_name(node_id: str) -> str:
    """The named actor of the node daemon on Ray node ``node_id``."""
    return f"node-{node_id}"


def require_token_auth() -> None:
    """A cluster runs untrusted guests: refuse one without Ray's token authentication.

    :raises NotConfigured: ``RAY_AUTH_MODE`` is not ``token`` or no token is given."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        raise NotConfigured(
            "forkpoint joins only a Ray cluster with token authentication: "
            "set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH)"
        )
    if not (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")):
        raise NotConfigured("RAY_AUTH_MODE=token needs RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH")


def store_url() -> str:
    """The cluster's S3 store (checkpoints and session records), ``FORKPOINT_CLUSTER_STORE``.

    :raises NotConfigured: unset."""
    url = os.environ.get("FORKPOINT_CLUSTER_STORE", "").strip()
    if not url:
        raise NotConfigured(
            "a cluster needs its S3 store: set FORKPOINT_CLUSTER_STORE=s3://BUCKET/PREFIX "
            "(and AWS_ENDPOINT_URL and credentials for a self-hosted one)"
        )
    return url


def connect(address: str) -> None:
    """Connect this process to the Ray cluster at ``address`` (once per process).

    :raises NotConfigured: no token authentication, or the cluster cannot be reached."""
    require_token_auth()  # before Ray is even loaded
    import ray

    if ray.is_initialized():
        return
    try:
        ray.init(
            address=address, namespace=NAMESPACE, logging_level=logging.ERROR, log_to_driver=False
        )
    except (ConnectionError, ray.exceptions.AuthenticationError) as error:
        raise NotConfigured(f"cannot join the Ray cluster at {address}: {error}") from None
    if not isinstance(sys.stdout, _CommandsOwn):
        sys.stdout = _CommandsOwn(sys.stdout, sys.stderr)


class _CommandsOwn:
    """stdout for this process's own output only: Ray's driver prints cluster events (a
    node marked dead) on stdout from a thread of its own; they go to stderr, so a
    command's ``--json`` stays one document."""

    def __init__(self, out: TextIO, err: TextIO) -> None:
        self._out = out
        self._err = err

    def write(self, text: str) -> int:
        own = threading.current_thread() is threading.main_thread()
        return (self._out if own else self._err).write(text)

    def __getattr__(self, name: str) -> Any:  # flush, buffer, isatty, encoding, ...
        return getattr(self._out, name)
