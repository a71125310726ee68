"""The in-guest agent: serves the forkpoint protocol on the virtio-serial port ``agent``.

Run as ``PYTHONPATH=/opt/forkpoint python3 -m forkpoint.guest.agent`` (stdlib only).
``--connect-unix PATH`` serves over a unix socket instead (for tests on the host).

One reader thread decodes frames; each request runs in its own thread; writes are
serialised. Connections are numbered ("generations"): a new one starts when the host
sends ``SYNC_MAGIC`` (the agent answers with ``SYNC_MAGIC``) or the transport reports a
disconnect. Responses for requests of an older generation are dropped, uploads of an
older generation are aborted, partial frames are discarded: every connection starts clean.
"""

from __future__ import annotations

import argparse
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from ..protocol import (
    OPS,
    SYNC,
    SYNC_MAGIC,
    BadArguments,
    Empty,
    ErrorCode,
    FrameDecoder,
    Op,
    ProtocolError,
    Request,
    StreamCancelArgs,
    encode_frame,
    error_message,
    from_wire,
    ok_message,
    parse_request,
    request_id_of,
    to_wire,
)
from .context import ConnectionGone, Context, GuestError
from .files import FileOps
from .identity import IdentityOps
from .process_table import ProcessTable
from .procs import ProcessOps
from .restore import ListenersPort, RestoreOps
from .scan import ScanOps
from .stats import guest_stats
from .streams import StreamRegistry
from .transport import (
    Disconnected,
    Transport,
    TransportClosed,
    UnixClientTransport,
    VirtioPortTransport,
    find_virtio_port,
)
from .tunnels import TunnelOps
from .volumes import start_bridge
from .watch import WatchOps

__all__ = ["Agent", "error_for", "main"]

Handler = Callable[[Context, Any], Any]


def error_for(exc: BaseException) -> tuple[ErrorCode, str]:
    """The protocol error code and one-line message for an exception from a handler."""
    if isinstance(exc, GuestError):
        return exc.code, exc.message
    if isinstance(exc, BadArguments):
        return ErrorCode.INVALID_INPUT, f"invalid arguments: {exc}"
    if isinstance(exc, ProtocolError):
        return ErrorCode.PROTOCOL_ERROR, str(exc)
    if isinstance(exc, OSError):
        where = f": {exc.filename}" if exc.filename is not None else ""
        text = f"{exc.strerror or exc}{where}"
        if isinstance(exc, FileNotFoundError):
            return ErrorCode.NOT_FOUND, f"no such file or directory{where}"
        if isinstance(exc, ProcessLookupError):
            return ErrorCode.NOT_FOUND, "no such process"
        if isinstance(exc, IsADirectoryError):
            return ErrorCode.INVALID_INPUT, f"is a directory{where}"
        if isinstance(exc, NotADirectoryError):
            return ErrorCode.INVALID_INPUT, f"not a directory{where}"
        if isinstance(exc, FileExistsError):
            return ErrorCode.INVALID_INPUT, f"already exists{where}"
        if isinstance(exc, PermissionError):
            return ErrorCode.PERMISSION_DENIED, f"permission denied: {text}"
        return ErrorCode.IO_ERROR, text
    if isinstance(exc, ValueError):  # e.g. a path with unencodable characters
        return ErrorCode.INVALID_INPUT, str(exc)
    return ErrorCode.INTERNAL, f"agent bug: {type(exc).__name__}: {exc}"


