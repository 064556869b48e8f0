"""What structured output adds to a request (strata.generation.constraints, llguidance): on the CPU, the tokenizer's
one-time build, then per request the time to the first token a new JSON schema adds (compiling it against the
tokenizer, its first mask, a generation's copy of the parser), per generated token the mask and the advance, and
what a Session does around each token with and without a schema (over an engine that computes nothing);
with --decode, a loaded model's decode speed under a JSON schema against the same decode unconstrained.

    python3 benchmarks/bench_structured.py                      # the benchmark model's vocabulary (qwen4exp, bench)
    python3 benchmarks/bench_structured.py --vocab 151936 --fields 20 --schemas 30 --json out.json
    python3 benchmarks/bench_structured.py --decode [MODEL.gguf] [--expert-cache auto] [--engine gpu] [--fields 20]
        [--rounds 3] [--decode-tokens 1024] [--sync-masks] [--steps] [--json out.json]

The vocabulary is the synthetic byte-level one strata synth writes (the benchmark model's), of the geometry's size.
Each schema is new (its own field names, kinds and bounds), so nothing is reused from the one before. Prints RESULT
lines; --json PATH writes the figures. Without llguidance installed it says so in its RESULT line and exits 0.

--decode loads MODEL (without one, `strata bench`'s default benchmark model, synthesized once into the cache) and
decodes greedily from a fixed random prompt of 16 tokens, in alternating rounds: unconstrained, then under one
schema of --fields properties, and again. The schema's answer ends with EOS where the schema is complete (or at
--decode-tokens); the unconstrained answer decodes exactly as many tokens, past EOS, so both rates are over the
same positions. A rate is (tokens - 1) / the seconds from the first token to the last: the prompt and the schema's
compile (the first token's cost above) are outside it. Prints the medians over the rounds and whether each
constrained answer parses as JSON and validates against the schema; --json adds every round's figures. The GPU engine
computes each decode step's mask while the device runs the step (docs/structured.md, "Where it runs");
--sync-masks computes it before the step instead (GpuEngine.defer_masks off), to measure what that hides. --steps
then steps the engine itself, one token at a time with no Session, 200 greedy tokens a round: with no mask, with a
constant all-allowed mask, and under the schema (the host's advance and mask before each step, timed apart, the
mask given as words: the synchronous path): what a mask costs the device and the host."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

import strata
from strata.api import ENGINES
from strata.bench.decode import prompt_ids
from strata.bench.default_model import bench_model, cache_dir
from strata.convert import tokenizer_meta
from strata.format import Tokenizer
from strata.sampling import SamplingParams, TokenMask
from strata.synth import synthesize
from strata.synth.presets import geometry

PROMPT_TOKENS = 16
STEP_TOKENS = 200  # --steps: greedy steps a round
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


class InstantEngine:
    """An engine that computes nothing: it draws a random token (of those its draw's mask allows, filled into a
    buffer as the GPU engine fills its words), so a Session over it costs what the host does around each token."""

    token_masks = True  # its draws take SamplingParams.token_mask

    def __init__(self, vocab: int, context: int, seed: int):
        self.context, self.position, self.vocab = context, 0, vocab
        self.words = np.zeros((vocab + 31) // 32, np.int32)
        self.rng = np.random.default_rng(seed)

    def feed(self, ids, params, u, seen) -> int:
        self.position += len(ids)
        if params.token_mask is None:
            return int(self.rng.integers(self.vocab))
        params.token_mask.fill(self.words)
        word = int(self.rng.choice(np.flatnonzero(self.words)))
        bits = int(self.words[word]) & 0xFFFFFFFF
        return word * 32 + (bits & -bits).bit_length() - 1  # the lowest token the word allows

    def reset(self) -> None:
        self.position = 0


def session_costs(codec, schema: dict, seed: int) -> dict:
    """Microseconds a token of Session.generate over InstantEngine: unconstrained (600 tokens), and under `schema`
    (to its end), its first answer and a second one (what a client repeating the schema pays)."""
    from strata.generation import Session

    session = Session(InstantEngine(len(codec.tokens), 4096, seed), codec)

    def per_token(**options) -> float:
        session.reset()
        start, tokens = time.perf_counter(), 0
        for _ in session.generate([100, 200, 300], temperature=0.0, **options):
            tokens += 1
        return (time.perf_counter() - start) / tokens * 1e6

    return {"unconstrained_us": round(per_token(max_tokens=600, ignore_eos=True), 1),
            "schema_first_us": round(per_token(max_tokens=1024, json_schema=schema), 1),
            "schema_again_us": round(per_token(max_tokens=1024, json_schema=schema), 1)}


def cpu_costs(args: argparse.Namespace, constraints) -> None:
    """The tokenizer's build, a new schema's first token and a token's mask and advance, over a synthetic
    vocabulary (no model)."""
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
        "session": session_costs(codec, schema, args.seed),
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
    session = figures["session"]
    print(f"RESULT structured session: {session['unconstrained_us']} us a token unconstrained, "
          f"{session['schema_first_us']} us under a new {args.fields}-field schema, {session['schema_again_us']} us "
          f"under it again (Session.generate over an engine that computes nothing: its draw from the mask included)")


def model_geometry(model):
    """The loaded model's geometry, on either engine (a strata.Model's info, a ReferenceModel's file)."""
    return model.info.geometry if hasattr(model, "info") else model.file.geometry


