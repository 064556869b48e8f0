"""Control vectors as a GPU session takes them (docs/control_vectors.md): the (path, scale) pairs and the layer range
of Model.session read into the per-layer table (strata.control_vectors.steering_table, the reference's own), and the
table staged as the native session holds it: one float32 row per layer and a flag per layer saying which rows are
vectors (strata._native.DecodeSession.set_control_vectors)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from strata.control_vectors import steering_table
from strata.errors import InvalidArgument


class ControlVectors:
    """The control vectors of one model's GPU sessions: `table` reads files for its geometry, `staged` lays a table
    out for the native session."""

    def __init__(self, geometry: Any):
        self.geometry = geometry

    def table(self, control_vectors: Sequence[tuple[str | os.PathLike[str], float]] = (),
              control_layers: tuple[int, int] | None = None) -> dict[int, np.ndarray]:
        """{layer: float32 [n_embd]}: the files summed with their scales on the layers of `control_layers`, checked
        against the model (steering_table's errors name the file, tensor, layer and limit)."""
        return steering_table(control_vectors, self.geometry, control_layers)

    def staged(self, table: Mapping[int, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """(float32 [n_layer, n_embd], uint8 [n_layer]): each layer's vector in its row (zeros elsewhere) and 1 where
        the layer has one; an empty table stages no vector at all."""
        g = self.geometry
        rows = np.zeros((g.n_layer, g.n_embd), np.float32)
        flags = np.zeros(g.n_layer, np.uint8)
        for layer, vector in table.items():
            vector = np.asarray(vector, dtype=np.float32)
            if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= layer < g.n_layer \
                    or vector.shape != (g.n_embd,):
                raise InvalidArgument(f"control vector for layer {layer!r:.20}: need a layer in 0..{g.n_layer - 1} "
                                      f"and shape ({g.n_embd},), got shape {vector.shape}")
            if not np.all(np.isfinite(vector)):
                raise InvalidArgument(f"control vector for layer {layer}: its values must be finite")
            rows[layer], flags[layer] = vector, 1
        return rows, flags
