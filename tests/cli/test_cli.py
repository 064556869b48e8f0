"""The `strata` command: doctor, argument handling, one-line errors."""

import json
import subprocess
import sys

import pytest

from strata import _native, cli
from strata.convert.tokenizer_meta import CHATML_TEMPLATE
from strata.errors import InvalidArgument
from strata.format import inspect


def test_doctor_reports_the_machine(capsys):
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("strata ")
    for heading in ("host", "SIMD", "CUDA", "GPU"):
        assert f"\n{heading}" in out
    if _native.device_count() == 0:
        assert "GPU       none: no NVIDIA driver or GPU found" in out
    else:
        assert "self-test GPU 0: rms_norm vs the host in float64" in out and "OK" in out


def test_doctor_runs_as_a_console_script():
    result = subprocess.run(
        [sys.executable, "-c", "import sys; from strata.cli import main; sys.exit(main(['doctor']))"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "CUDA      driver" in result.stdout


def test_no_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([])
    assert exit_info.value.code == 2
    assert "COMMAND" in capsys.readouterr().err


def test_info_describes_a_valid_file(tmp_path, rng, capsys):
    from support.malformed import build_tiny

    path = tmp_path / "tiny.gguf"
    build_tiny(path, rng)
    assert cli.main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "architecture  qwen4exp:" in out
    assert "routed experts (host RAM)" in out and "dense layers (VRAM)" in out
    assert "KV state      at " in out and "KV streaming  in VRAM bf16 " in out


def test_info_says_where_each_part_runs_and_what_its_form_costs(tmp_path, capsys):
    path = tmp_path / "s.gguf"
    assert cli.main(["synth", str(path), "--arch", "qwen4exp", "--layers", "4", "--seed", "3", "--dense-type", "q6_k",
                     "--experts-type", "q4_k", "--expert-down-type", "q4_k"]) == 0
    capsys.readouterr()
    assert cli.main(["info", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()

    def row(*words: str) -> str:
        (line,) = [line for line in lines if "->" in line and all(f" {w} " in line for w in words)]
        return line

    experts = row("CPU pool", "Q4_K", "q4_k")
    assert "routed experts (host RAM)" in experts and "4.50 ->  4.62" in experts and "widened" not in experts
    dense = row("GPU", "Q6_K", "q6_k")   # 6-bit codes held as bytes (docs/forms.md)
    assert "dense layers (VRAM)" in dense and "6.56 ->  8.56" in dense and "widened x1.30" in dense
    assert any("VRAM expert cache run on the GPU" in line for line in lines)


def test_info_on_a_bad_file_is_one_line_not_a_traceback(tmp_path, capsys):
    path = tmp_path / "bad.gguf"
    path.write_bytes(b"GGUF" + b"\x00" * 7)
    assert cli.main(["info", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("strata info: ") and err.count("\n") == 1 and "Traceback" not in err


def test_synth_then_info_from_the_command_line(tmp_path, capsys):
    path = tmp_path / "s.gguf"
    args = ["synth", str(path), "--arch", "qwen3next", "--layers", "4", "--seed", "3", "--dense-type", "q8_0"]
    assert cli.main(args) == 0
    assert capsys.readouterr().out.strip() == str(path)
    assert cli.main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "architecture  qwen3next: 4 layers" in out and "Q8_0" in out
    assert cli.main(["synth", str(tmp_path / "m.gguf"), "--arch", "qwen3next", "--layers", "4", "--mtp"]) == 0
    with inspect(capsys.readouterr().out.strip()) as written:
        assert written.geometry.n_mtp == 1


def test_convert_from_the_command_line(tmp_path, capsys):
    pytest.importorskip("transformers")
    from support.hf_models import CONFIGS, hf_model

    model = hf_model("qwen4exp", *CONFIGS[0])
    model.save_pretrained(tmp_path / "hf")
    out = tmp_path / "c.gguf"
    assert cli.main(["convert", str(tmp_path / "hf"), str(out), "--outtype", "q8_0"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert cli.main(["info", str(out)]) == 0


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["synth", "x.gguf", "--experts-type", "q9_9"], "strata synth: type 'q9_9' is not a GGML type name"),
        (["convert", "no-such-dir", "x.gguf"], "strata convert: "),
        (["synth", "missing/x.gguf"], "strata synth: missing/x.gguf: the folder missing does not exist"),
        (["synth", "."], "strata synth: . is a directory; name the .gguf file to write"),
        (["info", "x.gguf"], "strata info: x.gguf: cannot read the file (No such file or directory)"),
    ],
)
def test_user_errors_are_one_line(tmp_path, monkeypatch, capsys, argv, fragment):
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(fragment) and err.count("\n") == 1, err
    assert not (tmp_path / "x.gguf").exists()


def test_bench_pool_quick_runs_and_writes_json(tmp_path, capsys):
    out = tmp_path / "pool.json"
    assert cli.main(["bench", "pool", "--quick", "-k", "2", "--isa", "avx2", "--json", str(out)]) == 0
    assert "GB/s" in capsys.readouterr().out
    assert out.stat().st_size > 0


def test_bench_pool_mix_limits_the_rows_to_the_headline_and_those_mixes(tmp_path, capsys):
    out = tmp_path / "pool.json"
    assert cli.main(["bench", "pool", "--quick", "-k", "2", "--isa", "avx2", "--mix", "Q4_K+Q6_K",
                     "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["layers"]
    assert {(r["shape"], r["mix"]) for r in rows} == {("qwen4exp", "Q4_K"), ("qwen4exp", "Q4_K+Q6_K"),
                                                      ("qwen3next", "Q4_K+Q6_K")}
    # qwen3next's 512-wide down rows hold whole Q6_K super-blocks; qwen4exp's 640 fall back as llama-quantize does
    assert {r["down_form"] for r in rows if r["mix"] == "Q4_K+Q6_K" and r["shape"] == "qwen3next"} == {"q6_k"}
    capsys.readouterr()
    assert cli.main(["bench", "pool", "--quick", "--mix", "Q9_K"]) != 0
    assert "unknown mix Q9_K" in capsys.readouterr().err


def test_bench_pool_hot_times_every_row_cache_resident_too(tmp_path, capsys):
    out = tmp_path / "pool.json"
    assert cli.main(["bench", "pool", "--quick", "-k", "2", "--isa", "avx2", "--mix", "Q4_K+Q4_0", "--hot",
                     "--json", str(out)]) == 0
    assert "hot GB/s" in capsys.readouterr().out
    rows = json.loads(out.read_text())["layers"]
    assert rows and all(r["hot_gb_per_s"] > 0 for r in rows)  # NaN fails too


def test_bench_pool_groups_quick_runs_and_writes_json(tmp_path, capsys):
    out = tmp_path / "groups.json"
    assert cli.main(["bench", "pool", "--groups", "--quick", "--isa", "avx2", "--json", str(out)]) == 0
    assert "RESULT pool_groups_q4k_q4_0_gbps=" in capsys.readouterr().out
    assert json.loads(out.read_text())["rows"] == 8 * 80


def test_bench_pool_jobs_quick_times_every_organisation_of_the_job(tmp_path, capsys):
    out = tmp_path / "jobs.json"
    assert cli.main(["bench", "pool", "--jobs", "--quick", "-k", "3", "--isa", "avx2", "--json", str(out)]) == 0
    assert "RESULT pool_jobs rows_us=" in capsys.readouterr().out
    jobs = json.loads(out.read_text())["jobs"]
    assert set(jobs) == {"rows", "rows_numpy_sum", "sum_caller_joins", "sum_caller_waits"}
    assert all(job["median_s"] > 0 and job["gb_per_s"] > 0 for job in jobs.values())  # NaN fails too


def test_run_streams_text_with_the_reference_engine(tmp_path, capsys):
    path = tmp_path / "r.gguf"
    assert cli.main(["synth", str(path), "--arch", "qwen35moe", "--layers", "4"]) == 0
    capsys.readouterr()
    assert cli.main(["run", str(path), "-p", "hello", "-n", "4", "--temperature", "0.7", "--seed", "1",
                     "--engine", "reference"]) == 0
    captured = capsys.readouterr()
    assert "tokens" in captured.err and "tok/s decode" in captured.err and "engine: reference" in captured.err


def test_run_with_bad_sampling_is_one_line(tmp_path, capsys):
    path = tmp_path / "r.gguf"
    assert cli.main(["synth", str(path), "--arch", "qwen35moe", "--layers", "4"]) == 0
    capsys.readouterr()
    assert cli.main(["run", str(path), "-p", "x", "--top-p", "0", "--engine", "reference"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("strata run: top_p must be in (0, 1]") and err.count("\n") == 1


def test_run_and_chat_default_to_the_gpu_engine_with_its_options():
    for command in (["run", "m.gguf", "-p", "x"], ["chat", "m.gguf"]):
        args = cli.parse_args(command)
        assert (args.engine, args.context, args.kv, args.mode) == ("gpu", None, "int8", "token_graph")
    args = cli.parse_args(["run", "m.gguf", "-p", "x", "--engine", "reference", "--context", "64", "--kv", "bf16",
                           "--mode", "uncaptured"])
    assert (args.engine, args.context, args.kv, args.mode) == ("reference", 64, "bf16", "uncaptured")
    for kv in ("bf16", "int8", "k8v4", "q4"):
        assert cli.parse_args(["chat", "m.gguf", "--kv", kv]).kv == kv
    for command in (["run", "m.gguf", "-p", "x"], ["chat", "m.gguf"], ["serve", "m.gguf"], ["bench"]):
        assert cli.parse_args(command).defer_experts == 0  # off unless asked: the exact path
        assert cli.parse_args([*command, "--defer-experts", "3"]).defer_experts == 3


@pytest.fixture
def no_gpu(monkeypatch):
    import importlib

    monkeypatch.setattr(importlib.import_module("strata.devices"), "device_count", lambda: 0)


@pytest.mark.parametrize("command", [["run", "m.gguf", "-p", "hi"], ["chat", "m.gguf"]])
def test_gpu_engine_without_a_gpu_is_one_line_suggesting_the_reference(no_gpu, capsys, command):
    assert cli.main(command) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"strata {command[0]}: no CUDA device found") and err.count("\n") == 1, err
    assert "--engine reference" in err


def test_bench_argument_shapes():
    args = cli.parse_args(["bench"])
    assert args.handler is cli.bench.handle and args.model is None and args.mode == "all" and args.json is None
    assert args.kv == "int8"
    args = cli.parse_args(["bench", "m.gguf", "--tokens", "5", "--prompt-tokens", "3", "--mode", "uncaptured",
                           "--context", "64", "--kv", "k8v4", "--json", "b.json"])
    assert (args.model, args.tokens, args.prompt_tokens, args.mode, args.context, args.kv, args.json) == (
        "m.gguf", 5, 3, "uncaptured", 64, "k8v4", "b.json")
    args = cli.parse_args(["bench", "pool", "--quick", "-k", "4", "--isa", "avx2"])
    assert args.handler is cli.bench_pool.handle and (args.quick, args.k, args.isa) == (True, 4, "avx2")
    with pytest.raises(SystemExit):
        cli.parse_args(["bench", "pool", "--tokens", "5"])  # a model-bench option is not a pool option
    with pytest.raises(SystemExit):
        cli.parse_args(["bench", "--mode", "fast"])


def test_bench_list_options_parse_or_name_the_option():
    from strata.cli.bench import cache_shares, prompt_lengths

    assert prompt_lengths("512,4096") == (512, 4096) and prompt_lengths("0") == () and prompt_lengths("8,0,2") == (8, 2)
    assert cache_shares("0,25,100") == [0.0, 0.25, 1.0] and cache_shares("12.5") == [0.125]
    with pytest.raises(InvalidArgument, match="--prompt-lengths takes token counts such as 512,4096, got '512,x'"):
        prompt_lengths("512,x")
    with pytest.raises(InvalidArgument, match="--cache-shares takes percentages such as 0,50,100, got '50%'"):
        cache_shares("50%")


def test_bench_refuses_a_wrong_list_option_before_synthesizing(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr("strata.cli.session.require_gpu", lambda hint: None)  # as on a GPU machine
    monkeypatch.setenv("STRATA_CACHE", str(tmp_path / "cache"))
    assert cli.main(["bench", "--prompt-lengths", "many"]) == 1
    assert "--prompt-lengths takes token counts" in capsys.readouterr().err and not (tmp_path / "cache").exists()


def test_bench_without_a_gpu_is_one_line_and_synthesizes_nothing(no_gpu, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("STRATA_CACHE", str(tmp_path / "cache"))
    assert cli.main(["bench"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("strata bench: no CUDA device found") and err.count("\n") == 1, err
    assert "strata bench pool" in err and not (tmp_path / "cache").exists()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "tiny.gguf"
    assert cli.main(["synth", str(path), "--arch", "qwen3next", "--layers", "4", "--seed", "5"]) == 0
    return path


def test_synth_tiny_writes_a_file_the_gpu_engine_runs_with_a_chat_template(tiny_model, capsys):
    capsys.readouterr()
    assert cli.main(["info", str(tiny_model)]) == 0
    out = capsys.readouterr().out
    assert "GPU engine    runs this file as it is" in out and "'<|im_end|>'" in out
    template = len(CHATML_TEMPLATE)
    assert f"chat template {template} characters" in out and "tokenizer     gpt2 BPE, 512 tokens" in out
    assert not list(tiny_model.parent.glob("*.partial-*"))  # written under a temporary name, then renamed


def test_info_says_why_the_gpu_engine_would_refuse_a_file(tmp_path, capsys):
    path = tmp_path / "f.gguf"
    assert cli.main(["synth", str(path), "--arch", "qwen3next", "--layers", "4", "--embeddings-type", "q4_0"]) == 0
    capsys.readouterr()
    assert cli.main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "GPU engine    cannot run this file as it is:" in out and "token_embd.weight is Q4_0" in out


def test_info_runs_float_routed_experts(tmp_path, capsys):
    path = tmp_path / "f.gguf"
    assert cli.main(["synth", str(path), "--arch", "qwen3next", "--layers", "4", "--experts-type", "f16",
                     "--expert-down-type", "bf16"]) == 0
    capsys.readouterr()
    assert cli.main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "GPU engine    runs this file as it is" in out and "BF16 x4" in out


def test_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: 128)" in out and "(default: int8)" in out and "(default: -1)" in out


def test_a_negative_seed_is_random_and_ignored_gpu_flags_are_named(tiny_model, capsys):
    args = ["run", str(tiny_model), "-p", "hello", "-n", "3", "--engine", "reference", "--temperature", "0.9",
            "--seed", "-1", "--kv", "bf16", "--mode", "uncaptured"]
    assert cli.main(args) == 0
    err = capsys.readouterr().err
    assert "strata run: --kv, --mode ignored: the reference engine has no use for it" in err
    assert cli.parse_args(args).seed == -1 and "seed" not in err


def test_the_context_is_checked_the_same_way_on_both_engines(tiny_model, capsys):
    for engine in ("reference", "gpu"):
        if engine == "gpu" and _native.device_count() == 0:
            continue
        assert cli.main(["run", str(tiny_model), "-p", "x", "--context", "5000", "--engine", engine]) == 1
        err = capsys.readouterr().err
        assert "context 5000 is outside 1..4096 (the model's context_length)" in err, (engine, err)


def test_expert_deferral_runs_on_the_reference_and_is_refused_past_the_routed_experts(tiny_model, capsys):
    assert cli.main(["run", str(tiny_model), "-p", "hello", "-n", "3", "--engine", "reference",
                     "--defer-experts", "1"]) == 0
    assert capsys.readouterr().out
    assert cli.main(["run", str(tiny_model), "-p", "x", "--engine", "reference", "--defer-experts", "2"]) == 1
    err = capsys.readouterr().err
    assert "--defer-experts must be in 0..1 (below the 2 routed experts of a token), got 2" in err, err


def test_a_closed_pipe_is_one_line(tiny_model, monkeypatch, capsys):
    import sys

    class ClosedPipe:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    code = cli.main(["run", str(tiny_model), "-p", "x", "-n", "2", "--engine", "reference"])
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert code == 1 and err.endswith("strata run: the output was closed before the end\n"), err


def test_chat_drops_the_oldest_turns_when_the_context_is_full_and_keeps_the_system_prompt():
    import io

    from strata.cli.chat import converse
    from strata.generation import Session
    from support.char_engine import CharCodec, ScriptedEngine, TurnCodec

    engine = ScriptedEngine([ord("a"), 0] * 10, context=60)
    out = io.StringIO()
    lines = ["first question\n", "second question\n", "third question\n", "x" * 80 + "\n", "/exit\n"]
    converse(Session(engine, TurnCodec()), lines, out, system="be brief", max_tokens=4)
    text = out.getvalue()
    assert text.startswith("(/exit or Ctrl-D leaves") and "(the context is full: the oldest" in text
    assert "does not fit the session's context of 60 tokens: /reset, or start strata chat with a larger --context" \
        in text
    prompts = [CharCodec().decode(ids) for ids in engine.fed if len(ids) > 1]
    assert all(p.startswith("<system>be brief") for p in prompts), prompts


def test_a_full_disk_is_one_line_and_leaves_no_file(tmp_path, monkeypatch, capsys):
    import errno
    import os

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", full)
    assert cli.main(["synth", str(tmp_path / "x.gguf"), "--layers", "2"]) == 1
    err = capsys.readouterr().err
    assert err == "strata synth: No space left on device\n", err
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_while_running_exits_130_at_a_token_boundary(tiny_model, monkeypatch, capsys):
    import os
    import signal

    from strata.reference.engine import ReferenceEngine

    feed = ReferenceEngine.feed

    def interrupted(self, ids, params, u, seen):
        token = feed(self, ids, params, u, seen)
        if self.position > 3:
            os.kill(os.getpid(), signal.SIGINT)  # as if the user pressed Ctrl-C mid-answer
        return token

    monkeypatch.setattr(ReferenceEngine, "feed", interrupted)
    assert cli.main(["run", str(tiny_model), "-p", "hi", "-n", "50", "--engine", "reference"]) == 130
    assert "ended by interrupted" in capsys.readouterr().err


def test_draft_flags_parse_on_every_command_that_makes_a_session(capsys):
    for command in (["run", "m.gguf", "-p", "x"], ["chat", "m.gguf"], ["serve", "m.gguf"], ["bench"]):
        args = cli.parse_args(command)
        assert (args.draft, args.draft_tokens) == (None, 4)  # off unless asked
        args = cli.parse_args([*command, "--draft", "lookup", "--draft-tokens", "6"])
        assert (args.draft, args.draft_tokens) == ("lookup", 6)
        assert cli.parse_args([*command, "--draft", "auto"]).draft == "auto"
        assert cli.parse_args([*command, "--draft", "mtp"]).draft == "mtp"
        with pytest.raises(SystemExit):
            cli.parse_args([*command, "--draft", "medusa"])
        assert "invalid choice: 'medusa'" in capsys.readouterr().err


def test_run_with_drafts_prints_the_same_answer_and_the_acceptance(tiny_model, capsys):
    prompt = ["-p", "ab ab ab ab ab ab", "-n", "10", "--engine", "reference", "--seed", "3"]
    assert cli.main(["run", str(tiny_model), *prompt]) == 0
    plain = capsys.readouterr()
    assert cli.main(["run", str(tiny_model), *prompt, "--draft", "lookup", "--draft-tokens", "3"]) == 0
    drafted = capsys.readouterr()
    assert drafted.out == plain.out and "drafts:" not in plain.err
    assert "; drafts: " in drafted.err and " accepted (" in drafted.err and "tokens per step]" in drafted.err
    assert cli.main(["run", str(tiny_model), "-p", "x", "--engine", "reference", "--draft", "auto",
                     "--draft-tokens", "9"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("strata run: --draft-tokens must be in 1..7, got 9") and err.count("\n") == 1, err


def test_run_with_mtp_drafts_on_the_reference_prints_the_plain_answer(tmp_path, capsys):
    path = tmp_path / "mtp.gguf"
    assert cli.main(["synth", str(path), "--arch", "qwen3next", "--layers", "4", "--mtp"]) == 0
    capsys.readouterr()
    prompt = ["-p", "ab ab ab ab", "-n", "8", "--engine", "reference", "--temperature", "0"]
    assert cli.main(["run", str(path), *prompt]) == 0
    plain = capsys.readouterr().out
    assert cli.main(["run", str(path), *prompt, "--draft", "mtp", "--draft-tokens", "2"]) == 0
    assert capsys.readouterr().out == plain
