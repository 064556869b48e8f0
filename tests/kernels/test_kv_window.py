"""KV streaming: the VRAM window of QSA blocks over a host copy of an attention layer's cache (kernels/kv_window.cuh)
against a numpy model of its rule, and attention_decode over it against attention_decode over the whole cache.

strata._native_check.kv_window_steps runs decoded tokens as a session would: kv_window_claim, the token's row
written into the window (as attention_prep writes it), kv_window_fill with the token's selection, then
attention_decode over the window and over a whole VRAM cache holding the same rows. The host copy and the rows
are random bytes of each format (finite values, so attention's outputs can be compared bit for bit). The rule
is exact, so the model predicts every page table, slot owner, stamp and fetched byte.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from strata.errors import InvalidArgument
from strata.reference import kv_formats as kf

pytestmark = pytest.mark.hooks

FORMATS = ["bf16", "int8", "q4", "k8v4"]
PAGE = 256  # tokens per page of the host copy (kKvPageTokens)
RATIO = 4
# (kv heads, head_dim): qwen4exp's shape, and narrow heads whose 2-byte scale rows take the copies' narrow words.
SHAPES = [(2, 256), (1, 32), (3, 96)]


def row_bytes(codes: kf.Codes, d: int) -> tuple[int, int]:
    """Bytes of one head row of a half: its codes, its scales (kv_format.hpp)."""
    code = {"bf16": 2 * d, "int8": d, "q4": d // 2}[codes.name]
    return code, (d // kf.GROUP * 2 if codes.scaled else 0)


@dataclass(frozen=True)
class Shape:
    kv: str
    kv_heads: int
    d: int
    keep: int
    slots: int
    context: int

    @property
    def blocks(self) -> int:
        return self.context // RATIO

    def args(self) -> dict:
        return {"kv": self.kv, "n_head_kv": self.kv_heads, "head_dim": self.d, "ratio": RATIO,
                "keep_blocks": self.keep, "slots": self.slots, "context": self.context}


class Half:
    """One half of a cache as stored: codes [rows, code row] and scales [rows, scale row] (bytes)."""

    def __init__(self, data: np.ndarray, rows: int, code: int, scale: int):
        self.codes = data[:rows * code].reshape(rows, code)
        self.scales = data[rows * code:].reshape(rows, scale)

    def row(self, at: int) -> bytes:
        return self.codes[at].tobytes() + self.scales[at].tobytes()


def random_rows(rng, codes: kf.Codes, rows: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """`rows` head rows of finite values in `codes`: (codes [rows, code row], scales [rows, scale row]) as bytes."""
    if codes.name == "bf16":
        bits = rng.standard_normal((rows, d), dtype=np.float32).view(np.uint32) >> 16
        return bits.astype(np.uint16).view(np.uint8).reshape(rows, 2 * d), np.zeros((rows, 0), np.uint8)
    if codes.name == "int8":
        code = rng.integers(-127, 128, (rows, d), dtype=np.int8).view(np.uint8)
    else:
        code = rng.integers(0, 256, (rows, d // 2), dtype=np.uint8)
    scale = rng.uniform(0.01, 0.1, (rows, d // kf.GROUP)).astype(np.float16).view(np.uint8)
    return code, scale.reshape(rows, -1)


def random_half(rng, codes: kf.Codes, rows: int, d: int) -> np.ndarray:
    code, scale = random_rows(rng, codes, rows, d)
    return np.concatenate([code.reshape(-1), scale.reshape(-1)])


def token_rows(rng, codes: kf.Codes, count: int, kv_heads: int, d: int) -> np.ndarray:
    """Each token's row of a half: every kv head's codes, then their scales."""
    code, scale = random_rows(rng, codes, count * kv_heads, d)
    return np.concatenate([code.reshape(count, -1), scale.reshape(count, -1)], axis=1)


class WindowModel:
    """The window's rule (kv_window.cuh) in numpy: which block each slot holds, stamps and fetched bytes."""

    def __init__(self, shape: Shape, slot_bytes: int, token_bytes: int):
        self.shape, self.slot_bytes, self.token_bytes = shape, slot_bytes, token_bytes
        self.reset()
        self.fetched = 0

    def reset(self) -> None:
        """kv_window_reset: nothing resident, the clock back to 0; the fetched bytes keep counting."""
        self.slot_of = np.full(self.shape.blocks, -1, np.int32)
        self.owner = np.full(self.shape.slots, -1, np.int32)
        self.stamps = np.zeros(self.shape.slots, np.int32)
        self.clock = 0

    def age(self, slot: int) -> int:
        """Eviction order, oldest first: the clock of the last token that needed the slot's block (0: free)."""
        return int(self.stamps[slot])

    def _place(self, block: int, slot: int, stamp: int) -> None:
        if self.owner[slot] >= 0:
            self.slot_of[self.owner[slot]] = -1
        self.owner[slot], self.slot_of[block], self.stamps[slot] = block, slot, stamp

    def claim(self, p: int) -> None:
        block = p // RATIO
        self.clock += 1
        if self.slot_of[block] < 0:
            slot = min(range(self.shape.slots), key=lambda s: (self.age(s), s))
            self._place(block, slot, self.clock)
            self.fetched += (p - block * RATIO) * self.token_bytes
        self.stamps[self.slot_of[block]] = self.clock

    def fill(self, p: int, selection: list[int]) -> None:
        block, stamp = p // RATIO, self.clock
        needed = selection + ([] if selection and selection[-1] == block else [block])
        missing = []
        for b in needed:
            if self.slot_of[b] >= 0:
                self.stamps[self.slot_of[b]] = stamp
            else:
                missing.append(b)
        spare = sorted((s for s in range(self.shape.slots) if self.stamps[s] != stamp),
                       key=lambda s: (self.age(s), s))
        assert len(spare) >= len(missing), "the window has too few spare slots for the selection"
        for b, slot in zip(missing, spare):
            self._place(b, slot, stamp)
            self.fetched += self.slot_bytes