class Agent:
    """Serves requests from ``transport`` until it is closed."""

    def __init__(
        self, transport: Transport, *, log_dir: str, identity_dry_run: bool = False
    ) -> None:
        self._transport = transport
        self._write_lock = threading.Lock()
        self._generation = 0
        self._decoder = FrameDecoder(require_sync=True)
        self.files = FileOps()
        self.procs = ProcessOps(log_dir)
        self.restores = RestoreOps()
        self.identity = IdentityOps(self.restores, dry_run=identity_dry_run)
        self.streams = StreamRegistry()
        self.processes = ProcessTable(self.streams)
        self.tunnels = TunnelOps(self.streams)
        self.scans = ScanOps(self.procs)
        self.watches = WatchOps(self.streams, self.files)
        self._handlers: dict[Op, Handler] = {
            Op.HELLO: self.identity.hello,
            Op.EXEC: self.procs.exec,
            Op.SPAWN: self.procs.spawn,
            Op.READ_FILE: self.files.read_file,
            Op.WRITE_BEGIN: self.files.write_begin,
            Op.WRITE_CHUNK: self.files.write_chunk,
            Op.WRITE_COMMIT: self.files.write_commit,
            Op.WRITE_ABORT: self.files.write_abort,
            Op.LIST_DIR: self.files.list_dir,
            Op.STAT: self.files.stat,
            Op.REMOVE: self.files.remove,
            Op.PS: self.procs.ps,
            Op.KILL: self.procs.kill,
            Op.RESTORE_IDENTITY: self.identity.restore_identity,
            Op.PROC_START: self.processes.start,
            Op.PROC_ATTACH: self.processes.attach,
            Op.PROC_INPUT: self.processes.input,
            Op.PROC_CLOSE_STDIN: self.processes.close_stdin,
            Op.PROC_SIGNAL: self.processes.signal,
            Op.PROC_LIST: self.processes.list_processes,
            Op.PROC_RESIZE: self.processes.resize,
            Op.STREAM_CREDIT: self.streams.credit,
            Op.STREAM_CANCEL: self._cancel_stream,
            Op.TUNNEL_OPEN: self.tunnels.open,
            Op.TUNNEL_WRITE: self.tunnels.write,
            Op.TUNNEL_SHUTDOWN: self.tunnels.shutdown,
            Op.MAKE_DIR: self.files.make_dir,
            Op.RENAME: self.files.rename,
            Op.SCAN: self.scans.scan,
            Op.WATCH_DIR: self.watches.watch,
            Op.WATCH_FLUSH: self.watches.flush,
            Op.STATS: guest_stats,
            Op.RESTORE_STATUS: self.restores.status,
        }

    def _cancel_stream(self, ctx: Context, args: StreamCancelArgs) -> Empty:
        """Detach a process stream, or close a tunnel (also one whose stream has ended)."""
        self.streams.cancel(ctx.generation, args.request_id)
        self.tunnels.close((ctx.generation, args.request_id))
        return Empty()

    # -- writing -----------------------------------------------------------------------

    def _current_generation(self) -> int:
        return self._generation

    def send(self, generation: int, message: dict[str, Any]) -> bool:
        """Send one message of connection ``generation``; False if it was dropped."""
        try:
            frame = encode_frame(message)
        except ProtocolError as e:
            if "event" in message:
                raise GuestError(ErrorCode.TOO_LARGE, str(e)) from None
            message = error_message(message.get("id"), ErrorCode.TOO_LARGE, str(e))
            frame = encode_frame(message)
        with self._write_lock:
            if generation != self._generation:
                return False
            return self._transport.send(frame)

    def _new_generation(self, *, answer_sync: bool) -> None:
        with self._write_lock:
            self._generation += 1
            if answer_sync:
                self._transport.send(SYNC_MAGIC)
        self.files.abort_stale(self._generation)
        self.streams.drop_stale(self._generation)
        self.tunnels.drop_stale(self._generation)

    # -- reading -----------------------------------------------------------------------

    def serve_forever(self) -> None:
        """Read and dispatch until the transport is closed for good."""
        while True:
            try:
                data = self._transport.recv()
            except Disconnected:
                self._decoder.reset(require_sync=True)
                self._new_generation(answer_sync=False)
                continue
            except TransportClosed:
                return
            self._decoder.feed(data)
            try:
                self._drain()
            except Exception:  # a bug here must not kill the agent: start clean instead
                traceback.print_exc(file=sys.stderr)
                self._decoder.reset(require_sync=True)

    def _drain(self) -> None:
        while True:
            try:
                item = self._decoder.next()
            except ProtocolError as e:
                self.send(self._generation, error_message(None, ErrorCode.PROTOCOL_ERROR, str(e)))
                continue
            if item is None:
                return
            if item is SYNC:
                self._new_generation(answer_sync=True)
                continue
            assert isinstance(item, dict)
            try:
                request = parse_request(item)
            except ProtocolError as e:
                rid = request_id_of(item)
                self.send(self._generation, error_message(rid, ErrorCode.PROTOCOL_ERROR, str(e)))
                continue
            ctx = Context(request.id, self._generation, self.send, self._current_generation)
            threading.Thread(
                target=self._handle, args=(ctx, request), name=f"req-{request.id}", daemon=True
            ).start()

    def _handle(self, ctx: Context, request: Request) -> None:
        """Run one request and send its response; never raises."""
        try:
            try:
                op = Op(request.op)
            except ValueError:
                raise GuestError(ErrorCode.UNKNOWN_OP, f"unknown op: {request.op!r}") from None
            args_type, _ = OPS[op]
            args: Any = from_wire(args_type, request.args)
            result = self._handlers[op](ctx, args)
            message = ok_message(request.id, to_wire(result))
        except ConnectionGone:
            return
        except Exception as e:  # every failure becomes an error response
            code, text = error_for(e)
            if code == ErrorCode.INTERNAL:
                traceback.print_exc(file=sys.stderr)
            message = error_message(request.id, code, text)
        try:
            self.send(ctx.generation, message)
        except Exception:
            traceback.print_exc(file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="forkpoint-agent", description=__doc__)
    parser.add_argument("--port-name", default="agent", help="virtio-serial port name")
    parser.add_argument("--connect-unix", metavar="PATH", help="serve over a unix socket")
    parser.add_argument("--log-dir", default="/var/log/forkpoint", help="spawn log files")
    parser.add_argument(
        "--identity-dry-run",
        action="store_true",
        help="restore_identity only validates (never touches the clock/RNG/hostname)",
    )
    opts = parser.parse_args(argv)
    transport: Transport
    if opts.connect_unix:
        transport = UnixClientTransport(opts.connect_unix)
    else:
        transport = VirtioPortTransport(find_virtio_port(opts.port_name))
    agent = Agent(transport, log_dir=opts.log_dir, identity_dry_run=opts.identity_dry_run)
    if not opts.connect_unix:  # in a guest: say whether a restore must wait for it
        ListenersPort(agent.restores).start()
        threading.Thread(target=start_bridge, name="volumes-start", daemon=True).start()
    try:
        agent.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        transport.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
