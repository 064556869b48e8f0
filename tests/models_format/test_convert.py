"""strata.convert on tiny random transformers checkpoints, checked tensor by tensor against the HF state dict.

The expected GGUF values are derived here from the in-memory HF model with the transforms of
docs/models/qwen4exp.md §2.3 and qwen3next.md §2.4, written out independently (index lists,
not the converter's reshapes).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")

from support.llamacpp_layout import expected_layout, type_of_class, value_type  # noqa: E402
from strata.convert import convert  # noqa: E402

T = gguf.GGMLQuantizationType
H, HK, HV, DK, DV = 64, 2, 6, 16, 16      # hidden, GDN key/value heads (r = 3, as released qwen4exp), head dims
FF, N_EXPERT, VOCAB = 32, 4, 512


def _rope(sections: bool) -> dict:
    rope = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}
    if sections:  # head_dim 32 * 0.25 = 8 rotary dims = 4 frequencies
        rope.update(mrope_section=[2, 1, 1], mrope_interleaved=True)
    return rope


def _common(n_v_heads: int) -> dict:
    return dict(vocab_size=VOCAB, hidden_size=H, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                head_dim=32, linear_key_head_dim=DK, linear_value_head_dim=DV, linear_num_key_heads=HK,
                linear_num_value_heads=n_v_heads, moe_intermediate_size=FF, shared_expert_intermediate_size=FF,
                num_experts=N_EXPERT, num_experts_per_tok=2, eos_token_id=3, bos_token_id=3)


def _model(arch: str):
    if arch == "qwen4exp":
        from transformers.models.qwen4_exp import Qwen4ExpTextConfig
        from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpForCausalLM
        cfg = Qwen4ExpTextConfig(
            **_common(HV), hc_lowrank=16, ple_layer_ids=[2], ple_embed_dim=H, ngram_vocab_size_base=100,
            split_ngram_parts=4, indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=32, indexer_budget=8,
            indexer_compress_ratio=4, output_gate_type="sigmoid", rope_parameters=_rope(True))
        return Qwen4ExpForCausalLM(cfg)
    if arch == "qwen3next":
        from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
        return Qwen3NextForCausalLM(Qwen3NextConfig(**_common(4), intermediate_size=96, rope_parameters=_rope(False)))
    from transformers.models.qwen3_5_moe import Qwen3_5MoeTextConfig
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeForCausalLM
    return Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(**_common(HV), rope_parameters=_rope(True)))


def _randomize(model, seed: int) -> dict[str, np.ndarray]:
    """Every float parameter random (norm gammas too, so a missing +1 shows); the int64 PLE buffers kept."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return {k.removeprefix("model."): v.detach().numpy().copy() for k, v in model.state_dict().items()}


def _tiled(n_k: int, n_v: int) -> list[int]:
    """GGUF v-head j = i*Hk + g holds HF head g*r + i."""
    r = n_v // n_k
    return [g * r + i for i in range(r) for g in range(n_k)]


def _head_rows(heads: list[int], size: int) -> np.ndarray:
    return np.array([h * size + e for h in heads for e in range(size)])


