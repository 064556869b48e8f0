"""The server's sessions: each request takes the free session that can resume the longest prefix of its prompt
(what it holds of it, or its latest state snapshot before they part: a conversation that continues goes back to
the session that holds it), an idle empty session before one that would start over and lose its conversation;
one generation per session at a time, a bounded queue of waiting requests in front (a full one is refused at
once). A request of several answers may take more sessions (`spare`), but only ones no waiting request is owed."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from strata.generation import Session


class QueueFull(Exception):
    """Every session is busy and `max_waiting` requests already wait."""


class SessionPool:
    def __init__(self, sessions: Sequence[Session], max_waiting: int):
        self.sessions = list(sessions)
        self.max_waiting = max_waiting
        self.free = list(self.sessions)
        self.waiting = 0
        self._changed = asyncio.Condition()

    @property
    def busy(self) -> int:
        return len(self.sessions) - len(self.free)

    async def take(self, ids: Sequence[int]) -> Session:
        """A session for a prompt of `ids`, once one is free (requests take them in the order they came);
        QueueFull when too many already wait. The caller gives it back (`give_back`)."""
        async with self._changed:
            if not self.free and self.waiting >= self.max_waiting:
                raise QueueFull(f"the server is busy: {self.busy} request(s) generating and {self.waiting} waiting")
            self.waiting += 1
            try:
                await self._changed.wait_for(lambda: self.free)
            finally:
                self.waiting -= 1
            return self._best(ids)

    def spare(self, ids: Sequence[int]) -> Session | None:
        """A free session for a prompt of `ids` where no request waits (one that waits is owed the next free
        session), taken at once; None where there is none to spare. The caller gives it back (`give_back`)."""
        if not self.free or self.waiting:
            return None
        return self._best(ids)

    async def give_back(self, session: Session) -> None:
        async with self._changed:
            self.free.append(session)
            self._changed.notify()

    def _best(self, ids: Sequence[int]) -> Session:
        session = max(self.free, key=lambda s: (s.resumable(ids), not s.tokens))
        self.free.remove(session)
        return session
