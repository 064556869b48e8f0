"""The disk tier's side of a bench on the CPU (strata.bench.tiers, docs/tiers.md): the spans the tier reads, the
file's read rate with the tier's kind of reads, the tiered limit's arithmetic and its report line."""

from __future__ import annotations

import math

import pytest

from strata.bench.limit import machine_limit
from strata.bench.rates import Rates
from strata.bench.report import tier_line
from strata.bench.tiers import DiskRate, disk_rate, expert_spans, tiered_limit
from strata.format import inspect
from strata.runtime.tiers import file_matrices, matrix_file_bytes
from strata.synth import synthesize

RATES = Rates(host_read=20e9, pcie_upload=55e9, hbm_copy=4.2e12, doorbell_round_trip=3.1e-6)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiers") / "tiny.gguf"
    synthesize(path, "qwen3next", "tiny", types={"experts": "q4_k", "expert_down": "q8_0"}, seed=5)
    with inspect(path) as file:
        yield file


def test_the_spans_are_every_matrix_of_every_routed_expert(tiny):
    g = tiny.geometry
    spans = expert_spans(tiny)
    matrices = [m for layer in range(g.n_layer) for m in file_matrices(tiny, layer) or ()]
    assert len(spans) == len(matrices) * g.n_expert
    assert sum(length for _, length in spans) == sum(matrix_file_bytes(m) * g.n_expert for m in matrices)
    size = tiny.path.stat().st_size
    assert all(0 <= offset and offset + length <= size for offset, length in spans)
    assert len(set(spans)) == len(spans)


def test_the_read_rate_reads_the_file_as_the_tier_does(tiny):
    rate = disk_rate(str(tiny.path), expert_spans(tiny), seconds=0.2, threads=2)
    assert rate.reads in ("O_DIRECT", "buffered")  # buffered where the file system refuses O_DIRECT (tmpfs)
    assert math.isfinite(rate.bytes_per_second) and rate.bytes_per_second > 0
    with pytest.raises(ValueError, match="no routed expert"):
        disk_rate(str(tiny.path), [], seconds=0.1)


def test_the_tiered_limit_adds_the_missed_bytes_at_the_files_rate(tiny):
    g = tiny.geometry
    limit = machine_limit(g, {n: (t.ggml_type, t.ne) for n, t in tiny.tensors.items()}, RATES)
    disk = DiskRate(2e9, "O_DIRECT")
    # 30 hits and 10 misses over 4 tokens, 8 MB read from the file
    got = tiered_limit(limit, (100, 50, 1_000_000), (130, 60, 9_000_000), 4, disk)
    want = 0.75 * limit.routed_seconds + 2e6 / 2e9 + limit.dense_seconds + limit.doorbell_seconds
    assert math.isclose(got["seconds"], want, rel_tol=1e-12)
    assert (got["misses_per_token"], got["disk_bytes_per_token"], got["missed_share"]) == (2.5, 2e6, 0.25)
    none = tiered_limit(limit, (0, 0, 0), (40, 0, 0), 4, disk)  # every expert in the arena: the plain limit
    assert math.isclose(none["seconds"], limit.seconds, rel_tol=1e-12) and none["disk_seconds"] == 0
    line = tier_line("token_graph", got)
    assert "2.5 experts a token missed (25.0% of the pool's), 2.0 MB at 2.00 GB/s (O_DIRECT" in line
    assert f"{1 / want:.1f} tok/s" in line
