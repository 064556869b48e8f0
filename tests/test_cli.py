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
        assert "self-test GPU 0: rms_norm vs numpy" in out and "OK" in out


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
