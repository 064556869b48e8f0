"""The memory plan: sizes from first principles, canonical bytes equal to real repacks, clear refusals."""

import math
import re

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import strata
from strata.models import released, tensor_inventory
from strata.options import KV
from strata.runtime.geometry import native_geometry
from strata.runtime.plan import GIB, check_fits, largest_context, memory_plan, tensor_bytes
from strata.quant import repack
from strata.quant.synthetic import random_blocks

BENCH = {"experts": T.Q4_K, "expert_down": T.Q4_0, "dense": T.Q8_0}


def bench_tensors(g):
    def pick(spec):
        if spec.forced_f32:
            return T.F32
        if "_exps." in spec.name:
            return BENCH["expert_down"] if "down" in spec.name else BENCH["experts"]
        return BENCH["dense"]

    return {spec.name: (pick(spec), spec.ne) for spec in tensor_inventory(g)}


@pytest.mark.parametrize("ggml_type", [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K,
                                       T.IQ4_NL, T.IQ4_XS, T.MXFP4, T.IQ2_XXS, T.IQ2_XS, T.IQ3_S, T.IQ1_M, T.TQ1_0,
                                       T.F16, T.BF16, T.F32])
def test_canonical_bytes_equal_what_repack_produces(rng, ggml_type):
    ne = (512, 3)
    raw = random_blocks(ggml_type, math.prod(ne), rng)
    held = repack(raw, ggml_type, ne)
    nbytes = held.nbytes if isinstance(held, np.ndarray) else held.nbytes
    assert tensor_bytes(ggml_type, ne) == nbytes


def test_session_state_matches_the_model_doc():
    # models/qwen4exp.md section 4: 24 KiB of bf16 K+V per token over 12 layers; GDN state 36 x 786432 fp32.
    g = released("qwen4exp")
    plan = memory_plan(g, bench_tensors(g), 262144, KV.BF16)
    assert plan.vram["KV cache (bf16)"] == 262144 * 24 * 1024 + 12 * 4 * 1024  # + the page tables
    assert plan.vram["GDN recurrent + conv state"] == 36 * 4 * (48 * 128 * 128 + 3 * 10240)
    # f32 raw keys per token and f32 pooled keys per 4 tokens, as the QSA kernels keep them.
    assert plan.vram["QSA indexer keys"] == 12 * 262144 * 128 * (4 + 1)
    assert plan.mapped["n-gram table"] > 0 and "n-gram table" not in plan.vram
    # The quantized formats hold, per element of a K or V row: INT8 one byte, Q4 half a byte, each plus an fp16
    # scale per 32 elements; K8V4 keys as INT8 and values as Q4.
    page_tables = 12 * 4 * 1024  # one int32 per 256-token page
    per_element = {KV.INT8: (1 + 2 / 32, 1 + 2 / 32), KV.Q4: (0.5 + 2 / 32, 0.5 + 2 / 32),
                   KV.K8V4: (1 + 2 / 32, 0.5 + 2 / 32)}
    for kv, (key, value) in per_element.items():
        plan = memory_plan(g, bench_tensors(g), 262144, kv)
        assert plan.vram[f"KV cache ({kv.value})"] == 262144 * 12 * 512 * (key + value) + page_tables, kv
        assert plan.vram["QSA indexer keys"] == 12 * 262144 * 128 * (4 + 1), kv  # f32 in every KV format


def test_routed_experts_go_to_host_and_the_rest_to_vram():
    g = released("qwen4exp")
    tensors = bench_tensors(g)
    plan = memory_plan(g, tensors, 4096)
    experts = sum(tensor_bytes(t, ne) for name, (t, ne) in tensors.items() if "_exps." in name)
    assert plan.host["routed experts"] == experts
    # 48 layers x 512 experts x 2560 x 640 per matrix: gate and up in the Q4_K form (4 bits + fp16 d and
    # -dmin per 256 + int8 scale and min per 32 = 4.625 bits), down in Q4_0 (4.5 bits).
    n = 48 * 512 * 2560 * 640
    assert experts == 2 * n * 4.625 / 8 + n * 4.5 / 8


def test_context_outside_the_model_is_refused():
    g = released("qwen4exp")
    with pytest.raises(strata.InvalidArgument, match="context 300000 is outside 1..262144"):
        memory_plan(g, bench_tensors(g), 300000)


