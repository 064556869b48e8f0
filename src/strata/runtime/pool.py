"""The CPU expert pool from Python: lays routed-expert weights out for the native pool and owns them.

The native pool (cuda/src/cpu) streams each layer's gate/up/down expert matrices from host memory with
pinned workers, one per physical core but the first (left to the host loop). Weights come in as ``repack``
makes them from the 3-D GGUF expert tensors (``ne = {cols, rows, n_expert}``): a strata.quant.QuantTensor
(quantized forms) or a float ``[n_expert * rows, cols]`` array (float32, float16, or uint16 holding bf16
bits), expert-major, so each expert's rows are already contiguous in every plane, which is the layout the
pool streams. Float and quantized matrices mix freely within a layer. This class keeps those arrays alive
for as long as the native pool points into them.

A layer may instead be tiered (docs/tiers.md): `slots` of its experts in the native pool's page-locked arena,
the rest read from the model file while the pool computes, each described by where its matrices lie in the file
(FileMatrix); the native pool repacks what it reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType
from typing import Any

import os

import numpy as np

from strata.errors import InvalidArgument
from strata.quant import QuantTensor
from strata.quant.forms import FLOAT_DTYPES, Form, float_form_of

MATRICES = ("gate", "up", "down")
ExpertWeight = QuantTensor | np.ndarray  # a quantized form, or a float form's [rows, cols] array


def _form_and_planes(q: ExpertWeight, what: str) -> tuple[Form, int, int, dict[str, np.ndarray]]:
    """(form, rows, cols, planes by name) of ``q``; a float form's elements are its one plane, ``codes``."""
    if isinstance(q, QuantTensor):
        return q.form, q.rows, q.cols, q.planes()
    if isinstance(q, np.ndarray) and q.ndim == 2 and q.dtype in FLOAT_DTYPES.values():
        return float_form_of(q), q.shape[0], q.shape[1], {"codes": q}
    found = f"{q.dtype}{list(q.shape)}" if isinstance(q, np.ndarray) else type(q).__name__
    raise InvalidArgument(f"{what}: the CPU pool takes a QuantTensor or a 2-D float32, float16 or uint16 (bf16 bits) "
                          f"array; found {found}")


