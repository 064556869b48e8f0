"""A long decode in one session, watched window by window: does it stay fast, finite and flat in memory?

    python3 benchmarks/soak_decode.py [MODEL.gguf] [--tokens 10000] [--window 500] [--mode token_graph]
        [--expert-cache 0] [--kv int8] [--host-bound 64] [--device-bound 16] [--json PATH]

Without MODEL, `strata bench`'s default benchmark model (synthesized once into the cache). One session of `tokens`
tokens decodes greedily from one fixed id, each step fed the token the last one sampled. After each window of
`window` tokens: its decode tok/s, this process's host RSS (VmRSS), the GPU's used memory (total - free, as the
driver reports it: every process's) and whether the last step's logits are all finite. The first window warms
what is made once (graph capture, the pool's pages, the allocators' pools), so memory is measured from its end:
the exit status is 1 when any window's logits held a NaN or inf, or host RSS grew more than --host-bound MiB or
device memory more than --device-bound MiB past the first window's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from strata.errors import InvalidArgument, StrataError
from strata.options import KV, Mode

MIB = 1 << 20
FIRST_ID = 1  # the id the first step is fed; every later one is the previous step's greedy sample
PROC_STATUS = Path("/proc/self/status")


@dataclass(frozen=True)
class Window:
    """One window's figures, read at its end."""

    index: int
    end: int  # tokens decoded so far
    tokens: int
    seconds: float
    host_rss_bytes: int
    device_used_bytes: int
    nonfinite_logits: int  # NaN or inf among the last step's logits

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds


@dataclass(frozen=True)
class Bounds:
    """How far memory may grow past the first window's end."""

    host_rss_bytes: int
    device_used_bytes: int


def window_sizes(tokens: int, window: int) -> list[int]:
    """The tokens of each window: `window` each, the last one what remains."""
    if tokens < 1 or window < 1:
        raise InvalidArgument(f"--tokens and --window must be >= 1, got {tokens} and {window}")
    full, rest = divmod(tokens, window)
    return [window] * full + ([rest] if rest else [])


def host_rss_bytes(status: str) -> int:
    """VmRSS of a /proc/PID/status text, in bytes."""
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            value, unit = line.split()[1:3]
            if unit != "kB":
                break
            return int(value) * 1024
    raise StrataError("no 'VmRSS: N kB' line in the process status: host RSS is read from Linux's /proc")


def growth(windows: Sequence[Window], figure: str) -> tuple[int, Window]:
    """The most `figure` (a Window field) grew past the first window's, and the window where it peaked."""
    peak = max(windows, key=lambda w: getattr(w, figure))
    return getattr(peak, figure) - getattr(windows[0], figure), peak


def verdict(windows: Sequence[Window], bounds: Bounds) -> list[str]:
    """What went wrong, a line each; empty when the soak passed."""
    if not windows:
        return ["no window was decoded"]
    problems = [f"window {w.index} (to token {w.end}): {w.nonfinite_logits} non-finite logits"
                for w in windows if w.nonfinite_logits]
    for name, figure, bound in (("host RSS", "host_rss_bytes", bounds.host_rss_bytes),
                                ("device memory", "device_used_bytes", bounds.device_used_bytes)):
        grown, peak = growth(windows, figure)
        if grown > bound:
            problems.append(f"{name} grew {grown / MIB:.1f} MiB past the first window's by window {peak.index} "
                            f"(to token {peak.end}): more than the {bound / MIB:g} MiB bound")
    return problems


def soak(engine: Any, sizes: Sequence[int], memory: Callable[[], tuple[int, int]],
         on_window: Callable[[list[Window]], None]) -> list[Window]:
    """Greedy decode on `engine` (a strata.generation Engine at position 0) window by window; `memory` reads
    (host RSS, device used) bytes, and `on_window` sees the windows so far as each one ends."""
    from strata.sampling import SamplingParams

    greedy = SamplingParams()
    history: list[int] = []
    token, end, windows = FIRST_ID, 0, []
    for index, size in enumerate(sizes):
        start = time.perf_counter()
        for _ in range(size):
            history.append(token)
            token = engine.feed([token], greedy, 0.0, history)
        seconds = time.perf_counter() - start
        nonfinite = int(np.count_nonzero(~np.isfinite(engine.logits())))
        end += size
        window = Window(index, end, size, seconds, *memory(), nonfinite)
        windows.append(window)
        on_window(windows)
    return windows


