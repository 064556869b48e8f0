"""GPU sessions through a Batcher answer token for token as each alone: prompts split into the prompt path's
chunks (a tail under its shortest feed kept with the chunk before), short prompts stepped whole, with and without
snapshots (prefill or feed), greedy and seeded. The decode steps run one at a time here (max_batch 1), so the
tokens are those of stepping alone exactly; batched steps, whose products sum in another order, are held to
stepping alone up to a near-tie in tests/session/test_batch_step.py."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from strata.generation.batcher import Batcher
from strata.runtime.prompt import PROMPT_MIN_TOKENS
from strata.synth import synthesize

pytestmark = pytest.mark.gpu
EXPERT_TYPES = {"experts": "q8_0", "expert_down": "q8_0"}
CONTEXT = 512
CHUNK = 64


@pytest.fixture(scope="module", params=["qwen4exp", "qwen3next"])
def model(request, tmp_path_factory):
    from strata.runtime.model import load

    path = tmp_path_factory.mktemp("batcher-gpu") / f"{request.param}.gguf"
    synthesize(path, request.param, types=EXPERT_TYPES, seed=21)
    with load(path, progress=False) as model:
        yield model


def test_gpu_sessions_through_the_batcher_answer_as_alone(model):
    text = model.tokenizer.encode(" ".join(f"word{i} and{i * 7 % 13}" for i in range(200)))
    lengths = [5, 2 * CHUNK + PROMPT_MIN_TOKENS - 3, CHUNK + 20, PROMPT_MIN_TOKENS + 1]
    prompts = [text[i * 3:i * 3 + n] for i, n in enumerate(lengths)]
    options = [{}, {"temperature": 0.8, "seed": 5}, {}, {"temperature": 1.0, "top_k": 20, "seed": 9}]

    def session(i: int):
        return model.session(CONTEXT, prompt_chunk=CHUNK, snapshots=4 if i % 2 else 0)

    alone = []
    for i, prompt in enumerate(prompts):
        with session(i) as s:
            assert s.engine.prompt_chunk == CHUNK
            alone.append(s.complete(prompt, max_tokens=12, **options[i]).tokens)
    sessions = [session(i) for i in range(len(prompts))]
    start = threading.Barrier(len(prompts))
    try:
        with Batcher(max_batch=1) as batcher:
            for s in sessions:
                s.engine = batcher.member(s.engine)

            def run(i: int):
                start.wait(timeout=60)
                with sessions[i].engine.active():
                    return sessions[i].complete(prompts[i], max_tokens=12, **options[i]).tokens

            with ThreadPoolExecutor(len(prompts)) as pool:
                together = list(pool.map(run, range(len(prompts))))
            counts = batcher.stats()
            engines = [s.engine.engine for s in sessions]
        for s, engine in zip(sessions, engines):
            s.engine = engine
    finally:
        for s in sessions:
            s.close()
    assert together == alone
    assert counts["prompt_chunks"] >= 6  # the two long prompts were split in two
