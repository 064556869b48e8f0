"""The command line as llama.cpp's users type it (-m, -c / --ctx-size, --temp, -f FILE, -p - for standard input),
its errors in its own words (flags, not the library's argument names), a modifying flag refused without the flag
it modifies, files read bounded and without blocking, and the smaller tools' defects of issue 48: the partial
files of killed writes cleaned on the next write to that name, a NaN control vector refused at load, progress on
`strata cvector`, a type synth cannot use replaced only with a line saying so, the real port of --port 0 (and
--alias, llama-server's name for --name)."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import gguf
import numpy as np
import pytest

from strata import cli
from strata.control_vectors import read_control_vector, write_control_vector
from strata.errors import FormatError

REFERENCE = ["--engine", "reference", "-n", "3", "--temp", "0"]


def test_llama_cpp_spellings_run_as_strata_s(tiny_model, tmp_path, monkeypatch, capsys):
    path = str(tiny_model("qwen3next", seed=5))
    assert cli.main(["run", path, "-p", "hello", *REFERENCE]) == 0
    plain = capsys.readouterr().out
    (tmp_path / "prompt.txt").write_text("hello")
    assert cli.main(["run", "-m", path, "-f", str(tmp_path / "prompt.txt"), "-c", "64", *REFERENCE]) == 0
    assert capsys.readouterr().out == plain
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello"))
    assert cli.main(["run", "-m", path, "-p", "-", "--ctx-size", "64", *REFERENCE]) == 0
    assert capsys.readouterr().out == plain
    assert cli.main(["run", "-p", "x", *REFERENCE]) == 1
    assert capsys.readouterr().err == "strata run: name the model file: strata run MODEL (or -m MODEL)\n"
    assert cli.main(["run", path, "-m", path, "-p", "hello", *REFERENCE]) == 0  # the same file twice: that one
    assert capsys.readouterr().out == plain
    assert cli.main(["run", path, "-m", "other.gguf", "-p", "x", *REFERENCE]) == 1  # not the last one silently
    assert capsys.readouterr().err == f"strata run: two model files named ({path} and -m other.gguf): give one\n"


@pytest.mark.parametrize("flags, said", [
    (["--draft-tokens", "3"], "strata run: --draft-tokens sets how many --draft drafts: give --draft too"),
    (["--draft", "lookup", "--draft-tokens", "9"], "strata run: --draft-tokens must be in 1..7, got 9"),
    (["--control-vector-layer-range", "1", "2"],
     "strata run: --control-vector-layer-range sets the layers a control vector steers: give --control-vector"),
    (["-f", "/dev/zero"], "strata run: -f /dev/zero: not a regular file"),
])
def test_errors_are_said_in_the_command_lines_words(tiny_model, capsys, flags, said):
    assert cli.main(["run", str(tiny_model("qwen3next", seed=5)), *(["-p", "x"] if "-f" not in flags else []),
                     *flags, "--engine", "reference"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(said) and err.count("\n") == 1, err
    assert not re.search(r"\b(draft_tokens|control_layers|overwrite=True)\b", err)


def test_an_existing_output_is_refused_in_the_command_lines_words(tmp_path, capsys):
    (tmp_path / "x.gguf").write_bytes(b"")
    assert cli.main(["synth", str(tmp_path / "x.gguf")]) == 1
    assert capsys.readouterr().err == f"strata synth: {tmp_path / 'x.gguf'} exists; pass --force to replace it\n"


def test_a_template_file_that_would_never_end_or_block_is_refused_at_once(tmp_path, capsys):
    fifo = tmp_path / "template.fifo"
    os.mkfifo(fifo)
    for source, said in ((str(fifo), "not a regular file"), ("/dev/zero", "not a regular file")):
        start = time.monotonic()
        assert cli.main(["chat", "m.gguf", "--engine", "reference", "--chat-template-file", source]) == 1
        assert said in capsys.readouterr().err and time.monotonic() - start < 5
    big = tmp_path / "big.jinja"
    big.write_bytes(b"{{ x }}" * (1 << 18))
    assert cli.main(["chat", "m.gguf", "--chat-template-file", str(big)]) == 1
    assert f"--chat-template-file {big}: over 1048576 bytes" in capsys.readouterr().err


def test_the_partial_file_of_a_killed_write_is_removed_by_the_next_write_to_its_name(tmp_path, capsys):
    out = tmp_path / "m.gguf"
    # a write SIGKILLed mid-way: its process is gone and its partial file stays
    killed = subprocess.Popen([sys.executable, "-c", "import os, sys, time; open(sys.argv[1] + '.partial-' + "
                               "str(os.getpid()), 'wb').write(b'half'); time.sleep(60)", str(out)])
    deadline = time.monotonic() + 30
    while not list(tmp_path.glob("m.gguf.partial-*")):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    killed.send_signal(signal.SIGKILL)
    killed.wait(30)
    running = tmp_path / f"m.gguf.partial-{os.getpid()}1"  # no such process (a pid with a digit added): removed
    other = tmp_path / "other.gguf.partial-1"  # another name's: left alone
    running.write_bytes(b"")
    other.write_bytes(b"")
    assert cli.main(["synth", str(out), "--arch", "qwen3next", "--layers", "4"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf", "other.gguf.partial-1"]


def test_a_control_vector_that_is_not_finite_is_refused_at_load(tmp_path):
    path = tmp_path / "nan.gguf"
    write_control_vector(path, {1: np.array([0.5, np.nan, 1.0, 2.0], np.float32)}, "qwen3next")
    with pytest.raises(FormatError, match=r"tensor direction.1 holds nan at index 1; a direction must be finite"):
        read_control_vector(path)


def test_cvector_says_its_engine_and_progress(tiny_model, tmp_path, capsys):
    """The engine, then a line after the first prompt, after any that ends a second past the last line, and after
    the last (on the GPU a prompt takes milliseconds: one line each would be noise)."""
    (tmp_path / "pos.txt").write_text("hello\nagain\n")
    (tmp_path / "neg.txt").write_text("world\nonce\n")
    assert cli.main(["cvector", str(tiny_model("qwen3next", seed=5)), "--positive", str(tmp_path / "pos.txt"),
                     "--negative", str(tmp_path / "neg.txt"), "-o", str(tmp_path / "v.gguf"), "--engine",
                     "reference"]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "strata cvector: engine reference"
    done = [int(re.fullmatch(r"strata cvector: (\d) of 4 prompts run \(\d+\.\d s\)", line)[1]) for line in lines[1:]]
    assert done[0] == 1 and done[-1] == 4 and done == sorted(set(done)), lines


def test_synth_says_which_type_it_used_instead_of_one_that_does_not_fit(tmp_path, capsys):
    out = tmp_path / "q.gguf"
    assert cli.main(["synth", str(out), "--arch", "qwen3next", "--layers", "4", "--expert-down-type", "Q2_K"]) == 0
    err = capsys.readouterr().err
    assert "strata synth: 4 expert-down tensor(s) of 64 columns cannot be Q2_K: written as Q4_0" in err
    down = {t.tensor_type for t in gguf.GGUFReader(out).tensors if t.name.endswith("ffn_down_exps.weight")}
    assert down == {gguf.GGMLQuantizationType.Q4_0}  # llama-quantize's fallback, not the larger Q8_0


def test_serve_on_port_0_says_the_port_it_took_and_alias_names_the_model(tiny_model):
    server = subprocess.Popen([sys.executable, "-m", "strata.cli", "serve", str(tiny_model("qwen3next", seed=5)),
                               "--engine", "reference", "--port", "0", "--context", "64", "--alias", "my-model"],
                              stderr=subprocess.PIPE, text=True)
    try:
        line = server.stderr.readline()
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)/v1", line).group(1))
        assert port != 0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30) as answer:
            assert answer.status == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30) as answer:
            assert [model["id"] for model in json.loads(answer.read())["data"]] == ["my-model"]
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            pass
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(30)
        server.stderr.close()
