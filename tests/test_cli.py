"""The `strata` command: doctor, argument handling, one-line errors."""

import subprocess
import sys

import pytest

from strata import _native, cli


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
    from malformed import build_tiny

    path = tmp_path / "tiny.gguf"
    build_tiny(path, rng)
    assert cli.main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "architecture  qwen4exp:" in out
    assert "routed experts (host RAM)" in out and "dense layers (VRAM)" in out


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


def test_convert_from_the_command_line(tmp_path, capsys):
    from test_convert import _model

    model = _model("qwen4exp")
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
    args = cli.parse_args(["bench", "m.gguf", "--tokens", "5", "--prompt-tokens", "3", "--mode", "uncaptured",
                           "--context", "64", "--json", "b.json"])
    assert (args.model, args.tokens, args.prompt_tokens, args.mode, args.context, args.json) == (
        "m.gguf", 5, 3, "uncaptured", 64, "b.json")
    args = cli.parse_args(["bench", "pool", "--quick", "-k", "4", "--isa", "avx2"])
    assert args.handler is cli.bench_pool.handle and (args.quick, args.k, args.isa) == (True, 4, "avx2")
    with pytest.raises(SystemExit):
        cli.parse_args(["bench", "pool", "--tokens", "5"])  # a model-bench option is not a pool option
    with pytest.raises(SystemExit):
        cli.parse_args(["bench", "--mode", "fast"])


def test_bench_without_a_gpu_is_one_line_and_synthesizes_nothing(no_gpu, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("STRATA_CACHE", str(tmp_path / "cache"))
    assert cli.main(["bench"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("strata bench: no CUDA device found") and err.count("\n") == 1, err
    assert "strata bench pool" in err and not (tmp_path / "cache").exists()
