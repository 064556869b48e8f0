"""`strata serve` under concurrent clients: aggregate and per-stream tok/s, time to first token and time between
tokens at 1, 2, 4, 8, 16 and 32 clients, with the routed experts on the CPU, half in VRAM and all in VRAM;
llama-server beside it on the same file where one is given.

    python3 benchmarks/bench_server.py [--model FILE | --url URL] [--clients 1,2,4,8,16,32] [--requests 2]
        [--prompt-tokens 64] [--max-tokens 64] [--expert-cache 0%,50%,100%] [--batch B] [--sessions S]
        [--llama-server PATH] [--parallel 8] [--json PATH]
    python3 benchmarks/bench_server.py --engine scripted [--costs-ms 2.5,1.9,0.88,0.1] [--batch B] ...

Without --url it starts `strata serve` on the file (without --model: the default benchmark model, synthesized
once into the cache) once per --expert-cache placement, waits for /health, measures, and stops it, also on
Ctrl-C or an error; with --llama-server, llama-server on the same file with --parallel N and the same share of
the experts in VRAM, after each. With --url it measures the server already running there (strata or
llama-server; its vocabulary from --model or --vocab). Each client sends --requests streamed greedy completions
of --prompt-tokens token ids (every request its own prompt, from --seed) one after another
(strata.bench.server). ignore_eos is asked for; strata takes it. Where sessions step together, the table has what
the server's /metrics counted over each level: rows per decode batch, and the shares of the level's time its
compute thread was busy and gathering (waiting, a step in, for the rest of a batch).

With --engine scripted no GPU is needed: the bench serves, in a child process, the server over sessions whose
engine sleeps stated times (strata.bench.server_scripted: --costs-ms, a lone step, a batch's base and its cost per
row, a prompt token; by default the GPU box's step of several rows with every expert in VRAM) and the tokenizer of
--model (by default a tiny model synthesized in a temporary folder): what the server, the batcher and the streams
add between steps, measured on any machine.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import threading
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from strata.bench.default_model import bench_model, cache_dir
from strata.bench.records import write_json
from strata.bench.server import run
from strata.bench.server_process import (
    HOST, cpu_moe_layers, expert_budget, free_port, llama_server_command, started, strata_serve_command,
)
from strata.bench.server_scripted import StepCosts, TimedEngine
from strata.errors import InvalidArgument
from strata.format import inspect
from strata.runtime.expert_cache import expert_bytes
from strata.runtime.plan import file_tensors
from strata.synth import synthesize

PASSED_TO_SERVE = ("batch", "sessions", "queue", "decode_stall", "kv", "mode", "cache_policy", "vram_limit")


def costs_ms(text: str) -> StepCosts:
    try:
        values = [float(x) / 1e3 for x in text.split(",")]
        return StepCosts(*values)
    except (ValueError, TypeError):
        raise InvalidArgument(f"--costs-ms takes up to four milliseconds (a lone step, a batch's base, a row, a "
                              f"prompt token), got {text!r}") from None


def counts(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError:
        raise InvalidArgument(f"--clients takes counts such as 1,2,4, got {text!r}") from None


def share(placement: str) -> float | None:
    """A placement's share of the experts in VRAM (0..1) where it is a percentage (or 0); None for a size or auto,
    which strata takes as they are and llama-server cannot mirror."""
    if placement.endswith("%"):
        try:
            return float(placement[:-1]) / 100
        except ValueError:
            raise InvalidArgument(f"--expert-cache: {placement!r} is not a percentage") from None
    return 0.0 if placement == "0" else None


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--url", help="a server already running (http://HOST:PORT[/v1]): measured as it is")
    parser.add_argument("--model", help="the .gguf file to serve (with --url: the one served, for its vocabulary)")
    parser.add_argument("--vocab", type=int, help="with --url and no --model: prompt ids are drawn below this")
    parser.add_argument("--clients", type=counts, default=[1, 2, 4, 8, 16, 32], help="concurrency levels, in turn")
    parser.add_argument("--requests", type=int, default=2, help="per client, one after another")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0, help="the prompts' seed")
    parser.add_argument("--engine", choices=["gpu", "reference", "scripted"], default="gpu",
                        help="strata serve's engine (reference: a tiny model without a GPU; scripted: an engine "
                             "sleeping --costs-ms, over --model's tokenizer; neither has placements)")
    parser.add_argument("--costs-ms", type=costs_ms, default=StepCosts(),
                        help="the scripted engine's milliseconds: a lone step, a batch's base, its cost per row, a "
                             "prompt token (default: 2.5,1.9,0.88,0.1, the GPU box with every expert in VRAM)")
    parser.add_argument("--serve-scripted", type=int, metavar="PORT", help=argparse.SUPPRESS)  # the child
    parser.add_argument("--expert-cache", default="0%,50%,100%",
                        help="placements, each a server run: a share of every layer's routed experts in VRAM "
                             "(llama-server gets the same share of layers), or strata's own auto or size")
    parser.add_argument("--context", type=int, help="serve's --context (default: prompt + max tokens + 8)")
    for name in PASSED_TO_SERVE:
        parser.add_argument("--" + name.replace("_", "-"), help="passed to strata serve as it is")
    target.add_argument("--llama-server", metavar="PATH", help="also run llama-server (a binary) on the same file")
    parser.add_argument("--parallel", type=int, default=8, help="llama-server's --parallel")
    parser.add_argument("--startup-timeout", type=float, default=900.0, help="seconds for a server to load")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    if args.engine == "scripted" and args.llama_server:
        parser.error("--llama-server has no match for --engine scripted")
    if args.url and args.model is None and args.vocab is None:
        parser.error("--url needs --model (the file served) or --vocab for its prompts' token ids")
    return args


def serve_options(args: argparse.Namespace, context: int, cache: str | None) -> list[str]:
    options = ["--context", str(context), "--queue", args.queue or str(max(args.clients))]
    for name in PASSED_TO_SERVE:
        if getattr(args, name) is not None and name != "queue":
            options += ["--" + name.replace("_", "-"), getattr(args, name)]
    return options + ([] if cache is None else ["--expert-cache", cache])


def measure(label: str, command: list[str] | None, url: str, args: argparse.Namespace, vocab: int,
            exclude: set[int]) -> dict[str, Any]:
    print(f"bench_server: {label}", file=sys.stderr, flush=True)
    result = run(url, args.clients, args.requests, args.prompt_tokens, args.max_tokens, vocab, seed=args.seed,
                 exclude=exclude, emit=lambda line: print(line, flush=True))
    return {"server": label, "command": command, **result}


def served(label: str, command: list[str], port: int, args: argparse.Namespace, vocab: int,
           exclude: set[int]) -> dict[str, Any]:
    """`command` started, measured, stopped; the lines it said about its experts' placement kept."""
    with started(command, port, startup_seconds=args.startup_timeout) as server:
        result = measure(label, command, server.url, args, vocab, exclude)
        result["placement"] = [line for line in server.output_lines() if "expert cache:" in line]
    return result