def test_too_big_says_what_would_fit():
    g = released("qwen4exp")
    tensors = bench_tensors(g)
    free = 9 * GIB
    options = {kv: largest_context(g, tensors, kv, free) for kv in KV}
    assert options[KV.Q4] > options[KV.K8V4] > options[KV.INT8] > options[KV.BF16] > 0
    assert memory_plan(g, tensors, options[KV.BF16], KV.BF16).vram_total <= free
    with pytest.raises(strata.OutOfMemory, match=rf"GPU 0 has 9\.00 GiB free; the plan of context 262144 with kv=bf16 "
                                                  rf".*would fit: context <= {options[KV.BF16]} with kv=bf16, "
                                                  rf"context <= {options[KV.INT8]} with kv=int8, "
                                                  rf"context <= {options[KV.K8V4]} with kv=k8v4, "
                                                  rf"context <= {options[KV.Q4]} with kv=q4"):
        check_fits(g, tensors, 262144, KV.BF16, vram_free=free, device=0)
    resident = memory_plan(g, tensors, 256, KV.BF16).vram["dense weights"]  # a loaded model's share
    with pytest.raises(strata.OutOfMemory, match=rf"{resident / GIB:.2f} GiB of it in place\); would fit: context <= "
                                                  rf"{options[KV.BF16]} with kv=bf16"):
        check_fits(g, tensors, 262144, KV.BF16, vram_free=free - resident, device=0, resident=resident)
    assert check_fits(g, tensors, options[KV.BF16], KV.BF16, vram_free=free, device=0).vram_total <= free


def test_host_shortfall_is_named():
    g = released("qwen4exp")
    with pytest.raises(strata.OutOfMemory, match="host RAM: 32.00 GiB available"):
        check_fits(g, bench_tensors(g), 4096, KV.INT8, vram_free=1 << 50, device=0, host_available=32 * GIB)


def test_kv_parse_names_the_choices():
    assert KV.parse("INT8") is KV.INT8
    with pytest.raises(strata.InvalidArgument, match="choose one of bf16, int8, k8v4, q4"):
        KV.parse("fp8")


def test_the_session_arena_layout_is_aligned_disjoint_and_per_layer_kind():
    from strata import _native

    g = released("qwen4exp")
    layout = _native.session_layout(native_geometry(g), 5000, "int8")
    regions = sorted(layout["regions"], key=lambda r: r[2])
    end = 0
    for name, layer, offset, nbytes, place in regions:
        assert offset % 256 == 0 and offset >= end and nbytes > 0 and place == "device", name
        end = offset + nbytes
        if layer >= 0:
            assert name.startswith("gdn") == g.recurrent[layer], (name, layer)
    assert layout["total"] >= end and layout["kv_pages"] == 20  # 5000 tokens in 256-token pages
    with pytest.raises(strata.InvalidArgument, match="context must be > 0"):
        _native.session_layout(native_geometry(g), 0, "int8")
    with pytest.raises(strata.InvalidArgument, match="unknown KV format 'fp8'"):
        _native.session_layout(native_geometry(g), 16, "fp8")
    with pytest.raises(strata.InvalidArgument, match="model geometry: missing hc_rank; unknown hc_ranks"):
        _native.session_layout({**{k: v for k, v in native_geometry(g).items() if k != "hc_rank"}, "hc_ranks": 1},
                               16, "int8")


@pytest.mark.parametrize("arch", ["qwen4exp", "qwen3next", "qwen35moe"])
def test_the_native_geometry_is_the_models_geometry_under_the_cores_field_names(arch):
    from strata import _native

    g = released(arch)
    n = native_geometry(g)
    assert tuple(n) == _native.GEOMETRY_FIELDS
    core_form = {"compress_ratios", "ple_layer", "ple_n_heads"}  # what the core holds in its own form
    assert {name: n[name] for name in n.keys() - core_form} == {name: getattr(g, name) for name in n.keys() - core_form}
    assert n["ple_layer"] == (g.ple_layers[0] if g.ple_layers else -1)
    assert n["ple_n_heads"] == (g.ple.n_heads if g.ple else 0)
    assert n["compress_ratios"] == ([g.qsa_ratio(layer) for layer in range(g.n_layer)] if g.qsa_block else [])


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("n_layer", "48", "int"), ("rms_eps", "1e-6", "float"), ("recurrent", 3, "list"),
    ("compress_ratios", [4, None], "list"), ("n_embd", 1 << 40, "int"),
])
def test_a_geometry_field_that_does_not_convert_is_named(field, value, expected):
    from strata import _native

    geometry = {**native_geometry(released("qwen4exp")), field: value}
    message = f"model geometry: {field}: {expected} expected, got {value!r}"
    with pytest.raises(strata.InvalidArgument, match=re.escape(message)):
        _native.session_layout(geometry, 16, "int8")


