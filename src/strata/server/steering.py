"""The control vectors `strata serve` loaded (docs/control_vectors.md, "The server"): the files given at start, in
order, steer every request at their scales; a request's `control_vectors` field ([{"id": i, "scale": s}, ...], as
llama-server's `lora` field names its adapters) picks its own of them instead, and `GET /control-vectors` lists
them. A request's steering is a key (each vector's id and summed scale, zeros left out, by id) that the session
pool matches: a session steered otherwise is steered anew and emptied before the request runs on it, so that a
prefix computed under other vectors is never resumed."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from strata.server.errors import BadRequest

Key = tuple[tuple[int, float], ...]
MAX_SCALE = 1e4  # a request's scale: far past any useful strength, short of what float32 tables overflow at


class ServedVectors:
    """`vectors` ([(path, scale), ...], the sessions' own at start) and `layers` (the inclusive layer range they
    steer, None: every layer), as Model.session takes them."""

    def __init__(self, vectors: Sequence[tuple[Any, float]] = (), layers: tuple[int, int] | None = None):
        self.vectors = [(path, float(scale)) for path, scale in vectors]
        self.layers = layers
        self.default = _key((i, scale) for i, (_, scale) in enumerate(self.vectors))

    def key(self, asked: Sequence[tuple[int, float]] | None) -> Key:
        """The steering of a request that asked for `asked` (its `control_vectors`: None, the server's own set);
        BadRequest naming the entry whose id the server did not load."""
        if asked is None:
            return self.default
        for index, (vector, _) in enumerate(asked):
            if vector >= len(self.vectors):
                loaded = f"ids 0..{len(self.vectors) - 1}" if self.vectors else "none"
                raise BadRequest(f"'control_vectors[{index}].id' is {vector}: this server loaded {loaded} "
                                 "(GET /control-vectors lists them)", f"control_vectors[{index}].id", "invalid_value")
        return _key(asked)

    def apply(self, session: Any, key: Key) -> None:
        """Steer `session` by `key` and empty it: what it holds was computed under other vectors."""
        session.set_control_vectors([(self.vectors[vector][0], scale) for vector, scale in key], self.layers)
        session.reset()

    def listing(self) -> list[dict[str, Any]]:
        """GET /control-vectors: each vector's id, file name and the scale it steers every request at."""
        return [{"id": i, "name": Path(path).name, "scale": scale} for i, (path, scale) in enumerate(self.vectors)]


def parse_control_vectors(value: Any) -> tuple[tuple[int, float], ...] | None:
    """A request's `control_vectors`: None (absent or null: the server's own set), else [{"id": i, "scale": s}, ...]
    with ids of the server's vectors (checked against them by ServedVectors.key) and finite scales (default 1);
    an empty list steers by none."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise BadRequest("'control_vectors' must be a list of {\"id\": ..., \"scale\": ...}", "control_vectors",
                         "invalid_type")
    out = []
    for index, entry in enumerate(value):
        where = f"control_vectors[{index}]"
        if not isinstance(entry, dict) or "id" not in entry or set(entry) - {"id", "scale"}:
            raise BadRequest(f"'{where}' must be an object of an 'id' and, optionally, a 'scale'", where,
                             "invalid_value")
        vector, scale = entry["id"], entry.get("scale", 1.0)
        if isinstance(vector, bool) or not isinstance(vector, int) or vector < 0:
            raise BadRequest(f"'{where}.id' must be an integer >= 0, got {vector!r:.40}", f"{where}.id",
                             "invalid_value")
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not abs(scale) <= MAX_SCALE:
            raise BadRequest(f"'{where}.scale' must be a number in [-{MAX_SCALE:g}, {MAX_SCALE:g}], got "
                             f"{scale!r:.40}", f"{where}.scale", "invalid_value")
        out.append((vector, float(scale)))
    return tuple(out)


def _key(pairs) -> Key:
    """Each vector's summed scale, zeros left out, by id: requests that steer alike share a key."""
    summed: dict[int, float] = {}
    for vector, scale in pairs:
        summed[vector] = summed.get(vector, 0.0) + scale
    return tuple((vector, scale) for vector, scale in sorted(summed.items()) if scale != 0.0)
