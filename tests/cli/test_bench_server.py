"""strata.bench.server and benchmarks/bench_server.py without a GPU: concurrent streaming clients against a real
`strata serve --engine reference` on a tiny model (every request's tokens as its non-streamed answer counts them)
and against a scripted llama-server-like stream; the prompts, the level figures, the servers' commands, and the
child server stopped after every run, a failed start included."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from strata.bench import server_process
from strata.bench.server import (
    COUNTERS, Answer, Endpoint, batching, completion, prompts, run, summary, takes_ignore_eos,
)
from strata.bench.server_process import (
    cpu_moe_layers, expert_budget, free_port, llama_server_command, started, strata_serve_command,
)
from strata.errors import InvalidArgument, StrataError
from strata.format import inspect
from strata.runtime import expert_cache
from strata.runtime.loader import load_experts
from strata.runtime.plan import file_tensors
from strata.runtime.pool import ExpertPool
from strata.synth import synthesize

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_server.py"
HEALTHY = """import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""  # a server whose /health answers 200


@pytest.fixture(scope="module")
def tiny(tiny_model):
    path = tiny_model("qwen3next", seed=4)
    with inspect(path) as file:
        return path, file.geometry.n_vocab


@pytest.fixture
def popened(monkeypatch):
    """Every process server_process starts, to check afterwards that none is left running."""
    made = []
    real = subprocess.Popen

    def recording(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(server_process.subprocess, "Popen", recording)
    return made


def whole_answer(url: str, prompt: list[int], max_tokens: int) -> dict:
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}).encode()
    request = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def test_prompts_are_reproducible_distinct_in_their_first_id_and_avoid_the_excluded(rng):
    vocab, length, count = int(rng.integers(50, 500)), int(rng.integers(1, 40)), int(rng.integers(2, 40))
    exclude = {int(t) for t in rng.integers(0, vocab, 5)}
    seed = int(rng.integers(1 << 30))
    got = prompts(count, length, vocab, seed, exclude)
    assert got == prompts(count, length, vocab, seed, exclude)
    assert got != prompts(count, length, vocab, seed + 1, exclude)
    assert all(len(p) == length for p in got)
    assert all(0 <= t < vocab and t not in exclude for p in got for t in p)
    assert len({p[0] for p in got}) == count  # no two share a prefix to reuse
    with pytest.raises(InvalidArgument, match="count and length must be >= 1, got 3 and 0"):
        prompts(3, 0, vocab, seed)


def test_a_levels_figures_from_known_answers(rng):
    max_tokens = 8
    answers = []
    for i in range(int(rng.integers(4, 20))):
        tokens = int(rng.integers(1, max_tokens + 1))
        ttft, decode = float(rng.uniform(0.01, 1)), float(rng.uniform(0.01, 1))
        answers.append(Answer(i % 3, i + 1, 5, ttft, ttft + decode + 0.001, tokens, decode))
    failed = Answer(0, 99, 5, None, 0.5, 0, 0.0, "HTTP 429: busy")
    wall = float(rng.uniform(1, 5))
    got = summary(3, [*answers, failed], wall, max_tokens)
    tokens = sum(a.tokens for a in answers)
    assert got["requests"] == len(answers) + 1 and got["errors"] == 1 and got["error_messages"] == ["HTTP 429: busy"]
    assert got["tokens"] == tokens and got["short"] == sum(a.tokens < max_tokens for a in answers)
    assert got["aggregate_tokens_per_second"] == pytest.approx(tokens / wall, rel=1e-12)
    streams = [(a.tokens - 1) / a.decode_seconds for a in answers if a.tokens >= 2]
    assert got["stream_tokens_per_second"] == (pytest.approx(statistics.median(streams), rel=1e-12) if streams
                                               else None)
    ttft = sorted(a.ttft for a in answers)
    assert got["ttft_p50"] == pytest.approx(statistics.median(ttft), rel=1e-12)
    assert ttft[0] <= got["ttft_p50"] <= got["ttft_p90"] <= ttft[-1]
    assert summary(1, [failed], wall, max_tokens)["ttft_p50"] is None
    assert got["itl_p50"] is None  # no answer here has its gaps


