"""The server's sessions: each request takes the free session that can resume the longest prefix of its prompt
(what it holds of it, or its latest state snapshot before they part: a conversation that continues goes back to
the session that holds it), an idle empty session before one that would start over and lose its conversation;
one generation per session at a time, a bounded queue of waiting requests in front (a full one is refused at
once). A request of several answers may take more sessions (`spare`), but only ones no waiting request is owed.
Each session is steered by some control vectors (strata.server.steering: a key): a request takes one steered as it
asks before any other, and resumes a prefix only there; `steer` steers (and empties) the one it got otherwise."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from strata.generation import Session
from strata.server.steering import Key, ServedVectors


class QueueFull(Exception):
    """Every session is busy and `max_waiting` requests already wait."""


class SessionPool:
    def __init__(self, sessions: Sequence[Session], max_waiting: int, vectors: ServedVectors | None = None):
        self.sessions = list(sessions)
        self.max_waiting = max_waiting
        self.free = list(self.sessions)
        self.waiting = 0
        self.vectors = vectors or ServedVectors()
        self._steered = {session: self.vectors.default for session in self.sessions}  # as each was made
        self._changed = asyncio.Condition()

    @property
    def busy(self) -> int:
        return len(self.sessions) - len(self.free)

    async def take(self, ids: Sequence[int], key: Key | None = None) -> Session:
        """A session for a prompt of `ids` steered by `key` (None: the server's own vectors; `steer` it before
        use), once one is free (requests take them in the order they came); QueueFull when too many already wait.
        The caller gives it back (`give_back`)."""
        async with self._changed:
            if not self.free and self.waiting >= self.max_waiting:
                raise QueueFull(f"the server is busy: {self.busy} request(s) generating and {self.waiting} waiting")
            self.waiting += 1
            try:
                await self._changed.wait_for(lambda: self.free)
            finally:
                self.waiting -= 1
            return self._best(ids, key)

    def spare(self, ids: Sequence[int], key: Key | None = None) -> Session | None:
        """A free session for a prompt of `ids` where no request waits (one that waits is owed the next free
        session), taken at once; None where there is none to spare. The caller gives it back (`give_back`)."""
        if not self.free or self.waiting:
            return None
        return self._best(ids, key)

    async def give_back(self, session: Session) -> None:
        async with self._changed:
            self.free.append(session)
            self._changed.notify()

    def steer(self, session: Session, key: Key | None = None) -> None:
        """Steer `session` (taken from this pool) by `key` where it is steered otherwise, emptying it. On the
        thread that runs it: a new set reads its files and may make a GPU session capture its graphs again."""
        key = self._key(key)
        if self._steered[session] != key:
            self._steered[session] = None  # until it is done: a failure leaves it matching no request
            self.vectors.apply(session, key)
            self._steered[session] = key

    def _key(self, key: Key | None) -> Key:
        return self.vectors.default if key is None else key

    def _best(self, ids: Sequence[int], key: Key | None) -> Session:
        key = self._key(key)

        def rank(session: Session) -> tuple:
            alike = self._steered[session] == key
            return alike and session.resumable(ids), alike, not session.tokens

        session = max(self.free, key=rank)
        self.free.remove(session)
        return session
