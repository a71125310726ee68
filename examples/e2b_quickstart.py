"""forkpoint driven by the unmodified official `e2b` SDK.

    forkpoint serve --e2b &
    eval "$(forkpoint e2b env)"
    python examples/e2b_quickstart.py

create → write an app → serve it in the background → get_host → fork(3) → every fork
answers through its own get_host from the same PID → pause → connect → still the same
PID → rollback (forkpoint's extension, plain HTTP) → kill.

`*.localhost` must resolve for Python (`make setup` installs libnss-myhostname); without
it, run with HTTP_PROXY=http://127.0.0.1:3001 NO_PROXY=127.0.0.1 (see README).
"""

from __future__ import annotations

import os
import time

import httpx
from e2b import Sandbox

APP = """
import http.server, os
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"hello from pid {os.getpid()}\\n".encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
    def log_message(self, *args): pass
http.server.ThreadingHTTPServer(("127.0.0.1", 8000), H).serve_forever()
"""


def fetch(sbx: Sandbox, timeout_s: float = 90.0) -> str:
    """GET / through the sandbox's get_host, waiting for the app to listen."""
    url = f"http://{sbx.get_host(8000)}/"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            response = httpx.get(url, timeout=5)
            if response.status_code == 200:
                return response.text.strip()
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not answer in {timeout_s} s")
        time.sleep(0.5)


def rollback(sbx: Sandbox, snapshot_id: str) -> None:
    """forkpoint's extension: roll the sandbox back in place (same id, same host)."""
    response = httpx.post(
        f"{os.environ['E2B_API_URL']}/sandboxes/{sbx.sandbox_id}/rollback",
        json={"snapshotID": snapshot_id},
        headers={"X-API-KEY": os.environ["E2B_API_KEY"]},
        timeout=120,
    )
    response.raise_for_status()


def main() -> None:
    sbx = Sandbox.create(timeout=600)
    forks: list[Sandbox] = []
    try:
        sbx.files.write("app.py", APP)
        server = sbx.commands.run("python3 app.py", background=True, timeout=0)
        first = fetch(sbx)
        print(f"{sbx.sandbox_id}: {first} (server pid {server.pid})")
        assert first == f"hello from pid {server.pid}"

        snapshot = sbx.create_snapshot()
        for fork in sbx.fork(count=3):
            if isinstance(fork, Exception):
                raise fork
            forks.append(fork)
            answer = fetch(fork)
            print(f"fork {fork.sandbox_id} via {fork.get_host(8000)}: {answer}")
            assert answer == first  # same process, same PID, in every fork

        sbx.pause()
        sbx = Sandbox.connect(sbx.sandbox_id)
        assert fetch(sbx) == first
        print(f"paused and resumed {sbx.sandbox_id}: {first}")

        sbx.commands.run(f"kill {server.pid}")
        rollback(sbx, snapshot.snapshot_id)
        assert fetch(sbx) == first
        print(f"killed the server, rolled back: {fetch(sbx)}")
    finally:
        for fork in forks:
            fork.kill()
        sbx.kill()


if __name__ == "__main__":
    main()