def scripted_command(args: argparse.Namespace, path: str, port: int, context: int) -> list[str]:
    """This script as the child that serves the scripted engine on HOST:port."""
    costs = args.costs_ms
    command = [sys.executable, str(Path(__file__).resolve()), "--serve-scripted", str(port), "--model", path,
               "--context", str(context), "--queue", args.queue or str(max(args.clients)),
               "--costs-ms", ",".join(f"{x * 1e3:g}" for x in (costs.lone, costs.batch, costs.row, costs.prompt_token))]
    for name in ("batch", "sessions", "decode_stall"):
        if getattr(args, name) is not None:
            command += ["--" + name.replace("_", "-"), getattr(args, name)]
    return command


def serve_scripted(args: argparse.Namespace) -> int:
    """The child: the server over sessions of the scripted engine, on HOST:--serve-scripted, until SIGINT or
    SIGTERM."""
    from strata.generation import Session
    from strata.server import Server
    from strata.server.background import serving

    with inspect(args.model) as file:
        codec = file.tokenizer()
    batch, sessions = int(args.batch or 1), int(args.sessions or 1)
    made = [Session(TimedEngine(len(codec.tokens), args.context, args.costs_ms, codec.eos_ids), codec)
            for _ in range(max(batch, sessions))]
    server = Server(made, "scripted", max_waiting=int(args.queue or 16), batch=min(batch, len(made)),
                    decode_stall_seconds=float(args.decode_stall or 0) / 1000)
    stop = threading.Event()
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda *_: stop.set())
    try:
        with serving(server, HOST, args.serve_scripted) as url:
            print(f"bench_server: the scripted engine ({args.costs_ms}) at {url}, {len(made)} session(s), batch "
                  f"{batch}", flush=True)
            stop.wait()
    finally:
        server.close()
    return 0


