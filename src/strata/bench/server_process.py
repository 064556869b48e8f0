"""The server a benchmark measures, in a child process: `strata serve` or llama-server on a model file, with the
routed experts placed alike (a share of them in VRAM), ready once its /health answers 200 and stopped (SIGINT,
then SIGKILL) when the block ends, however it ends. A server that exits, or is not ready in time, is a
StrataError naming its command and its last lines of output."""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import IO

from strata.errors import InvalidArgument, StrataError

HOST = "127.0.0.1"
STOP_SECONDS = 30.0  # for a server to exit after SIGINT before it is killed
POLL_SECONDS = 0.2
OUTPUT_LINES = 20  # of its output, in an error
# The native cache's figure for a layer (ExpertCache::bytes_for) exceeds its slots' canonical bytes by its
# expert -> slot map (an int per expert) and the alignment of its map and its up to 15 planes' stacks (256 bytes
# each): this much more per layer holds the slots asked for, and not an expert more where experts are larger than
# it (they are megabytes in a real model).
LAYER_SLACK_BYTES = 8192


def free_port(host: str = HOST) -> int:
    """A port free on `host` a moment ago, for a child server to listen on."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def expert_budget(per_expert: Sequence[int], n_expert: int, share: float) -> int:
    """Bytes of an expert cache (strata's --expert-cache) that hold `share` (0..1) of every layer's `n_expert`
    routed experts of `per_expert` bytes each (strata.runtime.expert_cache.expert_bytes; 0: no routed experts)."""
    if not 0.0 <= share <= 1.0:
        raise InvalidArgument(f"an expert share must be in 0..100 %, got {share * 100:g}")
    slots = round(share * n_expert)
    return sum(slots * b + 4 * n_expert + LAYER_SLACK_BYTES for b in per_expert if b) if slots else 0


def cpu_moe_layers(share: float, n_layer: int) -> int:
    """llama-server's --n-cpu-moe for `share` of the routed experts in VRAM: the layers whose experts stay on the
    CPU (llama.cpp places experts by layer, the first layers' on the CPU; strata by slots in every layer)."""
    if not 0.0 <= share <= 1.0:
        raise InvalidArgument(f"an expert share must be in 0..100 %, got {share * 100:g}")
    return math.ceil((1.0 - share) * n_layer - 1e-9)


def strata_serve_command(model: str, port: int, *, engine: str = "gpu", options: Sequence[str] = ()) -> list[str]:
    """`strata serve` on `model`, on HOST:port, with `options` (serve's own: --batch, --sessions, --expert-cache,
    ...) after the engine."""
    return [sys.executable, "-m", "strata.cli", "serve", str(model), "--host", HOST, "--port", str(port),
            "--engine", engine, *options]


def llama_server_command(binary: str, model: str, port: int, *, parallel: int, context: int,
                         cpu_moe: int) -> list[str]:
    """llama-server on `model`, on HOST:port: every layer on the GPU but the routed experts of the first `cpu_moe`
    layers, `parallel` slots of `context` tokens each (its -c is the slots' total)."""
    if parallel < 1 or context < 1 or cpu_moe < 0:
        raise InvalidArgument(f"llama-server: parallel and context must be >= 1 and cpu_moe >= 0, got {parallel}, "
                              f"{context} and {cpu_moe}")
    return [binary, "-m", str(model), "--host", HOST, "--port", str(port), "-ngl", "999", "--parallel",
            str(parallel), "-c", str(parallel * context), "--n-cpu-moe", str(cpu_moe)]


class ServerProcess:
    """A started server: its command, base URL, process, and its output so far (stdout and stderr, in a file)."""

    def __init__(self, command: list[str], port: int, process: subprocess.Popen, output: IO[bytes]):
        self.command, self.process, self._output = command, process, output
        self.url = f"http://{HOST}:{port}"

    def output_lines(self) -> list[str]:
        self._output.seek(0)
        return self._output.read().decode(errors="replace").splitlines()

    def failure(self, what: str) -> StrataError:
        """An error saying `what` of this server, with its command and its last lines of output."""
        tail = "\n".join(self.output_lines()[-OUTPUT_LINES:]) or "(no output)"
        return StrataError(f"{what}: {' '.join(self.command)}\nits last output:\n{tail}")


def _dies_with_parent() -> None:
    """In the child before exec: SIGTERM when the benchmark dies, even by SIGKILL (Linux's PR_SET_PDEATHSIG),
    so no server outlives it."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the context manager's stop still covers every exit but a kill


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as response:
            return response.status == 200
    except (OSError, urllib.error.HTTPError):
        return False  # not listening yet, or (llama-server) 503 while the model loads


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGINT)  # the Ctrl-C both servers stop cleanly on
    try:
        process.wait(STOP_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextmanager
def started(command: list[str], port: int, *, startup_seconds: float = 900.0,
            environ: dict[str, str] | None = None) -> Iterator[ServerProcess]:
    """Run `command` (a server listening on HOST:port) for the block, from when its /health answers 200; stop it
    at the end, also on an error or Ctrl-C in the block. StrataError (its command and last output) where it exits
    or is not ready within `startup_seconds`; FileNotFoundError names a binary that is not there."""
    with tempfile.TemporaryFile() as output:
        # a session of its own: a Ctrl-C at the terminal reaches the benchmark alone, which then stops the server
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                   env=environ if environ is not None else os.environ.copy(),
                                   start_new_session=True, preexec_fn=_dies_with_parent)
        server = ServerProcess(command, port, process, output)
        try:
            deadline = time.monotonic() + startup_seconds
            while not _healthy(server.url):
                if process.poll() is not None:
                    raise server.failure(f"the server exited with status {process.returncode} before it was ready")
                if time.monotonic() > deadline:
                    raise server.failure(f"the server was not ready within {startup_seconds:g} s")
                time.sleep(POLL_SECONDS)
            yield server
        finally:
            _stop(process)
