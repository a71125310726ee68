"""The demo's builder agents: whoever writes ``/app/index.html`` at each step.

One small interface, :class:`Builder` (``await builder.build(step, session_id)``), two
implementations:

- :class:`ScriptedBuilder` (the default): offline and deterministic; writes the page
  variants of :mod:`forkpoint.demo.pages` through the runtime.
- :class:`CommandBuilder` (``--agent CMD``): runs a real coding-agent CLI inside the
  session with the step's prompt, in ``/app``. The prompt is in the file named by
  ``$FORKPOINT_PROMPT_FILE`` and in ``$FORKPOINT_PROMPT``; a JSON line on stdout with a
  ``usage`` object (or token counts) is recorded.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol

from forkpoint.demo.pages import DOT_PERIOD_MS, ROASTERY, page
from forkpoint.errors import ForkpointError, InvalidInput

if TYPE_CHECKING:
    from forkpoint.runtime import Runtime

__all__ = [
    "APP_DIR",
    "PAGE_PATH",
    "PROMPT_PATH",
    "STEPS",
    "AgentStepFailed",
    "Builder",
    "CommandBuilder",
    "ScriptedBuilder",
    "Step",
    "StepResult",
    "parse_usage",
]

APP_DIR: Final = "/app"
PAGE_PATH: Final = "/app/index.html"
PROMPT_PATH: Final = "/tmp/forkpoint-prompt.md"
_TAIL_CHARS = 2000
_TOKEN_KEYS = (
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "prompt_tokens",
    "completion_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)
_COST_KEYS = ("total_cost_usd", "cost_usd")


class AgentStepFailed(ForkpointError):
    """The ``--agent`` command exited non-zero at a step (exit 1: a guest command failed)."""

    code = "agent_failed"
    exit_code = 1


@dataclass(frozen=True)
class Step:
    """One instruction to the builder: ``key`` names the page variant it produces."""

    key: str
    title: str
    prompt: str


@dataclass(frozen=True)
class StepResult:
    """What one build step cost. ``usage`` is the agent's token report, if it printed one."""

    step: str
    session_id: str
    builder: str
    duration_ms: float
    exit_code: int = 0
    usage: dict[str, Any] | None = None
    output_tail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "step": self.step,
            "session_id": self.session_id,
            "builder": self.builder,
            "duration_ms": round(self.duration_ms, 1),
            "exit_code": self.exit_code,
            "usage": self.usage,
        }
        if self.output_tail:
            out["output_tail"] = self.output_tail
        return out | self.extra


class Builder(Protocol):
    """Writes (or edits) ``/app/index.html`` in a session for one step."""

    @property
    def name(self) -> str: ...

    async def build(self, step: Step, session_id: str) -> StepResult: ...


_RULES = (
    f"Work in {APP_DIR}. The page is ONE file, {PAGE_PATH}: inline CSS only, system fonts, "
    "no external resources (no CDN, no web fonts, no images from the network). "
    "All data is static: no clocks, dates or random numbers in the text. "
    "A web server (python3 -m http.server 8000) serves the directory; do not start, stop "
    "or restart any server."
)

STEPS: Final[dict[str, Step]] = {
    "original": Step(
        "original",
        "Build the dashboard",
        f'Build a status dashboard for a fictional coffee roastery, "{ROASTERY}", in '
        f"{PAGE_PATH}: a header with the roastery's name, four metric cards (e.g. kg "
        "roasted this week, batches today, green coffee stock, orders to ship), a table of "
        "recent roast batches (batch id, origin, profile, weight, roast level, status), and "
        "a small status dot (at most 12 px) that pulses with a CSS animation. Set the dot's "
        "animation phase from the wall clock with an inline script: "
        f"`dot.style.animationDelay = -(Date.now() % {DOT_PERIOD_MS}) + 'ms'` for a "
        f"{DOT_PERIOD_MS} ms animation. Nothing else on the page may move. {_RULES}",
    ),
    "scandinavian": Step(
        "scandinavian",
        "Fork 1: minimal Scandinavian",
        f"Restyle the dashboard in {PAGE_PATH} as a light, minimal Scandinavian design: "
        "off-white background, generous white space, hairline dividers instead of boxes, "
        "thin dark type, one muted accent colour. Keep all content and the pulsing dot. " + _RULES,
    ),
    "crt": Step(
        "crt",
        "Fork 2: retro green CRT terminal",
        f"Restyle the dashboard in {PAGE_PATH} as a retro green CRT terminal: black "
        "background, phosphor-green monospace text with a soft glow, static scanlines, "
        "dashed or box-drawing borders. Keep all content and the pulsing dot. " + _RULES,
    ),
    "chart": Step(
        "chart",
        "Fork 3: add a seven-day chart",
        f"Keep the design of the dashboard in {PAGE_PATH} and add a bar chart of the kg "
        "roasted on each of the last seven days, as inline SVG: one <rect> bar per day and "
        "a <text> value label with the bar's number centred above each bar, plus the day "
        "names below. Bar heights must be exactly proportional to their value labels (the "
        "same px per kg for every bar). Keep it all visible in a 1280x800 viewport. " + _RULES,
    ),
}