def _expected(arch: str, sd: dict[str, np.ndarray], n_v: int) -> dict[str, np.ndarray]:
    exp: dict[str, np.ndarray] = {"token_embd.weight": sd["embed_tokens.weight"], "output.weight": sd["lm_head.weight"]}
    reorder = arch != "qwen3next"
    vh = _tiled(HK, n_v) if reorder else list(range(n_v))
    v_rows = _head_rows(vh, DV)
    if arch == "qwen4exp":
        hc = "hyper_connection_mixer."
        exp.update({"output_hc_norm.weight": sd[hc + "hc_norm.weight"] + 1,
                    "output_hc_down.weight": sd[hc + "input_mix_weight_down.weight"],
                    "output_hc_up.weight": sd[hc + "input_mix_weight_up.weight"]})
    else:
        exp["output_norm.weight"] = sd["norm.weight"] + 1
    for l in range(4):
        L, b = f"layers.{l}.", f"blk.{l}."
        gu, down = sd[L + "mlp.experts.gate_up_proj"], sd[L + "mlp.experts.down_proj"]
        exp.update({b + "ffn_gate_inp.weight": sd[L + "mlp.gate.weight"],
                    b + "ffn_gate_exps.weight": gu[:, :FF], b + "ffn_up_exps.weight": gu[:, FF:],
                    b + "ffn_down_exps.weight": down,
                    b + "ffn_gate_inp_shexp.weight": sd[L + "mlp.shared_expert_gate.weight"]})
        for p in ("gate", "up", "down"):
            exp[b + f"ffn_{p}_shexp.weight"] = sd[L + f"mlp.shared_expert.{p}_proj.weight"]
        if arch == "qwen4exp":
            for g_name, h_name in (("attn", "attn"), ("ffn", "mlp")):
                P = L + h_name + "_hyper_connection."
                exp.update({b + f"hc_{g_name}_norm.weight": sd[P + "hc_norm.weight"] + 1,
                            b + f"hc_{g_name}_down.weight": sd[P + "input_mix_weight_down.weight"],
                            b + f"hc_{g_name}_up.weight": sd[P + "input_mix_weight_up.weight"],
                            b + f"hc_{g_name}_inject.weight": sd[P + "block_inject_weight.weight"]})
        else:
            exp[b + "attn_norm.weight"] = sd[L + "input_layernorm.weight"] + 1
            exp[b + "post_attention_norm.weight"] = sd[L + "post_attention_layernorm.weight"] + 1
        if l == 3:
            A = L + "self_attn."
            for g_name, h_name in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("output", "o_proj")):
                exp[b + f"attn_{g_name}.weight"] = sd[A + h_name + ".weight"]
            exp[b + "attn_q_norm.weight"] = sd[A + "q_norm.weight"] + 1
            exp[b + "attn_k_norm.weight"] = sd[A + "k_norm.weight"] + 1
            if arch == "qwen4exp":
                qk = sd[A + "indexer.index_qk_proj.weight"]
                exp.update({b + "indexer.q_proj.weight": qk[:64], b + "indexer.k_proj.weight": qk[64:],
                            b + "indexer.q_norm.weight": sd[A + "indexer.q_layernorm.weight"] + 1,
                            b + "indexer.k_norm.weight": sd[A + "indexer.k_layernorm.weight"] + 1})
            continue
        G = L + "linear_attn."
        kd = HK * DK
        if arch == "qwen3next":
            w = sd[G + "in_proj_qkvz.weight"]
            per = 2 * DK + 2 * (n_v // HK) * DV
            q = [w[g * per + e] for g in range(HK) for e in range(DK)]
            k = [w[g * per + DK + e] for g in range(HK) for e in range(DK)]
            v = [w[g * per + 2 * DK + e] for g in range(HK) for e in range((n_v // HK) * DV)]
            z = [w[g * per + 2 * DK + (n_v // HK) * DV + e] for g in range(HK) for e in range((n_v // HK) * DV)]
            exp[b + "attn_qkv.weight"] = np.stack(q + k + v)
            exp[b + "attn_gate.weight"] = np.stack(z)
            exp[b + "ssm_ba.weight"] = sd[G + "in_proj_ba.weight"]
        else:
            qkv = sd[G + "in_proj_qkv.weight"]
            exp[b + "attn_qkv.weight"] = np.concatenate([qkv[:2 * kd], qkv[2 * kd:][v_rows]])
            exp[b + "attn_gate.weight"] = sd[G + "in_proj_z.weight"][v_rows]
            exp[b + "ssm_beta.weight"] = sd[G + "in_proj_b.weight"][vh]
            exp[b + "ssm_alpha.weight"] = sd[G + "in_proj_a.weight"][vh]
        conv = sd[G + "conv1d.weight"][:, 0, :]
        exp[b + "ssm_conv1d.weight"] = np.concatenate([conv[:2 * kd], conv[2 * kd:][v_rows]])
        exp[b + "ssm_dt.bias"] = sd[G + "dt_bias"][vh]
        exp[b + "ssm_a"] = -np.exp(sd[G + "A_log"][vh])
        exp[b + "ssm_norm.weight"] = sd[G + "norm.weight"]  # no +1
        exp[b + "ssm_out.weight"] = sd[G + "out_proj.weight"][:, v_rows]
        if arch == "qwen4exp" and l == 1:
            P = L + "ple."
            exp.update({b + "ple_key.weight": sd[P + "key_proj.weight"], b + "ple_value.weight": sd[P + "value_proj.weight"],
                        b + "ple_norm_key.weight": sd[P + "norm_key.weight"] + 1,
                        b + "ple_norm_query.weight": sd[P + "norm_query.weight"] + 1,
                        b + "ple_norm_conv.weight": sd[P + "norm_conv.weight"] + 1,
                        b + "ple_conv1d.weight": sd[P + "conv1d.weight"][:, 0, :]})
            exp["per_layer_token_embd.weight"] = sd[P + "ple_embedding.ngram_embedding.weight"]
    return exp


@pytest.fixture(scope="module", params=["qwen4exp", "qwen3next", "qwen35moe"])
def checkpoint(request, tmp_path_factory):
    arch = request.param
    seed = int(np.random.default_rng().integers(2**31))
    model = _model(arch)
    sd = _randomize(model, seed)
    path = tmp_path_factory.mktemp(arch)
    model.save_pretrained(path)
    n_v = model.config.linear_num_value_heads
    return arch, path, _expected(arch, sd, n_v), seed, model


def _read(path):
    reader = gguf.GGUFReader(path)
    fields = {f.name: f for f in reader.fields.values()}
    return {t.name: t for t in reader.tensors}, fields


def test_f32_matches_transformed_state_dict(checkpoint, tmp_path):
    arch, hf_dir, expected, seed, _ = checkpoint
    out = convert(hf_dir, tmp_path / "m.gguf", outtype="f32")
    tensors, fields = _read(out)
    assert bytes(fields["general.architecture"].parts[-1]).decode() == arch
    assert set(tensors) == set(expected), f"seed {seed}: names differ: {set(tensors) ^ set(expected)}"
    for name, want in expected.items():
        t = tensors[name]
        got = np.asarray(t.data)
        assert t.tensor_type == T.F32, f"{name}: type {t.tensor_type.name}"
        # the converter only copies, reorders and adds 1 / exponentiates in float32: exact equality
        np.testing.assert_array_equal(got.reshape(want.shape), want.astype(np.float32), err_msg=f"{name} seed {seed}")
        assert got.size == want.size


def _table_sizes(hf_dir) -> dict[str, int]:
    """The n-gram table's width and rows (its shards summed), read from the checkpoint with the safetensors package."""
    from safetensors import safe_open
    shapes = []
    for path in sorted(hf_dir.glob("*.safetensors")):
        with safe_open(path, framework="numpy") as f:
            shapes += [f.get_slice(n).get_shape() for n in f.keys() if ".ple_embedding.ngram_embedding." in n]
    return {"ple_table_width": shapes[0][1], "ple_table_rows": sum(s[0] for s in shapes)} if shapes else {}


# llama.cpp's general.file_type for each --outtype (gguf.LlamaFileType)
FILE_TYPES = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16", "q8_0": "MOSTLY_Q8_0"}


@pytest.mark.parametrize("outtype", sorted(FILE_TYPES))
def test_layout_is_llama_cpps_converter(checkpoint, tmp_path, outtype):
    """Tensor for tensor (name, ne, type) and key for key (name, value type) the listing of a llama.cpp-converted
    file in tests/data. No allow-list: every key strata writes is one llama.cpp's converter writes."""
    arch, hf_dir, _, seed, _ = checkpoint
    layout = expected_layout(arch, hf_dir, _table_sizes(hf_dir))
    reader = gguf.GGUFReader(convert(hf_dir, tmp_path / "m.gguf", outtype=outtype))
    otype = T[outtype.upper()]
    got = {t.name: (tuple(int(d) for d in t.shape), t.tensor_type) for t in reader.tensors}
    assert set(got) == set(layout.tensors), f"names differ: {sorted(set(got) ^ set(layout.tensors))}"
    for name, (ne, type_class) in layout.tensors.items():
        assert got[name] == (ne, type_of_class(type_class, ne, otype)), f"{name}: {got[name]}, listed {ne} {type_class}"
    fields = {name: value_type(f) for name, f in reader.fields.items() if not name.startswith("GGUF.")}
    for key, vtype in fields.items():
        entry = layout.key_for(key)
        assert entry is not None, f"{key}: llama.cpp's converter does not write it"
        assert entry.value_type in ("*", vtype), f"{key}: {vtype}, llama.cpp writes {entry.value_type}"
    missing = [k.pattern for k in layout.keys if k.required and k.pattern not in fields]
    assert not missing, f"keys llama.cpp's converter writes are missing: {missing}"
    file_type = gguf.LlamaFileType(int(reader.fields["general.file_type"].parts[-1][0]))
    assert file_type.name == FILE_TYPES[outtype]


def test_q8_0_types_follow_llama_cpp_rules(checkpoint, tmp_path):
    arch, hf_dir, expected, seed, _ = checkpoint
    out = convert(hf_dir, tmp_path / "m.gguf", outtype="q8_0")
    tensors, _ = _read(out)
    for name, t in tensors.items():
        ne0 = int(t.shape[0])
        forced = t.n_elements == ne0 or name.endswith(("_norm.weight", "ffn_gate_inp.weight", "ssm_conv1d.weight", "ssm_a"))
        want = T.F32 if forced else (T.Q8_0 if ne0 % 32 == 0 else T.F16)
        if name.endswith("ffn_gate_inp_shexp.weight"):
            want = T.F32
        assert t.tensor_type == want, f"{name}: {t.tensor_type.name}, expected {want.name}"
        values = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).reshape(expected[name].shape)
        ref = expected[name].astype(np.float32)
        # Q8_0 error is at most half a step (max|block| / 127 / 2) per element; f16 relative 2^-11
        tol = np.abs(ref).max() / 127 if want == T.Q8_0 else (np.abs(ref).max() * 2**-10 if want == T.F16 else 0)
        np.testing.assert_allclose(values, ref, rtol=0, atol=tol, err_msg=f"{name} seed {seed}")


def test_bf16_rounds_to_nearest_even(checkpoint, tmp_path):
    arch, hf_dir, expected, seed, _ = checkpoint
    out = convert(hf_dir, tmp_path / "m.gguf", outtype="bf16")
    tensors, _ = _read(out)
    w = expected["token_embd.weight"].astype(np.float32)
    t = tensors["token_embd.weight"]
    assert t.tensor_type == T.BF16
    got = (np.asarray(t.data).view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(w.shape)
    # bf16 keeps 8 significant bits: relative error <= 2^-9
    np.testing.assert_allclose(got, w, rtol=2**-8, atol=0, err_msg=f"seed {seed}")
    assert tensors["output_norm.weight" if arch != "qwen4exp" else "output_hc_norm.weight"].tensor_type == T.F32


def test_output_passes_strata_format_inspect(checkpoint, tmp_path):
    from strata.format import inspect
    arch, hf_dir, _, seed, model = checkpoint
    with inspect(convert(hf_dir, tmp_path / "m.gguf")) as m:
        assert m.arch == arch and not m.warnings, f"seed {seed}: {m.warnings}"
        assert m.geometry.n_vocab == VOCAB and m.geometry.n_layer == 4
        m.tokenizer()


def test_qwen4exp_layer_types_are_written_per_layer_beside_the_interval(checkpoint, tmp_path):
    """qwen4exp carries its layer types as {arch}.attention.recurrent_layers (one bool per block, what the
    converter exporting them writes) as well as the interval; the other architectures the interval only."""
    arch, hf_dir, _, seed, model = checkpoint
    _, fields = _read(convert(hf_dir, tmp_path / "m.gguf"))
    key = f"{arch}.attention.recurrent_layers"
    assert f"{arch}.full_attention_interval" in fields
    if arch != "qwen4exp":
        assert key not in fields
        return
    assert value_type(fields[key]) == "array[bool]"
    written = [bool(fields[key].parts[i][0]) for i in fields[key].data]
    assert written == [t == "linear_attention" for t in model.config.layer_types], f"seed {seed}"


def test_an_irregular_qwen4exp_layout_is_written_once_as_the_list(tmp_path, caplog):
    from support.hf_models import CONFIGS, hf_model, save_and_convert

    hidden, types = CONFIGS[0]  # attention on layers 2 and 4: no interval reproduces it
    path = save_and_convert(hf_model("qwen4exp", hidden, types), tmp_path, "f32")
    assert "Duplicated key" not in caplog.text  # gguf-py keeps the last of a key written twice, and says so
    reader = gguf.GGUFReader(path)
    names = [f.name for f in reader.fields.values()]
    assert names.count("qwen4exp.attention.recurrent_layers") == 1
    assert "qwen4exp.full_attention_interval" not in names
    field = reader.fields["qwen4exp.attention.recurrent_layers"]
    assert [bool(field.parts[i][0]) for i in field.data] == [t == "linear_attention" for t in types]


def test_sharded_bf16_checkpoint_widens_exactly(tmp_path):
    """bf16 shards + index json: the F32 output equals the bf16 values widened (exact, no rounding)."""
    seed = int(np.random.default_rng().integers(2**31))
    model = _model("qwen4exp")
    _randomize(model, seed)
    model = model.to(torch.bfloat16)
    model.save_pretrained(tmp_path / "hf", max_shard_size="200KB")
    assert (tmp_path / "hf" / "model.safetensors.index.json").exists()
    tensors, _ = _read(convert(tmp_path / "hf", tmp_path / "m.gguf"))
    want = model.state_dict()["lm_head.weight"].float().numpy()
    np.testing.assert_array_equal(np.asarray(tensors["output.weight"].data).reshape(want.shape), want,
                                  err_msg=f"seed {seed}")


def test_errors_name_the_problem(tmp_path, checkpoint):
    import json
    import shutil
    from strata.errors import FormatError, InvalidArgument
    arch, hf_dir, _, _, _ = checkpoint
    with pytest.raises(InvalidArgument, match="outtype"):
        convert(hf_dir, tmp_path / "m.gguf", outtype="q4_k")
    bad = tmp_path / "bad"
    shutil.copytree(hf_dir, bad)
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "model_type": "llama"}))
    with pytest.raises(InvalidArgument, match="llama"):
        convert(bad, tmp_path / "m.gguf")
    (bad / "config.json").write_text(json.dumps({**cfg, "moe_intermediate_size": 2 * FF}))
    with pytest.raises(FormatError, match="ffn_gate_exps.weight.*does not fit"):
        convert(bad, tmp_path / "m.gguf")
    assert not (tmp_path / "m.gguf").exists()


def test_malformed_checkpoint_errors_name_the_file_and_tensor(tmp_path, checkpoint):
    import json
    import shutil
    import struct
    from strata.errors import FormatError
    _, hf_dir, _, _, _ = checkpoint
    bad = tmp_path / "bad"
    shutil.copytree(hf_dir, bad)
    weights = bad / "model.safetensors"
    blob = weights.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    last = max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][1])
    weights.write_bytes(blob[:-100])                       # a download cut short
    with pytest.raises(FormatError, match=rf"model\.safetensors: .*{last}.* ends past the end"):
        convert(bad, tmp_path / "m.gguf")
    weights.write_bytes(blob[:8] + b"x" + blob[9:])          # not JSON
    with pytest.raises(FormatError, match=r"model\.safetensors: not a valid safetensors file"):
        convert(bad, tmp_path / "m.gguf")
    first = min((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
    header[first]["data_offsets"][0] += 4                    # a hole before the first tensor's data
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    weights.write_bytes(struct.pack("<Q", len(text)) + text + blob[8 + n:])
    with pytest.raises(FormatError, match=rf"model\.safetensors: .*{first}"):
        convert(bad, tmp_path / "m.gguf")
    assert not (tmp_path / "m.gguf").exists()


def _mtp_block(arch: str, seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A checkpoint's `mtp.*` tensors (random: the block's layer is another random model's attention layer 3) and
    the GGUF block they convert to, blk.4 (its layer's tensors as layer 3's, the block's own ones written out)."""
    model = _model(arch)
    sd = _randomize(model, seed)
    layer = _expected(arch, sd, model.config.linear_num_value_heads)
    hf = {"mtp.layers.0." + k.removeprefix("layers.3."): v for k, v in sd.items() if k.startswith("layers.3.")}
    want = {"blk.4." + k.removeprefix("blk.3."): v for k, v in layer.items() if k.startswith("blk.3.")}
    rng = np.random.default_rng(seed)

    def r(*shape: int) -> np.ndarray:
        return (0.5 * rng.standard_normal(shape)).astype(np.float32)

    if arch == "qwen4exp":
        wide, rank = 4 * H, 16
        own = {"fc_embedding.weight": r(H, H), "fc_hidden.weight": r(H, H), "pre_fc_norm_embedding.weight": r(H),
               "pre_fc_norm_hidden.weight": r(wide), "hyper_connection_mixer.hc_norm.weight": r(wide),
               "hyper_connection_mixer.input_mix_weight_down.weight": r(rank, wide),
               "hyper_connection_mixer.input_mix_weight_up.weight": r(wide, rank)}
        want.update({"blk.4.nextn.eh_proj.weight": np.hstack([own["fc_embedding.weight"], own["fc_hidden.weight"]]),
                     "blk.4.nextn.hc_head_norm.weight": own["hyper_connection_mixer.hc_norm.weight"] + 1,
                     "blk.4.nextn.hc_head_down.weight": own["hyper_connection_mixer.input_mix_weight_down.weight"],
                     "blk.4.nextn.hc_head_up.weight": own["hyper_connection_mixer.input_mix_weight_up.weight"]})
    else:
        own = {"fc.weight": r(H, 2 * H), "pre_fc_norm_embedding.weight": r(H), "pre_fc_norm_hidden.weight": r(H),
               "norm.weight": r(H)}
        want.update({"blk.4.nextn.eh_proj.weight": own["fc.weight"],
                     "blk.4.nextn.shared_head_norm.weight": own["norm.weight"] + 1})
    want.update({"blk.4.nextn.enorm.weight": own["pre_fc_norm_embedding.weight"] + 1,
                 "blk.4.nextn.hnorm.weight": own["pre_fc_norm_hidden.weight"] + 1})
    hf.update({"mtp." + k: v for k, v in own.items()})
    return hf, want


def test_an_mtp_block_is_kept_where_asked(checkpoint, tmp_path):
    """convert(mtp=True) writes the checkpoint's mtp.* as block n_layer in llama.cpp's layout, value for value;
    by default it drops them as llama.cpp's --no-mtp. The file loads with no warning and the reference drafts
    from it; a checkpoint without a block is refused by name."""
    import json
    import shutil

    from safetensors.numpy import save_file
    from strata.errors import FormatError
    from strata.format import ModelFile
    from strata.reference import Reference
    from strata.reference.mtp import MtpDrafter, MtpReference

    arch, hf_dir, expected, seed, _ = checkpoint
    with pytest.raises(FormatError, match="no MTP block to keep"):
        convert(hf_dir, tmp_path / "none.gguf", mtp=True)
    work = tmp_path / "hf"
    shutil.copytree(hf_dir, work)
    hf, want = _mtp_block(arch, seed + 1)
    save_file({k: np.ascontiguousarray(v) for k, v in hf.items()}, work / "mtp.safetensors")
    cfg = json.loads((work / "config.json").read_text())
    (work / "config.json").write_text(json.dumps({**cfg, "mtp_num_hidden_layers": 1}))

    tensors, _ = _read(convert(work, tmp_path / "plain.gguf"))
    assert set(tensors) == set(expected)
    out = convert(work, tmp_path / "m.gguf", mtp=True)
    tensors, fields = _read(out)
    names = set(expected) | set(want)
    assert set(tensors) == names, f"seed {seed}: {sorted(set(tensors) ^ names)}"
    for name, value in {**expected, **want}.items():
        got = np.asarray(tensors[name].data)
        np.testing.assert_array_equal(got.reshape(value.shape), value.astype(np.float32), err_msg=f"{name} seed {seed}")
    assert int(fields[f"{arch}.block_count"].parts[-1][0]) == 5
    assert int(fields[f"{arch}.nextn_predict_layers"].parts[-1][0]) == 1
    with ModelFile(out) as f:
        assert f.geometry.n_layer == 4 and f.geometry.n_mtp == 1 and not f.warnings, f.warnings
        mtp = MtpReference(Reference(f))
        prompt = np.random.default_rng(seed).integers(0, VOCAB, 5).tolist()
        mtp.forward(prompt)
        assert len(MtpDrafter(mtp).propose(prompt + [1], 2)) == 2