def header() -> str:
    return (f"{'window':>6s} {'to token':>8s} {'tok/s':>8s} {'host RSS MiB':>12s} {'grown':>7s} "
            f"{'device MiB':>10s} {'grown':>7s} {'logits':>14s}")


def row(w: Window, first: Window) -> str:
    logits = "finite" if not w.nonfinite_logits else f"{w.nonfinite_logits} non-finite"
    return (f"{w.index:6d} {w.end:8d} {w.tokens_per_second:8.2f} "
            f"{w.host_rss_bytes / MIB:12.1f} {(w.host_rss_bytes - first.host_rss_bytes) / MIB:+7.1f} "
            f"{w.device_used_bytes / MIB:10.1f} {(w.device_used_bytes - first.device_used_bytes) / MIB:+7.1f} "
            f"{logits:>14s}")


def result_line(windows: Sequence[Window], problems: Sequence[str], mode: str, kv: str) -> str:
    rates = [w.tokens_per_second for w in windows]
    overall = sum(w.tokens for w in windows) / sum(w.seconds for w in windows)
    host, _ = growth(windows, "host_rss_bytes")
    device, _ = growth(windows, "device_used_bytes")
    return (f"RESULT soak {windows[-1].end} tokens ({mode}, kv {kv}): {overall:.1f} tok/s, windows "
            f"{min(rates):.1f}..{max(rates):.1f}; host RSS {host / MIB:+.1f} MiB, device {device / MIB:+.1f} MiB past "
            f"the first window; {'FAIL' if problems else 'PASS'}")


def memory_reader(device: int) -> Callable[[], tuple[int, int]]:
    """(this process's host RSS, GPU `device`'s used memory) in bytes, read now."""
    from strata.devices import devices

    def read() -> tuple[int, int]:
        gpu = devices()[device]
        return host_rss_bytes(PROC_STATUS.read_text()), gpu.total_memory - gpu.free_memory

    return read


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("--tokens", type=int, default=10000)
    parser.add_argument("--window", type=int, default=500)
    parser.add_argument("--mode", choices=Mode.values(), default=Mode.TOKEN_GRAPH.value)
    parser.add_argument("--kv", choices=KV.values(), default=KV.INT8.value)
    parser.add_argument("--expert-cache", default="0", help="VRAM for routed experts (0: all on the CPU pool)")
    parser.add_argument("--host-bound", type=float, default=64.0, help="MiB host RSS may grow past the first window")
    parser.add_argument("--device-bound", type=float, default=16.0, help="MiB device memory may grow likewise")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    sizes = window_sizes(args.tokens, args.window)
    bounds = Bounds(round(args.host_bound * MIB), round(args.device_bound * MIB))
    import strata
    from strata.bench.default_model import bench_model, cache_dir

    if args.model is None:
        from strata.synth import synthesize

        args.model = str(bench_model(cache_dir(), synthesize))
    with strata.load(args.model, expert_cache=args.expert_cache, progress=False) as model:
        session = model.session(args.tokens, kv=args.kv, mode=args.mode, snapshots=0)
        record = {"model": args.model, "mode": args.mode, "kv": args.kv, "expert_cache": args.expert_cache,
                  "tokens": args.tokens, "window": args.window, "bounds": asdict(bounds), "windows": []}

        def report(windows: list[Window]) -> None:
            print(row(windows[-1], windows[0]), flush=True)
            record["windows"] = [{**asdict(w), "tokens_per_second": w.tokens_per_second} for w in windows]
            if args.json:  # after every window: a run cut short keeps what it measured
                Path(args.json).write_text(json.dumps(record, indent=1))

        print(header(), flush=True)
        try:
            windows = soak(session.engine, sizes, memory_reader(model.device), report)
        finally:
            session.engine.close()
    problems = verdict(windows, bounds)
    for problem in problems:
        print(f"soak: {problem}", flush=True)
    print(result_line(windows, problems, args.mode, args.kv), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({**record, "problems": problems, "passed": not problems}, indent=1))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