def timed_answer(session, prompt: list[int], **options) -> tuple[list, float]:
    """A greedy answer to `prompt` from an empty session: its pieces and the seconds from its first token to its
    last, which leave out the prompt's feed and the schema's compile (both before the first token)."""
    session.reset()  # every answer decodes from the same start, over the same positions
    pieces, stamps = [], []
    for piece in session.generate(prompt, temperature=0.0, **options):
        stamps.append(time.perf_counter())
        pieces.append(piece)
    if len(pieces) < 2:
        raise SystemExit(f"bench_structured: an answer of {len(pieces)} token(s) has no decode rate")
    return pieces, stamps[-1] - stamps[0]


def rate(pieces: list, seconds: float) -> float:
    """Tokens per second of decode: the first token is the prompt's, so `seconds` spans the other len - 1."""
    return (len(pieces) - 1) / seconds


def validates(text: str, schema: dict) -> bool:
    """Whether `text` parses as JSON and the value validates against `schema`."""
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


def decode_rounds(session, prompt: list[int], schema: dict, rounds: int, cap: int) -> dict:
    """Alternating unconstrained and constrained answers, `rounds` of each, after one of each untimed: the first
    tells the constrained answer's length (greedy, so every round's is the same), and both warm what a first
    answer pays once (llguidance's tokenizer, the GPU's graphs and expert cache)."""
    constrained = {"max_tokens": cap, "json_schema": schema}
    warm, _ = timed_answer(session, prompt, **constrained)
    complete = session.stats.finish_reason == "eos"  # else --decode-tokens cut it before the schema's end
    unconstrained = {"max_tokens": len(warm), "ignore_eos": True}  # the same positions, past any EOS
    timed_answer(session, prompt, **unconstrained)
    per_round = []
    for _ in range(rounds):
        plain, plain_seconds = timed_answer(session, prompt, **unconstrained)
        held, held_seconds = timed_answer(session, prompt, **constrained)
        per_round.append({"unconstrained": {"tokens": len(plain), "tokens_per_second": rate(plain, plain_seconds)},
                          "schema": {"tokens": len(held), "tokens_per_second": rate(held, held_seconds)},
                          "valid": validates("".join(p.text for p in held), schema)})
    return {"tokens": len(warm), "complete": complete, "rounds": per_round}


def engine_steps(engine, codec, grammar, prompt: list[int], kind: str, tokens: int) -> tuple[float, float]:
    """Microseconds a token of `tokens` greedy steps of the engine itself (no Session) and of the host's grammar
    work in them: `kind` "none" (no mask), "constant" (an all-allowed mask given as words: the fill's copy, the
    staging and the device's reads) or "schema" (the constraint advanced and its mask computed before each step,
    started again where it ends)."""
    greedy = SamplingParams()
    allowed = TokenMask(np.full(grammar.words, -1, np.int32))
    engine.reset()
    seen = list(prompt)
    token = engine.feed(prompt, greedy, 0.0, seen)
    constraint, host = None, 0.0
    start = time.perf_counter()
    for _ in range(tokens):
        seen.append(token)
        params = greedy
        if kind == "constant":
            params = SamplingParams(token_mask=allowed)
        elif kind == "schema":
            begun = time.perf_counter()
            if constraint is None or token in codec.eos_ids or constraint.done:
                constraint = grammar.start()  # the first token was drawn unconstrained
            else:
                constraint.advance(token)
            words = np.zeros(grammar.words, np.int32)
            constraint.mask().fill(words)
            host += time.perf_counter() - begun
            params = SamplingParams(token_mask=TokenMask(words))
        token = engine.feed([token], params, 0.0, seen)
    return (time.perf_counter() - start) / tokens * 1e6, host / tokens * 1e6


def step_costs(session, codec, schema: dict, prompt: list[int], rounds: int) -> dict:
    """engine_steps' three kinds in alternating rounds (after one untimed round of each)."""
    from strata.generation import constraints

    grammar = constraints.compile_grammar(codec, "json_schema", schema, "json_schema")
    kinds = ("none", "constant", "schema")
    for kind in kinds:
        engine_steps(session.engine, codec, grammar, prompt, kind, STEP_TOKENS)
    got = {kind: [] for kind in kinds}
    for _ in range(rounds):
        for kind in kinds:
            us, host = engine_steps(session.engine, codec, grammar, prompt, kind, STEP_TOKENS)
            got[kind].append({"us_per_token": round(us, 1), "host_grammar_us": round(host, 1)})
    return got