class ScriptedBuilder:
    """The offline, deterministic builder: writes the prepared page for each step."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    @property
    def name(self) -> str:
        return "scripted"

    async def build(self, step: Step, session_id: str) -> StepResult:
        started = time.perf_counter()
        await self._runtime.write_file(session_id, PAGE_PATH, page(step.key).encode())
        return StepResult(step.key, session_id, self.name, _ms_since(started))


class CommandBuilder:
    """Runs ``command`` (a shell command line) in the guest for each step, in ``/app``.

    :raises AgentStepFailed: the command exits non-zero; :raises CommandTimeout: it runs
        longer than ``timeout_s`` seconds (then it is killed).
    """

    def __init__(self, runtime: Runtime, command: str, timeout_s: float = 1800.0) -> None:
        if not command.strip():
            raise InvalidInput("--agent needs a command")
        if timeout_s <= 0:
            raise InvalidInput(f"the agent timeout must be positive, got {timeout_s:g} s")
        self._runtime = runtime
        self.command = command
        self.timeout_s = timeout_s

    @property
    def name(self) -> str:
        first = self.command.strip().splitlines()[0]
        short = first if len(first) <= 60 and "\n" not in self.command.strip() else first[:57]
        return f"agent: {short}" + ("…" if short != self.command.strip() else "")

    async def build(self, step: Step, session_id: str) -> StepResult:
        runtime = self._runtime
        await runtime.exec(session_id, ["mkdir", "-p", APP_DIR])
        await runtime.write_file(session_id, PROMPT_PATH, step.prompt.encode())
        env = {
            "FORKPOINT_PROMPT_FILE": PROMPT_PATH,
            "FORKPOINT_PROMPT": step.prompt,
            "FORKPOINT_STEP": step.key,
        }
        started = time.perf_counter()
        result = await runtime.exec(
            session_id, self.command, cwd=APP_DIR, env=env, timeout=self.timeout_s
        )
        duration_ms = _ms_since(started)
        stdout, stderr = result.stdout, result.stderr
        tail = (stdout + stderr)[-_TAIL_CHARS:]
        if result.exit_code != 0:
            last = (stderr.strip() or stdout.strip() or "no output").splitlines()[-1]
            raise AgentStepFailed(
                f"the agent failed at step {step.key!r} in session {session_id} "
                f"(exit {result.exit_code}): {last[:300]}",
                log_tail=tail,
            )
        return StepResult(
            step.key, session_id, self.name, duration_ms, result.exit_code,
            parse_usage(stdout), tail,
        )  # fmt: skip


def parse_usage(stdout: str) -> dict[str, Any] | None:
    """Token usage from the last JSON line of ``stdout`` that reports any (else None).

    Understands ``{"usage": {...}}`` (Claude Code, OpenAI-style) and token counts at the
    top level; a cost in USD is kept alongside.
    """
    found: dict[str, Any] | None = None
    for line in stdout.splitlines():
        line = line.strip()
        if not (line.startswith("{") and line.endswith("}")):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        usage: dict[str, Any] = {}
        nested = obj.get("usage")
        if isinstance(nested, dict):
            usage.update({k: v for k, v in nested.items() if isinstance(v, int | float)})
        usage.update({k: obj[k] for k in _TOKEN_KEYS if isinstance(obj.get(k), int | float)})
        if usage:
            usage.update({k: obj[k] for k in _COST_KEYS if isinstance(obj.get(k), int | float)})
            found = usage
    return found


def _ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000
