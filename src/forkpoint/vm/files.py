"""The files of one VM: sockets, logs, pidfile, RAM file."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

__all__ = ["VmFiles"]

# sun_path holds 108 bytes; leave room for the longest socket name below.
_MAX_SOCKET_DIR = 90


@dataclass(frozen=True)
class VmFiles:
    """Paths for one VM. ``dir`` holds logs and RAM; sockets go to a short directory."""

    dir: Path
    name: str  # unique, also written into QEMU's argv to recognise the process
    tag: str = ""  # a standby's (see :meth:`standby`); "" for the VM's own files

    @property
    def sock_dir(self) -> Path:
        preferred = self.dir / "run"
        if len(str(preferred)) <= _MAX_SOCKET_DIR:
            return preferred
        import hashlib  # here: only a path too long for a unix socket needs them
        import tempfile

        digest = hashlib.sha256(str(self.dir).encode()).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"forkpoint-{digest}"

    @property
    def qmp_socket(self) -> Path:
        return self.sock_dir / f"qmp{self._suffix}.sock"

    @property
    def agent_socket(self) -> Path:
        return self.sock_dir / f"agent{self._suffix}.sock"

    @property
    def net_socket(self) -> Path:
        return self.sock_dir / f"net{self._suffix}.sock"

    @property
    def volumes_socket(self) -> Path:
        """The guest's volume mounts' port (``volume_server.py`` connects to it)."""
        return self.sock_dir / f"vol{self._suffix}.sock"

    @property
    def _suffix(self) -> str:
        return f".{self.tag}" if self.tag else ""

    @property
    def qemu_log(self) -> Path:
        return self.dir / "qemu.log"

    @property
    def serial_log(self) -> Path:
        return self.dir / "serial.log"

    @property
    def pidfile(self) -> Path:
        return self.dir / f"qemu{self._suffix}.pid"  # QEMU locks it: one per process

    @property
    def boot_ram(self) -> Path:
        """The empty RAM file a cold-booted VM maps (restored VMs map a checkpoint's)."""
        return self.dir / "ram"

    @property
    def empty_root(self) -> Path:
        """The empty, read-only directory a jailed QEMU is chrooted into (see :mod:`.jail`)."""
        return self.dir / "root"

    def standby(self, tag: str) -> VmFiles:
        """The files of a second QEMU for the same VM, started ahead to replace it (see
        ``runtime/restore/standby.py``): its own ``-name`` (``name.tag``: not the VM's, so killing
        the VM by name spares it) and its own sockets and pidfile beside the VM's. Logs
        and the chroot are shared. ``tag``: at most 5 characters (socket path length)."""
        assert 0 < len(tag) <= 5 and not self.tag
        return VmFiles(self.dir, f"{self.name}.{tag}", tag)

    def move_into(self, own: VmFiles) -> None:
        """Make a standby's sockets and pidfile the VM's own (renamed over the files of
        the VM it replaces, which must be killed): a bound socket follows its path."""
        for mine, theirs in (
            (self.qmp_socket, own.qmp_socket),
            (self.agent_socket, own.agent_socket),
            (self.net_socket, own.net_socket),
            (self.volumes_socket, own.volumes_socket),
            (self.pidfile, own.pidfile),
        ):
            with contextlib.suppress(FileNotFoundError):  # no network: no net socket
                mine.rename(theirs)

    def remove_own(self) -> None:
        """Delete the sockets and pidfile of these files (a standby's, once it is gone)."""
        for path in (
            self.qmp_socket, self.agent_socket, self.net_socket, self.volumes_socket,
            self.pidfile,
        ):  # fmt: skip
            path.unlink(missing_ok=True)

    def ensure(self) -> VmFiles:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.sock_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.empty_root.mkdir(exist_ok=True, mode=0o555)
        return self

    def log_tail(self, lines: int = 15) -> str:
        """The last lines of QEMU's log and the serial console, for error reports."""
        parts = []
        for label, path in (("qemu.log", self.qemu_log), ("serial console", self.serial_log)):
            try:
                text = path.read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                continue
            if text:
                parts.append(f"--- {label} ({path}) ---\n" + "\n".join(text))
        return "\n".join(parts)
