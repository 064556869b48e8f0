"""Control vectors made from prompt pairs, as llama.cpp's cvector-generator offers them (mean difference or first
principal component, unit length per layer), measured where they are applied: direction.N from model layer N's output
at each prompt's last token (docs/control_vectors.md says where this departs from the generator). The states come
from the numpy reference or from any function that measures them the same way (the GPU engine's prompt path:
strata.runtime.engine.GpuEngine.layer_states)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from strata.errors import InvalidArgument

METHODS = ("mean", "pca")
# ids -> [n_layer, n_embd]: each layer's output at the last of the ids, fed from an empty sequence (with
# hyper-connections, the mean of the streams)
LayerStates = Callable[[Sequence[int]], np.ndarray]


def prompt_pairs(positive: Sequence[str], negative: Sequence[str]) -> list[tuple[str, str]]:
    """The (positive, negative) prompts paired by line, empty lines skipped in each (as the generator does)."""
    positive = [line for line in positive if line]
    negative = [line for line in negative if line]
    if len(positive) != len(negative):
        raise InvalidArgument(f"{len(positive)} positive prompts and {len(negative)} negative ones: they pair "
                              "by line, so the counts must be equal")
    if not positive:
        raise InvalidArgument("no prompt pair: give at least one positive and one negative prompt")
    return list(zip(positive, negative))


def last_token_states(reference: Any, ids: Sequence[int]) -> np.ndarray:
    """float64 [n_layer, n_embd]: each layer's output at the last of `ids`, fed from an empty sequence. With
    hyper-connections, the mean of the streams: a control vector is added to every stream alike, so the part they
    share is what it moves, and the mean favours no stream."""
    reference.reset()
    if not ids:
        raise InvalidArgument("a prompt encodes to no tokens")
    _, dumps = reference.forward(list(ids), dump=True)
    return np.stack([d["streams_after_ffn"][-1].astype(np.float64).mean(axis=0) for d in dumps])


def reference_states(reference: Any) -> LayerStates:
    """The reference's measure of a prompt's layer states (last_token_states), as a LayerStates."""
    return lambda ids: last_token_states(reference, ids)


def make_control_vector(states: Any, tokenizer: Any, pairs: Sequence[tuple[str, str]],
                        method: str = "mean", progress: Callable[[int, int], None] | None = None
                        ) -> dict[int, np.ndarray]:
    """{N: float32 [n_embd]} for every layer N >= 1: from the difference positive - negative of layer N's
    last-token output over the prompt pairs, their mean ("mean") or the first principal component of the
    differences ("pca": the top right singular vector, turned to agree with the mean), scaled to unit length as
    the generator's are. `states`: a strata.reference.Reference (exact: no deferral, no control vector), or a
    LayerStates function (the GPU engine's: GpuEngine.layer_states, one pass of the prompt path per prompt).
    `progress(done, total)` is called after each prompt (total: both prompts of every pair)."""
    if method not in METHODS:
        raise InvalidArgument(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    measure = reference_states(states) if hasattr(states, "forward") else states
    prompts = [prompt for pair in pairs for prompt in pair]
    measured = []
    for done, prompt in enumerate(prompts, 1):
        ids = tokenizer.encode(prompt, special=True)
        if not ids:
            raise InvalidArgument(f"prompt {done} encodes to no tokens")
        measured.append(np.asarray(measure(ids), dtype=np.float64))
        if progress is not None:
            progress(done, len(prompts))
    diffs = np.stack([positive - negative for positive, negative in zip(measured[::2], measured[1::2])])
    directions = {}
    for layer in range(1, diffs.shape[1]):
        rows = diffs[:, layer]
        mean = rows.mean(axis=0)
        vector = mean if method == "mean" else _principal(rows, mean)
        norm = np.linalg.norm(vector)
        if not norm > 0:
            raise InvalidArgument(f"layer {layer}: the positive and negative prompts give the same hidden state, "
                                  "so there is no direction to take")
        directions[layer] = (vector / norm).astype(np.float32)
    return directions


def _principal(rows: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """The unit vector along which the rows (not centred, as the generator's power iteration on rows^T rows) vary
    most, signed to point along `mean` (the generator's sign is random)."""
    top = np.linalg.svd(rows, full_matrices=False)[2][0]
    return -top if top @ mean < 0 else top
