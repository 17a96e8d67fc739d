"""scripts/bench/bench_train.py: the FLOP count against torch's counter, the peak table, a tiny run end to end."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from tests.conftest import load_script
from tests.model.test_packing import random_split
from tests.test_train import tiny_cfg
from tfx.data import BOS, PAD, Batch
from tfx.data.packing import collate_packed, pack_first_fit
from tfx.model import ModelConfig, Transformer
from tfx.model.packing import Packing
from tfx.optim.loss import label_smoothed_loss
from tfx.runtime.precision import Precision
from tfx.train import Trainer
from tfx.training.step import read

TINY = ["model.encoder_layers=1", "model.decoder_layers=1", "model.d_model=32", "model.ffn_dim=64",
        "data.max_tokens=128", "data.vocab_size=200"]  # fmt: skip


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_script("bench/bench_train")


def test_matmul_flops_match_torchs_flop_counter(bench: ModuleType) -> None:
    """6 x params x tokens against the FLOPs torch counts in the linear layers' forward + backward."""
    d, vocab = 128, 2000
    model = Transformer(
        ModelConfig(
            encoder_layers=2,
            decoder_layers=2,
            d_model=d,
            ffn_dim=4 * d,
            heads=4,
            norm="none",
            share_decoder_embeddings=True,
        ),
        vocab,
        0,
    )
    src, tgt = torch.randint(4, vocab, (8, 20)), torch.randint(4, vocab, (8, 16))
    with FlopCounterMode(display=False) as counter:
        loss, _ = label_smoothed_loss(model(src, tgt), tgt, 0.1, 0)
        loss.backward()
    counted = counter.get_flop_counts()["Global"]
    linear = sum(v for op, v in counted.items() if str(op) in ("aten.mm", "aten.addmm"))
    src_lens, tgt_lens = bench.sentence_lengths(batch(src, tgt))  # no padding: 8 sentences of 20 / 16
    assert bench.matmul_flops(model, d, vocab, src_lens, tgt_lens) == pytest.approx(linear, rel=0.02)
    # QK^T and AV, forward (2 + 2 FLOPs per multiply-add pair) and backward (twice that), per layer and sentence
    attn = 12 * d * 8 * (2 * 20 * 20 + 2 * (16 * 16 + 16 * 20))
    assert bench.attention_flops(model, d, src_lens, tgt_lens) == attn


def batch(src: torch.Tensor, target: torch.Tensor, packing: Packing | None = None) -> Batch:
    prev = torch.cat([torch.full_like(target[:, :1], BOS), target[:, :-1]], 1)
    return Batch(src, src.ne(PAD).sum(1), prev, target, int(target.ne(PAD).sum()), list(range(len(src))), packing)


def hand_flops(model: Transformer, d: int, vocab: int, pairs: list[tuple[int, int]]) -> float:
    """The docstring's formula written out per sentence (s, t): matmuls on real tokens, attention per sentence."""
    enc = sum(p.numel() for p in model.encoder.layers.parameters())
    dec = sum(p.numel() for p in model.decoder.layers.parameters())
    flops = 0.0
    for s, t in pairs:
        flops += 6 * (enc * s + (dec + d * vocab) * t)
        flops += 12 * d * (2 * s * s + 2 * (t * t + t * s))  # 2 encoder, 2 decoder layers
    return flops


def test_flops_count_a_padded_batchs_real_tokens_only(bench: ModuleType) -> None:
    d, vocab = 16, 50
    model = Transformer(
        ModelConfig(
            encoder_layers=2,
            decoder_layers=2,
            d_model=d,
            ffn_dim=2 * d,
            heads=2,
            norm="none",
            share_decoder_embeddings=True,
        ),
        vocab,
        0,
    )
    src = torch.tensor([[5, 6, 7, 8, 3], [5, 6, 3, PAD, PAD], [9, 3, PAD, PAD, PAD]])
    tgt = torch.tensor([[5, 6, 3, PAD], [5, 6, 7, 3], [3, PAD, PAD, PAD]])
    assert [x.tolist() for x in bench.sentence_lengths(batch(src, tgt))] == [[5, 3, 2], [3, 4, 1]]
    expected = hand_flops(model, d, vocab, [(5, 3), (3, 4), (2, 1)])
    assert bench.batch_flops(model, d, vocab, batch(src, tgt)) == pytest.approx(expected, rel=1e-12)
    full = hand_flops(model, d, vocab, [(5, 4)] * 3)  # what the padded shapes would count
    assert bench.batch_flops(model, d, vocab, batch(src, tgt)) < 0.7 * full


