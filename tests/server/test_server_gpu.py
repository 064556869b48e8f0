"""`strata serve` on the GPU engine (a CUDA device, the native DecodeSession): the openai client gets the tokens a
GPU Session generates, streamed or not; two sessions share the model's pool one request at a time; a client that
hangs up mid-stream leaves its session generating the same tokens afterwards."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from support.server_harness import client
from strata.server import Server
from strata.server.background import serving
from strata.synth import synthesize

pytestmark = pytest.mark.gpu
EXPERT_TYPES = {"experts": "q8_0", "expert_down": "q8_0"}  # the CPU pool's quantized path
CONTEXT = 256
USER = [{"role": "user", "content": "hello strata"}]


@pytest.fixture(scope="module", params=["qwen4exp", "qwen3next"])
def model(request, tmp_path_factory):
    from strata.runtime.model import load

    path = tmp_path_factory.mktemp("serve-gpu") / f"{request.param}.gguf"
    synthesize(path, request.param, types=EXPERT_TYPES, seed=12)
    with load(path, progress=False) as model:
        yield model


def ask(api, messages, max_tokens: int, **options):
    """Greedy, as the direct Session's default (the server's is OpenAI's temperature 1)."""
    return api.chat.completions.create(model="tiny", messages=messages, max_tokens=max_tokens, temperature=0,
                                       **options)


def test_the_gpu_engine_served_answers_as_its_session_does(model):
    direct = model.session(CONTEXT)
    try:
        expected = direct.chat_complete(USER, 16)
        expected_text = direct.complete("Once upon a time", 12)
    finally:
        direct.close()
    sessions = [model.session(CONTEXT), model.session(CONTEXT)]
    server = Server(sessions, "tiny")
    try:
        with serving(server) as url, client(url) as api:
            whole = ask(api, USER, 16)
            assert whole.choices[0].message.content == expected.text
            assert whole.usage.completion_tokens == expected.usage.completion_tokens
            chunks = ask(api, USER, 16, stream=True)
            assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected.text
            text = api.completions.create(model="tiny", prompt="Once upon a time", max_tokens=12, temperature=0)
            assert text.choices[0].text == expected_text.text

            # eight clients at once on two sessions: each gets the answer it would get alone
            prompts = [[{"role": "user", "content": f"question {i}"}] for i in range(8)]
            alone = [ask(api, p, 8).choices[0].message.content for p in prompts]
            with ThreadPoolExecutor(8) as pool:
                together = list(pool.map(lambda p: ask(api, p, 8).choices[0].message.content, prompts))
            assert together == alone

            # a client that hangs up mid-stream; the session it used answers the same conversation exactly after
            stream = ask(api, USER, 200, stream=True)
            for i, _ in enumerate(stream):
                if i == 4:
                    break
            stream.close()
            again = ask(api, USER, 16)
            assert again.choices[0].message.content == expected.text
            with pytest.raises(openai.BadRequestError):
                ask(api, [{"role": "user", "content": "x " * CONTEXT}], 4)
    finally:
        server.close()
        for session in sessions:
            session.close()