@pytest.mark.parametrize("kv", list(KV))
def test_kv_streaming_moves_the_kv_and_raw_keys_to_the_host_and_keeps_a_window_of_the_selection(kv):
    from strata import _native

    g = released("qwen4exp")
    layout = _native.session_layout(native_geometry(g), 262144, kv.value, 2, True)
    resident = _native.session_layout(native_geometry(g), 262144, kv.value, 2, False)
    places = {}
    for name, layer, offset, nbytes, place in layout["regions"]:
        places.setdefault(name, set()).add(place)
    host_names = ("kv keys", "kv values", "indexer raw keys")
    assert all(places[name] == ({"host"} if name in host_names else {"device"}) for name in places)
    by_name = {}
    for name, _layer, _offset, nbytes, _place in layout["regions"]:
        by_name[name] = by_name.get(name, 0) + nbytes
    moved = sum(n for name, _l, _o, n, _p in resident["regions"] if name in host_names)
    assert layout["host_total"] >= moved and sum(by_name[name] for name in host_names) == moved
    # Per layer a window of keep_blocks + 2 QSA blocks of 4 tokens: 514 x 4 x 2 kv heads x 256 dims per half.
    assert layout["window_slots"] == 2048 // 4 + 2
    key, value = {KV.BF16: (2, 2), KV.INT8: (1 + 2 / 32,) * 2, KV.K8V4: (1 + 2 / 32, 0.5 + 2 / 32),
                  KV.Q4: (0.5 + 2 / 32,) * 2}[kv]
    rows = 12 * 514 * 4 * 512  # elements of each half of the 12 windows
    assert rows * (key + value) < by_name["kv window"] < rows * (key + value) + 12 * (65536 + 3 * 514 + 1024) * 4
    # VRAM: what the session held there less what moved to the host, plus the windows (regions start at 256 bytes).
    assert abs(layout["total"] - (resident["total"] - moved + by_name["kv window"])) <= 256 * 4 * 12
    plan = memory_plan(g, bench_tensors(g), 262144, kv, kv_streaming=True)
    assert plan.host[f"KV host copy ({kv.value})"] == by_name["kv keys"] + by_name["kv values"]
    assert f"KV cache ({kv.value})" in plan.vram and f"KV window ({kv.value})" in plan.vram


def test_kv_streaming_is_refused_where_attention_has_no_indexer_and_widens_the_largest_context():
    from strata import _native

    g = released("qwen3next")
    with pytest.raises(strata.InvalidArgument, match="no indexer and read every cell"):
        _native.session_layout(native_geometry(g), 4096, "int8", 0, True)
    g = released("qwen4exp")
    tensors = bench_tensors(g)
    free = memory_plan(g, tensors, 65536, KV.INT8).vram_total
    resident = largest_context(g, tensors, KV.INT8, free)
    streamed = largest_context(g, tensors, KV.INT8, free, kv_streaming=True)
    assert resident == 65536 and streamed > 2 * resident
    assert memory_plan(g, tensors, streamed, KV.INT8, kv_streaming=True).vram_total <= free
    if streamed < g.context_length:
        assert memory_plan(g, tensors, streamed + 256, KV.INT8, kv_streaming=True).vram_total > free
    with pytest.raises(strata.OutOfMemory, match="with kv=int8 and KV streaming"):
        check_fits(g, tensors, 262144, KV.BF16, vram_free=free - (1 << 30), device=0)
    # The prompt path's buffer of one attention layer's whole KV: only under streaming.
    from strata.runtime.plan import prompt_scratch_bytes

    one_layer = 262144 * 512 * 2 * (1 + 2 / 32)
    assert (prompt_scratch_bytes(g, 4096, 262144, KV.INT8, True) - prompt_scratch_bytes(g, 4096, 262144, KV.INT8)
            == pytest.approx(one_layer, abs=512))


@pytest.mark.gpu
@pytest.mark.parametrize("arch, streaming", [("qwen4exp", False), ("qwen4exp", True), ("qwen3next", False)])
@pytest.mark.hooks
def test_a_reset_arena_holds_an_empty_sequence(arch, streaming):
    from strata import _native_check

    g = released(arch)
    arena = _native_check.SessionArena(native_geometry(g), 1000, "int8", kv_streaming=streaming)
    arena.fill(0xFF)  # poison: what reset misses stays 0xFF
    arena.reset()
    data = arena.download()
    for name, layer, offset, nbytes, place in arena.layout["regions"]:
        if place == "host":  # the streamed KV: indexed by position, zeroed once at allocation
            continue
        region = data[offset:offset + nbytes]
        if name == "kv page table":
            assert np.array_equal(region.view(np.int32), np.arange(arena.layout["kv_pages"])), layer
        else:
            assert not region.any(), (name, layer)


