"""The REST API (FastAPI) over the runtime: :func:`create_app`, and where it listens."""

from forkpoint.server.app import DEFAULT_MAX_JSON_BYTES, DEFAULT_MAX_UPLOAD_BYTES, create_app
from forkpoint.server.listen import bind_tcp, bind_unix, is_loopback, serve_on, write_token

__all__ = [
    "DEFAULT_MAX_JSON_BYTES",
    "DEFAULT_MAX_UPLOAD_BYTES",
    "bind_tcp",
    "bind_unix",
    "create_app",
    "is_loopback",
    "serve_on",
    "write_token",
]
