"""`strata run` and `strata chat` with --json-schema FILE and --grammar FILE (llama.cpp's --json-schema-file and
--grammar-file too): every answer held to the file's schema or GBNF grammar on the reference engine; a file that
is missing, not JSON, or a schema or grammar that cannot be enforced is one line naming the flag, said before the
model loads; the GPU engine, whose sampler takes no mask yet, refuses before it loads."""

from __future__ import annotations

import io
import json
import re

import jsonschema
import pytest

from strata import cli

pytest.importorskip("llguidance")

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["answer", "sure"],
          "properties": {"answer": {"enum": ["yes", "no"]}, "sure": {"type": "integer", "minimum": 0, "maximum": 9}}}
GBNF = 'root ::= "The answer is " ("yes" | "no") "."\n'


@pytest.fixture
def files(tmp_path):
    schema, grammar = tmp_path / "schema.json", tmp_path / "answer.gbnf"
    schema.write_text(json.dumps(SCHEMA))
    grammar.write_text(GBNF)
    return schema, grammar


def test_run_holds_the_answer_to_the_schema_or_the_grammar(tiny_model, files, capsys):
    model, (schema, grammar) = str(tiny_model("qwen3next", seed=4)), files
    for seed in ("1", "2"):
        assert cli.main(["run", model, "--engine", "reference", "-p", "Well?", "--temp", "1", "--seed", seed,
                         "-n", "200", "--json-schema", str(schema)]) == 0
        out, err = capsys.readouterr()
        jsonschema.validate(json.loads(out), SCHEMA)
        assert "ended by eos" in err
    for flag in ("--grammar", "--grammar-file"):
        assert cli.main(["run", model, "--engine", "reference", "-p", "Well?", "--temp", "1", "--seed", "3",
                         flag, str(grammar)]) == 0
        assert re.fullmatch(r"The answer is (yes|no)\.\n", capsys.readouterr().out)


def test_chat_holds_every_answer_to_the_schema(tiny_model, files, monkeypatch, capsys):
    model, (schema, _) = str(tiny_model("qwen3next", seed=4)), files
    monkeypatch.setattr("sys.stdin", io.StringIO("Is it?\nAnd now?\n"))
    assert cli.main(["chat", model, "--engine", "reference", "--temp", "1", "--seed", "4", "-n", "200",
                     "--json-schema-file", str(schema)]) == 0
    answers = [line.removeprefix("> ") for line in capsys.readouterr().out.splitlines() if line.startswith("> {")]
    assert len(answers) == 2
    for answer in answers:
        jsonschema.validate(json.loads(answer), SCHEMA)


@pytest.mark.parametrize("content, flag, words", [
    ('{"type": "object", "if": {}}', "--json-schema", r'--json-schema \S+: Unimplemented keys: \["if"\]'),
    ("{not json", "--json-schema", r"--json-schema \S+: the JSON schema is not JSON"),
    ('"a string"', "--json-schema", r"--json-schema \S+: a JSON schema is an object"),
    ("root ::= nothing\n", "--grammar", r"--grammar \S+: the GBNF grammar cannot be read: Rule 'nothing' not found"),
    ("(unclosed", "--grammar", r"--grammar \S+: the GBNF grammar cannot be read"),
])
def test_a_file_that_cannot_constrain_is_one_line_before_the_model_loads(tmp_path, capsys, content, flag, words):
    path = tmp_path / "bad"
    path.write_text(content)
    # the model file does not exist: the flag's file is read and checked first
    assert cli.main(["run", str(tmp_path / "none.gguf"), "--engine", "reference", "-p", "x", flag, str(path)]) == 1
    err = capsys.readouterr().err
    assert re.match(f"strata run: {words}", err) and err.count("\n") == 1, err


def test_missing_files_both_flags_and_the_gpu_engine(tmp_path, files, capsys):
    schema, grammar = files
    assert cli.main(["run", "m.gguf", "--engine", "reference", "-p", "x", "--grammar", str(tmp_path / "no")]) == 1
    assert capsys.readouterr().err.startswith("strata run: --grammar ")
    with pytest.raises(SystemExit):
        cli.main(["run", "m.gguf", "-p", "x", "--grammar", str(grammar), "--json-schema", str(schema)])
    assert "not allowed with" in capsys.readouterr().err
    # the GPU engine takes a schema: what stops this run is the missing GPU or model, not the flag
    assert cli.main(["chat", "m.gguf", "--json-schema", str(schema)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("strata chat: ") and "json-schema" not in err and "token mask" not in err, err
