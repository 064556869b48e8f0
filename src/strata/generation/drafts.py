"""Drafted tokens that need no weights, for a verification step to check (strata.sampling.verify_drafts).

Prompt lookup (as llama.cpp's lookup decoding and transformers' prompt_lookup_num_tokens propose): the longest
n-gram that ends the sequence and occurred earlier in it proposes the tokens that followed its most recent earlier
occurrence. Any model, no weights; it drafts well where the output repeats its context (code edits, extraction,
quotes) and proposes nothing where no n-gram recurs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from strata.errors import InvalidArgument


def lookup_draft(history: Sequence[int], k: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Up to `k` tokens proposed to follow `history`: for n from max_ngram down to min_ngram, the last n tokens'
    most recent earlier occurrence (it may overlap them), and the up to k tokens after it; none when no such n-gram
    recurs. One vectorised pass over the history per n tried."""
    if k < 0 or min_ngram < 1 or max_ngram < min_ngram:
        raise InvalidArgument(f"lookup_draft needs k >= 0 and 1 <= min_ngram <= max_ngram, got k={k}, "
                              f"min_ngram={min_ngram}, max_ngram={max_ngram}")
    tokens = np.asarray(history, dtype=np.int64)
    for n in range(min(max_ngram, tokens.size - 1), min_ngram - 1, -1):
        if k == 0:
            break
        # Windows starting at 0 .. size - n - 1: every earlier place of the last n tokens, the last one excluded.
        windows = sliding_window_view(tokens[:-1], n)
        found = np.flatnonzero(np.all(windows == tokens[-n:], axis=1))
        if found.size:
            start = int(found[-1]) + n
            return tokens[start:start + k].tolist()
    return []
