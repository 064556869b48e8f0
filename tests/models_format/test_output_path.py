"""Where synth and convert write (strata.convert.output_path, through GGUFStream): a new name or, with
overwrite/--force, a regular file; never a symbolic link, FIFO or device; and no temporary file left behind when
SIGTERM or SIGHUP ends the write, as none is after Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from strata.cli import main
from strata.errors import InvalidArgument
from strata.format import inspect
from strata.synth import synthesize

# Writes a tiny model to argv[1] and sends itself the signal named in argv[2] once the first bytes are written.
SIGNALLED_SYNTH = """
import os, signal, sys
from strata.synth import synthesize
sent = []
def progress(done, total):
    if not sent:
        sent.append(True)
        os.kill(os.getpid(), getattr(signal, sys.argv[2]))
synthesize(sys.argv[1], "qwen3next", "tiny", progress=progress, threads=2)
"""


def _leftovers(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if ".partial-" in p.name)


def test_an_existing_file_is_replaced_only_when_asked(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"not a model")
    with pytest.raises(InvalidArgument, match="exists; pass --force"):
        synthesize(path, "qwen3next", "tiny")
    assert path.read_bytes() == b"not a model"
    synthesize(path, "qwen3next", "tiny", overwrite=True)
    with inspect(path) as m:
        assert m.arch == "qwen3next"
    assert _leftovers(tmp_path) == []


def test_a_name_in_a_missing_or_closed_folder_is_refused_in_its_own_words(tmp_path, capsys):
    """Not the system's words about the temporary file beside it (x.gguf.partial-PID)."""
    with pytest.raises(InvalidArgument, match=r"m\.gguf: the folder .*nowhere does not exist"):
        synthesize(tmp_path / "nowhere" / "m.gguf", "qwen3next", "tiny")
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(InvalidArgument, match=r"m\.gguf: .*file is not a folder"):
        synthesize(tmp_path / "file" / "m.gguf", "qwen3next", "tiny")
    assert main(["synth", str(tmp_path / "nowhere" / "m.gguf"), "--arch", "qwen3next"]) != 0
    err = capsys.readouterr().err
    assert "the folder" in err and ".partial-" not in err
    if os.geteuid() != 0:  # root may write anywhere
        closed = tmp_path / "closed"
        closed.mkdir(mode=0o500)
        with pytest.raises(InvalidArgument, match="may not write in"):
            synthesize(closed / "m.gguf", "qwen3next", "tiny")


@pytest.mark.parametrize("kind", ["symlink", "dangling symlink", "fifo", "directory"])
def test_what_is_not_a_regular_file_is_refused_and_left_as_it_was(tmp_path, kind):
    target, path = tmp_path / "target.gguf", tmp_path / "m.gguf"
    target.write_bytes(b"kept")
    if kind == "symlink":
        path.symlink_to(target)
    elif kind == "dangling symlink":
        path.symlink_to(tmp_path / "nowhere.gguf")
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    words = {"symlink": "symbolic link", "dangling symlink": "symbolic link", "fifo": "not a regular file",
             "directory": "is a directory"}[kind]
    with pytest.raises(InvalidArgument, match=words):
        synthesize(path, "qwen3next", "tiny", overwrite=True)
    assert target.read_bytes() == b"kept" and not (tmp_path / "nowhere.gguf").exists()
    assert path.is_symlink() == ("symlink" in kind)
    assert _leftovers(tmp_path) == []


def test_a_device_is_refused_before_anything_is_written(capsys):
    assert main(["synth", os.devnull, "--arch", "qwen3next", "--force"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a regular file" in err


def test_the_cli_refuses_an_existing_file_without_force(tmp_path, capsys):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"x")
    assert main(["synth", str(path), "--arch", "qwen3next"]) == 1
    assert "exists; pass --force" in capsys.readouterr().err and path.read_bytes() == b"x"
    assert main(["synth", str(path), "--arch", "qwen3next", "--force"]) == 0
    assert path.stat().st_size > 1


@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_signal_during_the_write_leaves_no_file_behind(tmp_path, name):
    path = tmp_path / "m.gguf"
    done = subprocess.run([sys.executable, "-c", SIGNALLED_SYNTH, str(path), name], capture_output=True,
                          text=True, timeout=120)
    # ended by the signal itself, as it would have been without the write (Python ends so on a KeyboardInterrupt
    # nothing caught)
    assert done.returncode == -getattr(signal, name), done.stderr
    assert not path.exists() and _leftovers(tmp_path) == []


def test_an_ignored_sighup_stays_ignored(tmp_path):
    """Under nohup SIGHUP is ignored: the write goes on to the end."""
    path = tmp_path / "m.gguf"
    done = subprocess.run([sys.executable, "-c", SIGNALLED_SYNTH, str(path), "SIGHUP"], capture_output=True,
                          text=True, timeout=120, preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    assert done.returncode == 0, done.stderr
    with inspect(path) as m:
        assert m.arch == "qwen3next"