@pytest.mark.hooks
def test_an_arena_without_a_gpu_names_the_device():
    from strata import _native, _native_check

    if _native.device_count() > 0:
        pytest.skip("a CUDA device is present")
    with pytest.raises(strata.InvalidArgument, match="device index 0 out of range: 0 CUDA device"):
        _native_check.SessionArena(native_geometry(released("qwen3next")), 64, "bf16")


def test_state_snapshots_are_planned_as_copies_of_the_recurrent_state():
    g = released("qwen4exp")
    tensors = bench_tensors(g)
    none = memory_plan(g, tensors, 4096, KV.INT8, snapshots=0)
    two = memory_plan(g, tensors, 4096, KV.INT8, snapshots=2)
    assert "state snapshots" not in none.vram
    # GDN recurrent + conv state (36 layers) and the PLE conv history (dilation 3 x (kernel 4 - 1) rows of the
    # 4 x 2560 streams), each region rounded up to 256 bytes; KV and indexer keys are indexed by position.
    gdn = 36 * (4 * 48 * 128 * 128 + -(-4 * 3 * 10240 // 256) * 256)
    ple = -(-4 * 9 * 4 * 2560 // 256) * 256
    assert two.vram["state snapshots"] == 2 * (gdn + ple)
    assert two.vram_total - none.vram_total == two.vram["state snapshots"]
    with pytest.raises(strata.InvalidArgument, match="state snapshots must be in 0..64"):
        memory_plan(g, tensors, 4096, KV.INT8, snapshots=65)


def test_the_scratch_grows_with_the_context_as_its_parts_say():
    from strata.runtime.plan import scratch_bytes

    g = released("qwen4exp")
    n = native_geometry(g)
    smallest_block = min(r for r, recurrent in zip(n["compress_ratios"], n["recurrent"]) if not recurrent)
    short, long = 4096, 262144
    grown = scratch_bytes(g, long) - scratch_bytes(g, short)
    # per token: the penalty's history (int32), the RoPE cos and sin tables (rope_dim / 2 floats each); per block
    # of the smallest QSA block size, one float of scores
    want = (long - short) * (4 + 4 * n["rope_dim"]) + (long - short) // smallest_block * 4
    assert 0 <= grown - want <= 4 * 256, (grown, want)  # each of the four buffers rounds up to 256 bytes
    assert memory_plan(g, bench_tensors(g), long).vram["scratch"] == scratch_bytes(g, long)
    assert scratch_bytes(g, 4000) == scratch_bytes(g, 4096)  # whole KV pages, as the session's arena


@pytest.mark.gpu
@pytest.mark.parametrize("n_vocab", [512, 151936, 248320])
def test_the_sampler_bound_covers_the_device_figure(n_vocab):
    from strata import _native
    from strata.runtime.plan import sampler_bound

    assert 0 < _native.sampler_workspace_bytes(n_vocab) <= sampler_bound(n_vocab)


@pytest.mark.gpu
@pytest.mark.parametrize("context", [256, 4096])
def test_a_session_takes_the_vram_its_plan_says(tmp_path, context):
    from strata.devices import free_memory
    from strata.runtime.model import load
    from strata.runtime.plan import file_tensors
    from strata.synth import synthesize
    from support.native_session import open_native_session

    path = tmp_path / "tiny.gguf"
    synthesize(path, "qwen4exp", seed=3)
    with load(path, progress=False, expert_cache=0) as model:
        g = model.info.geometry
        plan = memory_plan(g, file_tensors(model.file), context, KV.BF16, snapshots=2)
        need = plan.vram_total - plan.vram["dense weights"] - plan.vram["allocation slack"]
        before = free_memory(0)
        native = open_native_session(model, context=context, kv="bf16", snapshots=2)
        used = before - free_memory(0)
        native.close()
    # Allocations round up to the driver's 2 MiB pages, and the session's streams take a little: within the plan's
    # allocation slack, and its buffers within 8 MiB of what the device gave.
    assert used <= need + plan.vram["allocation slack"] and need <= used + (8 << 20), (context, used, need)