def matrix_spec(q: ExpertWeight, n_expert: int, what: str) -> tuple[dict[str, Any], list[np.ndarray]]:
    """The native description of ``q`` as ``n_expert`` stacked matrices, and the contiguous planes it points into."""
    form, rows, cols, named = _form_and_planes(q, what)
    if n_expert < 1 or rows % n_expert:
        raise InvalidArgument(f"{what}: {rows} rows do not split into {n_expert} experts")
    planes: dict[str, tuple[int, int]] = {}
    keep: list[np.ndarray] = []
    for name, plane in named.items():
        array = np.ascontiguousarray(plane)
        keep.append(array)
        planes[name] = (array.ctypes.data, array.nbytes)
    spec = {"form": form, "n_expert": n_expert, "rows": rows // n_expert, "cols": cols, "planes": planes}
    return spec, keep


@dataclass(frozen=True)
class FileMatrix:
    """One matrix of a layer's routed experts in the model file: its canonical form and shape per expert (rows x
    cols), and where expert e's blocks of ggml type `ggml_type` lie: `offset + e * stride`, absolute in the file."""

    form: Form
    rows: int
    cols: int
    ggml_type: int
    offset: int
    stride: int

    def spec(self, n_expert: int) -> dict[str, Any]:
        """The native matrix description without planes: the experts are in the pool's arena and the file."""
        return {"form": self.form, "n_expert": n_expert, "rows": self.rows, "cols": self.cols, "planes": {}}

    @property
    def where(self) -> tuple[int, int, int]:
        return self.offset, self.stride, int(self.ggml_type)


def tier_sizes(layer: int, matrices: tuple[FileMatrix, FileMatrix, FileMatrix], n_expert: int) -> tuple[int, int]:
    """(bytes of one expert in a tiered layer's arena, bytes its reads take in a staging slot): the native pool's
    own figures, before anything is allocated."""
    from strata import _native

    return _native.CpuExpertPool.tier_sizes(layer, *(m.spec(n_expert) for m in matrices),
                                            [m.where for m in matrices])


def tier_types() -> frozenset[int]:
    """The ggml type ids of expert tensors the pool reads from the file itself (the lattice i-quants are not yet)."""
    from strata import _native

    return _native.tier_block_types()


def physical_cores() -> list[tuple[tuple[int, ...], int]]:
    """The physical cores this process may use: (SMT sibling CPU ids, NUMA node), ordered by first CPU."""
    from strata import _native

    return _native.cpu_physical_cores()


def default_threads(smt: bool = False) -> int:
    """Workers of ``threads=None``: one per physical core but the first (every sibling with ``smt``)."""
    cores = physical_cores()
    workers = cores[1:] if len(cores) > 1 else cores
    return max(1, sum(len(cpus) if smt else 1 for cpus, _ in workers))


def routed_request(x: np.ndarray, ids: np.ndarray, weights: np.ndarray,
                   skip: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """x, ids, weights and skip (none skipped when None) as the native pool's jobs take them."""
    ids = np.ascontiguousarray(ids, dtype=np.int32)
    skip = np.zeros(ids.shape[0], np.uint8) if skip is None else np.ascontiguousarray(skip, dtype=np.uint8)
    return (np.ascontiguousarray(x, dtype=np.float32), ids, np.ascontiguousarray(weights, dtype=np.float32),
            skip)


class ExpertPool:
    """Pinned CPU workers computing routed experts: ``out[j] = w[j] * down(silu(gate x) * up x)`` of expert ``ids[j]``.

    ``threads=None`` runs one worker per physical core except the first; ``pin_caller`` pins the creating
    thread (the host loop) to that first core until ``close()``, which restores its affinity. ``isa`` is
    "avx2", "avx512" or None (env STRATA_CPU_ISA, else the best the CPU has). ``max_rows`` sizes run_groups' scratch
    (about 1.75 * (n_embd + expert_ff) + 4 * expert_ff bytes a row, allocated here); 0 leaves run_groups unusable.
    """

    def __init__(self, n_embd: int, expert_ff: int, max_k: int, *, threads: int | None = None, smt: bool = False,
                 pin_caller: bool = True, isa: str | None = None, spin_us: int = 3000, max_rows: int = 0):
        from strata import _native  # the extension is optional for `import strata`; the pool needs it

        self.n_embd, self.expert_ff, self.max_k = n_embd, expert_ff, max_k
        self._native = _native.CpuExpertPool(n_embd, expert_ff, max_k, threads=threads or 0, smt=smt,
                                             pin_caller=pin_caller, isa=isa or "auto", spin_us=spin_us,
                                             max_rows=max_rows)
        self._weights: dict[int, list[np.ndarray]] = {}
        self._n_expert: dict[int, int] = {}

    def set_layer(self, layer: int, gate: ExpertWeight, up: ExpertWeight, down: ExpertWeight, n_expert: int) -> None:
        """Registers layer ``layer``'s experts (each weight holds all ``n_expert`` experts, expert-major)."""
        specs, keep = {}, []
        for name, q in zip(MATRICES, (gate, up, down)):
            specs[name], arrays = matrix_spec(q, n_expert, f"layer {layer} {name}")
            keep += arrays
        self._native.set_layer(layer, specs["gate"], specs["up"], specs["down"])
        self._weights[layer] = keep
        self._n_expert[layer] = n_expert

    def run_layer(self, layer: int, x: np.ndarray, ids: np.ndarray, weights: np.ndarray,
                  skip: np.ndarray | None = None, out: np.ndarray | None = None) -> np.ndarray:
        """Computes every routed expert not in ``skip`` into its row of ``out`` ([k, n_embd] float32); skipped rows
        are left untouched. Blocks until done; with ``out`` given, allocates nothing per call."""
        request = routed_request(x, ids, weights, skip)
        if out is None:
            out = np.empty((request[1].shape[0], self.n_embd), np.float32)
        self._native.run_layer(layer, *request, out)
        return out

    def run_layer_sum(self, layer: int, x: np.ndarray, ids: np.ndarray, weights: np.ndarray,
                      skip: np.ndarray | None = None, out: np.ndarray | None = None) -> np.ndarray:
        """The sum of run_layer's rows not in ``skip``, added in order from zero, bit for bit, into ``out``
        ([n_embd] float32; zeros when every row is skipped): what the decode loop hands the GPU. Blocks until done;
        with ``out`` given, allocates nothing per call."""
        if out is None:
            out = np.empty(self.n_embd, np.float32)
        self._native.run_layer_sum(layer, *routed_request(x, ids, weights, skip), out)
        return out

    def run_groups(self, layer: int, x: np.ndarray, experts: np.ndarray, begin: np.ndarray,
                   out: np.ndarray | None = None) -> np.ndarray:
        """A prompt chunk's routed rows grouped by expert: ``out[r]`` = expert ``experts[g]`` of ``x[r]``, unweighted,
        for ``r`` in ``begin[g]:begin[g + 1]`` (``begin`` from 0, ``groups + 1`` entries, at most ``max_rows`` rows).
        Each row equals run_layer's row of that expert for x[r] with weight 1, bit for bit. With ``out`` given
        ([begin[-1], n_embd] float32), allocates nothing per call."""
        return self._native.run_groups(layer, np.ascontiguousarray(x, dtype=np.float32),
                                       np.ascontiguousarray(experts, dtype=np.int32),
                                       np.ascontiguousarray(begin, dtype=np.int32), out)

    def run_rows_sum(self, layer: int, x: np.ndarray, ids: np.ndarray, weights: np.ndarray,
                     skip: np.ndarray | None = None, out: np.ndarray | None = None) -> np.ndarray:
        """Several rows' routed experts at once (a step of several rows): ``out[r]`` = run_layer_sum of ``x[r]``,
        ``ids[r]``, ``weights[r]``, ``skip[r]``, bit for bit, each expert the rows route to computed once for all of
        them (their routed pairs, at most ``max_rows``). x, out [rows, n_embd]; ids, weights, skip [rows, k]."""
        ids = np.ascontiguousarray(ids, dtype=np.int32)
        skip = np.zeros(ids.shape, np.uint8) if skip is None else np.ascontiguousarray(skip, dtype=np.uint8)
        if out is None:
            out = np.empty((ids.shape[0], self.n_embd), np.float32)
        self._native.run_rows_sum(layer, np.ascontiguousarray(x, dtype=np.float32), ids,
                                  np.ascontiguousarray(weights, dtype=np.float32), skip, out)
        return out

    def open_file(self, path: str, *, direct: bool = True, io_threads: int = 8, staging_slots: int = 0) -> None:
        """Opens the model file that tiered layers read their missed experts from: O_DIRECT where its file system
        takes it (`direct`), else buffered reads whose pages are dropped; `io_threads` reads in flight; the staging
        holds 2 x `staging_slots` experts (0: max_k per half)."""
        self._native.open_expert_file(os.fspath(path), direct, io_threads, staging_slots)

    def set_tiered_layer(self, layer: int, matrices: tuple[FileMatrix, FileMatrix, FileMatrix], n_expert: int,
                         slots: int, hold: list[int], policy: dict[str, Any] | None = None) -> None:
        """Registers layer `layer` as tiered: gate, up and down in the open file, `slots` experts in the pool's
        arena starting with `hold` (read now), then moved by the decode calls' routing as `policy` says
        ({"replace", "admit_after", "window", "max_moves"}; docs/tiers.md)."""
        self._native.set_tiered_layer(layer, *(m.spec(n_expert) for m in matrices), [m.where for m in matrices],
                                      slots, list(hold), policy)
        self._n_expert[layer] = n_expert

    def is_tiered(self, layer: int) -> bool:
        return self._native.is_tiered(layer)

    def tier_stats(self) -> list[dict[str, Any]]:
        """Per tiered layer: layer, slots, hits, misses, moves, bytes_read and the experts its arena holds."""
        return self._native.tier_stats()

    def file_info(self) -> dict[str, Any]:
        """The disk tier's file: path, direct (and buffered_reason), io_threads, staging_slots, staging_bytes,
        arena_bytes, whether they are page-locked, bytes_read."""
        return self._native.expert_file_info()

    def read_expert(self, layer: int, expert: int) -> np.ndarray:
        """One expert's canonical planes wherever it lives (uint8: gate, up, down, each's planes in the order codes,
        d, sub_scales, mins, sub_mins)."""
        return self._native.read_expert(layer, expert)

    def read_bandwidth(self, nbytes: int, reps: int = 5) -> float:
        """Best bytes/s of all workers reading an ``nbytes`` buffer."""
        return self._native.read_bandwidth(nbytes, reps)

    def host_weights(self) -> list[list[np.ndarray]]:
        """The arrays the native pool's planes point into, per whole layer: whoever else reads them through the
        native pool (the expert cache) keeps this list, so that close() cannot free them under it."""
        return list(self._weights.values())

    def n_expert(self, layer: int) -> int:
        """Experts registered for `layer` (0: none)."""
        return self._n_expert.get(layer, 0)

    def layer_bytes(self, layer: int) -> int:
        """Weight bytes of one expert of ``layer`` (gate + up + down, every plane)."""
        return self._native.expert_bytes(layer) if self._n_expert.get(layer) else 0

    @property
    def native(self):
        """The strata._native.CpuExpertPool (the decode session answers rings through it)."""
        return self._native

    @property
    def threads(self) -> int:
        return self._native.threads

    @property
    def participants(self) -> int:
        """Threads a job from this thread runs on: the workers, and this thread where it is pinned apart from them
        (``pin_caller``), which then takes work items instead of waiting for them."""
        return self._native.participants

    @property
    def isa(self) -> str:
        return self._native.isa

    @property
    def worker_cpus(self) -> list[tuple[int, ...]]:
        return self._native.worker_cpus

    @property
    def parked_workers(self) -> int:
        return self._native.parked_workers

    def close(self) -> None:
        """Stops the workers, restores the creating thread's affinity and releases the weights."""
        self._native.close()
        self._weights.clear()

    def __enter__(self) -> ExpertPool:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
