"""The plan of a split of the layers over several GPUs: contiguous ranges covering every layer once, each fitting
its device, the expert caches' room balanced (the smallest room ratio as large as any split's), the one-device
plan's bytes kept (nothing counted twice or lost but the per-device parts), clear refusals."""

import dataclasses
import itertools
import random
import re

import pytest
from test_plan import bench_tensors

import strata
from strata.models import released
from strata.options import KV
from strata.runtime.layer_ranges import EMBEDDING, HEAD, PER_DEVICE, describe, plan_ranges
from strata.runtime.plan import GIB, memory_plan, scratch_bytes, size_text

ARCHS = ["qwen4exp", "qwen3next", "qwen35moe"]
CONTEXT, CHUNK = 8192, 1024
# (GPU, free bytes): two and three devices, equal and unequal
DEVICES = {
    "2 equal": [(0, 24 * GIB), (1, 24 * GIB)],
    "2 unequal": [(0, 16 * GIB), (1, 40 * GIB)],
    "3 equal": [(0, 12 * GIB), (1, 12 * GIB), (2, 12 * GIB)],
    "3 unequal": [(2, 30 * GIB), (0, 10 * GIB), (1, 20 * GIB)],
}


@pytest.fixture(scope="module", params=ARCHS)
def model(request):
    g = released(request.param)
    return g, bench_tensors(g)


def plan(model, devices, **options):
    g, tensors = model
    options = {"kv": KV.INT8, "prompt_chunk": CHUNK, **options}
    return plan_ranges(g, tensors, CONTEXT, options.pop("kv"), devices, **options)


def smallest_ratio(model, devices, split):
    """The smallest room ratio of `split`, or None where a range does not fit."""
    try:
        return min(r.room_ratio for r in plan(model, devices, split=split))
    except strata.OutOfMemory:
        return None


@pytest.mark.parametrize("devices", DEVICES.values(), ids=DEVICES.keys())
def test_a_split_is_contiguous_covers_every_layer_once_and_fits(model, devices):
    g, _ = model
    ranges = plan(model, devices)
    assert [r.device for r in ranges] == [device for device, _ in devices]
    assert [r.free for r in ranges] == [free for _, free in devices]
    assert ranges[0].first == 0 and ranges[-1].last == g.n_layer
    assert all(a.last == b.first for a, b in zip(ranges, ranges[1:]))
    assert all(r.layers >= 1 and 0 <= r.room == r.free - r.vram_total for r in ranges)
    assert all((EMBEDDING in r.vram) == (r is ranges[0]) and (HEAD in r.vram) == (r is ranges[-1]) for r in ranges)


def test_two_ranges_balance_the_expert_cache_room_over_every_split(model):
    # The smallest room ratio (room / routed expert bytes of the range's layers) is the largest of every split's.
    g, _ = model
    for devices in (DEVICES["2 equal"], DEVICES["2 unequal"]):
        best = min(r.room_ratio for r in plan(model, devices))
        ratios = [smallest_ratio(model, devices, [n, g.n_layer - n]) for n in range(1, g.n_layer)]
        assert best == max(ratio for ratio in ratios if ratio is not None), devices
    equal = plan(model, DEVICES["2 equal"])
    assert abs(equal[0].layers - equal[1].layers) <= 2  # only the embedding and head tell the two apart
    unequal = plan(model, DEVICES["2 unequal"])
    assert unequal[0].layers < unequal[1].layers  # the larger card takes more layers


@pytest.mark.parametrize("devices", [DEVICES["3 equal"], DEVICES["3 unequal"]], ids=["3 equal", "3 unequal"])
def test_three_ranges_balance_the_room_better_than_their_neighbours_and_random_splits(model, devices):
    g, _ = model
    ranges = plan(model, devices)
    best = min(r.room_ratio for r in ranges)
    a, b = ranges[0].layers, ranges[1].layers
    candidates = {(a + da, b + db) for da, db in itertools.product(range(-3, 4), repeat=2)}
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    candidates |= {tuple(sorted(rng.sample(range(1, g.n_layer), 2))) for _ in range(30)}
    for first, second in candidates:
        split = [first, second, g.n_layer - first - second] if first > 0 and second > 0 else None
        if split is not None and split[2] > 0 and (ratio := smallest_ratio(model, devices, split)) is not None:
            assert ratio <= best, (split, seed)


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("devices", DEVICES.values(), ids=DEVICES.keys())
def test_the_ranges_hold_the_one_device_plans_bytes_and_each_its_per_device_parts(model, devices, streaming):
    g, tensors = model
    if streaming and g.arch != "qwen4exp":
        pytest.skip("KV streaming serves qwen4exp's indexed attention only")
    ranges = plan(model, devices, kv_streaming=streaming, snapshots=3)
    one = memory_plan(g, tensors, CONTEXT, KV.INT8, snapshots=3, prompt_chunk=CHUNK, kv_streaming=streaming)
    total: dict[str, int] = {}
    for r in ranges:
        for part, nbytes in r.vram.items():
            total[part] = total.get(part, 0) + nbytes
    extra = len(ranges) - 1  # ranges beyond the one a single device holds
    last = ranges[-1].vram
    assert total.pop(EMBEDDING) + total.pop(HEAD) + total.pop("dense weights") == one.vram["dense weights"]
    assert last["scratch"] == one.vram["scratch"]  # the sampler's workspace: the last range's alone
    assert total.pop("scratch") == one.vram["scratch"] + extra * scratch_bytes(g, CONTEXT, sampler=False)
    assert set(PER_DEVICE) == {"residual streams", "scratch", "prompt scratch", "allocation slack"}
    for part in ("residual streams", "prompt scratch", "allocation slack"):  # every range's, the same
        assert all(r.vram[part] == one.vram[part] for r in ranges), part
        assert total.pop(part) == (1 + extra) * one.vram[part], part
    per_layer = {part: n for part, n in one.vram.items() if part not in ("dense weights", *PER_DEVICE)}
    assert total == per_layer and "state snapshots" in total  # KV, QSA keys, GDN and PLE state, their snapshots
    host: dict[str, int] = {}
    for r in ranges:
        for part, nbytes in r.host.items():
            host[part] = host.get(part, 0) + nbytes
    assert host == {part: n for part, n in one.host.items() if part not in ("routed experts", "pinned buffers")}
    assert bool(host) == streaming
    assert sum(r.experts for r in ranges) == one.host["routed experts"]


