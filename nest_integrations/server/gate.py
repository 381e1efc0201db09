"""One model, one generation at a time: a bounded FIFO queue and a worker thread per request.

``ModelGate.admit()`` reserves a place (running + waiting <= ``1 + max_queue``) or raises
``QueueFull`` at once, so the endpoint can answer 429 before a stream starts. ``run()`` then
waits its turn (FIFO), runs ``engine.stream`` in the gate's single worker thread and yields its
chunks to the event loop. The worker checks a cancel flag between chunks: a client that
disconnects (or a caller that stops iterating) ends the generation at the next chunk boundary,
and the slot passes to the next request as soon as the worker returns.

Requests are not batched into one forward pass: on CPU a batched multi-token pass is only
~1.3x cheaper per sequence, and NEST answers are mostly such passes (docs/decisions.md).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable

from nest_integrations.types import StreamChunk

LOG = logging.getLogger(__name__)

_END = object()


class QueueFull(Exception):
    """Every place (running + waiting) is taken."""


class Disconnected(Exception):
    """The client went away while its request waited or ran."""


class Ticket:
    """A reserved place in the gate; released exactly once."""

    def __init__(self, gate: "ModelGate"):
        self.gate = gate
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.gate._pending -= 1


class ModelGate:
    """Serialises generations on one engine; at most ``max_queue`` requests wait.

    Args:
        engine: a ``NestEngine`` (anything with ``stream(prompt, **kwargs)``).
        max_queue: requests allowed to wait while one runs (0: reject while busy).
        poll_s: how often a waiting or running request checks that its client is still there.
    """

    def __init__(self, engine: Any, max_queue: int = 8, poll_s: float = 0.1):
        if max_queue < 0:
            raise ValueError(f"max_queue={max_queue} is invalid: use an integer >= 0")
        self.engine = engine
        self.capacity = 1 + max_queue
        self.poll_s = poll_s
        self._pending = 0
        self._lock: asyncio.Lock | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nest-gen")
        self.running = False
        self.served = 0
        self.cancelled = 0
        self.rejected = 0
        self.busy_s = 0.0  # seconds the model spent generating (for Retry-After)

    # ----------------------------------------------------------------- admission
    @property
    def pending(self) -> int:
        """Requests admitted and not finished (the running one included)."""
        return self._pending

    def admit(self) -> Ticket:
        """Reserve a place or raise ``QueueFull`` (call on the event loop)."""
        if self._pending >= self.capacity:
            self.rejected += 1
            raise QueueFull(
                f"{self._pending} requests running or queued (capacity {self.capacity})"
            )
        self._pending += 1
        return Ticket(self)

    def retry_after(self) -> int:
        """Seconds a rejected client should wait: the queue's expected drain time, at least 1."""
        mean = self.busy_s / self.served if self.served else 1.0
        return max(1, int(round(mean * max(1, self._pending))))

    def status(self) -> dict[str, Any]:
        return {
            "running": int(self.running),
            "queued": max(0, self._pending - int(self.running)),
            "capacity": self.capacity,
            "served": self.served,
            "cancelled": self.cancelled,
            "rejected": self.rejected,
        }

    # ----------------------------------------------------------------- running
    async def run(
        self,
        ticket: Ticket,
        kwargs: dict[str, Any],
        is_disconnected: Callable[[], Awaitable[bool]] | None = None,
        work: Callable[[], Iterable[Any]] | None = None,
    ) -> AsyncIterator[StreamChunk]:
        """Wait for the model, then yield ``engine.stream(**kwargs)`` chunks (or, with
        ``work``, the items of ``work()``, run in the same worker: e.g. an attribution, which
        uses the model too).

        Raises ``Disconnected`` when ``is_disconnected()`` turns true; exceptions from the
        engine are re-raised here. Stopping the iteration early cancels the generation.
        """
        loop = asyncio.get_running_loop()
        if self._lock is None:
            self._lock = asyncio.Lock()
        lock = self._lock
        try:
            await self._until(lock.acquire(), is_disconnected, undo=lambda _: lock.release())
        except BaseException:
            ticket.release()
            raise
        queue: asyncio.Queue = asyncio.Queue()
        cancel = threading.Event()

        def done(_: Any) -> None:  # on the loop, once the worker has returned
            self.running = False
            lock.release()
            ticket.release()

        self.running = True
        start = work or (lambda: self.engine.stream(**kwargs))
        fut = loop.run_in_executor(self._executor, self._work, start, queue, cancel, loop)
        fut.add_done_callback(done)
        finished = False
        try:
            while True:
                item = await self._until(queue.get(), is_disconnected)
                if item is _END:
                    finished = True
                    return
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                yield item
        finally:
            if not finished:  # disconnected, cancelled, or the caller stopped iterating
                self.cancelled += 1
                LOG.info("generation cancelled before it finished (client gone)")
            cancel.set()  # the worker stops at its next chunk; `done` frees the slot

    def _work(
        self,
        start: Callable[[], Iterable[Any]],
        queue: asyncio.Queue,
        cancel: threading.Event,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        def put(item: Any) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop is closed (server shutting down)
                cancel.set()

        t0 = time.perf_counter()
        gen = None
        try:
            if cancel.is_set():
                return
            gen = iter(start())
            for chunk in gen:
                if cancel.is_set():
                    break
                put(chunk)
        except BaseException as exc:  # noqa: BLE001 - handed to the request coroutine
            put(exc)
        finally:
            close = getattr(gen, "close", None)
            if close is not None:
                close()
            self.busy_s += time.perf_counter() - t0
            self.served += 1
            put(_END)

    async def _until(
        self,
        aw: Awaitable[Any],
        is_disconnected: Callable[[], Awaitable[bool]] | None,
        undo: Callable[[Any], None] | None = None,
    ) -> Any:
        """Await ``aw``, checking every ``poll_s`` that the client is still connected.

        If we give up after ``aw`` already completed, ``undo(result)`` gives back what it got
        (a lock acquired in the same instant as the disconnect)."""
        task = asyncio.ensure_future(aw)
        try:
            while True:
                finished, _ = await asyncio.wait({task}, timeout=self.poll_s)
                if finished:
                    return task.result()
                if is_disconnected is not None and await is_disconnected():
                    raise Disconnected()
        except BaseException:
            if not task.done():
                task.cancel()
            elif undo is not None and not task.cancelled() and task.exception() is None:
                undo(task.result())
            raise

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

