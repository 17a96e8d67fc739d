"""scripts/bench_train.py: the FLOP count against torch's counter, the peak table, a tiny run end to end."""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from tests.conftest import load_script
from tfx.criterion import label_smoothed_loss
from tfx.model import Transformer

TINY = ["model.encoder_layers=1", "model.decoder_layers=1", "model.d_model=32", "model.ffn_dim=64",
        "data.max_tokens=128", "data.vocab_size=200"]  # fmt: skip


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_script("bench_train")


def test_matmul_flops_match_torchs_flop_counter(bench: ModuleType) -> None:
    """6 x params x tokens against the FLOPs torch counts in the linear layers' forward + backward."""
    d, vocab = 128, 2000
    model = Transformer(vocab, 0, 2, 2, d_model=d, ffn_dim=4 * d, heads=4, norm="none", share_decoder_embeddings=True)
    src, tgt = torch.randint(4, vocab, (8, 20)), torch.randint(4, vocab, (8, 16))
    with FlopCounterMode(display=False) as counter:
        loss, _ = label_smoothed_loss(model(src, tgt), tgt, 0.1, 0)
        loss.backward()
    counted = counter.get_flop_counts()["Global"]
    linear = sum(v for op, v in counted.items() if str(op) in ("aten.mm", "aten.addmm"))
    assert bench.matmul_flops(model, d, vocab, src, tgt) == pytest.approx(linear, rel=0.02)
    # QK^T and AV, forward (2 + 2 FLOPs per multiply-add pair) and backward (twice that), per layer and sentence
    attn = 12 * d * 8 * (2 * 20 * 20 + 2 * (16 * 16 + 16 * 20))
    assert bench.attention_flops(model, d, src, tgt) == attn


def test_peak_table_prefers_the_specific_name(bench: ModuleType) -> None:
    names = {"NVIDIA H100 PCIe": 756.0, "NVIDIA H100 80GB HBM3": 989.0, "NVIDIA H200": 989.0, "Tesla V100-SXM2": 125.0}
    for name, peak in names.items():
        assert next(p for key, p in bench.PEAK_TFLOPS if key in name) == peak
    assert bench.peak_tflops(torch.device("cpu"), None) is None and bench.peak_tflops(torch.device("cpu"), 2.0) == 2.0


def test_tiny_run_prints_the_table_and_profile(bench: ModuleType, capsys: pytest.CaptureFixture) -> None:
    argv = ["--experiment", "iwslt", "--device", "cpu", "--steps", "2", "--warmup", "1", "--lengths", "8", "12",
            "--peak-tflops", "1", "--profile", "--profile-steps", "1", *TINY]  # fmt: skip
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    assert "iwslt: 1+1 layers, d 32" in out and "vocab 200" in out
    row = next(line for line in out.splitlines() if line.startswith("| off |"))
    tokens_per_update, tokens_per_s, mfu = row.split("|")[3], float(row.split("|")[5]), row.split("|")[7]
    assert int(tokens_per_update) == (128 // 8 * 8 + 128 // 12 * 12) // 2 and tokens_per_s > 0
    assert mfu.strip().endswith("%")
    assert "| matmul |" in out and "| optimizer + clipping |" in out


FAIRSEQ_LOG = """\
07:00 | INFO | train_inner | epoch 001: 10 / 130 loss=13.5, wps=55.5, ups=0.02, wpb=3575.2, num_updates=10
07:00 | INFO | train_inner | epoch 001: 20 / 130 loss=13.3, wps=70.4, ups=0.02, wpb=3192.3, num_updates=20
07:00 | INFO | train_inner | epoch 001: 25 / 130 loss=13.2, wps=80.0, ups=0.02, wpb=3000.0, num_updates=25
2026-11-30 07:11:10 | INFO | train | epoch 001 | loss 13.4 | wps 65.1 | wpb 3300 | num_updates 25
"""


def test_fairseq_log_drops_the_first_interval(bench: ModuleType) -> None:
    """Steady state: the tokens of updates 11..25 over their time, from each interval's wpb and wps."""
    peer = bench.parse_fairseq_log(FAIRSEQ_LOG)
    tokens, seconds = 3192.3 * 10 + 3000.0 * 5, 3192.3 * 10 / 70.4 + 3000.0 * 5 / 80.0
    assert peer.updates == 15 and peer.tokens == pytest.approx(tokens)
    assert peer.tokens_per_s == pytest.approx(tokens / seconds)
    with pytest.raises(ValueError, match="1 train_inner line"):
        bench.parse_fairseq_log(FAIRSEQ_LOG.splitlines()[0])


def test_peer_run_prints_both_rates_and_the_ratio(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """--peer end to end with a stand-in for fairseq_peer.sh (it writes the log the real one would)."""
    (tmp_path / "peer.log").write_text(FAIRSEQ_LOG)
    script = tmp_path / "peer.sh"
    script.write_text(f'[ "$1 $2" = "20 1" ] || exit 3\ncp {tmp_path}/peer.log "$FAIRSEQ_PEER_DIR/train.log"\n')
    monkeypatch.setenv("FAIRSEQ_PEER_DIR", str(tmp_path))
    argv = ["--experiment", "iwslt", "--device", "cpu", "--steps", "2", "--warmup", "1", "--threads", "1",
            "--peer", "--peer-script", str(script), *TINY, "data=toy", f"data.cache_dir={tmp_path}/cache"]  # fmt: skip
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    tfx_rate = float(next(line for line in out.splitlines() if "| tfx |" in line).split("|")[-2])
    peer = bench.parse_fairseq_log(FAIRSEQ_LOG).tokens_per_s
    # the table rounds tfx's rate to a whole token/s (0.5 / peer in the ratio) and prints the ratio to
    # 0.01 (0.005), while the ratio uses the exact rate: compare within those two roundings
    ratio = re.search(rf"fairseq {peer:.0f}: ratio ([0-9.]+)x", out)
    assert ratio is not None, out
    assert float(ratio.group(1)) == pytest.approx(tfx_rate / peer, abs=0.5 / peer + 0.0051)
    script.write_text("echo boom; exit 3\n")
    with pytest.raises(RuntimeError, match="exited 3: boom"):
        bench.main(argv)


def test_a_missing_device_is_one_line(bench: ModuleType) -> None:
    with pytest.raises(SystemExit, match=r"error: --device=cuda:99: no such device on this machine; available: cpu"):
        bench.main(["--device", "cuda:99"])