def test_a_levels_time_between_tokens_is_over_every_gap_of_every_answer():
    answers = [Answer(0, 1, 5, 0.1, 1.0, 4, 0.6, gaps=(0.1, 0.2, 0.3)),
               Answer(1, 2, 5, 0.1, 1.0, 3, 0.5, gaps=(0.4, 0.5)),
               Answer(1, 3, 5, None, 1.0, 0, 0.0, "HTTP 500: no", gaps=(9.0,))]
    got = summary(2, answers, 2.0, 4)
    assert got["itl_p50"] == pytest.approx(0.3) and got["itl_p90"] == pytest.approx(0.46)


def test_the_servers_counters_give_a_levels_batching():
    before = {name: 0.0 for name in COUNTERS}
    after = {"strata_decode_batches_total": 10.0, "strata_decode_rows_total": 64.0,
             "strata_compute_busy_seconds_total": 1.5, "strata_compute_gathering_seconds_total": 0.1}
    assert batching(before, after, 2.0) == {"decode_batches": 10, "decode_rows": 64, "rows_per_batch": 6.4,
                                            "busy_share": 0.75, "gathering_share": 0.05}
    assert batching(None, after, 2.0) is None and batching(before, None, 2.0) is None


def test_clients_against_strata_serve_count_what_the_whole_answers_count(tiny, popened):
    path, vocab = tiny
    port = free_port()
    command = strata_serve_command(str(path), port, engine="reference", options=["--context", "32"])
    lines = []
    with started(command, port, startup_seconds=120) as server:
        result = run(server.url + "/v1", [1, 2], 2, 6, 5, vocab, seed=3, emit=lines.append)
        every = prompts(1 + 3 * 2, 6, vocab, 3)
        whole = {a["request"]: whole_answer(server.url, every[a["request"]], 5)
                 for level in result["levels"] for a in level["answers"]}
    assert popened and all(p.poll() is not None for p in popened), "the server outlived its block"
    assert result["ignore_eos"] is True  # strata takes it, as llama-server and vLLM do
    assert [json.loads(line)["clients"] for line in lines] == [1, 2]
    numbers = []
    for level, line in zip(result["levels"], lines):
        assert {k: v for k, v in level.items() if k != "answers"} == {
            k: v for k, v in json.loads(line).items() if k not in ("record", "url", "ignore_eos")}
        assert level["requests"] == 2 * level["clients"] and level["errors"] == 0
        assert sorted(a["client"] for a in level["answers"]) == sorted(list(range(level["clients"])) * 2)
        for a in level["answers"]:
            numbers.append(a["request"])
            assert a["error"] is None and a["prompt_tokens"] == 6
            assert a["tokens"] == whole[a["request"]]["usage"]["completion_tokens"]
            assert 0 < a["ttft"] <= a["seconds"] and 0 <= a["decode_seconds"] <= a["seconds"] - a["ttft"]
        assert level["tokens"] == sum(a["tokens"] for a in level["answers"])
        assert level["short"] == sum(a["tokens"] < 5 for a in level["answers"])
        assert level["aggregate_tokens_per_second"] == pytest.approx(level["tokens"] / level["wall_seconds"])
        assert level["server"] is None  # batch 1: no batching counters
        assert all(len(a["gaps"]) == a["tokens"] - 1 for a in level["answers"])
    assert sorted(numbers) == list(range(1, 7))  # every prompt once, the warm-up's (0) not among them