def test_flops_count_each_packed_sentence_on_its_own(bench: ModuleType) -> None:
    """Row 0 holds pairs (3, 2) and (2, 3), row 1 one pair (4, 4) and padding: attention is per pair, not per row."""
    d, vocab = 16, 50
    model = Transformer(
        ModelConfig(
            encoder_layers=2,
            decoder_layers=2,
            d_model=d,
            ffn_dim=2 * d,
            heads=2,
            norm="none",
            share_decoder_embeddings=True,
        ),
        vocab,
        0,
    )
    src_seg = torch.tensor([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 0, 0]])
    tgt_seg = torch.tensor([[1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 0, 0]])
    src = torch.where(src_seg > 0, 7, PAD)
    tgt = torch.where(tgt_seg > 0, 8, PAD)
    positions = torch.zeros_like(src_seg)  # not read by the count
    packed = batch(src, tgt, Packing(src_seg, tgt_seg, positions, positions))
    assert [x.tolist() for x in bench.sentence_lengths(packed)] == [[3, 2, 4], [2, 3, 4]]
    expected = hand_flops(model, d, vocab, [(3, 2), (2, 3), (4, 4)])
    assert bench.batch_flops(model, d, vocab, packed) == pytest.approx(expected, rel=1e-12)


def test_packed_lengths_are_the_collated_pairs_lengths(bench: ModuleType) -> None:
    """On rows that collate_packed builds, the per-segment lengths are exactly the packed pairs' lengths."""
    split = random_split(30, seed=3)
    rows = pack_first_fit(np.arange(30), split, 24, 24)
    packed = collate_packed(split, rows, len(rows) + 1, 24, 24)  # one all-padding row too
    src, tgt = bench.sentence_lengths(packed)
    expected = sorted((int(split.src_sizes[i]), int(split.tgt_sizes[i])) for i in packed.indices)
    assert sorted(zip(src.tolist(), tgt.tolist(), strict=True)) == expected


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
    assert row.split("|")[9:13] == [" n/a "] * 4  # compile off: no graphs; CPU: no kernel count, no GPU-busy


def table_rows(out: str, first: str) -> list[list[str]]:
    """The cells of every table row starting with ``| first |``."""
    return [[c.strip() for c in line.split("|")[1:-1]] for line in out.splitlines() if line.startswith(f"| {first} |")]


def test_packed_run_compiles_static_once_and_times_the_torch_peer(
    bench: ModuleType, capsys: pytest.CaptureFixture
) -> None:
    """--batching packed --torch-peer, compile off and on (eager backend: trace only, seconds on CPU)."""
    argv = ["--experiment", "iwslt", "--device", "cpu", "--steps", "2", "--warmup", "2", "--lengths", "16",
            "--threads", "1", "--batching", "packed", "--compile", "off", "on", "--compile-backend", "eager",
            "--torch-peer", *TINY]  # fmt: skip
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    assert "packed batches (synthetic, lengths [16]; rows x src/tgt: 8x16/16; compile would be static)" in out
    on = table_rows(out, "on")
    tfx_on = next(r for r in on if len(r) == len(bench.COLUMNS))
    assert int(tfx_on[2]) == 128 and 1 <= int(tfx_on[8]) <= bench.GRAPHS_PER_SCOPE["layers"] and tfx_on[9] == "0"
    tfx_precision = Precision("auto", torch.device("cpu")).name  # TINY leaves train.precision=auto
    assert f"torch peer (scripts/bench/torch_peer.py, {tfx_precision}) on the same batches" in out  # the peer's too
    peers = [r for r in table_rows(out, "off") + on if len(r) == 6]  # the peer table: compile off and on
    assert [r[0] for r in peers] == ["off", "on"]
    for r in peers:
        tfx_rate, peer_rate, ratio = float(r[2]), float(r[4]), float(r[5])
        assert tfx_rate > 0 and peer_rate > 0 and ratio == pytest.approx(tfx_rate / peer_rate, abs=0.01 + 1 / peer_rate)


def test_device_activity_counts_cuda_kernels_and_their_time(bench: ModuleType) -> None:
    """Kernels and copies on the GPU count as busy time, CPU ops not; copies are not kernels."""
    from torch.autograd import DeviceType

    def event(name: str, us: float, device: DeviceType = DeviceType.CUDA) -> SimpleNamespace:
        return SimpleNamespace(name=name, device_type=device, time_range=SimpleNamespace(elapsed_us=lambda: us))

    events = [event("aten::mm", 900.0, DeviceType.CPU), event("sm90_xmma_gemm", 300.0), event("elementwise", 100.0),
              event("Memcpy HtoD (Pinned -> Device)", 100.0), event("Memset (Device)", 0.0)]  # fmt: skip
    kernels, busy = bench.device_activity(events, step_s=0.001)
    assert kernels == 2 and busy == pytest.approx(0.5)


