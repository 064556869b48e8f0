"""strata.chat_templates: a template given by a built-in's name, as Jinja text or in a file, checked when given."""

from __future__ import annotations

import pytest

from strata.chat import render_chat
from strata.chat_templates import BUILT_IN, CHATML_TEMPLATE, chosen_template
from strata.errors import InvalidArgument

HELLO = [{"role": "user", "content": "hello"}]


def test_none_given_is_the_model_files():
    assert chosen_template() is None


def test_a_built_in_by_name_and_jinja_text_as_it_is():
    assert chosen_template("chatml") == BUILT_IN["chatml"] == CHATML_TEMPLATE
    assert render_chat(chosen_template("chatml"), HELLO) == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    text = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert chosen_template(text) == text


def test_a_file(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages[0]['content'] }}!", encoding="utf-8")
    assert render_chat(chosen_template(file=path), HELLO) == "hello!"


@pytest.mark.parametrize("text, file, words", [
    ("chatmI", None, "neither a built-in"),
    ("{% for m in messages %}", None, "--chat-template: chat template does not parse"),
    ("{{ raise_exception('no') }}", None, "--chat-template: chat template refused"),
    ("chatml", "t.jinja", "not both"),
    (None, "absent.jinja", "--chat-template-file"),
    (None, "empty.jinja", "is empty"),
    (None, "latin1.jinja", "--chat-template-file"),
])
def test_what_cannot_be_a_template_is_refused_naming_the_option(tmp_path, text, file, words):
    (tmp_path / "empty.jinja").write_text(" \n")
    (tmp_path / "latin1.jinja").write_bytes("{{ 'caf\xe9' }}".encode("latin-1"))
    with pytest.raises(InvalidArgument, match=words):
        chosen_template(text, None if file is None else tmp_path / file)