class LlamaLike(BaseHTTPRequestHandler):
    """A stream as llama-server sends one: a chunk per token, then one with the finish reason and usage (or,
    with usage off, none), ending [DONE]; it stops after 2 tokens (an EOS) unless asked to ignore EOS."""

    usage = True
    bodies: list[dict] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.bodies.append(body)
        tokens = body["max_tokens"] if body.get("ignore_eos") else 2
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for _ in range(tokens):
            self._send({"choices": [{"text": "a", "index": 0, "finish_reason": None}]})
        last = {"choices": [{"text": "", "index": 0, "finish_reason": "length"}]}
        self._send({**last, "usage": {"completion_tokens": tokens}} if self.usage else last)
        self.wfile.write(b"data: [DONE]\n\n")

    def _send(self, event):
        self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
        self.wfile.flush()

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("usage", [True, False])
def test_a_server_that_takes_ignore_eos_gets_it_and_its_tokens_are_counted(usage, monkeypatch):
    monkeypatch.setattr(LlamaLike, "usage", usage)
    monkeypatch.setattr(LlamaLike, "bodies", [])
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), LlamaLike)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = Endpoint(f"http://127.0.0.1:{httpd.server_address[1]}/v1")
        takes, warm = takes_ignore_eos(endpoint, [1, 2, 3], 7)
        assert takes and warm.tokens == 7 and warm.error is None
        assert completion(endpoint, [4, 5], 7).tokens == 2  # not asked: the scripted EOS
        result = run(endpoint.base_url, [2], 1, 3, 6, 100, seed=1)
    finally:
        httpd.shutdown()
        thread.join()
        httpd.server_close()
    assert all(b["ignore_eos"] is True for b in LlamaLike.bodies[2:]) and result["ignore_eos"] is True
    level = result["levels"][0]
    assert level["tokens"] == 12 and level["short"] == 0 and level["errors"] == 0


def test_a_server_that_fails_to_start_is_named_with_its_last_output(tmp_path, popened):
    missing = tmp_path / "missing.gguf"
    port = free_port()
    command = strata_serve_command(str(missing), port, engine="reference")
    with pytest.raises(StrataError, match=r"exited with status [1-9]\d* before it was ready") as caught:
        with started(command, port, startup_seconds=60):
            pytest.fail("the block ran without a server")
    assert " ".join(command) in str(caught.value) and "missing.gguf" in str(caught.value).split("its last output")[1]
    assert popened and all(p.poll() is not None for p in popened)


def test_a_server_never_ready_or_interrupted_is_stopped(popened):
    port = free_port()
    asleep = [sys.executable, "-c", "import time; print('loading', flush=True); time.sleep(120)"]
    with pytest.raises(StrataError, match=r"not ready within 0.5 s: .*\nits last output:\nloading"):
        with started(asleep, port, startup_seconds=0.5):
            pass
    assert popened[-1].poll() is not None
    answering = [sys.executable, "-c", HEALTHY, str(port)]
    with pytest.raises(KeyboardInterrupt):  # a Ctrl-C in the block: the server is stopped all the same
        with started(answering, port, startup_seconds=30) as server:
            raise KeyboardInterrupt
    assert server.process.poll() is not None and len(popened) == 2


def test_the_servers_commands_place_the_experts_alike():
    mib = 1 << 20
    per_expert, n_expert = [0, mib, 3 * mib], 8  # a layer without routed experts, then two with
    assert expert_budget(per_expert, n_expert, 0.0) == 0
    half = expert_budget(per_expert, n_expert, 0.5)
    assert 4 * 4 * mib < half < 4 * 4 * mib + mib  # four of each layer's eight and their maps, not a fifth
    assert expert_budget(per_expert, n_expert, 1.0) > 8 * 4 * mib
    assert [cpu_moe_layers(s, 48) for s in (0.0, 0.5, 1.0)] == [48, 24, 0]
    with pytest.raises(InvalidArgument, match="in 0..100 %, got 150"):
        cpu_moe_layers(1.5, 48)
    command = llama_server_command("/opt/llama-server", "m.gguf", 8080, parallel=8, context=200, cpu_moe=24)
    assert command == ["/opt/llama-server", "-m", "m.gguf", "--host", "127.0.0.1", "--port", "8080", "-ngl", "999",
                       "--parallel", "8", "-c", "1600", "--n-cpu-moe", "24"]
    serve = strata_serve_command("m.gguf", 8081, options=["--batch", "4"])
    assert serve[1:] == ["-m", "strata.cli", "serve", "m.gguf", "--host", "127.0.0.1", "--port", "8081", "--engine",
                         "gpu", "--batch", "4"]