def runs(args: argparse.Namespace, out: list[dict[str, Any]]) -> None:
    """Each server's result appended to `out` as it is measured (so an error later keeps what was measured)."""
    if args.engine == "scripted" and not args.url:
        with tempfile.TemporaryDirectory() as folder:
            path = args.model or str(synthesize(Path(folder) / "tokenizer.gguf", "qwen3next"))
            with inspect(path) as file:
                vocab = file.geometry.n_vocab
            context = args.context or args.prompt_tokens + args.max_tokens + 8
            port = free_port()
            out.append(served(f"strata serve (scripted engine: {args.costs_ms})",
                              scripted_command(args, path, port, context), port, args, vocab, set()))
        return
    path = args.model or (None if args.url else str(bench_model(cache_dir(), synthesize)))
    per_expert, g = [], None
    if path is not None:
        with inspect(path) as file:
            g, per_expert = file.geometry, expert_bytes(file.geometry, file_tensors(file))
    vocab = g.n_vocab if g is not None else args.vocab
    exclude = {g.ple_eos} if g is not None and g.ple_layers else set()  # an EOS in the prompt cuts the PLE n-grams
    if args.url:
        out.append(measure(f"the server at {args.url}", None, args.url, args, vocab, exclude))
        return
    context = args.context or args.prompt_tokens + args.max_tokens + 8
    if args.engine == "gpu":  # each placement's budget before any server starts: a bad one is said at once
        placements = []
        for placement in args.expert_cache.split(","):
            fraction = share(placement)
            budget = placement if fraction is None else str(expert_budget(per_expert, g.n_expert, fraction))
            placements.append((placement, fraction, budget))
    else:
        placements = [(None, None, None)]
    llama = args.llama_server and shutil.which(args.llama_server)
    if args.llama_server and not llama:
        print(f"bench_server: no llama-server at {args.llama_server}: llama-server skipped", flush=True)
    for placement, fraction, budget in placements:
        port = free_port()
        command = strata_serve_command(path, port, engine=args.engine, options=serve_options(args, context, budget))
        label = f"strata serve, experts in VRAM: {placement}" if placement else "strata serve (reference engine)"
        out.append(served(label, command, port, args, vocab, exclude))
        if llama and fraction is not None:
            port = free_port()
            command = llama_server_command(llama, path, port, parallel=args.parallel, context=context,
                                           cpu_moe=cpu_moe_layers(fraction, g.n_layer))
            out.append(served(f"llama-server --parallel {args.parallel}, experts in VRAM: {placement}", command,
                              port, args, vocab, exclude))
        elif llama:
            what = f"--expert-cache {placement}" if placement else "the reference engine"
            print(f"bench_server: llama-server has no match for {what}: skipped", flush=True)


def figure(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def table(results: list[dict[str, Any]]) -> list[str]:
    lines = []
    for result in results:
        lines.append(f"{result['server']}: {result['prompt_tokens']} prompt tokens, {result['max_tokens']} asked, "
                     f"{result['requests_per_client']} requests per client, ignore_eos "
                     f"{'taken' if result['ignore_eos'] else 'refused (tokens up to EOS)'}")
        if result["command"]:
            lines.append("  command: " + " ".join(result["command"]))
        lines += [f"  {line.strip()}" for line in result.get("placement", [])]
        lines.append(f"  {'clients':>7} {'requests':>8} {'errors':>6} {'tokens':>7} {'short':>5} {'tok/s':>8} "
                     f"{'stream tok/s':>12} {'TTFT p50 ms':>11} {'TTFT p90 ms':>11} {'ITL p50 ms':>10} "
                     f"{'ITL p90 ms':>10} {'rows/batch':>10} {'busy %':>6} {'gather %':>8}")
        for level in result["levels"]:
            batching = level.get("server") or {}
            lines.append(f"  {level['clients']:>7} {level['requests']:>8} {level['errors']:>6} {level['tokens']:>7} "
                         f"{level['short']:>5} {figure(level['aggregate_tokens_per_second']):>8} "
                         f"{figure(level['stream_tokens_per_second']):>12} {figure(level['ttft_p50'], 1e3, 0):>11} "
                         f"{figure(level['ttft_p90'], 1e3, 0):>11} {figure(level.get('itl_p50'), 1e3, 2):>10} "
                         f"{figure(level.get('itl_p90'), 1e3, 2):>10} "
                         f"{figure(batching.get('rows_per_batch'), 1, 2):>10} "
                         f"{figure(batching.get('busy_share'), 100, 0):>6} "
                         f"{figure(batching.get('gathering_share'), 100, 1):>8}")
        levels = result["levels"]
        lines.append(f"RESULT {result['server']}: clients " + "/".join(str(x["clients"]) for x in levels) +
                     ": aggregate " + "/".join(figure(x["aggregate_tokens_per_second"]) for x in levels) +
                     " tok/s, per stream " + "/".join(figure(x["stream_tokens_per_second"]) for x in levels) +
                     " tok/s, TTFT p50 " + "/".join(figure(x["ttft_p50"], 1e3, 0) for x in levels) +
                     " ms, TTFT p90 " + "/".join(figure(x["ttft_p90"], 1e3, 0) for x in levels) +
                     " ms, ITL p90 " + "/".join(figure(x.get("itl_p90"), 1e3, 1) for x in levels) +
                     " ms, errors " + str(sum(x["errors"] for x in levels)))
    return lines


def main() -> int:
    args = parse()
    if args.serve_scripted is not None:
        return serve_scripted(args)
    # a SIGTERM unwinds as Ctrl-C does, through the blocks that stop the servers
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(128 + number))
    results: list[dict[str, Any]] = []
    try:
        runs(args, results)
    finally:
        print("\n".join(table(results)), flush=True)
        if args.json:
            write_json(args.json, {"arguments": {k: asdict(v) if is_dataclass(v) else v for k, v in vars(args).items()},
                                   "runs": results})
    return 1 if any(level["errors"] for result in results for level in result["levels"]) else 0


if __name__ == "__main__":
    sys.exit(main())
