"""``forkpoint bench``: forkpoint's operations timed side by side with baselines.

A consumer of the public runtime and vm APIs: :class:`Suite` runs the measurements,
:mod:`~forkpoint.bench.report` turns them into ``bench.json`` and ``bench.md``.
"""

from forkpoint.bench.fanout import fanout_rows
from forkpoint.bench.report import build_result, op_rows, render_markdown, write_report
from forkpoint.bench.stats import Summary, percentile, summarize
from forkpoint.bench.suite import Plan, Suite

__all__ = [
    "Plan",
    "Suite",
    "Summary",
    "build_result",
    "fanout_rows",
    "op_rows",
    "percentile",
    "render_markdown",
    "summarize",
    "write_report",
]
