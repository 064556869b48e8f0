"""Concurrent streaming clients against an OpenAI-compatible server (`strata serve`, llama-server, any other):
C clients, each a thread of this process sending R requests to /v1/completions back to back (token-id prompts,
greedy, streamed), at each concurrency level in turn; per request the time to its first token, its tokens, its
decode seconds and the gaps between its token events; per level the aggregate and per-stream tok/s, the time to
first token's p50 and p90, the time between tokens' p50 and p90, the requests and the errors, and where the server
is strata's with sessions stepping together, what its /metrics counted over the level (rows per decode batch, the
compute thread's busy and gathering shares of the level's time). HTTP is the standard library's (http.client), so
no dependency comes with it.

`ignore_eos` is asked for when the server takes it (llama-server and vLLM do); a server that refuses the field by
name (strata serve does: it refuses unknown fields) is asked without it, and the records then count the tokens
actually generated, which an EOS may cut short of max_tokens (`short` says how many requests were)."""

from __future__ import annotations

import http.client
import json
import statistics
import threading
import time
import urllib.parse
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from strata.bench.records import Emit
from strata.errors import InvalidArgument, StrataError

REQUEST_TIMEOUT_SECONDS = 600.0  # one request, queue wait included: a loaded batch-1 server answers late
ERRORS_KEPT = 3  # error messages a level's record keeps (the count covers all)


@dataclass(frozen=True)
class Answer:
    """One request as its client saw it; seconds are counted from the moment the request was sent."""

    client: int
    request: int                    # its number in the run: its prompt is prompts(...)[request] (0: the warm-up)
    prompt_tokens: int              # the prompt's length as sent
    ttft: float | None              # seconds to the first token (None: none came)
    seconds: float                  # to the end of the answer (or the error)
    tokens: int                     # generated: the server's usage count, else the token events received
    decode_seconds: float           # from the first token to the last
    error: str | None = None
    gaps: tuple[float, ...] = ()    # seconds between consecutive token events, as received

    @property
    def stream_tokens_per_second(self) -> float | None:
        """Tokens after the first over the time after the first (None with fewer than two tokens)."""
        if self.error is not None or self.tokens < 2 or self.decode_seconds <= 0:
            return None
        return (self.tokens - 1) / self.decode_seconds


