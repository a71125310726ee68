"""``make cluster-bench``: ``forkpoint bench --cluster`` on the test cluster of
``cluster_net.py`` (a head and three nodes of 12 VM slots, each in its own network
namespace, on this machine). All nodes share this machine's two cores and one disk.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(out_dir: Path) -> int:
    from cluster_net import ClusterNet
    from forkpoint.config import home

    net = ClusterNet(home().ensure().root / "cluster-bench", slots=12)
    net.remove_files()
    try:
        net.start()
        forkpoint = Path(sys.executable).with_name("forkpoint")
        argv = ["ip", "netns", "exec", net.ns("head"), str(forkpoint), "bench", "--cluster"]
        return subprocess.run([*argv, "--out", str(out_dir.absolute())], env=net.env()).returncode
    finally:
        net.stop()
        net.remove_files()


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "bench-out")))
