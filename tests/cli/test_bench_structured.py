"""benchmarks/bench_structured.py on a small vocabulary: its RESULT lines and its JSON, and each schema it makes new
and one the grammar engine enforces."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import numpy as np
import pytest

pytest.importorskip("llguidance")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_structured.py"


def test_the_bench_prints_its_results_and_writes_its_figures(tmp_path):
    out = tmp_path / "structured.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--vocab", "700", "--schemas", "3", "--tokens", "30",
                           "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT structured")]
    assert [line.split(":")[0] for line in lines] == ["RESULT structured tokenizer", "RESULT structured first token",
                                                      "RESULT structured per token", "RESULT structured session"]
    figures = json.loads(out.read_text())
    assert figures["vocab"] == 700 and figures["schemas"] == 3 and figures["fields"] == 20
    assert 0 < figures["first_token_added_ms"]["median"] <= figures["first_token_added_ms"]["max"]
    assert figures["per_token_us"]["median"] > 0
    assert all(figures["session"][key] > 0 for key in ("unconstrained_us", "schema_first_us", "schema_again_us"))


def test_its_schemas_are_new_each_time_and_valid():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_structured", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rng = np.random.default_rng(1)
    schemas = [bench.new_schema(20, rng) for _ in range(5)]
    names = [set(schema["properties"]) for schema in schemas]
    assert all(len(n) == 20 for n in names) and not set.intersection(*names)
    for schema in schemas:
        jsonschema.Draft202012Validator.check_schema(schema)