@dataclass
class Tokens:
    positions: np.ndarray
    selected: np.ndarray
    n_selected: np.ndarray
    resets: np.ndarray

    def selection(self, t: int) -> list[int]:
        return [int(b) for b in self.selected[t, :self.n_selected[t]]]


def random_selection(rng, p: int, keep: int, previous: list[int], repeat: bool) -> list[int]:
    """Ascending complete blocks of position p: with `repeat` the previous selection again where it is still a
    full one, else some of it kept and the rest drawn afresh; the block p closes is often among them."""
    complete = (p + 1) // RATIO
    count = min(keep, complete)
    if repeat and len(previous) == count and all(b < complete for b in previous):
        return previous
    kept = [b for b in previous if b < complete and rng.random() < 0.7][:count]
    rest = np.setdiff1d(np.arange(complete), kept)
    chosen = set(kept) | set(rng.choice(rest, count - len(kept), replace=False).tolist())
    if (p + 1) % RATIO == 0 and count > 0 and p // RATIO not in chosen and rng.random() < 0.5:
        chosen.discard(min(chosen))
        chosen.add(p // RATIO)
    return sorted(chosen)


def random_tokens(rng, shape: Shape, count: int, low: int) -> Tokens:
    """`count` decoded positions from `low` on: runs of consecutive positions, a reset with a jump (a new prompt),
    and a jump back without one (a session cutting back to an earlier position). Every third token repeats the
    previous selection where it can."""
    high = shape.context // 2
    reset_at, rewind_at = sorted(rng.choice(np.arange(4, count - 4), 2, replace=False).tolist())
    positions, resets = [], []
    p = int(rng.integers(low, high))
    for t in range(count):
        if t == reset_at:
            p = int(rng.integers(low, high))
        elif t == rewind_at:
            p = max(low, p - int(rng.integers(1, 4 * RATIO * shape.keep)))
        positions.append(p)
        resets.append(t == reset_at)
        p += 1
    selected = np.full((count, shape.keep), -1, np.int32)
    n_selected = np.zeros(count, np.int32)
    previous: list[int] = []
    for t, p in enumerate(positions):
        previous = random_selection(rng, p, shape.keep, previous, repeat=t % 3 == 2)
        selected[t, :len(previous)] = previous
        n_selected[t] = len(previous)
    return Tokens(np.array(positions, np.int32), selected, n_selected, np.array(resets, np.uint8))


def run(rng, shape: Shape, count: int, heads: int = 0, low: int = 0) -> tuple[dict, dict]:
    from strata import _native_check

    keys, values = kf.halves(shape.kv)
    rows = shape.context * shape.kv_heads
    inputs = {"host_keys": random_half(rng, keys, rows, shape.d),
              "host_values": random_half(rng, values, rows, shape.d),
              "tokens": random_tokens(rng, shape, count, low),
              "key_rows": token_rows(rng, keys, count, shape.kv_heads, shape.d),
              "value_rows": token_rows(rng, values, count, shape.kv_heads, shape.d)}
    attention = {}
    if heads:
        f = np.float32
        attention = {"q": rng.standard_normal((count, heads, shape.d), dtype=f),
                     "q_gate": rng.standard_normal((count, heads, 2 * shape.d), dtype=f)}
    tokens = inputs["tokens"]
    got = _native_check.kv_window_steps(inputs["host_keys"], inputs["host_values"], tokens.positions, tokens.selected,
                                        tokens.n_selected, tokens.resets, inputs["key_rows"], inputs["value_rows"],
                                        **shape.args(), **attention)
    return inputs, got


def host_row(shape: Shape, p: int, head: int) -> int:
    return ((p // PAGE) * shape.kv_heads + head) * PAGE + p % PAGE


def window_row(shape: Shape, slot: int, head: int, i: int) -> int:
    return (slot * shape.kv_heads + head) * RATIO + i


def written(host: np.ndarray, row: np.ndarray, p: int, shape: Shape, codes: kf.Codes) -> None:
    """Token row `row` (every head's codes, then scales) stored at position p of a host half, in place."""
    code, scale = row_bytes(codes, shape.d)
    half = Half(host, shape.context * shape.kv_heads, code, scale)
    for j in range(shape.kv_heads):
        at = host_row(shape, p, j)
        half.codes[at] = row[j * code:(j + 1) * code]
        half.scales[at] = row[shape.kv_heads * code + j * scale:shape.kv_heads * code + (j + 1) * scale]


def assert_window(shape: Shape, inputs: dict, got: dict) -> None:
    """Per token: the state the model predicts, owners and page table each other's inverse, every block the token
    needs resident with its rows up to p bit-equal to the host copy's; at the end the host copy holds exactly the
    initial bytes with each token's row written at its position."""
    tokens: Tokens = inputs["tokens"]
    keys, values = kf.halves(shape.kv)
    sizes = {name: got[name].shape[1] for name in ("window_keys", "window_values")}
    token_bytes = inputs["key_rows"].shape[1] + inputs["value_rows"].shape[1]
    slot_bytes = token_bytes * RATIO
    model = WindowModel(shape, slot_bytes, token_bytes)
    host = {"keys": inputs["host_keys"].copy(), "values": inputs["host_values"].copy()}
    host_rows = shape.context * shape.kv_heads
    window_rows = shape.slots * RATIO * shape.kv_heads
    for t, p in enumerate(tokens.positions.tolist()):
        label = f"{shape} token {t} (position {p})"
        if tokens.resets[t]:
            model.reset()
        selection = tokens.selection(t)
        model.claim(p)
        model.fill(p, selection)
        written(host["keys"], inputs["key_rows"][t], p, shape, keys)
        written(host["values"], inputs["value_rows"][t], p, shape, values)
        slot_of, owner = got["slot_of"][t], got["owner"][t]
        assert np.array_equal(slot_of, model.slot_of), f"{label}: page table differs from the model"
        assert np.array_equal(owner, model.owner), f"{label}: slot owners differ from the model"
        assert np.array_equal(got["stamps"][t], model.stamps), f"{label}: stamps differ from the model"
        assert int(got["fetched"][t]) == model.fetched, f"{label}: fetched bytes differ from the model"
        held = owner[owner >= 0]
        assert np.array_equal(slot_of[held], np.nonzero(owner >= 0)[0]), f"{label}: owners not the table's inverse"
        assert np.count_nonzero(slot_of >= 0) == held.size, f"{label}: the table maps a block no slot holds"
        current = p // RATIO
        needed = set(selection) | {current}
        for name, codes in (("keys", keys), ("values", values)):
            code, scale = row_bytes(codes, shape.d)
            expect = Half(host[name], host_rows, code, scale)
            window = Half(got[f"window_{name}"][t], window_rows, code, scale)
            assert got[f"window_{name}"][t].size == sizes[f"window_{name}"]
            for b in sorted(needed):
                assert slot_of[b] >= 0, f"{label}: needed block {b} not resident"
                for i in range(min(RATIO, p + 1 - b * RATIO)):
                    for j in range(shape.kv_heads):
                        assert window.row(window_row(shape, int(slot_of[b]), j, i)) == expect.row(
                            host_row(shape, b * RATIO + i, j)), f"{label}: {name} of block {b} row {i} head {j}"
    for name in ("keys", "values"):
        assert np.array_equal(got[f"host_{name}"], host[name]), f"{shape}: the host copy's {name} differ"


def assert_reset(got: dict, shape: Shape) -> None:
    reset = got["reset"]
    assert np.all(reset["slot_of"] == -1) and np.all(reset["owner"] == -1), f"{shape}: a reset left blocks resident"
    assert np.all(reset["stamps"] == 0), f"{shape}: a reset left stamps"
    assert reset["fetched"] == got["fetched"][-1], f"{shape}: a reset changed the fetched bytes (they keep counting)"


@pytest.mark.gpu
@pytest.mark.parametrize("kv", FORMATS)
@pytest.mark.parametrize("kv_heads, d", SHAPES)
@pytest.mark.parametrize("spare", [2, 7])
def test_the_window_follows_its_rule(rng, kv, kv_heads, d, spare):
    """keep_blocks + 2 slots (the fewest) and 5 more, where the oldest-stamp order picks among spare slots."""
    keep = 8
    shape = Shape(kv, kv_heads, d, keep, keep + spare, 1024)
    inputs, got = run(rng, shape, 48)
    assert_window(shape, inputs, got)
    assert_reset(got, shape)


@pytest.mark.gpu
@pytest.mark.parametrize("kv", FORMATS)
def test_resident_blocks_are_never_fetched_again(rng, kv):
    """Stated without the model: on consecutive positions a block both tokens need keeps its slot, and a
    selection that repeats fetches nothing (the claim of a new block starts it empty: no rows before p)."""
    shape = Shape(kv, 2, 256, 8, 10, 1024)
    inputs, got = run(rng, shape, 64, low=RATIO * shape.keep)  # every selection full, so every third repeats
    tokens: Tokens = inputs["tokens"]
    repeats = 0
    for t in range(1, len(tokens.positions)):
        p, previous = int(tokens.positions[t]), int(tokens.positions[t - 1])
        if tokens.resets[t] or p != previous + 1:
            continue
        both = (set(tokens.selection(t - 1)) | {previous // RATIO}) & (set(tokens.selection(t)) | {p // RATIO})
        for b in both:
            assert got["slot_of"][t][b] == got["slot_of"][t - 1][b], f"token {t}: block {b} moved"
        if tokens.selection(t) == tokens.selection(t - 1):
            repeats += 1
            assert got["fetched"][t] == got["fetched"][t - 1], f"token {t}: a repeated selection fetched bytes"
    assert repeats > 0, "the token sequence should repeat some selection"


@pytest.mark.gpu
@pytest.mark.parametrize("kv", FORMATS)
@pytest.mark.parametrize("kv_heads, d, heads", [(2, 256, 6), (1, 32, 2)])
def test_attention_over_the_window_is_attention_over_the_whole_cache(rng, kv, kv_heads, d, heads):
    """attention_decode reads the same rows in the same order through the window's page table as through the
    whole cache's, so its outputs are the same bits."""
    shape = Shape(kv, kv_heads, d, 8, 10, 1024)
    inputs, got = run(rng, shape, 40, heads=heads)
    assert_window(shape, inputs, got)
    out = got["out_window"]
    assert np.all(np.isfinite(out)), f"{shape}: NaN or infinity in attention over the window"
    same = np.all(out.view(np.uint32) == got["out_whole"].view(np.uint32), axis=(1, 2))
    assert np.all(same), f"{shape}: attention over the window differs first at token {np.argmin(same)}"


@pytest.mark.gpu
@pytest.mark.parametrize("slots, launcher", [(9, "kv_window_fill"), (4097, "kv_window_reset")])
def test_launchers_refuse_too_few_or_too_many_slots(rng, slots, launcher):
    """A fill needs keep_blocks + 2 slots; the plan holds at most 4,096 slots in shared memory."""
    shape = Shape("int8", 2, 256, 8, slots, 1024)
    with pytest.raises(InvalidArgument, match=launcher):
        run(rng, shape, 12)


@pytest.mark.parametrize("kv, slot", [("bf16", 8192), ("int8", 4352), ("q4", 2304), ("k8v4", 3328)])
def test_window_bytes_for_qwen4exp(kv, slot):
    """qwen4exp's attention layers (2 kv heads of 256, blocks of 4 tokens, 512 kept) at 262,144 tokens: each slot
    holds one block of both halves, and the region adds the page table (an int per block) and the slots'
    bookkeeping and its clock, each piece on a 256-byte boundary."""
    from strata import _native_check

    keep, context = 512, 262144
    sizes = _native_check.kv_window_sizes(kv, n_head_kv=2, head_dim=256, ratio=RATIO, keep_blocks=keep,
                                          slots=keep + 2, context=context)
    assert sizes["slot"] == slot
    assert sizes["key_row"] + sizes["value_row"] == slot // RATIO
    assert sizes["window_keys"] + sizes["window_values"] == slot * (keep + 2)
    aligned = [-(-n // 256) * 256 for n in (sizes["window_keys"], sizes["window_values"], 4 * context // RATIO,
                                            4 * (keep + 2), 4 * (keep + 2), 4, 4 * (keep + 2), 4, 8)]
    assert sizes["region"] == sum(aligned)


@pytest.mark.parametrize("blocks, message", [([3, 2], "entry 1 is 2"), ([0, 9], "entry 1 is 9")])
def test_steps_refuse_a_selection_attention_could_not_read(blocks, message):
    """Blocks out of order or not yet complete (position 35 has 9 complete blocks: 0..8) are named before any
    device work."""
    from strata import _native_check

    shape = Shape("int8", 2, 64, 2, 4, 256)
    sizes = _native_check.kv_window_sizes(**shape.args())
    with pytest.raises(InvalidArgument, match=message):
        _native_check.kv_window_steps(np.zeros(sizes["host_keys"], np.uint8), np.zeros(sizes["host_values"], np.uint8),
                                      [35], [blocks], [2], [0], np.zeros((1, sizes["key_row"]), np.uint8),
                                      np.zeros((1, sizes["value_row"]), np.uint8), **shape.args())


def test_sizes_refuse_a_context_of_partial_pages():
    from strata import _native_check

    with pytest.raises(InvalidArgument, match="context 1000"):
        _native_check.kv_window_sizes("bf16", n_head_kv=2, head_dim=256, ratio=RATIO, keep_blocks=8, slots=10,
                                      context=1000)