def test_one_device_is_the_one_device_plan(model):
    g, tensors = model
    (whole,) = plan(model, [(0, 80 * GIB)])
    one = memory_plan(g, tensors, CONTEXT, KV.INT8, prompt_chunk=CHUNK)
    assert whole.vram_total == one.vram_total and (whole.first, whole.last) == (0, g.n_layer)


def test_each_layers_state_goes_to_its_range():
    g = released("qwen4exp")
    ranges = plan((g, bench_tensors(g)), DEVICES["3 equal"], split=[1, 23, 24])
    # layer 0 is GDN; the PLE layer (1) and the first attention layer (3) are the second range's
    assert "KV cache (int8)" not in ranges[0].vram and "PLE conv history" not in ranges[0].vram
    assert "PLE conv history" in ranges[1].vram and "PLE conv history" not in ranges[2].vram
    assert all("GDN recurrent + conv state" in r.vram and "state snapshots" in r.vram for r in ranges)
    text = "\n".join(describe(g, ranges))
    assert "its rows go to GPU 1, which runs the PLE layer 1" in text and "1 + 23 + 24 layers over 3 GPU(s)" in text
    assert "GPU 2 (layers 24..47)" in text and "planned only" in text


def test_a_given_split_is_kept_and_checked(model):
    g, _ = model
    half = g.n_layer // 2
    ranges = plan(model, DEVICES["2 equal"], split=[half, g.n_layer - half])
    assert [(r.first, r.last) for r in ranges] == [(0, half), (half, g.n_layer)]
    lopsided = [g.n_layer - 2, 2]
    need = plan(model, [(0, 80 * GIB), (1, 80 * GIB)], split=lopsided)[0].vram_total
    free = need - 1
    message = (f"layer split {g.n_layer - 2},2: GPU 0 (layers 0..{g.n_layer - 3}) needs {size_text(need)} "
               f"(dense weights ")
    with pytest.raises(strata.OutOfMemory, match=re.escape(message)) as refused:
        plan(model, [(0, free), (1, 80 * GIB)], split=lopsided)
    assert f"and has {size_text(free)} free; try another split" in str(refused.value)


@pytest.mark.parametrize(("devices", "split", "message"), [
    ([(0, GIB), (1, GIB)], [24, 20], "layer split 24,20 covers 44 layers; the model has 48"),
    ([(0, GIB), (1, GIB)], [48, 0], "layer split 48,0: the range of GPU 1 has 0 layers; each device runs at least one"),
    ([(0, GIB), (1, GIB)], [16, 16, 16], "layer split 16,16,16 gives 3 ranges for 2 devices (GPUs 0, 1)"),
    ([(0, GIB), (0, GIB)], None, "device 0 is named twice"),
    ([(-1, GIB)], None, "device -1 is not a GPU index"),
    ([(0, -1)], None, "free memory of GPU 0 must be >= 0 bytes, got -1"),
    ([], None, "a split of the layers needs at least one device"),
    ([(n, GIB) for n in range(49)], None, "49 devices for 48 layers: each device runs a range of at least one layer"),
])
def test_a_bad_split_or_device_list_is_named(devices, split, message):
    g = released("qwen4exp")
    with pytest.raises(strata.InvalidArgument, match=re.escape(message)):
        plan((g, bench_tensors(g)), devices, split=split)


def test_no_split_that_fits_names_the_tightest_range():
    g = released("qwen3next")
    model = (g, bench_tensors(g))
    with pytest.raises(strata.OutOfMemory, match=r"no split of the 48 layers over GPUs 3, 1 fits: the most balanced, "
                                                 r"\d+,\d+: GPU [13] \(layers \d+\.\.\d+\) needs [\d.]+ GiB \(.*\) "
                                                 r"and has 1.00 GiB free; try more devices"):
        plan(model, [(3, GIB), (1, GIB)])
    with pytest.raises(strata.InvalidArgument, match="context 300000 is outside 1..262144"):
        plan_ranges(g, model[1], 300000, KV.INT8, [(0, GIB)])


def test_snapshots_split_by_the_arenas_spans_where_a_region_is_not_aligned():
    # A conv history of 384 bytes takes 512 in the arena, and a snapshot copies the span: the ranges' snapshots
    # sum to the one-device plan's only if each range counts its regions' spans.
    from strata.synth.presets import geometry

    g = dataclasses.replace(geometry("qwen3next", "tiny", 6), ssm_conv_kernel=2, ssm_n_k_heads=1, ssm_head_k_dim=32,
                            ssm_n_v_heads=1, ssm_head_v_dim=32)
    tensors = bench_tensors(g)
    ranges = plan_ranges(g, tensors, 600, KV.INT8, [(0, GIB), (1, GIB), (2, GIB)], snapshots=3)
    one = memory_plan(g, tensors, 600, KV.INT8, snapshots=3)
    assert sum(r.vram["state snapshots"] for r in ranges) == one.vram["state snapshots"]
    assert sum(r.vram["GDN recurrent + conv state"] for r in ranges) == one.vram["GDN recurrent + conv state"]
