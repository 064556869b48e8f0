"""TextStream with a byte-level codec (strata.generation.text): decoding only the ids after the last whole character
gives, token for token, what decoding every id gives (new text and stop), on the tiny model's tokenizer over random
streams rich in pieces of UTF-8 characters, control tokens and stop strings; and the tokenizer's decode splits so
wherever its text ends in a whole character, as `byte_level` says."""

from __future__ import annotations

import numpy as np
import pytest

from strata.format import inspect
from strata.generation.text import TextStream


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    with inspect(tiny_model("qwen3next", seed=7)) as file:
        return file.tokenizer()


def streams(tokenizer, rng: np.random.Generator, count: int, length: int) -> list[list[int]]:
    """Random ids, half of them single bytes of multi-byte characters (lead and continuation bytes alike)."""
    vocab = len(tokenizer.tokens)
    pieces = [t for t in range(vocab) if (b := tokenizer.token_bytes(t)) and len(b) == 1 and b[0] >= 0x80]
    assert len(pieces) > 32
    return [[int(rng.choice(pieces)) if rng.random() < 0.5 else int(rng.integers(0, vocab)) for _ in range(length)]
            for _ in range(count)]


def test_the_tokenizer_splits_wherever_its_text_ends_in_a_whole_character(tokenizer, rng):
    assert tokenizer.byte_level
    for ids in streams(tokenizer, rng, 40, 60):
        for cut in range(1, len(ids)):
            head = tokenizer.decode(ids[:cut])
            if head and not head.endswith("\ufffd"):
                assert tokenizer.decode(ids) == head + tokenizer.decode(ids[cut:]), (ids, cut)


def test_decoding_the_tail_gives_every_tokens_text_and_stop_as_decoding_it_all(tokenizer, rng):
    for ids in streams(tokenizer, rng, 60, 80):
        text = tokenizer.decode(ids)
        start = int(rng.integers(0, max(1, len(text) - 3)))
        stops = [text[start:start + int(rng.integers(1, 4))], "\ufffd", "zz"] if rng.random() < 0.7 else []
        whole, tail = TextStream(tokenizer.decode, stops), TextStream(tokenizer.decode, stops, byte_level=True)
        for token in ids:
            got = tail.push(token)
            assert got == whole.push(token), (ids, stops, token)
            if got[1]:
                break
        assert tail.emitted == whole.emitted
