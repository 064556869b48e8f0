"""What structured output adds to a request on the CPU (strata.generation.constraints, llguidance): the tokenizer's
one-time build, then per request the time to the first token a new JSON schema adds (compiling it against the
tokenizer, its first mask, a generation's copy of the parser), and per generated token the mask and the advance.

    python3 benchmarks/bench_structured.py                      # the benchmark model's vocabulary (qwen4exp, bench)
    python3 benchmarks/bench_structured.py --vocab 151936 --fields 20 --schemas 30 --json out.json

The vocabulary is the synthetic byte-level one strata synth writes (the benchmark model's), of the geometry's size.
Each schema is new (its own field names, kinds and bounds), so nothing is reused from the one before. Prints RESULT
lines; --json PATH writes the figures. Without llguidance installed it says so in its RESULT line and exits 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from strata.convert import tokenizer_meta
from strata.format import Tokenizer
from strata.synth.presets import geometry

KINDS = ("string", "integer", "number", "boolean", "enum", "array", "object", "pattern", "nullable")


def field_schema(kind: str, rng: np.random.Generator) -> dict:
    """One field of a kind, its bounds drawn from `rng` (a schema like the ones programs send: bounded strings,
    ranges, enums, small arrays and objects)."""
    if kind == "string":
        return {"type": "string", "maxLength": int(rng.integers(4, 40))}
    if kind == "integer":
        low = int(rng.integers(-1000, 1000))
        return {"type": "integer", "minimum": low, "maximum": low + int(rng.integers(1, 10_000))}
    if kind == "number":
        return {"type": "number", "minimum": 0, "maximum": float(rng.integers(1, 1000))}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "enum":
        return {"enum": [f"v{int(rng.integers(1 << 30))}" for _ in range(int(rng.integers(2, 8)))]}
    if kind == "array":
        return {"type": "array", "maxItems": int(rng.integers(1, 6)), "items": {"type": "string", "maxLength": 12}}
    if kind == "object":
        return {"type": "object", "additionalProperties": False, "required": ["x", "y"],
                "properties": {"x": {"type": "integer"}, "y": {"type": "string", "maxLength": 8}}}
    if kind == "pattern":
        return {"type": "string", "pattern": f"^[A-Z]{{{int(rng.integers(1, 4))}}}-[0-9]{{{int(rng.integers(2, 6))}}}$"}
    return {"anyOf": [{"type": "string", "maxLength": 10}, {"type": "null"}]}


def new_schema(fields: int, rng: np.random.Generator) -> dict:
    """A schema of `fields` properties, every one required, with names no other schema of the run has."""
    stem = f"f{int(rng.integers(1 << 40)):x}"
    properties = {f"{stem}_{i}": field_schema(KINDS[int(rng.integers(len(KINDS)))], rng) for i in range(fields)}
    return {"type": "object", "additionalProperties": False, "required": list(properties), "properties": properties}


def walk(constraint, words: int, vocab: int, eos: set[int], rng: np.random.Generator, limit: int) -> list[float]:
    """Seconds per token of mask + advance along one answer: each step's mask computed into a buffer (as an engine
    fills its own), then a token it allows (not EOS while another is allowed) drawn at random and taken."""
    out = np.zeros(words, np.int32)
    seconds = []
    for _ in range(limit):
        start = time.perf_counter()
        constraint.mask().fill(out)
        spent = time.perf_counter() - start
        allowed = np.flatnonzero(np.unpackbits(out.view(np.uint8), bitorder="little")[:vocab])
        choices = [int(t) for t in allowed if int(t) not in eos]
        if not choices:
            break
        token = int(rng.choice(choices))
        start = time.perf_counter()
        constraint.advance(token)
        seconds.append(spent + time.perf_counter() - start)
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="qwen4exp", help="the geometry whose vocabulary size is used")
    ap.add_argument("--preset", default="bench")
    ap.add_argument("--vocab", type=int, default=None, help="the vocabulary's size (default: the geometry's)")
    ap.add_argument("--fields", type=int, default=20, help="properties per schema")
    ap.add_argument("--schemas", type=int, default=20, help="new schemas compiled, one after the other")
    ap.add_argument("--tokens", type=int, default=300, help="the most tokens walked per schema")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON to PATH")
    args = ap.parse_args()
    try:
        from strata.generation import constraints
        import llguidance  # noqa: F401
    except ImportError:
        print("RESULT structured: skipped (llguidance is not installed: pip install 'strata-moe[structured]')")
        return
    vocab = args.vocab or geometry(args.arch, args.preset).n_vocab
    codec = Tokenizer({key: value for key, value, _ in tokenizer_meta.byte_level(vocab, chat=True)})
    start = time.perf_counter()
    constraints.warm(codec)
    tokenizer_seconds = time.perf_counter() - start
    rng = np.random.default_rng(args.seed)
    compile_ms, start_ms, token_us, answer_tokens = [], [], [], []
    for _ in range(args.schemas):
        schema = new_schema(args.fields, rng)
        start = time.perf_counter()
        grammar = constraints.compile_grammar(codec, "json_schema", schema, "json_schema")
        compiled = time.perf_counter()
        constraint = grammar.start()
        first = constraint.mask()
        first.fill(np.zeros(grammar.words, np.int32))
        started = time.perf_counter()
        compile_ms.append((compiled - start) * 1e3)
        start_ms.append((started - compiled) * 1e3)
        seconds = walk(constraint, grammar.words, vocab, set(codec.eos_ids), rng, args.tokens)
        token_us += [s * 1e6 for s in seconds]
        answer_tokens.append(len(seconds))
    added = [c + s for c, s in zip(compile_ms, start_ms)]
    figures = {
        "vocab": vocab, "fields": args.fields, "schemas": args.schemas,
        "tokenizer_seconds": round(tokenizer_seconds, 3),
        "first_token_added_ms": {"median": round(statistics.median(added), 2),
                                 "p90": round(float(np.percentile(added, 90)), 2), "max": round(max(added), 2)},
        "compile_ms_median": round(statistics.median(compile_ms), 2),
        "start_ms_median": round(statistics.median(start_ms), 3),
        "per_token_us": {"median": round(statistics.median(token_us), 1),
                         "p90": round(float(np.percentile(token_us, 90)), 1),
                         "p99": round(float(np.percentile(token_us, 99)), 1)},
        "answer_tokens_median": statistics.median(answer_tokens),
    }
    if args.json:
        Path(args.json).write_text(json.dumps(figures))
    print(f"RESULT structured tokenizer: {tokenizer_seconds:.2f} s once per model ({vocab} tokens)")
    print(f"RESULT structured first token: +{figures['first_token_added_ms']['median']} ms median, "
          f"+{figures['first_token_added_ms']['p90']} ms p90 for a new {args.fields}-field schema "
          f"(compile {figures['compile_ms_median']} ms, start {figures['start_ms_median']} ms; "
          f"{args.schemas} schemas)")
    print(f"RESULT structured per token: {figures['per_token_us']['median']} us median, "
          f"{figures['per_token_us']['p90']} us p90, {figures['per_token_us']['p99']} us p99 (mask + advance, "
          f"{sum(answer_tokens)} tokens)")


if __name__ == "__main__":
    main()
