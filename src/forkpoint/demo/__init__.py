"""``forkpoint demo``: the flagship scenario end to end, with a report to look at.

A consumer of the runtime like the CLI: :class:`Scenario` runs the steps with a pluggable
:class:`Builder` (the offline :class:`ScriptedBuilder`, or :class:`CommandBuilder` running
a real coding-agent CLI in the guest), and :func:`write_report` renders what it found.
"""

from forkpoint.demo.builder import (
    STEPS,
    AgentStepFailed,
    Builder,
    CommandBuilder,
    ScriptedBuilder,
    Step,
    StepResult,
    parse_usage,
)
from forkpoint.demo.chart import ChartCheck, check_chart
from forkpoint.demo.report import timing_rows, write_report
from forkpoint.demo.scenario import REFERENCE_MS, Scenario

__all__ = [
    "REFERENCE_MS",
    "STEPS",
    "AgentStepFailed",
    "Builder",
    "ChartCheck",
    "CommandBuilder",
    "Scenario",
    "ScriptedBuilder",
    "Step",
    "StepResult",
    "check_chart",
    "parse_usage",
    "timing_rows",
    "write_report",
]
