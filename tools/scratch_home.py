"""Run a command in a scratch forkpoint home: ``<$FORKPOINT_HOME>/<name>-home``, sharing
the real home's images and caches (as the test suite's ``test-home`` does), so a fault
campaign or a load test never touches a user's sessions.

    python tools/scratch_home.py NAME -- COMMAND ARGS...
"""

from __future__ import annotations

import os
import sys

from forkpoint.config import home


def main() -> None:
    name, sep, *command = sys.argv[1:]
    if sep != "--" or not command:
        sys.exit(__doc__)
    real = home().ensure()
    scratch = real.root / f"{name}-home"
    scratch.mkdir(exist_ok=True)
    for shared in ("images", "cache"):
        link = scratch / shared
        if not link.is_symlink():
            link.symlink_to(real.root / shared)
    os.environ["FORKPOINT_HOME"] = str(scratch)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
