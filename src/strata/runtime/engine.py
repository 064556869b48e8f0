"""The GPU engine: strata.generation.Engine over the native decode session (strata._native.DecodeSession).

The native session runs one token per `step` (all layers on the GPU, routed experts on the CPU pool, the
sampler on the device) and keeps every id it was fed, so the penalties' history lives there (the repetition
penalty's, and the answer's counts from answer_start on); this side only checks that the caller's history agrees,
and hands the PLE layer each token's n-gram table rows where the native session does not gather them itself (a
table type strata.runtime.ple_rows.NATIVE_ROW_TYPES lacks). The sampler applies every SamplingParams field: a draw's
token mask is written straight into the native session's page-locked words, which its sampling kernel reads; a
decode step's mask not computed yet (a constraint's) is computed there on the engine's mask worker while the device
runs the step's layers (`defer_masks`; docs/structured.md, "Where it runs").
Control vectors (docs/control_vectors.md) are the native session's: this side reads the files
(strata.runtime.steering) and stages their table there.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from strata.errors import InvalidArgument, StrataError
from strata.options import Mode
from strata.runtime.mask_worker import MaskWorker
from strata.runtime.prompt import PROMPT_MIN_TOKENS

if TYPE_CHECKING:
    from strata.runtime.ple_rows import PleRows
    from strata.runtime.steering import ControlVectors
    from strata.sampling import SamplingParams, TokenMask


NO_DRAW = (0.0, 0, 1.0, 0.0, 1.0)  # the native sampling values of a step that draws nothing (greedy, unread)
ALL_ALLOWED = -1  # a mask word allowing its 32 tokens
MAX_TICKET = 0xFFFFFFFF  # a deferred mask's ticket is a native unsigned; 0 is no ticket


def _filters(params: SamplingParams) -> tuple:
    """The native sampling values of the filters: (temperature, top_k, top_p, min_p, repeat_penalty)."""
    return params.temperature, params.top_k, params.top_p, params.min_p, params.repeat_penalty


# The native session's per-token stages: the GPU's work before each router as the host loop waits for its ring,
# the CPU pool's layer jobs, and (mode uncaptured only, from CUDA events) the GPU's work before / after them.
STAGES = ("ring_wait", "pool", "gpu_pre", "gpu_post")


def per_token_timing(stats: Mapping[str, float], tokens: int, seconds: float | None = None) -> dict[str, float]:
    """Seconds per token of each stage over `tokens` tokens (stats: the native session's sums, or the difference
    of two reads), and `host`: what of `seconds` (default: the native steps' own time) is in no stage, i.e. the
    host loop's own work, launches, staging and the sampled token's copy back; with `seconds` a wall clock
    around the calls, also the Python around them. The one definition `Session.graphs` and `strata bench` use."""
    n = max(tokens, 1)
    timing = {stage: stats[f"{stage}_seconds"] / n for stage in STAGES}
    total = stats["seconds"] if seconds is None else seconds
    timing["host"] = total / n - sum(timing.values())  # the stages are timed inside the steps: never < 0
    return timing


@dataclass(frozen=True)
class Graphs:
    """How a GPU session runs its tokens: `mode`, whether its CUDA graphs are `captured` (on the first step),
    and `timing`: seconds per token of each stage, averaged since the session started or was reset (ring
    wait = the GPU's work before each router; gpu_pre / gpu_post only in mode "uncaptured", from CUDA
    events; host = the rest of the step: per_token_timing)."""

    mode: Mode
    captured: bool
    tokens: int
    timing: dict[str, float]


class GpuEngine:
    """strata.generation.Engine over a DecodeSession (`native`), with `ple` rows when the model has PLE and the
    session does not gather them, and `snapshots` state slots (the native session's) for prefix reuse.
    `control_vectors` (a strata.runtime.steering.ControlVectors, or None: the engine takes none) reads control-vector
    files for set_control_vectors. `defer_masks` (an attribute too, to switch it for a measurement): a feed of one id
    whose draw's token mask is not computed yet computes it on the engine's mask worker while the device runs the step
    (_step_deferred); off, every mask is computed before its step."""

    prompt_min_tokens = PROMPT_MIN_TOKENS  # a feed of fewer ids steps them one by one, not through the prompt path
    full_sampling = True  # the device sampler applies logit_bias and the frequency and presence penalties too
    token_masks = True  # and SamplingParams.token_mask (structured output: docs/api.md, "The engine's side")

    def __init__(self, native: Any, ple: PleRows | None = None, snapshots: int = 0, batch_key: object = None,
                 control_vectors: ControlVectors | None = None, defer_masks: bool = True):
        self.native, self.ple, self.snapshots = native, ple, snapshots
        self.defer_masks = defer_masks
        self._masks = MaskWorker()  # its thread starts with the first deferred mask
        self._ticket = 0  # the last deferred mask's (1, 2, ... modulo 2^32 without 0: never one published before)
        # the last deferred masks' seconds from the step's start to the worker's start, to its publication and to the
        # step's end: whether the mask came while the device ran, or the sampler waited for it
        self.deferred_mask_seconds: deque[tuple[float, float, float]] = deque(maxlen=4096)
        self._control = control_vectors
        # engines with the same key step together (step_batch): sessions of one loaded model, of one context and KV
        # format, with a prompt path and their KV in VRAM (docs/batch.md); None: this one steps alone
        self.batch_key = batch_key
        self._ple_saved: dict[int, Any] = {}  # per slot: the PLE rows' last ids, which the host keeps
        # the last verify's (position before it, the PLE ids before it, its ids): what truncate() rebuilds the host's
        # n-gram state from
        self._verified: tuple[int, np.ndarray, list[int]] = (0, np.zeros(0, np.int64), [])

    @property
    def context(self) -> int:
        return self.native.context

    @property
    def position(self) -> int:
        return self.native.position

    @property
    def mode(self) -> Mode:
        return Mode.parse(self.native.mode)

    @property
    def prompt_chunk(self) -> int:
        """Tokens per chunk of this session's prompt path; 0: none, every id steps."""
        return self.native.prompt_chunk

    def feed(self, ids: Sequence[int], params: SamplingParams, u: float, seen: Sequence[int]) -> int:
        """Step every id; only the last one samples (the earlier ones only fill the state). One id whose draw's mask is
        not computed yet steps with the mask computed while the device runs it (defer_masks): where that mask fails
        (its computation raises, it allows no token) or comes too late (the native session's timeout), the id is fed
        all the same and the error raised after, the draw void (the engine's position counts the id)."""
        mask = params.token_mask
        if self.defer_masks and len(ids) == 1 and mask is not None and not mask.computed:
            return self._step_deferred(int(ids[0]), params, u, seen)
        return self._step(ids, seen, self._sampling(params), u, sample=True)

    def _step_deferred(self, token: int, params: SamplingParams, u: float, seen: Sequence[int]) -> int:
        """Step `token` while the mask worker computes the draw's mask into the native words and publishes its
        ticket, which the step's sampler waits for; then the worker's error, if any, is raised. The worker is done
        before this returns or raises, so it never writes the words while a later draw reads them."""
        self._check_history([token], seen)
        self._ticket = self._ticket % MAX_TICKET + 1
        times = [time.perf_counter()]  # the step's start, then the worker's start and its publication
        job = self._masks.submit(partial(self._publish_mask, self._ticket, params.token_mask, times))
        try:
            drawn = self._step_one(token, self._sampling(params, self._ticket), u, sample=True)
        finally:
            ended = time.perf_counter()
            failed = job.exception()  # waits for the job, however the step ended
        if len(times) == 3:
            self.deferred_mask_seconds.append((times[1] - times[0], times[2] - times[0], ended - times[0]))
        if failed is not None:
            raise failed
        return drawn

    def _publish_mask(self, ticket: int, mask: TokenMask, times: list[float]) -> None:
        """The mask worker's job: `mask` into the native words, checked as a step checks a mask written before it,
        and `ticket` published. Published whatever happens, so that the sampler never waits out its timeout: where
        the mask fails the words allow every token (the draw stays defined; the engine voids it) and the error is
        the job's."""
        times.append(time.perf_counter())
        try:
            self._write_mask(mask)
            self.native.check_token_mask()
        except BaseException:
            self.native.token_mask_words()[:] = ALL_ALLOWED
            raise
        finally:
            self.native.publish_token_mask(ticket)
            times.append(time.perf_counter())

    def feed_prompt_path(self, ids: Sequence[int], params: SamplingParams, u: float, seen: Sequence[int]) -> int:
        """feed() through the prompt path however few the ids (feed() steps fewer than PROMPT_MIN_TOKENS): what a
        benchmark of the path times at every length."""
        if not self.native.prompt_chunk:
            raise InvalidArgument("feed_prompt_path() needs the prompt path: this session has none (prompt_chunk 0)")
        self._check_history(ids, seen)
        return self._feed_chunks(ids, self._sampling(params), u, sample=True)

    def prefill(self, ids: Sequence[int], seen: Sequence[int]) -> None:
        """Step every id; nothing is sampled."""
        self._step(ids, seen, NO_DRAW, 0.0, sample=False)

    def _sampling(self, params: SamplingParams, ticket: int = 0) -> tuple:
        """A draw's values as the native session takes them: the filters' five where it sets nothing more (what
        every draw staged before the sampler took more), else with the penalties, the bias, and whether the mask
        holds it, written now into the session's page-locked words that its sampling kernel reads; or, with a
        `ticket`, written by the mask worker while the step runs, which then publishes the ticket."""
        filters = _filters(params)
        if params.token_mask is None and not params.extended():
            return filters
        masked = params.token_mask is not None
        if masked and not ticket:
            self._write_mask(params.token_mask)
        values = filters + (params.frequency_penalty, params.presence_penalty, params.answer_start, params.logit_bias,
                            masked)
        return values + (ticket,) if ticket else values

    def _write_mask(self, mask: TokenMask) -> np.ndarray:
        """`mask` in the native session's words (a lazy mask is computed straight into them); returns them."""
        words = self.native.token_mask_words()
        if mask.size <= words.size:
            mask.fill(words)
        else:  # a tokenizer wider than the logits: its tokens past them are never drawn
            wide = np.zeros(mask.size, np.int32)
            mask.fill(wide)
            words[:] = wide[:words.size]
        return words

    def _check_history(self, ids: Sequence[int], seen: Sequence[int]) -> None:
        if not ids:
            raise InvalidArgument("feed() needs at least one token id")
        if len(seen) != self.position + len(ids):
            raise StrataError(f"the history passed as `seen` has {len(seen)} ids, but the session holds "
                              f"{self.position} and is fed {len(ids)}: the native session keeps the same "
                              "history, so the two would disagree")

    def _step(self, ids: Sequence[int], seen: Sequence[int], sampling: tuple, u: float, sample: bool) -> int:
        self._check_history(ids, seen)
        if self.native.prompt_chunk and len(ids) >= PROMPT_MIN_TOKENS:
            return self._feed_chunks(ids, sampling, u, sample)
        token = -1
        for i, token_id in enumerate(ids):
            token = self._step_one(int(token_id), sampling, u, sample=sample and i == len(ids) - 1)
        return token

    def _step_one(self, token: int, sampling: tuple, u: float, sample: bool) -> int:
        """The native step of one id with its PLE rows (the host's n-gram state as it was where the step refuses)."""
        if self.ple is None:  # the decode path of most models: nothing to keep
            return self.native.step(token, None, sampling, u, sample=sample)
        with _ple_kept_on_refusal([self]):
            return self.native.step(token, self.ple.rows(token), sampling, u, sample=sample)

    @property
    def max_batch(self) -> int:
        """The most engines one step_batch takes when this engine leads it: its prompt chunk's rows, at most a step's
        (MAX_STEP_ROWS: a step of 16 rows costs less a row than one of 8, docs/performance.md)."""
        from strata import _native

        return min(self.native.prompt_chunk, _native.MAX_STEP_ROWS)

    @staticmethod
    def step_batch(engines: Sequence[GpuEngine], ids: Sequence[int], params: Sequence[SamplingParams],
                   us: Sequence[float], seens: Sequence[Sequence[int]]) -> list[int]:
        """One decode step of every engine at once (docs/batch.md): engines[i] appends ids[i] (its history then
        seens[i]) and returns its next token for params[i] and the draw us[i], as engines[i].feed([ids[i]], ...)
        through the prompt path would, row for row. The engines share a batch_key; the rows run on the prompt path
        of the engine whose session was made first, in the order the sessions were made (so any order of the same
        engines replays one captured step)."""
        from strata import _native

        GpuEngine._check_step(engines, [[t] for t in ids], seens)
        with _ple_kept_on_refusal(engines):
            rows = [e.ple.rows(int(t)) if e.ple is not None else None for e, t in zip(engines, ids)]
            sampling = [e._sampling(p) for e, p in zip(engines, params, strict=True)]
            return _native.step_batch([e.native for e in engines], [int(t) for t in ids],
                                      rows if any(r is not None for r in rows) else None, sampling, list(us), True)

    @staticmethod
    def step_rows(engines: Sequence[GpuEngine], ids: Sequence[Sequence[int]], verify: Sequence[bool],
                  params: Sequence[SamplingParams], us: Sequence[float],
                  seens: Sequence[Sequence[int]]) -> list[int | np.ndarray]:
        """One step of several engines' rows at once (docs/rows.md): engines[i] appends ids[i] (its history then
        seens[i]). Where verify[i], that is engines[i].verify(ids[i], seens[i]): its float32 [len(ids[i]),
        n_vocab] logits come back (as verify()'s, valid until its next verification) and each row's state is kept
        for truncate(). Else ids[i] is one id, stepped as
        step_batch steps it: its next token for params[i] and the draw us[i] comes back. So drafting sessions
        verify together, and beside sessions that decode. The engines share a batch_key; the rows run as
        step_batch's, on the prompt path of the engine whose session was made first."""
        from strata import _native

        GpuEngine._check_step(engines, ids, seens)
        rows = []
        with _ple_kept_on_refusal(engines):
            for engine, part, verifies in zip(engines, ids, verify, strict=True):
                part = [int(t) for t in part]
                if verifies:
                    rows.append(engine._verification_ple_rows(part))
                else:
                    if len(part) != 1:
                        raise InvalidArgument(f"step_rows: an engine that does not verify steps one id, got "
                                              f"{len(part)}")
                    rows.append(engine.ple.rows(part[0]) if engine.ple is not None else None)
            # a verification draws nothing: its rows' masks are the session's, on the host
            sampling = [_filters(p) if verifies else e._sampling(p)
                        for e, p, verifies in zip(engines, params, verify, strict=True)]
            sampled = _native.step_rows([e.native for e in engines], [[int(t) for t in part] for part in ids],
                                        rows if any(r is not None for r in rows) else None, list(verify), sampling,
                                        list(us), [None] * len(engines))
        # each verification's rows are in its session's page-locked block (verified_rows)
        return [engine.native.verified_rows()[:len(part)] if verifies else token
                for engine, part, verifies, token in zip(engines, ids, verify, sampled, strict=True)]

    @staticmethod
    def _check_step(engines: Sequence[GpuEngine], ids: Sequence[Sequence[int]],
                    seens: Sequence[Sequence[int]]) -> None:
        """What a step of several engines' rows needs of them before any state changes: one batch key, and each
        engine's history as it will hold it."""
        keys = {e.batch_key for e in engines}
        if None in keys or len(keys) != 1:
            raise InvalidArgument("a step of several engines' rows takes engines of one batch key (sessions of one "
                                  "model, context and KV format, with a prompt path and their KV in VRAM)")
        for engine, part, seen in zip(engines, ids, seens, strict=True):
            engine._check_history(part, seen)

    def _feed_chunks(self, ids: Sequence[int], sampling: tuple, u: float, sample: bool) -> int:
        """The prompt path, chunk by chunk."""
        rows = self.ple.rows_for(ids) if self.ple is not None else None
        return self.native.feed(ids, rows, sampling, u, sample=sample)

    def score(self, ids: Sequence[int], seen: Sequence[int]) -> np.ndarray:
        """Feed `ids` through the prompt path and return float32 [len(ids), n_vocab]: row i the logits after ids[i]
        (what logits() would give after stepping it). Nothing is sampled."""
        if not self.native.prompt_chunk:
            raise InvalidArgument("score() needs the prompt path: this session has none (prompt_chunk 0)")
        self._check_history(ids, seen)
        logits = np.empty((len(ids), self.native.n_vocab), dtype=np.float32)
        rows = self.ple.rows_for(ids) if self.ple is not None else None
        self.native.feed(ids, rows, NO_DRAW, 0.0, sample=False, logits=logits)
        return logits

    def set_control_vectors(self, control_vectors: Sequence[tuple[str, float]] = (),
                            control_layers: tuple[int, int] | None = None) -> None:
        """The control vectors added from the next token on (Model.session's arguments; an empty list: none). The
        tokens the sequence holds keep what their vectors gave. Refused before anything changes: a file or range
        steering_table refuses."""
        self.set_steering(self._controls().table(control_vectors, control_layers))

    def set_steering(self, table: Mapping[int, np.ndarray]) -> None:
        """set_control_vectors with the files already read: {layer: float32 [n_embd]} (steering_table's)."""
        self.native.set_control_vectors(*self._controls().staged(table))

    def _controls(self) -> ControlVectors:
        if self._control is None:
            raise InvalidArgument("this engine was made without the model's control vectors (Model.session makes "
                                  "one with them)")
        return self._control

    @property
    def steered_layers(self) -> list[int]:
        """The layers whose control vector the session adds now."""
        return list(self.native.control_vector_layers)

    def layer_states(self, ids: Sequence[int]) -> np.ndarray:
        """float32 [n_layer, n_embd]: `ids` fed from an empty sequence through the prompt path, each layer's output at
        the last of them (the mean of its residual streams): what `strata cvector` measures, in one pass. The engine
        then holds `ids`."""
        if not self.native.prompt_chunk:
            raise InvalidArgument("layer_states() needs the prompt path: this session has none (prompt_chunk 0)")
        if not ids:
            raise InvalidArgument("a prompt encodes to no tokens")
        self.reset()
        rows = self.ple.rows_for(ids) if self.ple is not None else None
        return self.native.layer_states(ids, rows)

    @property
    def verify_rows(self) -> int:
        """The most ids one verify() takes (0: the session keeps no row states)."""
        return self.native.verify_rows

    def verify(self, ids: Sequence[int], seen: Sequence[int]) -> np.ndarray:
        """A verification step (docs/speculative.md): append `ids` as one prompt chunk and return float32
        [len(ids), n_vocab], row i the logits after ids[i]; each row's state is kept, so that truncate() can cut
        the sequence back to any of them. The rows are the session's page-locked block (the device copies them
        there at the bus's rate), valid until this engine's next verification: copy them to keep them longer."""
        self._check_history(ids, seen)
        return self.native.verify(ids, self._verification_ple_rows([int(t) for t in ids]))

    def _verification_ple_rows(self, ids: list[int]) -> np.ndarray | None:
        """The PLE rows of a verification of `ids` (None: the session gathers its own), keeping what truncate()
        needs to put the n-gram state back at any of its rows."""
        if self.ple is None:
            return None
        self._verified = (self.position, self.ple.previous.copy(), ids)
        return self.ple.rows_for(ids)

    def truncate(self, position: int) -> None:
        """Right after verify(): the sequence as stepping its first `position` tokens leaves it."""
        self.native.truncate(position)
        if self.ple is not None:  # a later truncate may cut further back: always from the state before the verify
            start, before, ids = self._verified
            kept = np.asarray(ids[:self.position - start], before.dtype)
            self.ple.previous = np.concatenate([before, kept])[-before.size:]

    def logits(self) -> np.ndarray:
        """float32 [n_vocab] of the last step."""
        return self.native.logits()

    def logprobs(self, token: int, n: int,
                 token_mask: TokenMask | None = None) -> tuple[float, list[tuple[int, float]]]:
        """log p(token) and the n most likely ids at the last step's position, from the device; with `token_mask`
        (the one the token was drawn under), over the tokens it allows (strata.sampling.log_probabilities)."""
        if token_mask is None:
            return self.native.logprobs(token, n)
        words = self._write_mask(token_mask)
        allowed = np.unpackbits(words.view(np.uint8), bitorder="little")[:self.native.n_vocab]
        if not 0 <= token < allowed.size or not allowed[token]:
            raise InvalidArgument(f"token {token} is not one the token mask allows")
        return self.native.logprobs(token, min(n, int(np.count_nonzero(allowed))), True)

    def snapshot(self, slot: int) -> None:
        self.native.snapshot(slot)
        if self.ple is not None:
            self._ple_saved[slot] = self.ple.previous.copy()

    def restore(self, slot: int) -> None:
        self.native.restore(slot)
        if self.ple is not None:
            self.ple.previous = self._ple_saved[slot].copy()

    def reset(self) -> None:
        self.native.reset()
        self._ple_saved.clear()
        if self.ple is not None:
            self.ple.reset()

    @property
    def graphs(self) -> Graphs:
        st = self.native.stats()
        return Graphs(self.mode, self.native.captured, st["tokens"], per_token_timing(st, st["tokens"]))

    def stats(self) -> dict[str, Any]:
        """The native session's sums since construction or reset (tokens, seconds, ring wait, pool, gpu), and per
        layer the routed experts the VRAM cache held and the pool computed (expert_hits, expert_misses)."""
        return self.native.stats()

    def close(self) -> None:
        self._masks.close()  # before the words it writes into go with the native session
        self.native.close()


@contextlib.contextmanager
def _ple_kept_on_refusal(engines: Sequence[GpuEngine]):
    """The engines' PLE n-gram states as they were where the step is refused: gathering a step's rows advances
    them before the native step checks its arguments, which leaves every session as it was when it refuses. An
    engine whose position moved was fed all the same (a deferred mask that failed after its step: feed) and keeps
    its new state."""
    before = [(e.ple.previous.copy(), e.position) if e.ple is not None else None for e in engines]
    try:
        yield
    except BaseException:
        for engine, kept in zip(engines, before):
            if kept is not None and engine.position == kept[1]:
                engine.ple.previous = kept[0]
        raise
