"""strata.models: released geometries, metadata round trip, inventories, and refusal of impossible values."""

from __future__ import annotations

import dataclasses

import pytest

from strata.errors import FormatError
from strata.models import (ARCHITECTURES, Role, geometry_from_metadata, metadata_for, mtp_inventory, mtp_optional,
                           mtp_specs, released, tensor_alternatives, tensor_inventory, tensor_specs)


def _kv(g) -> dict:
    """The metadata of a file of g: its architecture keys and, as in every converted file, a token list."""
    return {**{key: value for key, value, _ in metadata_for(g)}, "tokenizer.ggml.tokens": ["t"] * g.n_vocab}


@pytest.mark.parametrize("arch, count", [("qwen4exp", 1224), ("qwen3next", 843), ("qwen35moe", 733)])
def test_released_inventory_counts(arch: str, count: int) -> None:
    specs = tensor_inventory(released(arch))
    assert len(specs) == count
    assert len({s.name for s in specs}) == count, "tensor names must be unique"


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_metadata_round_trip(arch: str) -> None:
    g = released(arch)
    assert geometry_from_metadata(_kv(g)) == g


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_an_mtp_block_is_counted_by_block_count_not_by_the_main_layers(arch: str) -> None:
    g = dataclasses.replace(released(arch), n_mtp=1)
    kv = _kv(g)
    assert kv[f"{arch}.block_count"] == g.n_layer + 1 and kv[f"{arch}.nextn_predict_layers"] == 1
    assert geometry_from_metadata(kv) == g
    assert tensor_inventory(g) == tensor_inventory(released(arch))  # the main model's tensors, as without it
    block = {s.name: s for s in mtp_inventory(g)}
    n = g.n_layer
    assert block[f"blk.{n}.nextn.eh_proj.weight"].ne == (2 * g.n_embd, g.n_embd)
    assert block[f"blk.{n}.ffn_gate_exps.weight"].role is Role.ROUTED_EXPERT
    assert block[f"blk.{n}.nextn.hnorm.weight"].forced_f32 and f"blk.{n}.attn_qkv.weight" not in block
    assert [s.name for s in mtp_optional(g)] == [f"blk.{n}.nextn.embed_tokens.weight",
                                                 f"blk.{n}.nextn.shared_head_head.weight"]
    assert set(mtp_specs(g)) == {*block, *(s.name for s in mtp_optional(g)), f"blk.{n}.ffn_gate_up_exps.weight"}
    assert not set(mtp_specs(g)) & set(tensor_specs(g))   # the GPU engine's specs hold none of the block's


def test_qwen4exps_mtp_block_as_llama_cpps_converter_writes_it() -> None:
    """32 tensors (the released MTP files' count): an attention layer with its HC mixers and QSA indexer, the
    input projection and norms (the hidden one over every stream), the block's own output mixer, no final norm;
    the compress ratios have an entry for the block, 0."""
    g = dataclasses.replace(released("qwen4exp"), n_mtp=1)
    block = {s.name: s for s in mtp_inventory(g)}
    assert len(block) == 32
    p = "blk.48."
    assert block[p + "nextn.hnorm.weight"].ne == (4 * 2560,) and block[p + "nextn.enorm.weight"].ne == (2560,)
    assert block[p + "nextn.hc_head_norm.weight"].forced_f32
    assert block[p + "nextn.hc_head_down.weight"].ne == (10240, 320) and p + "nextn.hc_head_inject.weight" not in block
    assert block[p + "indexer.q_proj.weight"].ne == (2560, 512) and block[p + "hc_attn_inject.weight"].ne == (10240, 4)
    assert p + "nextn.shared_head_norm.weight" not in block
    kv = _kv(g)
    assert kv["qwen4exp.attention.compress_ratios"] == [*g.compress_ratios, 0]
    assert geometry_from_metadata({**kv, "qwen4exp.attention.compress_ratios": list(g.compress_ratios)}) == g
    assert geometry_from_metadata({**kv, "qwen4exp.attention.compress_ratios": [*g.compress_ratios, 4]}) == g
    with pytest.raises(FormatError, match="0 or 4 for the MTP blocks"):
        geometry_from_metadata({**kv, "qwen4exp.attention.compress_ratios": [*g.compress_ratios, 8]})


def test_an_mtp_block_is_refused_where_there_is_none() -> None:
    with pytest.raises(FormatError, match="qwen35moe: the file has no MTP block"):
        mtp_inventory(released("qwen35moe"))
    assert mtp_specs(released("qwen35moe")) == {}


