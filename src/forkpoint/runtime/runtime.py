"""The runtime: one façade over the services that do the work.

:class:`Runtime` is what every door (CLI, REST, SDK server, MCP, the E2B gateway, the
page) holds. It builds the services of one home — each in its own sub-package, receiving
what it needs and never importing this module (see ``docs/architecture.md``) — and
offers their operations under one name each: ``runtime.fork`` *is* ``Restore.fork``,
bound here, not re-declared. The reads (``get``, ``list_*``) are :class:`Queries`'.

The store is the truth; every operation that changes a session holds that session's
inter-process lock, so two CLIs and a server can work side by side. The blocking methods
(``get``, ``list_*``, ``gc``, ``history``, ...) are run by async callers with
``asyncio.to_thread``; the ``async`` ones never block the event loop.
"""

from __future__ import annotations

import asyncio

from forkpoint.config import ApiLimits, Home, home
from forkpoint.models import EventKind
from forkpoint.runtime import image_builds
from forkpoint.runtime.admission import UNLIMITED, Admission
from forkpoint.runtime.checkpoints.service import Checkpoints
from forkpoint.runtime.context import RuntimeContext
from forkpoint.runtime.events import Events, became, checkpointed, created, forked, removed
from forkpoint.runtime.guest.link import GuestLink
from forkpoint.runtime.guest.service import Guest
from forkpoint.runtime.guest.watchers import Watchers
from forkpoint.runtime.history.service import History
from forkpoint.runtime.housekeeping.collector import Collector
from forkpoint.runtime.inspection.service import Inspection
from forkpoint.runtime.metrics import Metrics
from forkpoint.runtime.queries import Queries
from forkpoint.runtime.restore.prepare import RollbackPreparer
from forkpoint.runtime.restore.service import Restore
from forkpoint.runtime.sessions.egress_rules import EgressRules
from forkpoint.runtime.sessions.lifetime import Lifetimes
from forkpoint.runtime.sessions.service import Sessions
from forkpoint.runtime.volumes import Volumes
from forkpoint.store import Store
from forkpoint.vm import QemuBuild
from forkpoint.vm.jail import jails_processes

__all__ = ["Runtime"]


