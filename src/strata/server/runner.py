"""One request's generation on its session, in a worker thread (an engine step blocks), with the pieces handed to
the event loop as they come; where the session's engine is a Batcher's member, it is active for the run.
Cancelling (the client went away) stops it at the next token boundary; the session then holds exactly what was
generated, and is handed back only once the worker is done with it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Executor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace

from strata.errors import StrataError
from strata.generation import Piece, Session, Stats
from strata.server.requests import Call

_END = object()


class Refused(Exception):
    """The session refused the call's arguments before generating anything (a client error); `error` says why.
    Any other error of a run is the model's or the engine's (a server error)."""

    def __init__(self, error: StrataError):
        super().__init__(str(error))
        self.error = error


class Run:
    def __init__(self, session: Session, call: Call, ids: Sequence[int], executor: Executor, *,
                 active: Callable[[], AbstractContextManager] | None = None):
        self.session, self.call, self.ids, self.executor = session, call, list(ids), executor
        self.active = active or nullcontext
        self.cancelled = threading.Event()
        self.stats: Stats | None = None
        self._future: asyncio.Future | None = None

    def _work(self, emit) -> Stats:
        with self.active():
            try:
                stream = self.session.stream(self.ids, **self.call.generate_options())
            except StrataError as error:
                raise Refused(error) from None
            try:
                for piece in stream:
                    emit(piece)
                    if self.cancelled.is_set():
                        break
            finally:
                stream.close()
            return replace(self.session.stats)

    async def pieces(self) -> AsyncIterator[Piece]:
        """The pieces as they are generated; `stats` is set once they end. Raises what the generation raised
        (Refused: the session refused the arguments)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        self._future = loop.run_in_executor(self.executor, self._work,
                                            lambda piece: loop.call_soon_threadsafe(queue.put_nowait, piece))
        self._future.add_done_callback(lambda _: queue.put_nowait(_END))
        while (item := await queue.get()) is not _END:
            yield item
        self.stats = self._future.result()

    async def finish(self) -> None:
        """Stop at the next token boundary and wait until the worker has let go of the session."""
        self.cancelled.set()
        if self._future is not None:
            await asyncio.wait([self._future])
            if self.stats is None and not self._future.exception():
                self.stats = self._future.result()
