"""`strata info --devices`: the plan of a split of the layers over several GPUs, on given free memory (no GPU
needed), and its one-line refusals."""

import pytest

from strata import _native, cli


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("split") / "q4.gguf"
    assert cli.main(["synth", str(path), "--arch", "qwen4exp", "--layers", "4", "--seed", "7"]) == 0
    return str(path)


def split_lines(capsys, *argv: str) -> list[str]:
    capsys.readouterr()
    assert cli.main(["info", *argv]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("split plan"))
    return lines[start:]


def test_info_plans_a_split_on_given_free_memory(model, capsys):
    lines = split_lines(capsys, model, "--devices", "0,1", "--vram-free", "2G")
    assert lines[0] == "split plan    one session of 4,096 tokens in kv int8, prompt chunks of 4096 tokens"
    assert lines[1] == "layer split   2 + 2 layers over 2 GPU(s)"
    assert lines[2].startswith("  GPU 0 (layers 0..1): ") and " of 2.00 GiB free; expert cache room " in lines[2]
    assert "token embedding" in lines[3] and "head" not in lines[3]
    assert lines[4].startswith("  GPU 1 (layers 2..3): ") and "head (final norm, LM head)" in lines[5]
    assert "its rows go to GPU 0, which runs the PLE layer 1" in "\n".join(lines)
    assert lines[-1].startswith("  planned only: load, run and serve use one GPU")


def test_info_takes_a_hand_split_a_limit_per_device_a_context_and_a_kv_format(model, capsys):
    lines = split_lines(capsys, model, "--devices", "1,0", "--vram-free", "2G,4G", "--vram-limit", "1G",
                        "--layer-split", "3,1", "--context", "512", "--kv", "q4")
    assert lines[0] == "split plan    one session of 512 tokens in kv q4, prompt chunks of 512 tokens"
    assert lines[1] == "layer split   3 + 1 layers over 2 GPU(s)"
    assert lines[2].startswith("  GPU 1 (layers 0..2): ") and " of 1.00 GiB free" in lines[2]
    assert lines[4].startswith("  GPU 0 (layers 3..3): ") and " of 1.00 GiB free" in lines[4]
    assert "KV cache (q4)" in lines[5]


@pytest.mark.parametrize(("argv", "message"), [
    (["--layer-split", "2,2"], "--layer-split plan a split over several GPUs: name them with --devices"),
    (["--devices", "0,x", "--vram-free", "1G"], "--devices 0,x: GPU indices such as 0,1 expected"),
    (["--devices", "0,1", "--vram-free", "1G,lots"], "--vram-free 1G,lots: sizes such as 24G or 24G,16G expected"),
    (["--devices", "0,1", "--vram-free", "1G,2G,3G"], "--vram-free 1G,2G,3G gives 3 figures for 2 devices"),
    (["--devices", "0,1", "--vram-free", "1G", "--vram-limit", "1G,2G"], "--vram-limit 1G,2G: one size such as 24G"),
    (["--devices", "0,1", "--vram-free", "1G", "--layer-split", "3,2"], "layer split 3,2 covers 5 layers; the "
                                                                         "model has 4"),
    (["--devices", "0,1", "--vram-free", "10M"], "no split of the 4 layers over GPUs 0, 1 fits: the most balanced, "
                                                  "2,2: GPU "),
    (["--devices", "0,1,2,3,4", "--vram-free", "1G"], "5 devices for 4 layers"),
])
def test_a_bad_split_is_one_line(model, capsys, argv, message):
    capsys.readouterr()
    assert cli.main(["info", model, *argv]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"strata info: {message}") and err.count("\n") == 1, err


def test_without_a_gpu_the_free_memory_must_be_given(model, capsys):
    if _native.device_count() > 0:
        pytest.skip("a CUDA device is present: its free memory is asked")
    capsys.readouterr()
    assert cli.main(["info", model, "--devices", "0,1"]) == 1
    assert capsys.readouterr().err == ("strata info: no CUDA device found to ask for its free memory; give it with "
                                       "--vram-free\n")
