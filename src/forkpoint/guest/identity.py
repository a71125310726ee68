"""hello (who is this agent) and restore_identity (fresh clock/RNG/hostname after a restore,
then the guest's processes told: see ``restore``).

A restored or forked VM resumes with the clock and RNG state of the moment it was
checkpointed, and every fork shares them: vmgenid does not work on microvm, so the host
hands over its wall clock and fresh entropy after every restore. It sends that identity
right after the restore without waiting, and again with every later hello: each identity
carries a token naming its restore, and is applied once per token.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import sys
import threading
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
from .restore import RestoreOps

__all__ = ["RNDADDENTROPY", "RNDRESEEDCRNG", "IdentityOps", "boot_id"]

# <linux/random.h>: _IOW('R', 0x03, int[2]) and _IO('R', 0x07)
RNDADDENTROPY: Final = 0x40085203
RNDRESEEDCRNG: Final = 0x5207
_CLOCK_SLACK_NS: Final = 10_000_000


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

    def __init__(
        self,
        restore: RestoreOps,
        *,
        dry_run: bool = False,
        hostname_file: str = "/etc/hostname",
    ) -> None:
        self.restore = restore
        self.dry_run = dry_run
        self.hostname_file = hostname_file
        self.applied_token: str | None = None
        # Requests run in parallel threads, so an identity that arrived earlier can be
        # handled later: e.g. one posted to a VM just before it was checkpointed, still
        # unread, and the fork's own one behind it. The connection generation orders them.
        self._applied_generation = -1
        self._lock = threading.Lock()

    def hello(self, ctx: Context, args: HelloArgs) -> HelloResult:
        if args.identity is not None:
            with self._lock:
                if ctx.generation < self._applied_generation:
                    pass  # a newer connection already set the identity
                elif args.identity.token is None or args.identity.token != self.applied_token:
                    self._apply(ctx, args.identity)
                elif not self.dry_run:
                    _catch_up_clock(args.identity.time_ns)
        return HelloResult(
            nonce=args.nonce,
            protocol_version=PROTOCOL_VERSION,
            pid=os.getpid(),
            hostname=socket.gethostname(),
            boot_id=boot_id(),
            identity_token=self.applied_token,
        )

    def restore_identity(self, ctx: Context, args: RestoreIdentityArgs) -> RestoreIdentityResult:
        """Set the clock, reseed the kernel RNG, set the hostname (needs root).

        Raises OSError (e.g. PermissionError) naming the step that failed; steps before
        it have been applied.
        """
        with self._lock:
            return self._apply(ctx, args)

    def _apply(self, ctx: Context, args: RestoreIdentityArgs) -> RestoreIdentityResult:
        """Apply ``args`` and remember its token (the caller holds the lock)."""
        self._applied_generation = max(self._applied_generation, ctx.generation)
        if args.token is not None:
            self.applied_token = args.token  # a failure below must not be retried forever
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
        if args.restore is not None:  # last: a process told finds the new identity
            try:
                self.restore.restored(args.restore, args.hostname)
            except OSError as error:  # e.g. /run full: the identity itself is applied
                print(
                    f"forkpoint: telling the guest of its restore failed: {error}", file=sys.stderr
                )
        return RestoreIdentityResult(
            clock_set=True,
            clock_delta_ns=args.time_ns - before,
            entropy_bytes=len(args.entropy),
            reseeded=True,
            hostname=args.hostname,
            dry_run=False,
        )


def _catch_up_clock(host_time_ns: int) -> None:
    """Step the clock forward to ``host_time_ns`` if it is behind it.

    The identity posted right after a restore is applied only once the guest gets to
    run, so the clock it sets lags by that delay (a good part of a second under TCG).
    The host's time in a later hello is a lower bound of the true time: moving up to it
    never overshoots, and the clock never goes backwards.
    """
    if time.time_ns() < host_time_ns - _CLOCK_SLACK_NS:
        try:
            time.clock_settime_ns(time.CLOCK_REALTIME, host_time_ns)
        except OSError:
            pass  # not root: the first restore_identity already said so


def _step(name: str, fn: Callable[..., object], *args: object) -> None:
    try:
        fn(*args)
    except OSError as e:
        raise type(e)(e.errno, f"{name} failed: {e.strerror}") from None
