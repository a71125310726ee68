"""hello (who is this agent) and restore_identity (fresh clock/RNG/hostname after a restore).

A restored or forked VM resumes with the clock and RNG state of the moment it was
checkpointed, and every fork shares them: vmgenid does not work on microvm, so the host
hands over its wall clock and fresh entropy after every restore.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import time
from collections.abc import Callable
from typing import Final

from ..protocol import (
    PROTOCOL_VERSION,
    HelloArgs,
    HelloResult,
    RestoreIdentityArgs,
    RestoreIdentityResult,
)
from .context import Context

__all__ = ["RNDADDENTROPY", "RNDRESEEDCRNG", "IdentityOps", "boot_id"]

# <linux/random.h>: _IOW('R', 0x03, int[2]) and _IO('R', 0x07)
RNDADDENTROPY: Final = 0x40085203
RNDRESEEDCRNG: Final = 0x5207


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


class IdentityOps:
    """Handlers for hello and restore_identity.

    ``dry_run``: restore_identity only validates and reports (for running on a host).
    """

    def __init__(self, *, dry_run: bool = False, hostname_file: str = "/etc/hostname") -> None:
        self.dry_run = dry_run
        self.hostname_file = hostname_file

    def hello(self, ctx: Context, args: HelloArgs) -> HelloResult:
        return HelloResult(
            nonce=args.nonce,
            protocol_version=PROTOCOL_VERSION,
            pid=os.getpid(),
            hostname=socket.gethostname(),
            boot_id=boot_id(),
        )

    def restore_identity(self, ctx: Context, args: RestoreIdentityArgs) -> RestoreIdentityResult:
        """Set the clock, reseed the kernel RNG, set the hostname (needs root).

        Raises OSError (e.g. PermissionError) naming the step that failed; steps before
        it have been applied.
        """
        if self.dry_run:
            return RestoreIdentityResult(
                clock_set=False,
                clock_delta_ns=args.time_ns - time.time_ns(),
                entropy_bytes=len(args.entropy),
                reseeded=False,
                hostname=args.hostname,
                dry_run=True,
            )
        before = time.time_ns()
        _step("clock_settime", time.clock_settime_ns, time.CLOCK_REALTIME, args.time_ns)
        with open("/dev/urandom", "wb", buffering=0) as rnd:
            info = struct.pack("ii", len(args.entropy) * 8, len(args.entropy)) + args.entropy
            _step("RNDADDENTROPY", fcntl.ioctl, rnd.fileno(), RNDADDENTROPY, info)
            _step("RNDRESEEDCRNG", fcntl.ioctl, rnd.fileno(), RNDRESEEDCRNG)
        if args.hostname is not None:
            _step("sethostname", socket.sethostname, args.hostname)
            try:
                with open(self.hostname_file, "w") as f:
                    f.write(args.hostname + "\n")
            except OSError:
                pass  # a read-only /etc must not undo a working reseed
        return RestoreIdentityResult(
            clock_set=True,
            clock_delta_ns=args.time_ns - before,
            entropy_bytes=len(args.entropy),
            reseeded=True,
            hostname=args.hostname,
            dry_run=False,
        )


def _step(name: str, fn: Callable[..., object], *args: object) -> None:
    try:
        fn(*args)
    except OSError as e:
        raise type(e)(e.errno, f"{name} failed: {e.strerror}") from None
