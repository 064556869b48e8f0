"""Chat templates render like transformers renders them, and cannot leave the sandbox."""

import pytest

import strata
from strata.chat import render_chat

# The shape of Qwen's ChatML templates, cut down.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_chatml_renders_messages_and_the_generation_prompt():
    text = render_chat(CHATML, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert not render_chat(CHATML, [{"role": "user", "content": "x"}], add_generation_prompt=False).endswith(
        "assistant\n"
    )


def test_template_helpers_match_transformers_conventions():
    template = "{{ messages[0]['content'] | tojson }}{% if bad %}{{ raise_exception('no bad') }}{% endif %}"
    assert render_chat(template, [{"role": "user", "content": "é\"x"}]) == '"é\\"x"'
    with pytest.raises(strata.InvalidArgument, match="no bad"):
        render_chat(template, [{"role": "user", "content": "x"}], bad=True)


def test_the_matches_of_trim_and_loopcontrols_are_on():
    template = "{% for m in messages %}\n  {% if loop.index > 1 %}{% break %}{% endif %}{{ m.role }}\n{% endfor %}"
    assert render_chat(template, [{"role": "a"}, {"role": "b"}]) == "a\n"


@pytest.mark.parametrize(
    "escape",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.__class__.__init__.__globals__ }}",
        "{% set _ = messages.append({'role': 'x'}) %}",
        "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    ],
)
def test_a_template_that_tries_to_escape_the_sandbox_raises(escape):
    with pytest.raises(strata.FormatError, match="sandbox"):
        render_chat(escape, [{"role": "user", "content": "x"}])


@pytest.mark.parametrize(
    ("messages", "fragment"),
    [("hello", "must be a list"), ([{"content": "x"}], "message 0 must be a mapping with a 'role' key")],
)
def test_bad_messages_are_named(messages, fragment):
    with pytest.raises(strata.InvalidArgument, match=fragment):
        render_chat(CHATML, messages)


def test_missing_or_broken_template_is_a_format_error():
    with pytest.raises(strata.FormatError, match="no chat template"):
        render_chat("", [{"role": "user", "content": "x"}])
    with pytest.raises(strata.FormatError, match="does not parse"):
        render_chat("{% for %}", [{"role": "user", "content": "x"}])