def decode_costs(args: argparse.Namespace) -> None:
    """Decode speed under a JSON schema against unconstrained, on a loaded model."""
    path = args.decode or bench_model(cache_dir(), synthesize)
    cache = None if args.engine == "reference" else args.expert_cache  # the reference engine has no expert cache
    options = {} if cache is None else {"progress": False, "expert_cache": 0 if cache == "0" else cache}
    rng = np.random.default_rng(args.seed)
    schema = new_schema(args.fields, rng)
    with strata.load(path, engine=args.engine, **options) as model:
        prompt = prompt_ids(model_geometry(model), PROMPT_TOKENS, rng)
        with model.session(PROMPT_TOKENS + args.decode_tokens + 1) as session:
            if args.sync_masks:
                session.engine.defer_masks = False
            got = decode_rounds(session, prompt, schema, args.rounds, args.decode_tokens)
            steps = step_costs(session, model.tokenizer, schema, prompt, args.rounds) if args.steps else None
            deferred = list(getattr(session.engine, "deferred_mask_seconds", ()))
    plain = statistics.median(r["unconstrained"]["tokens_per_second"] for r in got["rounds"])
    held = statistics.median(r["schema"]["tokens_per_second"] for r in got["rounds"])
    valid = sum(r["valid"] for r in got["rounds"])
    masks = "synchronous" if args.sync_masks or args.engine == "reference" else "deferred"
    figures = {"model": str(path), "engine": args.engine, "expert_cache": cache, "fields": args.fields, "masks": masks,
               "unconstrained_tokens_per_second_median": round(plain, 2),
               "schema_tokens_per_second_median": round(held, 2), "ratio": round(held / plain, 4), "valid": valid,
               "engine_steps": steps, **got}
    if args.json:
        Path(args.json).write_text(json.dumps(figures))
    where = "engine=reference" if cache is None else f"cache={cache}"
    cut = "" if got["complete"] else f", cut at --decode-tokens {args.decode_tokens} before the schema's end"
    print(f"RESULT structured decode: unconstrained {plain:.1f} tok/s, schema {held:.1f} tok/s "
          f"({100 * held / plain:.1f} %), {got['tokens']} tokens, {args.rounds} rounds, valid {valid}/{args.rounds}, "
          f"{args.fields} fields, {where}, masks {masks}{cut}")
    if deferred:  # whether each mask came while the device ran the step, or the sampler waited for it
        start, published, end = (statistics.median(t[i] for t in deferred) * 1e6 for i in range(3))
        print(f"RESULT structured deferred masks: from the step's start, the worker starts at {start:.0f} us, "
              f"publishes at {published:.0f} us, the step ends at {end:.0f} us (medians of {len(deferred)})")
    for kind, runs in (steps or {}).items():
        print(f"RESULT structured steps {kind}: " + ", ".join(
            f"{r['us_per_token']} us/token (host grammar {r['host_grammar_us']} us)" for r in runs) + f", {where}")


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
    ap.add_argument("--decode", nargs="?", const="", default=None, metavar="MODEL",
                    help="measure decode on MODEL (without one, the default benchmark model) instead")
    ap.add_argument("--engine", choices=ENGINES, default="gpu", help="--decode's engine (strata.load's default)")
    ap.add_argument("--expert-cache", default="auto", help="--decode's expert cache budget (0, auto, 24G, ...)")
    ap.add_argument("--rounds", type=int, default=3, help="--decode's rounds of each")
    ap.add_argument("--decode-tokens", type=int, default=1024,
                    help="--decode's cap on the constrained answer (a 20-field schema's is some 550 tokens)")
    ap.add_argument("--sync-masks", action="store_true",
                    help="--decode on the GPU engine: compute each step's mask before the step, not while it runs")
    ap.add_argument("--steps", action="store_true",
                    help="with --decode, also step the engine itself: no mask, a constant mask, the schema's")
    args = ap.parse_args()
    if args.sync_masks and args.engine != "gpu":
        ap.error("--sync-masks is the GPU engine's (the reference engine computes every mask before its step)")
    try:
        from strata.generation import constraints
        import llguidance  # noqa: F401
    except ImportError:
        print("RESULT structured: skipped (llguidance is not installed: pip install 'strata-moe[structured]')")
        return
    if args.decode is None:
        cpu_costs(args, constraints)
    else:
        decode_costs(args)


if __name__ == "__main__":
    main()
