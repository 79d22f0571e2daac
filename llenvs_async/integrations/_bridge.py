"""A sync/async bridge for trainers whose loops are synchronous: one event loop in one daemon
thread, the resource it serves (a runner, an adapter) and what was entered on that loop.

Trainers such as TRL call us from their own thread and expect a blocking call; engines,
containers and HTTP clients belong to the loop they were made on. ``LoopThread`` owns that
loop: ``run`` submits a coroutine and blocks until it is done (an interrupt of the waiting
thread cancels it and waits for its teardown), ``close`` cancels what runs, exits the
resource's context on the loop, stops the loop and joins the thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from typing import Any, Generic, TypeVar

from llenvs_async import ClosedError, LlenvsError

__all__ = ["LoopThread"]

_log = logging.getLogger("llenvs_async.integrations")

T = TypeVar("T")
R = TypeVar("R")
_POLL = 1.0  # seconds between checks that the loop thread is alive, while a call waits


class LoopThread(Generic[R]):
    """One event loop in one daemon thread named ``name``, serving one resource of type
    ``kind``: ``source`` itself, or what the zero-argument ``source()`` async context manager
    yields (entered on the loop at the first ``get``, exited by ``close``).

    Holds no reference to the object that owns it, so the owner's ``weakref.finalize`` can
    close it. ``owner`` names that object in errors.
    """

    def __init__(
        self,
        source: R | Callable[[], AbstractAsyncContextManager[R]],
        *,
        kind: type[R],
        owner: str,
        name: str,
        loop_factory: Callable[[], asyncio.AbstractEventLoop] | None,
        close_timeout: float,
    ) -> None:
        self.source = source
        self.kind = kind
        self.owner = owner
        self.close_timeout = close_timeout
        self.resource: R | None = None
        self.closed = False
        self._stack = contextlib.AsyncExitStack()
        self._resource_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._cleanups: set[asyncio.Task[Any]] = set()  # awaited by close, never cancelled
        self._lock = threading.Lock()
        self.loop = (loop_factory or asyncio.new_event_loop)()
        self.thread = threading.Thread(target=_serve, args=(self.loop,), name=name, daemon=True)
        self.thread.start()

    def on_loop(self) -> bool:
        """Whether the calling thread is the loop's own."""
        return threading.get_ident() == self.thread.ident

    def run(self, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
        """``await fn(*args)`` on the loop, from another thread; blocks until it is done."""
        if self.on_loop():
            raise RuntimeError(f"{self.owner} was called from its own event loop thread")
        result: concurrent.futures.Future[T] = concurrent.futures.Future()
        finished = threading.Event()
        started: list[asyncio.Task[T]] = []

        def start() -> None:
            task = self.loop.create_task(fn(*args))
            self._tasks.add(task)
            started.append(task)
            task.add_done_callback(lambda t: self._done(t, result, finished))

        with self._lock:
            if self.closed or not self.thread.is_alive():
                raise ClosedError(self.owner)
            self.loop.call_soon_threadsafe(start)
        try:
            while not concurrent.futures.wait([result], timeout=_POLL).done:
                if not self.thread.is_alive():  # SystemExit or the like ended the loop
                    raise LlenvsError(f"{self.owner}: its event loop thread has died")
            return result.result()
        except concurrent.futures.CancelledError:
            raise ClosedError(self.owner) from None
        except BaseException:
            if not finished.is_set():  # interrupted while waiting: cancel, let it tear down
                with contextlib.suppress(RuntimeError):  # the loop is already closed
                    self.loop.call_soon_threadsafe(_cancel, started)
                finished.wait(self.close_timeout)
            raise

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Start the cleanup ``coro`` on the loop without waiting (from any thread, the loop's
        included); ``close`` waits for it, never cancels it. Closes ``coro`` unrun when the
        bridge is closed."""
        with self._lock:
            if self.closed or not self.thread.is_alive():
                coro.close()
                return

            def start() -> None:
                task = self.loop.create_task(coro)
                self._cleanups.add(task)
                task.add_done_callback(self._cleanups.discard)

            if self.on_loop():
                start()
            else:
                self.loop.call_soon_threadsafe(start)

    def settle(self) -> None:
        """Block until the cleanups ``spawn`` started so far have finished."""
        self.run(self._settle)

    async def _settle(self) -> None:
        if self._cleanups:
            await asyncio.wait(list(self._cleanups))

    def _done(
        self,
        task: asyncio.Task[T],
        result: concurrent.futures.Future[T],
        finished: threading.Event,
    ) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            result.cancel()
        elif (error := task.exception()) is not None:
            result.set_exception(error)
        else:
            result.set_result(task.result())
        finished.set()

    async def get(self) -> R:
        """The resource, made (and its context entered) on first use; on the loop."""
        async with self._resource_lock:
            if self.resource is None:
                if isinstance(self.source, self.kind):
                    self.resource = self.source
                else:
                    factory: Callable[[], AbstractAsyncContextManager[Any]] = self.source  # type: ignore[assignment]
                    made = await self._stack.enter_async_context(factory())
                    if not isinstance(made, self.kind):
                        raise TypeError(
                            f"the {self.owner} factory must yield a {self.kind.__name__}, "
                            f"got {type(made).__name__}"
                        )
                    self.resource = made
            return self.resource

    def close(self) -> None:
        """Cancel what runs, exit the resource's context, stop the loop (idempotent)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        if not self.thread.is_alive():
            return
        done = threading.Event()
        if self.on_loop():  # collected on the loop: finish there
            self.loop.create_task(self._shutdown(done))
            return
        self.loop.call_soon_threadsafe(lambda: self.loop.create_task(self._shutdown(done)))
        if not done.wait(self.close_timeout):
            _log.error(
                "%s: teardown did not finish within %.0f s; stopping its loop",
                self.owner,
                self.close_timeout,
            )
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(self.close_timeout)

    async def _shutdown(self, done: threading.Event) -> None:
        try:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks)
            if self._cleanups:
                await asyncio.wait(list(self._cleanups))
            await self._stack.aclose()
            self.resource = None  # what the factory built is closed: let it be collected
            await self.loop.shutdown_asyncgens()
            await self.loop.shutdown_default_executor()
        except Exception:
            _log.exception("%s: error while closing the factory's context", self.owner)
        finally:
            self.loop.stop()
            done.set()


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.close()


def _cancel(tasks: list[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
