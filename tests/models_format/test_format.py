"""strata.format.inspect on well-formed files: metadata, geometry, zero-copy tensor views, alternatives, speed."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import gguf
import numpy as np
import pytest

from support.malformed import build_tiny, tiny_geometry
from strata.errors import FormatError
from strata.format import inspect
from strata.models import metadata_for, released, tensor_inventory

T = gguf.GGMLQuantizationType


def test_tiny_file_validates_and_views_match_gguf_reader(tmp_path: Path, rng: np.random.Generator) -> None:
    path = build_tiny(tmp_path / "tiny.gguf", rng)
    reader = gguf.GGUFReader(path)
    with inspect(path) as mf:
        assert mf.arch == "qwen4exp"
        # the file stores the epsilon as float32
        assert mf.geometry == dataclasses.replace(tiny_geometry(), rms_eps=float(np.float32(1e-6)))
        assert mf.warnings == []
        assert set(mf.tensors) == {s.name for s in tensor_inventory(tiny_geometry())}
        for t in reader.tensors:
            raw = mf.raw(t.name)
            assert raw.dtype == np.uint8 and raw.nbytes == mf.tensors[t.name].nbytes
            assert not raw.flags.owndata and not raw.flags.writeable, "raw() must be a read-only view, not a copy"
            assert np.array_equal(raw, np.asarray(t.data).view(np.uint8).reshape(-1)), t.name
        assert mf.tensors["blk.0.ffn_up_exps.weight"].ggml_type == T.Q8_0
        with pytest.raises(FormatError, match="no tensor named 'nope'"):
            mf.raw("nope")
    with pytest.raises(FormatError, match="closed"):
        mf.raw("token_embd.weight")


def test_merged_expert_gate_up_is_accepted(tmp_path: Path, rng: np.random.Generator) -> None:
    g = tiny_geometry()
    merged = {f"blk.{i}.ffn_gate_up_exps.weight": (g.n_embd, 2 * g.expert_ff, g.n_expert) for i in range(g.n_layer)}
    split = tuple(f"blk.{i}.ffn_{k}_exps.weight" for i in range(g.n_layer) for k in ("gate", "up"))
    with inspect(build_tiny(tmp_path / "m.gguf", rng, drop=split, extra=merged)) as mf:
        assert "blk.0.ffn_gate_up_exps.weight" in mf.tensors
    with pytest.raises(FormatError, match="also holds"):
        inspect(build_tiny(tmp_path / "both.gguf", rng, extra=merged))


def test_shared_gate_in_either_shape_loads_the_same(tmp_path: Path, rng: np.random.Generator) -> None:
    """llama.cpp's converter writes the shared-expert gate {n_embd, 1}, older strata files {n_embd}: both open,
    and the GPU upload and the reference see the same values."""
    from strata.reference.weights import FileWeights
    from strata.runtime.loader import dense_weights
    name = "blk.0.ffn_gate_inp_shexp.weight"
    seed = int(rng.integers(2**32))
    llama = build_tiny(tmp_path / "llama.gguf", np.random.default_rng(seed))
    older = build_tiny(tmp_path / "older.gguf", np.random.default_rng(seed), shapes={name: (64,)})
    x = rng.standard_normal((3, 64)).astype(np.float32)
    uploads, products = [], []
    for path, ne in ((llama, (64, 1)), (older, (64,))):
        with inspect(path) as mf:
            assert mf.tensors[name].ne == ne and not mf.warnings
            held = dense_weights(mf)[name]
            assert held.dtype == np.float32 and held.shape == (1, 64), (path.name, held.shape)
            uploads.append(np.array(held))
            products.append(FileWeights(mf).matmul(name, x))
    assert np.array_equal(uploads[0].view(np.uint32), uploads[1].view(np.uint32)), f"seed {seed}"
    assert np.array_equal(products[0], products[1]) and products[0].shape == (3, 1), f"seed {seed}"


def test_zero_compress_ratio_is_a_warning(tmp_path: Path, rng: np.random.Generator) -> None:
    kv = {"qwen4exp.attention.compress_ratios": ([0, 0, 0, 0], gguf.GGUFValueType.INT32)}
    with inspect(build_tiny(tmp_path / "r.gguf", rng, kv=kv)) as mf:
        assert mf.geometry.compress_ratios == (0, 0, 0, 0)
        assert any("strata runs QSA" in w and "[3]" in w for w in mf.warnings), mf.warnings


def test_file_without_tokenizer(tmp_path: Path, rng: np.random.Generator) -> None:
    # without a token list the vocabulary size must be stated ({arch}.vocab_size, which llama.cpp also reads)
    with pytest.raises(FormatError, match="vocabulary size is unknown"):
        inspect(build_tiny(tmp_path / "u.gguf", rng, tokenizer=False))
    vocab = {"qwen4exp.vocab_size": (tiny_geometry().n_vocab, gguf.GGUFValueType.UINT32)}
    with inspect(build_tiny(tmp_path / "n.gguf", rng, tokenizer=False, kv=vocab)) as mf:
        with pytest.raises(FormatError, match="no tokenizer"):
            mf.tokenizer()


def _write_header_only(path: Path, kv, specs, ggml_type: T) -> None:
    """A full-size file whose data section is a hole: the header is real, the tensor bytes are sparse zeros."""
    writer = gguf.GGUFWriter(path, "qwen4exp")
    for key, value, vtype in kv:
        if key == "general.architecture":
            continue
        if isinstance(value, list):
            writer.add_key_value(key, value, gguf.GGUFValueType.ARRAY, sub_type=vtype)
        else:
            writer.add_key_value(key, value, vtype)
    total = 0
    for s in specs:
        t = T.F32 if s.forced_f32 else ggml_type if s.ne[0] % 32 == 0 else T.F16
        block, size = gguf.GGML_QUANT_SIZES[t]
        nbytes = int(np.prod(s.ne, dtype=object)) // block * size
        writer.add_tensor_info(s.name, tuple(reversed(s.ne)), np.dtype(np.float32), nbytes, raw_dtype=t)
        total += -(-nbytes // 32) * 32
    writer.write_header_to_file(path)
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    with open(path, "r+b") as f:
        f.seek(0, 2)
        data_start = -(-f.tell() // 32) * 32
        f.truncate(data_start + total)


def test_full_size_released_file_inspects_fast(tmp_path: Path) -> None:
    g = released("qwen4exp")
    path = tmp_path / "full.gguf"
    try:
        kv = [*metadata_for(g), ("qwen4exp.vocab_size", g.n_vocab, gguf.GGUFValueType.UINT32)]  # no token list
        _write_header_only(path, kv, tensor_inventory(g), T.Q8_0)
    except OSError as exc:  # a filesystem without sparse files or large-file support
        pytest.skip(f"cannot create a sparse full-size file here: {exc}")
    start = time.perf_counter()
    with inspect(path) as mf:
        elapsed = time.perf_counter() - start
        assert mf.tensors["per_layer_token_embd.weight"].ne == (160, 320001536)
        assert len(mf.tensors) == 1224
        assert mf.raw("per_layer_token_embd.weight").nbytes == 160 * 320001536 // 32 * 34
    # generous: the work is proportional to the 1224 tensor infos, never to the ~130 GB of data
    assert elapsed < 2.0, f"inspect took {elapsed:.2f} s"