class Runtime(Queries):
    """In-process forkpoint. Open with :meth:`open`; every method is safe to call from
    several processes at once. Errors are :class:`~forkpoint.errors.ForkpointError`."""

    def __init__(self, home_: Home, store: Store) -> None:
        super().__init__(home_, store)
        self.context = context = RuntimeContext(home_, store)
        self.warm = context.warm
        self.standbys = context.standbys

        # The services, each given only what it uses (in an order without cycles).
        collector = Collector(context)
        link = GuestLink(context)
        preparer = RollbackPreparer(context)
        sessions = Sessions(context, link, collector)
        restore = Restore(context, sessions, link, preparer)
        checkpoints = Checkpoints(context, collector, preparer)
        history = History(context, checkpoints, collector, restore)
        guest = Guest(link, history)
        lifetimes = Lifetimes(context, sessions, checkpoints, restore, collector)
        inspection = Inspection(context, restore, sessions, link)
        metrics = Metrics(context, link)
        egress = EgressRules(context)
        volumes = Volumes(context)
        events = Events(context)
        announce = events.announce  # records what an operation did, once it succeeded
        self.watchers = watchers = Watchers(
            guest.watch_dir, lambda ref: context.store.get_session(ref).id
        )

        # Their operations, one name each.
        self.create = announce(sessions.create, created)
        self.prepare = sessions.prepare
        self.fill_warm = sessions.fill_warm
        self.stop = sessions.stop
        self.remove = announce(sessions.remove, removed)
        self.console = sessions.console
        self.forward_port = sessions.forward_port
        self.set_timeout = lifetimes.set_timeout
        self.set_egress = egress.set_egress
        self.injected_headers = egress.injected_headers
        self.expire = lifetimes.expire
        self.pause = announce(lifetimes.pause, became(EventKind.PAUSED))
        self.resume = announce(lifetimes.resume, became(EventKind.RESUMED))
        self.paused_at = lifetimes.paused_at
        self.checkpoint = announce(checkpoints.checkpoint, checkpointed)
        self.verify_checkpoint = checkpoints.verify_checkpoint
        self.push_checkpoint = checkpoints.push_checkpoint
        self.pull_checkpoint = checkpoints.pull_checkpoint
        self.export_checkpoint = checkpoints.export_checkpoint
        self.import_checkpoint = checkpoints.import_checkpoint
        self.remove_image = checkpoints.remove_image
        self.images = image_builds.images
        self.build_image = image_builds.build
        self.remove_checkpoint = collector.remove_checkpoint
        self.gc = collector.gc
        self.collect_hidden_checkpoints = collector.collect_hidden_checkpoints
        self.fork = announce(restore.fork, forked)
        self.scratch_fork = restore.scratch_fork
        self.rollback = announce(restore.rollback, became(EventKind.ROLLED_BACK))
        self.recover = restore.recover
        self.adopt = announce(restore.adopt, created)
        self.prepare_rollback = preparer.prepare_rollback
        self.scratch_sessions = context.scratch_sessions
        self.history = history.history
        self.undo = announce(history.undo, became(EventKind.ROLLED_BACK))
        self.step_labels = history.step_labels
        self.diff = inspection.diff
        self.diff_forks = inspection.diff_forks
        self.rollback_preview = inspection.rollback_preview
        self.metrics = metrics.metrics
        self.events = events.events
        self.recent_events = events.recent_events
        self.sample_metrics = metrics.sample
        self.agent = link.agent
        self.exec = guest.exec
        self.spawn = guest.spawn
        self.read_file = guest.read_file
        self.read_file_to = guest.read_file_to
        self.write_file = guest.write_file
        self.list_files = guest.list_files
        self.stat = guest.stat
        self.watch_dir = guest.watch_dir
        self.create_watcher = watchers.create_watcher
        self.watcher_events = watchers.watcher_events
        self.remove_watcher = watchers.remove_watcher
        self.make_dir = guest.make_dir
        self.rename = guest.rename
        self.remove_file = guest.remove_file
        self.ps = guest.ps
        self.restore_status = guest.restore_status
        self.kill_process = guest.kill_process
        self.start_process = guest.start_process
        self.attach_process = guest.attach_process
        self.send_stdin = guest.send_stdin
        self.resize_process = guest.resize_process
        self.close_stdin = guest.close_stdin
        self.signal_process = guest.signal_process
        self.list_processes = guest.list_processes
        self.tcp_tunnel = guest.tcp_tunnel
        self.checkpoint_files = context.checkpoint_files
        self.create_volume = volumes.create_volume
        self.list_volumes = volumes.list_volumes
        self.get_volume = volumes.get_volume
        self.remove_volume = volumes.remove_volume
        self.volume_files = volumes.files
        self.volume_records = volumes.records
        self.volume_record = volumes.record
        self.volume_stat = volumes.volume_stat
        self.volume_list = volumes.volume_list
        self.volume_read = volumes.volume_read
        self.volume_read_file = volumes.volume_read_file
        self.volume_write = volumes.volume_write
        self.volume_make_dir = volumes.volume_make_dir
        self.volume_set_metadata = volumes.volume_set_metadata
        self.volume_remove = volumes.volume_remove
        #: What a long-lived door lets in; everything until one calls :meth:`serve_long_lived`.
        self.admission = Admission(UNLIMITED, self)

    @property
    def filters_egress(self) -> bool:
        """Whether guests are held to their egress rules (jailed VMs: forkpoint is root)."""
        return jails_processes()

    @property
    def build(self) -> QemuBuild:
        """The QEMU in use; identified on first need (it hashes the binary)."""
        return self.context.build

    @property
    def refill_in_background(self) -> bool:
        """Whether warm VMs and rollback standbys are started in the background (a
        long-lived door) or by the CLI once it has printed its result."""
        return self.context.refill_in_background

    @refill_in_background.setter
    def refill_in_background(self, value: bool) -> None:
        self.context.refill_in_background = value

    @property
    def background(self) -> set[asyncio.Task[object]]:
        """The work running in the background (refills, standbys)."""
        return self.context.background

    @classmethod
    def open(cls, home_: Home | None = None) -> Runtime:
        h = (home_ or home()).ensure()
        return cls(h, Store.open(h))

    def close(self) -> None:
        self.store.close()

    def serve_long_lived(self, limits: ApiLimits) -> Admission:
        """Run as the runtime of a long-lived door (the REST server, the E2B gateway, MCP),
        each of which calls this once: admit heavy operations within ``limits``, and
        refill warm VMs after a create and prepare rollback standbys after a checkpoint or
        rollback in the background. Doors sharing a runtime share the first limits set,
        and so one count of what runs."""
        self.context.refill_in_background = True
        if self.admission.limits == UNLIMITED:
            self.admission = Admission(limits, self)
        return self.admission
