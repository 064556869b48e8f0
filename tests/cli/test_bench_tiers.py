"""benchmarks/bench_tiers.py on the CPU pool alone (--pool-only): the disk's read rate, then a share of the routed
experts in RAM and all of them, each with its RESULT line and its figures in the JSON."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest

from strata.synth import synthesize

pytest.importorskip("strata._native")

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "bench_tiers.py"
TYPES = {"experts": "q5_k", "expert_down": "q8_0", "dense": "q4_0", "embeddings": "q4_0", "ple": "q8_0"}


def test_pool_only_reports_each_share(tmp_path, monkeypatch, capsys):
    model = synthesize(tmp_path / "m.gguf", "qwen3next", "tiny", types=TYPES, seed=2)
    out = tmp_path / "tiers.json"
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), str(model), "--pool-only", "--shares", "0,100", "--tokens", "3",
                                      "--disk-seconds", "0.2", "--json", str(out)])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    assert done.value.code == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("RESULT")]
    assert lines[0].startswith("RESULT disk_read_rate ") and len(lines) == 3
    result = json.loads(out.read_text())
    shares = result["shares"]
    assert result["disk_read_rate"] > 0 and list(shares) == ["0% of the routed experts", "100% of the routed experts"]
    assert shares["0% of the routed experts"]["tiered"] and shares["0% of the routed experts"]["misses_per_token"] > 0
    assert not shares["100% of the routed experts"]["tiered"]
    assert all(s["tokens_per_second"] > 0 and s["fraction_of_limit"] > 0 for s in shares.values())
