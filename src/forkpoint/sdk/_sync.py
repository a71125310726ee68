"""The blocking SDK, derived mechanically from the async core — never a hand-kept copy.

How the twin is derived:

* Each sync class is declared with one line, ``class Sandbox(SyncTwin,
  twin_of=AsyncSandbox)``. ``SyncTwin.__init_subclass__`` walks the async class and
  generates, for every public member: a blocking method for each ``async def`` (also
  for async classmethods), a property for each property, and ``__enter__``/``__exit__``
  from ``__aenter__``/``__aexit__``. Docstrings and signatures come along
  (``functools.wraps``), so ``help(Sandbox.create)`` shows the async core's text.
* Every call runs the async coroutine on one private event loop in a daemon thread
  (:class:`_LoopThread`) and blocks for its result; exceptions are re-raised unchanged,
  so they are the same :mod:`forkpoint.errors` classes.
* Arguments that are sync twins are unwrapped to their async objects, and results are
  wrapped by the table ``TWINS`` (async type -> sync type), element-wise through lists
  and tuples: ``ck.fork(3)`` gives ``list[Sandbox | ForkpointError]``.

Adding a method to the async core adds it here; nothing in this module names one. Type
checkers cannot follow this, so they read ``_sync.pyi`` instead, generated from the async
core by :mod:`forkpoint.sdk._stubgen` (a test fails when it is stale).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from collections.abc import Callable, Coroutine
from typing import Any, ClassVar, TypeVar

from ._async import (
    AsyncCheckpoint,
    AsyncCommands,
    AsyncFiles,
    AsyncPorts,
    AsyncSandbox,
    AsyncTerminal,
    AsyncTerminals,
    AsyncWatcher,
)
from ._volume import AsyncVolume

__all__ = [
    "Checkpoint",
    "Commands",
    "Files",
    "Ports",
    "Sandbox",
    "SyncTwin",
    "Terminal",
    "Terminals",
    "Volume",
    "Watcher",
]

T = TypeVar("T")


class _LoopThread:
    """One event loop on a daemon thread, started on first use, shared by all twins
    (async objects such as an httpx client stay on the loop that made them)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    def _get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="forkpoint-sdk-loop", daemon=True
                )
                thread.start()
                self._loop = loop
            return self._loop

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._get()).result()


_LOOP = _LoopThread()
TWINS: dict[type, type[SyncTwin]] = {}


def _wrap(value: Any) -> Any:
    twin = TWINS.get(type(value))
    if twin is not None:
        obj = object.__new__(twin)
        obj._async = value
        return obj
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_wrap(v) for v in value)
    return value


def _unwrap(value: Any) -> Any:
    return value._async if isinstance(value, SyncTwin) else value


def _blocking_method(fn: Callable[..., Coroutine[Any, Any, Any]]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def method(self: SyncTwin, *args: Any, **kwargs: Any) -> Any:
        args = tuple(_unwrap(a) for a in args)
        kwargs = {k: _unwrap(v) for k, v in kwargs.items()}
        return _wrap(_LOOP.run(fn(self._async, *args, **kwargs)))

    return method


def _blocking_classmethod(fn: Callable[..., Coroutine[Any, Any, Any]], owner: type) -> Any:
    @functools.wraps(fn)
    def method(cls: type, *args: Any, **kwargs: Any) -> Any:
        args = tuple(_unwrap(a) for a in args)
        kwargs = {k: _unwrap(v) for k, v in kwargs.items()}
        return _wrap(_LOOP.run(fn(owner, *args, **kwargs)))

    return classmethod(method)


def _plain_method(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def method(self: SyncTwin, *args: Any, **kwargs: Any) -> Any:
        return _wrap(fn(self._async, *(_unwrap(a) for a in args), **kwargs))

    return method


def _property(name: str, doc: str | None) -> property:
    def get(self: SyncTwin) -> Any:
        return _wrap(getattr(self._async, name))

    return property(get, doc=doc)


class SyncTwin:
    """Base of the generated blocking classes; see the module docstring."""

    _async_type: ClassVar[type]
    _async: Any

    def __init_subclass__(cls, *, twin_of: type, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._async_type = twin_of
        TWINS[twin_of] = cls
        seen: set[str] = set()
        for klass in twin_of.__mro__:
            if klass is object:
                continue
            for name, member in vars(klass).items():
                if name in seen or (name.startswith("_") and name not in _DUNDERS):
                    continue
                seen.add(name)
                generated = _generate(name, member, twin_of)
                if generated is not None:
                    setattr(cls, _DUNDERS.get(name, name), generated)

    def __getattr__(self, name: str) -> Any:
        # Attributes the async object sets itself (``sb.commands``): wrapped once, then
        # kept on this twin, like the namespace objects of the async core.
        if name.startswith("_"):
            raise AttributeError(name)
        value = _wrap(getattr(self._async, name))
        if isinstance(value, SyncTwin):
            setattr(self, name, value)
        return value

    def __repr__(self) -> str:
        return repr(self._async).replace("<Async", "<", 1)


_DUNDERS = {"__aenter__": "__enter__", "__aexit__": "__exit__"}


def _generate(name: str, member: Any, owner: type) -> Any:
    if isinstance(member, classmethod):
        func = member.__func__
        return _blocking_classmethod(func, owner) if inspect.iscoroutinefunction(func) else None
    if isinstance(member, staticmethod):
        return None
    if isinstance(member, property):
        return _property(name, member.__doc__)
    if inspect.iscoroutinefunction(member):
        return _blocking_method(member)
    if inspect.isfunction(member):
        return _plain_method(member)
    return None


class Sandbox(SyncTwin, twin_of=AsyncSandbox):
    """Blocking :class:`~forkpoint.sdk.AsyncSandbox` (generated)."""


class Checkpoint(SyncTwin, twin_of=AsyncCheckpoint):
    """Blocking :class:`~forkpoint.sdk.AsyncCheckpoint` (generated)."""


class Commands(SyncTwin, twin_of=AsyncCommands):
    """Blocking ``sb.commands`` (generated)."""


class Files(SyncTwin, twin_of=AsyncFiles):
    """Blocking ``sb.files`` (generated)."""


class Ports(SyncTwin, twin_of=AsyncPorts):
    """Blocking ``sb.ports`` (generated)."""


class Terminal(SyncTwin, twin_of=AsyncTerminal):
    """Blocking :class:`~forkpoint.sdk.AsyncTerminal` (generated)."""


class Terminals(SyncTwin, twin_of=AsyncTerminals):
    """Blocking ``sb.terminals`` (generated)."""


class Watcher(SyncTwin, twin_of=AsyncWatcher):
    """Blocking :class:`~forkpoint.sdk.AsyncWatcher` (generated)."""


class Volume(SyncTwin, twin_of=AsyncVolume):
    """Blocking :class:`~forkpoint.sdk.AsyncVolume` (generated)."""
