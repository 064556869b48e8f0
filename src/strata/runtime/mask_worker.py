"""The thread a GPU engine computes its deferred token masks on (docs/structured.md, "Where it runs"): while the
device runs a step's layers, a draw's mask is computed into the native session's page-locked words and its ticket
published, which the step's sampler waits for. One per engine, made on its first mask; its jobs run one at a time,
in the order given."""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future


def _serve(jobs: queue.SimpleQueue) -> None:
    """The thread's loop: each job's function run, its result or exception into its future, until None comes.
    Holds nothing of a job once it is done (a job's function holds its engine)."""
    while (job := jobs.get()) is not None:
        future, work = job
        del job
        try:
            future.set_result(work())
        except BaseException as error:  # the submitter's to raise, whatever it is
            future.set_exception(error)
        del future, work


class MaskWorker:
    """One daemon thread running submitted functions in turn: `submit(work)` returns a Future of its result;
    `close()` ends the thread once the jobs given before are done. A worker dropped without close() ends its thread
    too (the thread holds the queue, not the worker)."""

    def __init__(self, name: str = "strata-mask"):
        self._name = name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, work: Callable[[], object]) -> Future:
        if self._thread is None:
            self._thread = threading.Thread(target=_serve, args=(self._jobs,), name=self._name, daemon=True)
            self._thread.start()
            weakref.finalize(self, self._jobs.put, None)
        future: Future = Future()
        self._jobs.put((future, work))
        return future

    def close(self) -> None:
        if self._thread is None:
            return
        self._jobs.put(None)
        self._thread.join()
        self._thread = None