def test_qwen4exp_released_shapes_and_dtypes() -> None:
    specs = {s.name: s for s in tensor_inventory(released("qwen4exp"))}
    assert specs["per_layer_token_embd.weight"].ne == (160, 320001536)
    assert specs["blk.3.attn_q.weight"].ne == (2560, 12288)
    assert specs["blk.0.attn_qkv.weight"].ne == (2560, 10240)
    assert specs["blk.0.ffn_down_exps.weight"].ne == (640, 2560, 512)
    assert specs["blk.1.ple_key.weight"].ne == (2560, 10240)
    forced = {n for n, s in specs.items() if s.forced_f32}
    for name in ("blk.0.ssm_a", "blk.0.ssm_conv1d.weight", "blk.0.ffn_gate_inp.weight", "blk.3.indexer.q_norm.weight",
                 "blk.1.ple_norm_key.weight", "output_hc_norm.weight", "blk.0.ssm_dt.bias"):
        assert name in forced, name
    assert not specs["blk.1.ple_conv1d.weight"].forced_f32          # outtype (qwen4exp.md §2.2)
    assert not specs["blk.3.indexer.q_proj.weight"].quantizable     # llama-quantize leaves it alone
    assert specs["blk.0.ffn_gate_exps.weight"].quantizable
    assert all(not s.quantizable for s in specs.values() if s.forced_f32)


def test_qwen3next_alternatives_cover_merged_experts_and_legacy_ssm_in() -> None:
    g = released("qwen3next")
    names = {a.spec.name: a for a in tensor_alternatives(g)}
    assert names["blk.0.ffn_gate_up_exps.weight"].spec.ne == (2048, 1024, 512)
    assert names["blk.0.ssm_in.weight"].spec.ne == (2048, 12288)
    assert "blk.3.ssm_in.weight" not in names        # attention layer


def test_vocab_from_tokens_unless_vocab_size_is_given() -> None:
    g = released("qwen3next")
    kv = _kv(g)
    assert "qwen3next.vocab_size" not in kv        # llama.cpp's converter leaves it to the token list
    assert geometry_from_metadata(kv).n_vocab == g.n_vocab
    kv["qwen3next.vocab_size"] = g.n_vocab + 64    # llama.cpp's loader reads the key first
    assert geometry_from_metadata(kv).n_vocab == g.n_vocab + 64
    del kv["qwen3next.vocab_size"], kv["tokenizer.ggml.tokens"]
    with pytest.raises(FormatError, match="vocabulary size is unknown"):
        geometry_from_metadata(kv)


def test_zero_compress_ratio_on_attention_layer_is_kept() -> None:
    g = released("qwen4exp")
    kv = _kv(g)
    kv["qwen4exp.attention.compress_ratios"] = [0] * g.n_layer
    assert geometry_from_metadata(kv).compress_ratios == (0,) * g.n_layer


@pytest.mark.parametrize("ratio, budget", [(1, 2048), (3, 2046), (8, 2048), (2048, 2048)])
def test_any_qsa_block_that_divides_the_budget_is_read(ratio: int, budget: int) -> None:
    g = released("qwen4exp")
    kv = _kv(g)
    kv["qwen4exp.attention.compress_ratios"] = [0 if r else ratio for r in g.recurrent]
    kv["qwen4exp.attention.indexer.top_k"] = budget
    got = geometry_from_metadata(kv)
    assert {got.qsa_ratio(layer) for layer in got.attention_layers} == {ratio}


@pytest.mark.parametrize("arch", ["qwen4exp", "qwen3next", "qwen35moe"])
def test_the_output_gate_key_is_written_only_where_it_departs_from_the_architecture(arch: str) -> None:
    g = released(arch)
    assert not any(key.endswith("output_gate_type") for key in _kv(g))
    other = dataclasses.replace(g, gdn_sigmoid_gate=not g.gdn_sigmoid_gate)
    kv = _kv(other)
    assert kv[f"{arch}.ssm.output_gate_type"] == ("sigmoid" if other.gdn_sigmoid_gate else "silu")
    assert geometry_from_metadata(kv) == other


def test_recurrent_pattern_without_interval_writes_the_list() -> None:
    g = dataclasses.replace(released("qwen35moe"), recurrent=(True, False) * 20)
    kv = _kv(g)
    assert kv["qwen35moe.full_attention_interval"] == 2
    assert "qwen35moe.attention.recurrent_layers" not in kv      # as llama.cpp's converter: the interval only
    assert all(f"{a}.attention.recurrent_layers" not in _kv(released(a)) for a in ARCHITECTURES)
    g = dataclasses.replace(g, recurrent=(False,) + (True,) * 39)
    kv = _kv(g)
    assert "qwen35moe.full_attention_interval" not in kv
    assert geometry_from_metadata(kv).recurrent == g.recurrent
    # with an MTP block the list has one entry per block, as llama.cpp's loader reads it: the block's is False
    g = dataclasses.replace(g, n_mtp=1)
    kv = _kv(g)
    assert kv["qwen35moe.attention.recurrent_layers"] == [*g.recurrent, False]
    assert geometry_from_metadata(kv) == g
    assert geometry_from_metadata({**kv, "qwen35moe.attention.recurrent_layers": list(g.recurrent)}) == g
    kv["qwen35moe.attention.recurrent_layers"] = [*g.recurrent, True]
    with pytest.raises(FormatError, match="False for the MTP blocks"):
        geometry_from_metadata(kv)