@pytest.mark.parametrize(("arch", "types"), [("qwen4exp", {"experts": "q4_k", "expert_down": "q4_0"}),
                                             ("qwen35moe", {"experts": "q8_0", "expert_down": "f16"})])
def test_a_shares_budget_holds_that_share_of_every_layer_by_the_native_figure(arch, types, tmp_path):
    path = synthesize(tmp_path / f"{arch}.gguf", arch, types=types, seed=6)
    with inspect(path) as file:
        g, per_expert = file.geometry, expert_cache.expert_bytes(file.geometry, file_tensors(file))
        with ExpertPool(g.n_embd, g.expert_ff, g.n_expert_used, threads=1, pin_caller=False) as pool:
            load_experts(file, pool)
            moe = expert_cache.moe_layers(pool, g.n_layer)
            for share in (0.25, 0.5, 1.0):
                budget = expert_budget(per_expert, g.n_expert, share)
                wanted = [round(share * g.n_expert) if layer in moe else 0 for layer in range(g.n_layer)]
                assert expert_cache.cache_bytes(pool, wanted) <= budget, (share, budget)
                placed = expert_cache.slots_for(pool, g.n_layer, budget)
                assert all(p >= w for p, w in zip(placed, wanted)), (share, placed, wanted)


def test_the_script_prints_its_table_and_writes_its_json(tiny, tmp_path):
    path, _ = tiny
    out = tmp_path / "server.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--model", str(path), "--engine", "reference", "--clients",
                           "1,2", "--requests", "1", "--prompt-tokens", "4", "--max-tokens", "3", "--llama-server",
                           str(tmp_path / "no-llama-server"), "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "no llama-server at" in done.stdout and "llama-server skipped" in done.stdout
    result = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert len(result) == 1 and result[0].startswith("RESULT strata serve (reference engine): clients 1/2:")
    runs = json.loads(out.read_text())["runs"]
    assert [level["clients"] for level in runs[0]["levels"]] == [1, 2]
    assert runs[0]["command"][3:5] == ["serve", str(path)] and runs[0]["ignore_eos"]
    assert np.isfinite(runs[0]["levels"][1]["aggregate_tokens_per_second"])


def test_the_script_serves_the_scripted_engine_in_a_child_and_reads_its_batching(tmp_path):
    out = tmp_path / "scripted.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--engine", "scripted", "--batch", "4", "--sessions", "4",
                           "--clients", "1,4", "--requests", "1", "--prompt-tokens", "4", "--max-tokens", "6",
                           "--costs-ms", "1,1,0.5,0.01", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert len(result) == 1 and result[0].startswith("RESULT strata serve (scripted engine: 1 ms alone, 1 + 0.5 ms a row")
    run_ = json.loads(out.read_text())["runs"][0]
    assert "--serve-scripted" in run_["command"] and run_["ignore_eos"]
    for level in run_["levels"]:
        assert level["errors"] == 0 and level["tokens"] == 6 * level["clients"] and level["short"] == 0
        batching_ = level["server"]
        assert batching_["decode_rows"] == 5 * level["clients"] and batching_["rows_per_batch"] >= 1
        assert 0 < batching_["busy_share"] <= 1 and 0 <= batching_["gathering_share"] <= 1


def test_the_script_against_a_url_needs_a_vocabulary_and_says_when_nothing_answers():
    port = free_port()  # nothing listens there
    base = [sys.executable, str(SCRIPT), "--url", f"http://127.0.0.1:{port}/v1", "--clients", "1"]
    refused = subprocess.run(base, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--url needs --model (the file served) or --vocab" in refused.stderr
    silent = subprocess.run([*base, "--vocab", "100"], capture_output=True, text=True, timeout=60)
    assert silent.returncode != 0
    assert f"the warm-up request to http://127.0.0.1:{port} failed: ConnectionRefusedError" in silent.stderr
