"""benchmarks/soak_decode.py without a GPU: its windows, the memory and logits it reads, and its verdict."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from strata.errors import InvalidArgument, StrataError

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "soak_decode.py"
MIB = 1 << 20


@pytest.fixture(scope="module")
def soak():
    spec = importlib.util.spec_from_file_location("soak_decode", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


class ScriptedEngine:
    """An Engine whose greedy sample is a fixed function of the id fed; its logits hold a NaN or an inf after
    the steps (counted from 1) in `poisoned`."""

    def __init__(self, poisoned: dict[int, float], n_vocab: int = 64):
        self.fed: list[int] = []
        self.poisoned, self.n_vocab = poisoned, n_vocab

    def feed(self, ids: Sequence[int], params, u: float, seen: Sequence[int]) -> int:
        assert params.temperature == 0.0 and u == 0.0, "the soak decodes greedily"
        assert list(seen) == self.fed + list(ids), "the history must be what the session was fed"
        self.fed.extend(ids)
        return (ids[-1] * 7 + 3) % self.n_vocab

    def logits(self) -> np.ndarray:
        out = np.linspace(-1.0, 1.0, self.n_vocab, dtype=np.float32)
        if len(self.fed) in self.poisoned:
            out[len(self.fed) % self.n_vocab] = self.poisoned[len(self.fed)]
        return out


def window(soak, index: int, host_mib: float, device_mib: float, nonfinite: int = 0, tokens: int = 500):
    return soak.Window(index, (index + 1) * tokens, tokens, 5.0, round(host_mib * MIB), round(device_mib * MIB),
                       nonfinite)


def test_windows_cover_the_tokens_and_the_last_takes_the_rest(soak, rng):
    assert soak.window_sizes(10000, 500) == [500] * 20
    assert soak.window_sizes(1001, 500) == [500, 500, 1]
    assert soak.window_sizes(7, 500) == [7]
    tokens, size = int(rng.integers(1, 5000)), int(rng.integers(1, 700))
    sizes = soak.window_sizes(tokens, size)
    assert sum(sizes) == tokens and all(0 < s <= size for s in sizes) and sizes[:-1] == [size] * (len(sizes) - 1)
    for bad in ((0, 500), (100, 0), (-1, 5)):
        with pytest.raises(InvalidArgument, match=rf"--tokens and --window must be >= 1, got {bad[0]} and {bad[1]}"):
            soak.window_sizes(*bad)


def test_host_rss_is_read_from_the_process_status(soak):
    status = "Name:\tpython3\nVmPeak:\t  9000 kB\nVmRSS:\t  123456 kB\nVmData: 1 kB\n"
    assert soak.host_rss_bytes(status) == 123456 * 1024
    assert soak.host_rss_bytes(soak.PROC_STATUS.read_text()) > 1 * MIB  # this interpreter, numpy loaded
    for text in ("Name:\tpython3\n", "VmRSS:\t12 MB\n"):
        with pytest.raises(StrataError, match="no 'VmRSS: N kB' line in the process status"):
            soak.host_rss_bytes(text)


def test_a_flat_soak_passes_and_growth_counts_from_the_first_window(soak):
    bounds = soak.Bounds(64 * MIB, 16 * MIB)
    flat = [window(soak, 0, 900, 30000), window(soak, 1, 964, 30016), window(soak, 2, 950, 29990)]
    assert soak.verdict(flat, bounds) == []  # exactly the bounds: still a pass
    warm = [window(soak, 0, 2000, 31000), window(soak, 1, 900, 30000), window(soak, 2, 1000, 30010)]
    assert soak.verdict(warm, bounds) == []  # below the first window's figure is no growth
    assert soak.growth(warm, "host_rss_bytes") == (0, warm[0])


def test_growth_past_a_bound_and_non_finite_logits_fail_and_say_where(soak):
    bounds = soak.Bounds(64 * MIB, 16 * MIB)
    windows = [window(soak, 0, 900, 30000), window(soak, 1, 964.5, 30000, nonfinite=3),
               window(soak, 2, 950, 30016.5), window(soak, 3, 940, 30000, nonfinite=1)]
    assert soak.verdict(windows, bounds) == [
        "window 1 (to token 1000): 3 non-finite logits",
        "window 3 (to token 2000): 1 non-finite logits",
        "host RSS grew 64.5 MiB past the first window's by window 1 (to token 1000): more than the 64 MiB bound",
        "device memory grew 16.5 MiB past the first window's by window 2 (to token 1500): more than the 16 MiB bound"]
    assert soak.verdict([], bounds) == ["no window was decoded"]
    assert soak.result_line(windows, ["x"], "token_graph", "int8").endswith("FAIL")
    line = soak.result_line(windows[:1], [], "token_graph", "int8")
    assert line.startswith("RESULT soak 500 tokens (token_graph, kv int8): 100.0 tok/s") and line.endswith("PASS")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_soak_feeds_its_own_samples_and_checks_each_windows_last_logits(soak, rng, bad):
    size = int(rng.integers(2, 40))
    sizes = soak.window_sizes(int(rng.integers(3 * size, 6 * size)), size)
    ends = np.cumsum(sizes)
    hit = int(rng.integers(len(sizes)))  # a window whose last step's logits are poisoned
    engine = ScriptedEngine({int(ends[hit]): bad, int(ends[0]) - 1: bad})  # and a step no window ends on: unseen
    reads = iter(range(len(sizes)))
    seen: list[int] = []

    def memory() -> tuple[int, int]:
        i = next(reads)
        return 1000 + i * MIB, 5000 + 2 * i * MIB

    windows = soak.soak(engine, sizes, memory, lambda so_far: seen.append(len(so_far)))
    assert seen == list(range(1, len(sizes) + 1))
    assert [w.end for w in windows] == ends.tolist() and [w.tokens for w in windows] == sizes
    assert [w.index for w in windows] == list(range(len(sizes)))
    assert [w.nonfinite_logits for w in windows] == [int(i == hit) for i in range(len(sizes))]
    assert [w.host_rss_bytes for w in windows] == [1000 + i * MIB for i in range(len(sizes))]
    assert [w.device_used_bytes for w in windows] == [5000 + 2 * i * MIB for i in range(len(sizes))]
    assert all(w.seconds > 0 for w in windows)
    expected = [soak.FIRST_ID]
    while len(expected) < len(engine.fed):
        expected.append((expected[-1] * 7 + 3) % engine.n_vocab)
    assert engine.fed == expected and len(engine.fed) == sum(sizes)


def test_bad_window_arguments_are_refused_before_any_model_is_opened(soak, tmp_path):
    with pytest.raises(InvalidArgument, match="--tokens and --window must be >= 1, got 10000 and 0"):
        soak.main([str(tmp_path / "absent.gguf"), "--window", "0"])