def test_a_compiled_rows_warnings_name_breaks_extra_graphs_and_recompiles(bench: ModuleType) -> None:
    """tfx.runtime.compilation.compile_problems under a row: what a GPU run's report must show, by scope."""
    row = dict(params_m=1.0, tokens_per_step=1.0, step_s=1.0, tokens_per_s=1.0, tflops=1.0, mfu=None,
               first_update_s=1.0, kernels=None, gpu_busy=None, skipped=0)  # fmt: skip
    clean = bench.Result(compile=True, graphs=2, recompiles=0, graph_breaks=0, **row)
    assert bench.warnings_for(clean, "layers") == []
    assert bench.warnings_for(clean, "model") == ["warning (compile on): 2 graphs compiled (expected at most 1): "
                                                  "graph breaks or recompiles"]  # fmt: skip
    broken = bench.Result(compile=True, graphs=4, recompiles=1, graph_breaks=1, **row)
    notes = bench.warnings_for(broken, "layers")
    assert [n.split(":")[1].strip() for n in notes] == ["1 graph break(s)", "4 graphs compiled (expected at most 2)",
                                                         "1 recompile(s) after the first update"]  # fmt: skip
    eager = bench.Result(compile=False, graphs=None, recompiles=None, graph_breaks=None, **row)
    assert bench.warnings_for(eager, "layers") == []


def test_torch_peer_needs_synthetic_batches(bench: ModuleType) -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(["--torch-peer", "--real-data"])


def test_end_to_end_reads_tokens_and_training_seconds(bench: ModuleType, tmp_path: Path) -> None:
    records = [{"event": "update", "step": 1, "train/ntokens": 100.0}, {"event": "valid", "step": 1},
               {"event": "update", "step": 2, "train/ntokens": 50.0},
               {"event": "end", "train_seconds": 3.0}]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    run = bench.read_run_metrics(tmp_path)
    assert (run.updates, run.tokens, run.seconds, run.tokens_per_s) == (2, 150.0, 3.0, 50.0)


@pytest.mark.slow
def test_real_packed_batches_and_end_to_end(bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """--real-data --batching packed plans tfx.train's packed batches; --end-to-end runs tfx.train beside it."""
    argv = ["--experiment", "iwslt", "--device", "cpu", "--steps", "2", "--warmup", "1", "--threads", "1",
            "--real-data", "--batching", "packed", "--end-to-end", "2", "--end-to-end-dir", str(tmp_path / "e2e"),
            *TINY, "data=toy", f"data.cache_dir={tmp_path}/cache"]  # fmt: skip
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    assert "packed batches (tfx.train's batches; rows x src/tgt: 5x24/24; compile would be static)" in out
    e2e = next(r for r in table_rows(out, "off") if len(r) == 6)
    run = bench.read_run_metrics(tmp_path / "e2e" / "compile_off")
    assert int(e2e[1]) == 2 and float(e2e[2]) == run.tokens and float(e2e[4]) == pytest.approx(run.tokens_per_s, abs=1)


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


@pytest.mark.parametrize("init", ["tfixup", "admin"])  # admin profiles a batch first: the bench must hand it one
def test_the_bench_times_the_trainers_update(bench: ModuleType, tmp_path: Path, init: str) -> None:
    """The bench builds through ``tfx.training.build``: for one config, seed and batch, its model, optimizer and
    precision are the trainer's, and one update of each (dropout on) leaves the same weights and Adam moments. A bench
    that re-created the build order by hand would drift from it here the day the order changed."""
    cfg = tiny_cfg(tmp_path, model_kw={"norm": "none" if init == "tfixup" else init}, init=init)
    trainer = Trainer(cfg, tmp_path / "run")
    try:
        batch = trainer.batches.first_padded()
        vocab = trainer.corpus.tokenizer.vocab_size
        initial = copy.deepcopy(trainer.model.state_dict())
        trainer.train_step([batch])
    finally:
        trainer.close()
    stepper = bench.build_stepper(cfg, vocab, torch.device("cpu"), None, [batch])
    assert type(stepper.model) is type(trainer.model) and type(stepper.optimizer) is type(trainer.optimizer)
    assert stepper.optimizer.defaults == trainer.optimizer.defaults
    assert stepper.precision.name == trainer.precision.name and stepper.world_size == 1
    assert_same(stepper.model.state_dict(), initial)
    read(bench.run_updates(stepper, [batch], cfg.optim, 0, 1))
    assert_same(stepper.model.state_dict(), trainer.model.state_dict())
    ours, theirs = stepper.optimizer.state_dict()["state"], trainer.optimizer.state_dict()["state"]
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert_same(ours[key], theirs[key])


def assert_same(ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    assert ours.keys() == theirs.keys()
    for name, value in ours.items():
        torch.testing.assert_close(value, theirs[name], rtol=0, atol=0, msg=name)