# (architecture, key, bad value, fragment of the message)
IMPOSSIBLE = [
    ("qwen4exp", "qwen4exp.block_count", 0, "block_count"),
    ("qwen4exp", "qwen4exp.embedding_length", -5, "embedding_length"),
    ("qwen4exp", "qwen4exp.attention.head_count_kv", 5, "a divisor of attention.head_count"),
    ("qwen4exp", "qwen4exp.rope.dimension_count", 512, "<= attention.key_length"),
    ("qwen4exp", "qwen4exp.rope.dimension_count", 63, "an even number"),
    ("qwen4exp", "qwen4exp.attention.value_length", 128, "equal to attention.key_length"),
    ("qwen4exp", "qwen4exp.expert_used_count", 513, "<= expert_count"),
    ("qwen4exp", "qwen4exp.attention.recurrent_layers", [True] * 47, "48 bools"),
    ("qwen4exp", "qwen4exp.attention.recurrent_layers", [1] * 48, "array of bools"),
    ("qwen4exp", "qwen4exp.ple.layers", [3], "GDN layer"),
    ("qwen4exp", "qwen4exp.ple.layers", [1, 2], "exactly one PLE layer"),
    ("qwen4exp", "qwen4exp.ple.head_vocab_sizes", [5] * 15, "16 integers"),
    ("qwen4exp", "qwen4exp.ple.layer_multipliers", [1, 2], "3 integers"),
    ("qwen4exp", "qwen4exp.ple.head_offsets", list(range(16)), "running sums"),
    ("qwen4exp", "qwen4exp.ple.eos_token_id", 248320, "token id < 248320"),
    ("qwen4exp", "qwen4exp.embedding_length_per_layer_input", 150, "embedding_length / 16"),
    ("qwen4exp", "qwen4exp.attention.indexer.key_length", 32, ">= rope.dimension_count"),
    ("qwen4exp", "qwen4exp.attention.indexer.top_k", 2047, "multiple of layer 3's QSA block of 4 tokens"),
    ("qwen4exp", "qwen4exp.attention.compress_ratios", [4] * 48, "0 at layer 0"),
    ("qwen4exp", "qwen4exp.attention.compress_ratios", [0, 0, 0, -8] * 12, "integers >= 0"),
    ("qwen4exp", "qwen4exp.attention.compress_ratios", [0, 0, 0, 4096] * 12, "QSA block of 4096 tokens"),
    ("qwen4exp", "qwen4exp.ssm.output_gate_type", "relu", "one of 'sigmoid', 'silu'"),
    ("qwen3next", "qwen3next.ssm.output_gate_type", 1, "one of 'sigmoid', 'silu'"),
    ("qwen4exp", "qwen4exp.hyper_connection.count", 1, ">= 2"),
    ("qwen4exp", "qwen4exp.attention.layer_norm_rms_epsilon", float("nan"), "finite"),
    ("qwen4exp", "qwen4exp.rope.dimension_sections", [11, 11, 10], "4 integers"),
    ("qwen4exp", "qwen4exp.context_length", "long", "an integer"),
    ("qwen35moe", "qwen35moe.ssm.time_step_rank", 8, "a multiple of ssm.group_count"),
    ("qwen35moe", "qwen35moe.ssm.inner_size", 4097, "a multiple of ssm.time_step_rank"),
    ("qwen35moe", "qwen35moe.rope.dimension_sections", [11, 11, 11, 0], "summing to"),
    ("qwen3next", "qwen3next.block_count", 10**9, "main layers"),
    ("qwen3next", "general.architecture", "llama", "one of"),
]


@pytest.mark.parametrize("arch, key, value, fragment", IMPOSSIBLE)
def test_impossible_hyperparameters_are_refused(arch: str, key: str, value, fragment: str) -> None:
    kv = _kv(released(arch))
    kv[key] = value
    with pytest.raises(FormatError) as info:
        geometry_from_metadata(kv)
    assert fragment in str(info.value) and (key in str(info.value) or key == "general.architecture"), str(info.value)


def test_missing_required_key_is_named() -> None:
    kv = _kv(released("qwen4exp"))
    del kv["qwen4exp.ssm.group_count"]
    with pytest.raises(FormatError, match="'qwen4exp.ssm.group_count' is required"):
        geometry_from_metadata(kv)
