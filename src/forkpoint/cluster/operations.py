"""The local runtime's operations on one session that a cluster runs, as they are, on the
node holding the session: their first argument is the session, and their other arguments
and their answers cross Ray as they are (no stream, no local file). ``ClusterRuntime``
forwards each to the session's daemon (:meth:`~.node.NodeDaemon.on_session`), which runs
nothing else this way."""

__all__ = ["NODE_READS", "ON_SESSION_NODE"]

ON_SESSION_NODE = frozenset(
    {
        # lifetime and state
        "set_timeout", "pause", "resume", "set_egress", "injected_headers", "rollback",
        "rollback_preview",
        "history", "undo", "metrics", "restore_status", "console",
        # processes
        "ps", "list_processes", "kill_process", "signal_process", "send_stdin",
        "close_stdin", "resize_process",
        # files
        "read_file", "write_file", "list_files", "stat", "make_dir", "rename", "remove_file",
        "create_watcher", "watcher_events", "remove_watcher",
    }
)  # fmt: skip

#: The local runtime's reads of a whole node that the cluster gathers from every node
#: (the page's state): each answers for its own home.
NODE_READS = frozenset({"step_labels", "latest_metrics", "host_status"})
