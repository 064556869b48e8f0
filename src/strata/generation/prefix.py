"""What a session reuses of the sequence it holds: the common prefix with a new prompt, and the engine's
state snapshots at turn boundaries to roll back to where the prompt diverges (recurrent state cannot be cut
back like a KV cache; docs/architecture.md, 'Conversations')."""

from __future__ import annotations

from collections.abc import Sequence


def common_prefix(held: Sequence[int], target: Sequence[int]) -> int:
    """How many leading ids the two sequences share."""
    n = min(len(held), len(target))
    for i in range(n):
        if held[i] != target[i]:
            return i
    return n


class Snapshots:
    """Which of the engine's snapshot slots holds the state after which position; the oldest is overwritten
    first when every slot is taken."""

    def __init__(self, slots: int):
        self.slots = slots
        self.position: dict[int, int] = {}  # slot -> tokens in the sequence when it was taken
        self.age: list[int] = []             # slots, oldest first

    def slot_for(self, position: int) -> int | None:
        """The slot to snapshot `position` into (None: no slots, or that position is already held)."""
        if self.slots == 0 or position in self.position.values():
            return None
        slot = next((s for s in range(self.slots) if s not in self.position), None)
        if slot is None:
            slot = self.age.pop(0)
        self.position[slot] = position
        self.age.append(slot)
        return slot

    def best(self, limit: int) -> tuple[int, int] | None:
        """(slot, position) of the latest snapshot taken at a position <= limit, or None."""
        held = [(position, slot) for slot, position in self.position.items() if position <= limit]
        if not held:
            return None
        position, slot = max(held)
        return slot, position

    def forget_after(self, position: int) -> None:
        """Drop the snapshots of a branch the sequence left (taken after `position`)."""
        for slot in [s for s, p in self.position.items() if p > position]:
            del self.position[slot]
            self.age.remove(slot)

    def clear(self) -> None:
        self.position.clear()
        self.age.clear()
