"""A scripted engine and codecs on characters (token i is chr(i), 0 is EOS): a Session without a model, for the
tests of generation and of the commands that drive one."""


class ScriptedEngine:
    """Returns a fixed script of tokens; records what it was fed."""

    def __init__(self, script, context=64):
        self.script, self.context, self.position, self.fed = list(script), context, 0, []

    def feed(self, ids, params, u, seen):
        self.fed.append(list(ids))
        self.position += len(ids)
        return self.script.pop(0)

    def reset(self):
        self.position = 0
        self.fed.clear()


class CharCodec:
    """Token i is chr(i); 0 is EOS."""

    eos_ids = [0]

    def encode(self, text, special=False):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


class TurnCodec(CharCodec):
    """A template whose turns end with the EOS the model writes (token 0), as real chat templates do."""

    chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{{ eos_token }}{% endfor %}"
                     "{% if add_generation_prompt %}<assistant>{% endif %}")
    tokens = [chr(i) for i in range(256)]
    special_ids = {"eos": [0]}