class Endpoint:
    """The server at `base_url` (http://host:port, with or without /v1): where its routes are."""

    def __init__(self, base_url: str):
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise InvalidArgument(f"the server's URL must be http://HOST:PORT[/v1], got {base_url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.prefix = parts.path.rstrip("/").removesuffix("/v1")
        self.base_url = f"http://{self.host}:{self.port}{self.prefix}"

    def connection(self, timeout: float = REQUEST_TIMEOUT_SECONDS) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def path(self, route: str) -> str:
        return self.prefix + route


def prompts(count: int, length: int, vocab: int, seed: int, exclude: Collection[int] = ()) -> list[list[int]]:
    """`count` prompts of `length` token ids below `vocab`, none in `exclude`, the same for the same arguments; each
    starts with its own id (while the vocabulary allows), so no two share a prefix a server could reuse."""
    if count < 1 or length < 1:
        raise InvalidArgument(f"prompts: count and length must be >= 1, got {count} and {length}")
    allowed = np.setdiff1d(np.arange(vocab), np.fromiter(exclude, dtype=np.int64, count=len(exclude)))
    if allowed.size < 2:
        raise InvalidArgument(f"prompts: a vocabulary of {vocab} ids less {len(exclude)} excluded leaves too few")
    rng = np.random.default_rng(seed)
    firsts = rng.permutation(allowed)
    return [[int(firsts[i % firsts.size]), *map(int, rng.choice(allowed, length - 1))] for i in range(count)]


def completion(endpoint: Endpoint, prompt: Sequence[int], max_tokens: int, *, client: int = 0, request: int = 0,
               ignore_eos: bool = False) -> Answer:
    """One streamed, greedy completion of `prompt`; an HTTP error, a broken stream or an error event is recorded in
    the Answer, never raised."""
    body: dict[str, Any] = {"prompt": list(prompt), "max_tokens": max_tokens, "temperature": 0, "stream": True,
                            "stream_options": {"include_usage": True}}
    if ignore_eos:
        body["ignore_eos"] = True
    start = time.perf_counter()
    arrivals: list[float] = []
    usage_tokens = None
    error = None
    connection = endpoint.connection()
    try:
        connection.request("POST", endpoint.path("/v1/completions"), json.dumps(body),
                           {"Content-Type": "application/json", "Accept": "text/event-stream"})
        response = connection.getresponse()
        if response.status != 200:
            error = f"HTTP {response.status}: {response.read().decode(errors='replace')[:300]}"
        else:
            for event in _events(response):
                if "error" in event:
                    error = f"error event: {json.dumps(event['error'])[:300]}"
                    break
                if _carries_token(event):
                    arrivals.append(time.perf_counter())
                if isinstance(event.get("usage"), dict):  # cumulative where a server repeats it: the last holds
                    usage_tokens = event["usage"].get("completion_tokens", usage_tokens)
    except (OSError, http.client.HTTPException, ValueError) as failure:
        error = f"{type(failure).__name__}: {failure}"
    finally:
        connection.close()
    end = time.perf_counter()
    if error is None and not arrivals:
        error = "the stream ended without a token"
    tokens = usage_tokens if usage_tokens is not None else len(arrivals)
    return Answer(client, request, len(prompt), arrivals[0] - start if arrivals else None, end - start, tokens,
                  arrivals[-1] - arrivals[0] if arrivals else 0.0, error,
                  tuple(b - a for a, b in zip(arrivals, arrivals[1:])))


def _events(response: http.client.HTTPResponse):
    """The JSON payloads of a server-sent event stream, up to `data: [DONE]` or its end."""
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


def _carries_token(event: dict[str, Any]) -> bool:
    """Whether a completion chunk brings a token: text, or no finish reason yet (a token whose bytes end no
    character comes with empty text). A chunk that only finishes the answer, or only carries usage, does not."""
    choices = event.get("choices") or []
    return any(choice.get("text") or choice.get("finish_reason") is None for choice in choices)


def takes_ignore_eos(endpoint: Endpoint, prompt: Sequence[int], max_tokens: int) -> tuple[bool, Answer]:
    """The warm-up request, asking for ignore_eos: whether the server takes it (one that names the field in a 400
    does not, and is asked again without it), and the warm-up's answer."""
    answer = completion(endpoint, prompt, max_tokens, ignore_eos=True)
    if answer.error and answer.error.startswith("HTTP 400") and "ignore_eos" in answer.error:
        return False, completion(endpoint, prompt, max_tokens)
    return True, answer


def level(endpoint: Endpoint, clients: int, requests: list[list[tuple[int, list[int]]]], max_tokens: int,
          ignore_eos: bool) -> tuple[list[Answer], float]:
    """`clients` threads, client c sending requests[c] (each its number and prompt) one after another, all starting
    together: every answer and the level's wall seconds (the first request sent to the last answer's end)."""
    answers: list[list[Answer]] = [[] for _ in range(clients)]
    gate = threading.Barrier(clients + 1)

    def client(c: int) -> None:
        gate.wait()
        for number, prompt in requests[c]:
            answers[c].append(completion(endpoint, prompt, max_tokens, client=c, request=number,
                                         ignore_eos=ignore_eos))

    threads = [threading.Thread(target=client, args=(c,), name=f"bench-client-{c}", daemon=True)
               for c in range(clients)]
    for thread in threads:
        thread.start()
    gate.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    return [a for got in answers for a in got], time.perf_counter() - start


def summary(clients: int, answers: list[Answer], wall: float, max_tokens: int) -> dict[str, Any]:
    """A level's figures: aggregate tok/s (every generated token over the level's wall seconds), per-stream tok/s
    (the median over requests of tokens after the first over seconds after the first), the time to first token's
    p50 and p90 (over answered requests), the time between tokens' p50 and p90 (over every gap of every answered
    request), requests, errors (with the first few messages), tokens and the requests that came back short of
    `max_tokens`."""
    answered = [a for a in answers if a.error is None]
    streams = [r for a in answered if (r := a.stream_tokens_per_second) is not None]
    ttft = [a.ttft for a in answered]
    gaps = [g for a in answered for g in a.gaps]
    tokens = sum(a.tokens for a in answered)

    def quantile(values: list[float], q: float) -> float | None:
        return float(np.quantile(values, q)) if values else None

    return {"clients": clients, "requests": len(answers), "errors": len(answers) - len(answered),
            "error_messages": [a.error for a in answers if a.error is not None][:ERRORS_KEPT],
            "tokens": tokens, "short": sum(a.tokens < max_tokens for a in answered), "wall_seconds": wall,
            "aggregate_tokens_per_second": tokens / wall if wall > 0 else None,
            "stream_tokens_per_second": statistics.median(streams) if streams else None,
            "ttft_p50": quantile(ttft, 0.5), "ttft_p90": quantile(ttft, 0.9),
            "itl_p50": quantile(gaps, 0.5), "itl_p90": quantile(gaps, 0.9)}


# strata serve's /metrics samples a level reads before and after it runs (strata.server.metrics)
COUNTERS = ("strata_decode_batches_total", "strata_decode_rows_total", "strata_compute_busy_seconds_total",
            "strata_compute_gathering_seconds_total")


def server_counters(endpoint: Endpoint) -> dict[str, float] | None:
    """strata serve's batching counters from its /metrics (None: no such page, or no sessions stepping together, as
    at --batch 1 or on llama-server)."""
    connection = endpoint.connection(timeout=10)
    try:
        connection.request("GET", endpoint.path("/metrics"))
        response = connection.getresponse()
        text = response.read().decode(errors="replace") if response.status == 200 else ""
    except (OSError, http.client.HTTPException):
        return None
    finally:
        connection.close()
    found = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in COUNTERS:
            try:
                found[name] = float(value)
            except ValueError:
                return None
    return found if len(found) == len(COUNTERS) else None


def batching(before: dict[str, float] | None, after: dict[str, float] | None, wall: float) -> dict[str, Any] | None:
    """What the server's counters say of a level of `wall` seconds: its decode batches and rows, rows per batch,
    and the compute thread's busy and gathering (waiting, a step in, for the rest of its batch) shares of the
    level's time (None where the server has no such counters)."""
    if before is None or after is None or wall <= 0:
        return None
    delta = {name: after[name] - before[name] for name in COUNTERS}
    batches, rows = delta["strata_decode_batches_total"], delta["strata_decode_rows_total"]
    return {"decode_batches": int(batches), "decode_rows": int(rows),
            "rows_per_batch": rows / batches if batches else None,
            "busy_share": delta["strata_compute_busy_seconds_total"] / wall,
            "gathering_share": delta["strata_compute_gathering_seconds_total"] / wall}


def run(base_url: str, client_counts: Sequence[int], requests: int, prompt_tokens: int, max_tokens: int,
        vocab: int, *, seed: int = 0, exclude: Collection[int] = (), emit: Emit | None = None) -> dict[str, Any]:
    """A warm-up request, then each concurrency level of `client_counts` in turn, each client sending `requests`
    requests of `prompt_tokens` ids below `vocab` (not in `exclude`; every request's prompt its own, from `seed`)
    for `max_tokens` tokens. Each level's summary goes to `emit` as a JSON line once measured; the result holds
    them, with every request's Answer, and whether ignore_eos was taken."""
    if not client_counts or min(client_counts) < 1 or requests < 1 or max_tokens < 1:
        raise InvalidArgument(f"clients, requests and max_tokens must be >= 1, got {list(client_counts)}, "
                              f"{requests} and {max_tokens}")
    endpoint = Endpoint(base_url)
    total = 1 + sum(client_counts) * requests
    every = prompts(total, prompt_tokens, vocab, seed, exclude)
    ignore_eos, warm = takes_ignore_eos(endpoint, every[0], max_tokens)
    if warm.error is not None:
        raise StrataError(f"the warm-up request to {endpoint.base_url} failed: {warm.error}")
    out: dict[str, Any] = {"url": endpoint.base_url, "prompt_tokens": prompt_tokens, "max_tokens": max_tokens,
                           "requests_per_client": requests, "seed": seed, "ignore_eos": ignore_eos,
                           "warm_up": asdict(warm), "levels": []}
    numbered = list(enumerate(every))
    used = 1
    for clients in client_counts:
        mine = [numbered[used + c * requests:used + (c + 1) * requests] for c in range(clients)]
        used += clients * requests
        before = server_counters(endpoint)
        answers, wall = level(endpoint, clients, mine, max_tokens, ignore_eos)
        record = {**summary(clients, answers, wall, max_tokens),
                  "server": batching(before, server_counters(endpoint), wall)}
        if emit is not None:
            emit(json.dumps({"record": "server_level", "url": endpoint.base_url, "ignore_eos": ignore_eos,
                             **record}))
        out["levels"].append({**record, "answers": [asdict(a) for a in answers]})
    return out
