"""Training throughput at a named experiment's sizes: real target tokens/s, model FLOPs utilization, profile.

Times the trainer's own update: the experiment's model (``+experiment=NAME`` plus any Hydra
overrides), its init, fused AdamW and ``train.precision``, optionally ``torch.compile``, stepped by
``tfx.training.step.Stepper.update`` (forward, label-smoothed loss, backward, clip, optimizer step, on the
device with no host sync) and read with ``tfx.training.step.read`` once, after the timed loop, as
``python -m tfx.train`` reads a log interval. Batches stay in (pinned) host memory and each update
copies its own to the device, as in the trainer; ``train.layer_stats_every_updates`` updates are
not in the figure.

Batches (``--batching padded|packed``):

- synthetic (default): random token ids at the experiment's vocabulary size, ``max_tokens // L``
  full rows of length L per batch, cycling through ``--lengths``. No padding, so a batch is also a
  valid packed batch of one sentence per row: ``packed`` gives it a ``Packing`` (one segment per
  row) and the model runs its packed attention masks, ``padded`` its padding masks. No corpus is
  read: data loading is not in the figure.
- ``--real-data``: tfx.train's own first batches of epoch 1, planned by ``tfx.data.plan.TrainBatches``
  from the experiment's corpus (``data.batching`` set from ``--batching``), collated before the clock.

``torch.compile`` (``--compile on``) is static (``dynamic=False``) when every batch has one shape
(packed, or synthetic with one length), with symbolic shapes otherwise, as ``tfx.training.build.wrap``
decides, over ``train.compile_scope`` (default ``layers``: one graph per layer kind, ``tfx.runtime.compilation``).
Each row reports the first warm-up update's wall time (cold: compilation, allocator and kernel warm-up),
the graphs dynamo compiled and the recompiles (frames compiled after the first update; a static run expects
none), and on CUDA, from one ``torch.profiler`` update after the timed
loop, the kernels per update and the GPU-busy fraction (CUDA kernel time of that update over the
timed ms/update); on CPU those two are n/a. Under a compiled row, a warning names each problem
``tfx.runtime.compilation.compile_problems`` finds: graph breaks (with dynamo's reason), more graphs than the
scope makes (2 for ``layers``, 1 for ``model``), recompiles.

Model FLOPs utilization (MFU, as in PaLM, Chowdhery et al. 2022, appendix B) counts the FLOPs the
model needs on **real (non-pad) tokens only**, not what the kernels do (no recomputation, no
padding, no masked-out attention across packed sentences):

- matmuls: 6 x parameters x tokens (2 forward, 4 backward), each parameter counted on the stream it
  runs over: encoder layers on real source tokens, decoder layers and the output projection
  (d x V, tied or not) on real target tokens; embedding lookups are free;
- attention scores and values: 12 x d x T_q x T_k per layer and sentence, summed over sentences
  with each sentence's own lengths s_i, t_i (encoder self s_i^2, decoder self t_i^2 without the
  causal saving, decoder cross t_i x s_i): padded rows' real lengths, packed rows' segments.

MFU = those FLOPs per second / the device's dense bf16 peak: ``PEAK_TFLOPS`` by device name
(``--peak-tflops`` overrides, and is needed on CPUs). ``--profile`` adds a ``torch.profiler``
breakdown of the first setting by operator family (self time, so nothing is counted twice).

Peers, in the same invocation:

- ``--torch-peer``: ``tfx.bench.torch_peer.PeerTrainer`` (nn.Transformer Post-LN, fused
  AdamW, torch.compile static with the same backend) on the very same synthetic batches, in tfx's
  precision (bf16 autocast or fp32) and compile on/off as each tfx row, on CPU as on CUDA; prints
  its target tokens/s and the ratio tfx / peer. The peer table's header says the peer's precision.
- ``--peer`` (implies ``--real-data``): ``../shared/bench/fairseq_peer.sh`` (fairseq 0.12.2,
  ``transformer_iwslt_de_en``, Multi30k, ``OMP_NUM_THREADS=--threads``), both sides steady state
  (fairseq's ``train_inner`` lines after the first, tfx's ``--steps`` after ``--warmup``);
  ``--repeat R`` alternates the two R times.
- ``--end-to-end N``: also runs ``python -m tfx.train +experiment=NAME train.max_updates=N`` (same
  overrides and batching, validation and numbered saves off) per compile setting and reports its
  real target tokens per training second from its ``metrics.jsonl`` beside the bench's figure. That
  figure includes the run's first updates (compilation, warm-up) and its data loading.

Usage::

    python scripts/bench/bench_train.py --experiment iwslt --batching packed --compile off on --lengths 32 --torch-peer
    python scripts/bench/bench_train.py --experiment iwslt --profile --device cpu --steps 3 model.encoder_layers=2
    python scripts/bench/bench_train.py --experiment iwslt --device cpu --threads 1 --peer --warmup 2 --steps 10 \
        data=multi30k data.local_dir=../shared/data/multi30k train.precision=fp32   # tfx vs fairseq
    python scripts/bench/bench_train.py --experiment multi30k --real-data --batching packed --end-to-end 50 \
        data.local_dir=../shared/data/multi30k

Needs tfx installed (``pip install -e .`` in the checkout): it imports tfx as a package.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import _require_tfx  # noqa: F401  (a one-line error, not a traceback, without `pip install -e .`)
import torch
from torch import Tensor

from tfx.bench.torch_peer import PeerTrainer, time_steps
from tfx.config import Config, compose_config
from tfx.data import BOS, PAD, Batch, prepare_data
from tfx.data.plan import TrainBatches
from tfx.model import Transformer
from tfx.model.packing import Packing
from tfx.optim.optimizers import lr_at
from tfx.runtime.compilation import (
    GRAPHS_PER_SCOPE,
    CompileCounts,
    compile_counts,
    compile_problems,
    reset_compile_counts,
)
from tfx.runtime.distributed import DeviceError, resolve_device
from tfx.runtime.precision import Precision
from tfx.training.build import fresh_stepper
from tfx.training.step import Pending, Stepper, read

PEER_SCRIPT = Path(__file__).resolve().parents[3] / "shared" / "bench" / "fairseq_peer.sh"
PEER_LOG_INTERVAL = 10  # fairseq_peer.sh's --log-interval

# Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s from NVIDIA's data sheets; first match of the
# device name wins, so the more specific names come first. V100/T4 have no bf16: their fp16 peak.
PEAK_TFLOPS = (
    ("H100 PCIe", 756.0),
    ("H200", 989.0),
    ("H100", 989.0),
    ("GH200", 989.0),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("A10G", 70.0),
    ("L4", 121.0),
    ("V100", 125.0),
    ("T4", 65.0),
)

# Operator families for the profile, matched in order against the op name (first match wins).
FAMILIES = (
    ("attention", r"scaled_dot_product|flash|efficient_attention|_cudnn_attention|attn"),
    ("matmul", r"aten::(mm|addmm|bmm|matmul|linear|_addmm_activation)|gemm|cublas|cutlass|sm\d+_xmma"),
    ("softmax / cross-entropy", r"softmax|nll_loss|cross_entropy|logsumexp"),
    ("dropout", r"dropout|bernoulli"),
    ("optimizer + clipping", r"adam|_foreach|multi_tensor_apply"),
)

TOP_OTHER = 6  # ops of the "other" family named under the table


def compose(experiment: str, overrides: list[str]) -> Config:
    """The experiment's resolved config, as ``python -m tfx.train +experiment=NAME ...`` would see it."""
    return compose_config([f"+experiment={experiment}", *overrides])


def peak_tflops(device: torch.device, override: float | None) -> float | None:
    if override:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_TFLOPS if key in name), None)


# ------------------------------------------------------------------ batches
def one_segment_packing(rows: int, length: int) -> Packing:
    """Packing of full rows holding one sentence each: segment 1 everywhere, positions 0..length-1."""
    segments = torch.ones(rows, length, dtype=torch.long)
    positions = torch.arange(length).expand(rows, length).contiguous()
    return Packing(segments, segments.clone(), positions, positions.clone())


def synthetic_batches(vocab: int, max_tokens: int, lengths: list[int], packed: bool, seed: int = 0) -> list[Batch]:
    """One batch per length: ``max_tokens // length`` full rows (no padding); ``packed``: with their ``Packing``."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for n in lengths:
        rows = max(1, max_tokens // n)
        src = torch.randint(4, vocab, (rows, n), generator=g)
        target = torch.randint(4, vocab, (rows, n), generator=g)
        prev = torch.cat([torch.full((rows, 1), BOS), target[:, :-1]], dim=1)
        packing = one_segment_packing(rows, n) if packed else None
        batches.append(Batch(src, torch.full((rows,), n), prev, target, target.numel(), list(range(rows)), packing))
    return batches


def real_batches(cfg: Config, count: int) -> tuple[list[Batch], int]:
    """tfx.train's first ``count`` batches of epoch 1 on rank 0 (same corpus, vocabulary, seed, ``data.batching``
    and plan: ``TrainBatches``), and the vocab size."""
    corpus = prepare_data(cfg.data, seed=cfg.train.seed, splits=("train",))
    plan = TrainBatches(corpus.splits["train"], cfg.data, cfg.train.seed, rank=0, world_size=1)
    planned = plan.epoch(1)
    if not planned:
        raise ValueError("the training split planned no batches")
    batches = [plan.collate(planned[i % len(planned)]) for i in range(count)]
    return batches, corpus.tokenizer.vocab_size


def one_shape(batches: list[Batch]) -> bool:
    """Whether every batch has the same source and target shape: a static compile then specializes once."""
    return len({(tuple(b.src_tokens.shape), tuple(b.target.shape)) for b in batches}) == 1


# -------------------------------------------------------------------- FLOPs
def sentence_lengths(batch: Batch) -> tuple[Tensor, Tensor]:
    """Real (source, target) token counts per sentence, aligned: per row when padded, per (row, segment)
    when packed (``batch.packing``'s segment ids)."""
    if batch.packing is None:
        return (batch.src_tokens != PAD).sum(1), (batch.target != PAD).sum(1)
    src_seg, tgt_seg = batch.packing.src_segments, batch.packing.tgt_segments
    width = int(max(src_seg.max(), tgt_seg.max())) + 1  # segment ids 0..width-1 in each row
    src = _per_segment(src_seg, width)
    tgt = _per_segment(tgt_seg, width)
    real = (src > 0) | (tgt > 0)
    return src[real], tgt[real]


def _per_segment(segments: Tensor, width: int) -> Tensor:
    """(rows * (width - 1),) token counts of segments 1..width-1 of each row (segment 0, padding, dropped)."""
    rows = segments.size(0)
    flat = (torch.arange(rows)[:, None] * width + segments).flatten()
    return torch.bincount(flat, minlength=rows * width).view(rows, width)[:, 1:].flatten()


def layer_params(layers: torch.nn.Module) -> int:
    return sum(p.numel() for p in layers.parameters())


def matmul_flops(model: Transformer, d_model: int, vocab: int, src_lens: Tensor, tgt_lens: Tensor) -> float:
    """6 x parameters x real tokens, each stack on its own stream, plus the output projection (see the docstring)."""
    enc, dec = layer_params(model.encoder.layers), layer_params(model.decoder.layers)
    return 6.0 * (enc * int(src_lens.sum()) + (dec + d_model * vocab) * int(tgt_lens.sum()))


def attention_flops(model: Transformer, d_model: int, src_lens: Tensor, tgt_lens: Tensor) -> float:
    """12 x d x T_q x T_k per layer and sentence: QK^T and AV, forward (4) and backward (8)."""
    s, t = src_lens.double(), tgt_lens.double()
    n_enc, n_dec = len(model.encoder.layers), len(model.decoder.layers)
    return 12.0 * d_model * float(n_enc * (s * s).sum() + n_dec * (t * t + t * s).sum())


def batch_flops(model: Transformer, d_model: int, vocab: int, batch: Batch) -> float:
    """Model FLOPs of one training update on this batch's real tokens."""
    src, tgt = sentence_lengths(batch)
    return matmul_flops(model, d_model, vocab, src, tgt) + attention_flops(model, d_model, src, tgt)


# ------------------------------------------------------------ the update
def build_stepper(cfg: Config, vocab: int, device: torch.device, backend: str | None, batches: list[Batch]) -> Stepper:
    """The trainer's update, built by ``tfx.training.build.fresh_stepper`` (the trainer's order and settings), compiled
    with ``backend`` (None: not compiled). Static when the batches have one shape (``tfx.training.build.wrap`` compiles
    a packed run so; a synthetic padded one of one length is static too); Admin profiles the first batch."""
    train = dataclasses.replace(cfg.train, compile=backend is not None)
    cfg = dataclasses.replace(cfg, train=train)
    return fresh_stepper(cfg, vocab, device, lambda: batches[0], one_shape(batches), backend or "inductor")


def run_updates(stepper: Stepper, batches: list[Batch], opt_cfg, first: int, count: int) -> list[Pending]:
    """Updates ``first .. first+count-1`` (lr as the trainer's), cycling ``batches``; nothing is read."""
    return [stepper.update([batches[i % len(batches)]], lr_at(i, opt_cfg)) for i in range(first, first + count)]


@dataclass
class Result:
    compile: bool
    params_m: float
    tokens_per_step: float
    step_s: float
    tokens_per_s: float
    tflops: float
    mfu: float | None
    first_update_s: float  # the first warm-up update's wall time: compilation when compile is on
    graphs: int | None  # dynamo's compiled graphs (compile on)
    recompiles: int | None  # frames compiled after the first update (compile on)
    graph_breaks: int | None  # dynamo's graph breaks (compile on): each splits a graph, eager code between
    kernels: int | None  # CUDA kernels per update (CUDA only)
    gpu_busy: float | None  # CUDA kernel time / wall time of an update (CUDA only)
    skipped: int  # timed updates the optimizer skipped (non-finite): should be 0


@dataclass
class Timing:
    first_update_s: float
    seconds: float
    raw: list[dict[str, float]]
    counts: CompileCounts  # what dynamo compiled over the whole run
    recompiles: int


def timed_updates(stepper: Stepper, batches: list[Batch], cfg: Config, warmup: int, steps: int) -> Timing:
    """A cold first update, the rest of the warm-up, then ``steps`` updates read once at the end (one sync)."""
    opt = cfg.optim
    tic = time.perf_counter()
    read(run_updates(stepper, batches, opt, 0, 1))  # the read waits for the device
    first = time.perf_counter() - tic
    after_first = compile_counts()
    read(run_updates(stepper, batches, opt, 1, max(warmup - 1, 0)))
    tic = time.perf_counter()
    raw = read(run_updates(stepper, batches, opt, warmup, steps))
    seconds = time.perf_counter() - tic
    counts = compile_counts()
    return Timing(first, seconds, raw, counts, counts.minus(after_first).frames)


def kernel_stats(stepper: Stepper, batch: Batch, lr: float, step_s: float) -> tuple[int, float]:
    """(CUDA kernels, GPU-busy fraction) of one profiled update; see ``device_activity``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        read([stepper.update([batch], lr)])
    return device_activity(prof.events(), step_s)


def device_activity(events: list, step_s: float) -> tuple[int, float]:
    """(kernels, device time / ``step_s``) of a profile's CUDA events: memcpy/memset time counts as busy, not
    as kernels. The wall time is the unprofiled ``step_s``: the profiler's own overhead would understate it."""
    from torch.autograd import DeviceType

    device_events = [e for e in events if e.device_type == DeviceType.CUDA]
    busy_s = sum(e.time_range.elapsed_us() for e in device_events) / 1e6
    kernels = sum(1 for e in device_events if not e.name.startswith(("Memcpy", "Memset")))
    return kernels, busy_s / step_s


def prepare_batches(cfg: Config, args: argparse.Namespace, device: torch.device) -> list[Batch]:
    """The batches every row times (and the torch peer too), in pinned host memory on CUDA as the trainer's."""
    if args.real_data:
        batches, args.vocab = real_batches(cfg, args.warmup + args.steps)
    else:
        batches = synthetic_batches(args.vocab, cfg.data.max_tokens, args.lengths, args.batching == "packed")
    return [b.pin_memory() for b in batches] if device.type == "cuda" else batches


def measure(cfg: Config, args: argparse.Namespace, batches: list[Batch], compile_model: bool) -> tuple[Result, Stepper]:
    """One row: build, warm up, time ``args.steps`` updates of the trainer's Stepper."""
    device = torch.device(args.device)
    reset_compile_counts()
    stepper = build_stepper(cfg, args.vocab, device, args.compile_backend if compile_model else None, batches)
    t = timed_updates(stepper, batches, cfg, args.warmup, args.steps)
    timed = [batches[(args.warmup + i) % len(batches)] for i in range(args.steps)]
    tokens = sum(r["ntokens"] for r in t.raw)
    flops = sum(batch_flops(stepper.model, cfg.model.d_model, args.vocab, b) for b in timed)
    step_s = t.seconds / args.steps
    kernels = busy = None
    if device.type == "cuda":
        kernels, busy = kernel_stats(stepper, timed[0], lr_at(args.warmup + args.steps, cfg.optim), step_s)
    peak = peak_tflops(device, args.peak_tflops)
    tflops = flops / t.seconds / 1e12
    result = Result(
        compile=compile_model,
        params_m=sum(p.numel() for p in stepper.model.parameters()) / 1e6,
        tokens_per_step=tokens / args.steps,
        step_s=step_s,
        tokens_per_s=tokens / t.seconds,
        tflops=tflops,
        mfu=tflops / peak if peak else None,
        first_update_s=t.first_update_s,
        graphs=t.counts.graphs if compile_model else None,
        recompiles=t.recompiles if compile_model else None,
        graph_breaks=t.counts.graph_breaks if compile_model else None,
        kernels=kernels,
        gpu_busy=busy,
        skipped=sum(1 for r in t.raw if not r["applied"]),
    )
    return result, stepper


def profile_table(stepper: Stepper, batches: list[Batch], cfg: Config, steps: int) -> str:
    """Self time per operator family over ``steps`` updates, per update."""
    from torch.profiler import ProfilerActivity, profile

    cuda = stepper.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        read(run_updates(stepper, batches, cfg.optim, 0, steps))
    totals: dict[str, float] = {}
    others: dict[str, float] = {}
    for event in prof.key_averages():
        us = event.self_device_time_total if cuda else event.self_cpu_time_total
        family = next((name for name, pattern in FAMILIES if re.search(pattern, event.key, re.I)), "other")
        totals[family] = totals.get(family, 0.0) + us
        if family == "other":
            others[event.key] = us
    total = sum(totals.values()) or 1.0
    where = "CUDA kernel" if cuda else "CPU"
    lines = [f"| op family ({where} self time) | ms/update | share |", "|---|---:|---:|"]
    for family, us in sorted(totals.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {family} | {us / 1e3 / steps:.2f} | {100 * us / total:.0f}% |")
    top = sorted(others.items(), key=lambda kv: -kv[1])[:TOP_OTHER]
    lines.append("\nlargest in other: " + ", ".join(f"{k} {100 * us / total:.1f}%" for k, us in top))
    return "\n".join(lines)


# ------------------------------------------------------------------ peers
@dataclass
class TorchPeerResult:
    compile: bool
    step_s: float
    tokens_per_s: float


def measure_torch_peer(cfg: Config, args: argparse.Namespace, batches: list[Batch], compile_model: bool):
    """PeerTrainer on the very same batches (on the device), the same warm-up and timed updates, in tfx's
    precision (bf16 autocast or fp32: the same arithmetic on both sides) and compile setting and backend."""
    device = torch.device(args.device)
    m = cfg.model
    sizes = dict(d_model=m.d_model, heads=m.heads, ffn_dim=m.ffn_dim, n_enc=m.encoder_layers, n_dec=m.decoder_layers)
    reset_compile_counts()
    torch.manual_seed(cfg.train.seed)
    bf16 = Precision(cfg.train.precision, device).bf16
    trainer = PeerTrainer(args.vocab, sizes, device, compile_model, backend=args.compile_backend, bf16=bf16)
    on_device = [(b.src_tokens.to(device), b.prev_output_tokens.to(device), b.target.to(device), b.ntokens)
                 for b in batches]  # fmt: skip
    seconds, tokens = time_steps(trainer, on_device, args.warmup, args.steps)
    return TorchPeerResult(compile_model, seconds / args.steps, tokens / seconds)


@dataclass
class PeerResult:
    """fairseq's steady-state throughput: its ``train_inner`` intervals after the first."""

    updates: int
    tokens: float
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def parse_fairseq_log(text: str) -> PeerResult:
    """Sum the tokens (wpb x updates) and time (tokens / wps) of every ``train_inner`` line but the first.

    fairseq resets its ``train_inner`` meters after each line, so each line's wps is that interval's
    wall-clock rate (data loading included); the first interval holds the warm-up and is dropped.
    """
    rows = []
    for line in text.splitlines():
        if "train_inner" not in line:
            continue
        fields = {k: float(v) for k, v in re.findall(r"\b(wps|wpb|num_updates)[= ]([0-9.]+)", line)}
        if len(fields) == 3:
            rows.append(fields)
    if len(rows) < 2:
        raise ValueError(f"fairseq's log has {len(rows)} train_inner line(s); need 2 (run >= 2 log intervals)")
    updates = tokens = seconds = 0.0
    for before, row in zip(rows, rows[1:], strict=False):
        n = row["num_updates"] - before["num_updates"]
        updates, tokens, seconds = updates + n, tokens + row["wpb"] * n, seconds + row["wpb"] * n / row["wps"]
    return PeerResult(int(updates), tokens, seconds)


def run_peer(script: Path, updates: int, threads: int, timeout_s: float) -> PeerResult:
    """Run fairseq_peer.sh (installs fairseq on its first run) and read its log."""
    if not script.is_file():
        raise FileNotFoundError(f"peer script {script} not found: pass --peer-script PATH")
    done = subprocess.run(
        ["bash", str(script), str(updates), str(threads)], capture_output=True, text=True, timeout=timeout_s
    )
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        raise RuntimeError(f"{script.name} exited {done.returncode}: {' / '.join(tail)}")
    work = Path(os.environ.get("FAIRSEQ_PEER_DIR", "/tmp/fairseq_peer"))
    return parse_fairseq_log((work / "train.log").read_text())


# -------------------------------------------------------------- end to end
@dataclass
class EndToEnd:
    updates: int
    tokens: float
    seconds: float  # the run's training seconds (its end record)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)


def read_run_metrics(run_dir: Path) -> EndToEnd:
    """Real target tokens of the update records and the training seconds of the end record of metrics.jsonl."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in records if r["event"] == "update"]
    end = next(r for r in records if r["event"] == "end")
    return EndToEnd(len(updates), sum(r["train/ntokens"] for r in updates), end["train_seconds"])


def end_to_end_command(args: argparse.Namespace, overrides: list[str], run_dir: Path, compile_model: bool) -> list[str]:
    """``python -m tfx.train`` at the bench's config: N updates, no validation, no numbered saves."""
    threads = [f"train.threads={args.threads}"] if args.threads > 0 else []
    return [sys.executable, "-m", "tfx.train", f"+experiment={args.experiment}", f"hydra.run.dir={run_dir}",
            f"train.max_updates={args.end_to_end}", "train.validate_every_updates=0", "train.validate_every_minutes=0",
            "train.save_every_epochs=0", "train.save_every_updates=0", "train.max_minutes=0", "train.max_epochs=0",
            "train.progress=false", f"train.compile={str(compile_model).lower()}", *threads, *overrides]  # fmt: skip


def run_end_to_end(args: argparse.Namespace, overrides: list[str], compile_model: bool) -> EndToEnd:
    out = Path(args.end_to_end_dir or tempfile.mkdtemp(prefix="bench_train_e2e_"))
    run_dir = out / f"compile_{'on' if compile_model else 'off'}"
    cmd = end_to_end_command(args, overrides, run_dir, compile_model)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:]
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: {tail}")
    return read_run_metrics(run_dir)


# ------------------------------------------------------------------ report
COLUMNS = ("compile", "params (M)", "tgt tokens/update", "ms/update", "tgt tokens/s", "model TFLOP/s", "MFU",
           "1st update s", "graphs", "recompiles", "kernels/update", "GPU busy")  # fmt: skip


def batch_shapes(batches: list[Batch]) -> str:
    shapes = sorted({f"{b.src_tokens.size(0)}x{b.src_tokens.size(1)}/{b.target.size(1)}" for b in batches})
    return ", ".join(shapes[:4]) + (f" (+{len(shapes) - 4} more)" if len(shapes) > 4 else "")


def table_header(cfg: Config, args: argparse.Namespace, batches: list[Batch]) -> str:
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    peak = peak_tflops(device, args.peak_tflops)
    m = cfg.model
    source = "tfx.train's batches" if args.real_data else f"synthetic, lengths {args.lengths}"
    static = "static" if one_shape(batches) else "dynamic"
    return "\n".join([
        f"{args.experiment}: {m.encoder_layers}+{m.decoder_layers} layers, d {m.d_model}, ffn {m.ffn_dim}, "
        f"{m.heads} heads, vocab {args.vocab}, max_tokens {cfg.data.max_tokens}, {args.batching} batches "
        f"({source}; rows x src/tgt: {batch_shapes(batches)}; compile would be {static}), "
        f"precision {Precision(cfg.train.precision, device).name}, {name}, "
        f"peak {f'{peak:g} TFLOP/s' if peak else 'unknown (--peak-tflops)'}; "
        f"{args.steps} timed updates after {args.warmup} warm-up; FLOPs and tokens: real (non-pad) tokens only",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|---|" + "---:|" * (len(COLUMNS) - 1),
    ])  # fmt: skip


def _or_na(value: float | int | None, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def table_row(r: Result) -> str:
    mfu = f"{100 * r.mfu:.1f}%" if r.mfu is not None else "n/a"
    busy = f"{100 * r.gpu_busy:.0f}%" if r.gpu_busy is not None else "n/a"
    cells = ["on" if r.compile else "off", f"{r.params_m:.1f}", f"{r.tokens_per_step:.0f}", f"{1e3 * r.step_s:.1f}",
             f"{r.tokens_per_s:.0f}", f"{r.tflops:.3g}", mfu, f"{r.first_update_s:.2f}", _or_na(r.graphs, "d"),
             _or_na(r.recompiles, "d"), _or_na(r.kernels, "d"), busy]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


def warnings_for(r: Result, scope: str) -> list[str]:
    """What makes a row's figure suspect: skipped updates, and what ``tfx.runtime.compilation.compile_problems`` finds
    in a compiled row (``scope``: ``train.compile_scope``, which sets the graphs expected). Call it before the next
    row resets dynamo's counters (the graph breaks' reasons are read there)."""
    notes = []
    if r.skipped:
        notes.append(f"{r.skipped} timed update(s) skipped by the optimizer (non-finite)")
    if r.graphs is not None:
        notes += compile_problems(graphs=r.graphs, graph_breaks=r.graph_breaks or 0, recompiles=r.recompiles or 0,
                                  max_graphs=GRAPHS_PER_SCOPE[scope])  # fmt: skip
    return [f"warning (compile {'on' if r.compile else 'off'}): {n}" for n in notes]


def peer_row(tfx: Result, peer: TorchPeerResult) -> str:
    ratio = tfx.tokens_per_s / peer.tokens_per_s
    return (f"| {'on' if peer.compile else 'off'} | {1e3 * tfx.step_s:.1f} | {tfx.tokens_per_s:.0f} "
            f"| {1e3 * peer.step_s:.1f} | {peer.tokens_per_s:.0f} | {ratio:.2f} |")  # fmt: skip


PEER_HEADER = ("| compile | tfx ms/update | tfx tgt tokens/s | torch peer ms/update | torch peer tgt tokens/s "
               "| tfx / peer |\n|---|---:|---:|---:|---:|---:|")  # fmt: skip


def end_to_end_row(tfx: Result, run: EndToEnd) -> str:
    return (f"| {'on' if tfx.compile else 'off'} | {run.updates} | {run.tokens:.0f} | {run.seconds:.2f} "
            f"| {run.tokens_per_s:.0f} | {tfx.tokens_per_s:.0f} |")  # fmt: skip


E2E_HEADER = ("| compile | tfx.train updates | real tgt tokens | training s | tfx.train tgt tokens/s "
              "| bench tgt tokens/s |\n|---|---:|---:|---:|---:|---:|")  # fmt: skip


# -------------------------------------------------------------------- CLI
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model.encoder_layers=2 train.precision=fp16")
    p.add_argument("--experiment", default="iwslt")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:N")
    p.add_argument("--batching", choices=["padded", "packed"], default="padded", help="data.batching (see above)")
    p.add_argument("--compile", nargs="+", choices=["off", "on"], default=["off"], help="one row each")
    p.add_argument("--compile-backend", default="inductor", help="eager: trace only (a quick dry run on CPU)")
    p.add_argument("--steps", type=int, default=30, help="timed updates")
    p.add_argument("--warmup", type=int, default=6, help="untimed updates first (compilation happens here)")
    p.add_argument("--lengths", type=int, nargs="+", default=[24, 32, 40], help="sentence lengths to cycle")
    p.add_argument("--vocab", type=int, default=None, help="default: the experiment's data.vocab_size")
    p.add_argument("--peak-tflops", type=float, default=None, help="the device's dense bf16 peak (TFLOP/s)")
    p.add_argument("--profile", action="store_true", help="add a torch.profiler breakdown of the first setting")
    p.add_argument("--profile-steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: train.threads)")
    p.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    p.add_argument("--real-data", action="store_true", help="time tfx.train's first batches of the corpus")
    p.add_argument(
        "--torch-peer", action="store_true", help="also time scripts/bench/torch_peer.py on the same batches"
    )
    p.add_argument("--end-to-end", type=int, default=0, metavar="N", help="also run tfx.train for N updates")
    p.add_argument("--end-to-end-dir", type=Path, default=None, help="its run folders (default: a temporary one)")
    p.add_argument("--peer", action="store_true", help="also run fairseq_peer.sh; implies --real-data")
    p.add_argument("--peer-script", type=Path, default=PEER_SCRIPT)
    p.add_argument("--peer-updates", type=int, default=2 * PEER_LOG_INTERVAL, help="fairseq updates (timed: after 10)")
    p.add_argument("--peer-timeout", type=float, default=1800.0, help="seconds (the first run installs fairseq)")
    p.add_argument("--repeat", type=int, default=1, help="with --peer: alternate tfx and fairseq this many times")
    args = p.parse_args(argv)
    if args.warmup < 1 or args.steps < 1:
        p.error("--warmup and --steps must be >= 1 (the first warm-up update is the cold one)")
    if args.torch_peer and args.real_data:
        p.error("--torch-peer runs on synthetic batches (the peer has no packed attention): drop --real-data")
    if args.peer:
        args.real_data = True
        if args.peer_updates < 2 * PEER_LOG_INTERVAL:
            p.error(f"--peer-updates must be >= {2 * PEER_LOG_INTERVAL}: fairseq's first log interval is warm-up")
        if args.threads <= 0 or args.compile != ["off"]:
            p.error("--peer needs --threads N (the same on both sides) and --compile off")
    return args


def peer_comparison(cfg: Config, args: argparse.Namespace, batches: list[Batch]) -> int:
    """Alternate tfx and fairseq ``--repeat`` times; one row each, then the ratio of the medians."""
    print(f"\npeer: {args.peer_script} {args.peer_updates} {args.threads} (timed: updates "
          f"{PEER_LOG_INTERVAL + 1}..{args.peer_updates})\n", flush=True)  # fmt: skip
    print("| run | system | timed updates | tgt tokens | s | tgt tokens/s |\n|---|---|---:|---:|---:|---:|", flush=True)
    ours, theirs = [], []
    for r in range(1, args.repeat + 1):
        result, stepper = measure(cfg, args, batches, compile_model=False)
        del stepper
        ours.append(result.tokens_per_s)
        tokens = result.tokens_per_step * args.steps
        print(f"| {r} | tfx | {args.steps} | {tokens:.0f} | {result.step_s * args.steps:.1f} "
              f"| {result.tokens_per_s:.0f} |", flush=True)  # fmt: skip
        peer = run_peer(args.peer_script, args.peer_updates, args.threads, args.peer_timeout)
        theirs.append(peer.tokens_per_s)
        print(f"| {r} | fairseq 0.12.2 | {peer.updates} | {peer.tokens:.0f} | {peer.seconds:.1f} "
              f"| {peer.tokens_per_s:.0f} |", flush=True)  # fmt: skip
    a, b = statistics.median(ours), statistics.median(theirs)
    pairs = ", ".join(f"{x / y:.2f}" for x, y in zip(ours, theirs, strict=True))
    print(f"\ntfx {a:.0f} tgt tokens/s, fairseq {b:.0f}: ratio {a / b:.2f}x (medians; per pair: {pairs})")
    return 0


def failed_row(label: str, err: Exception, columns: int) -> str:
    first_line = (str(err).strip().splitlines() or [""])[0]
    return f"| {label} | failed: {type(err).__name__}: {first_line} |" + "|" * (columns - 2)


def rows(cfg: Config, args: argparse.Namespace, batches: list[Batch]) -> tuple[list[Result], bool]:
    """One row per compile setting, printed as soon as it exists (a later one failing or timing out, as
    torch.compile can take minutes, keeps it); the profile of the first, and its torch peer row."""
    results, profiled, failed, peers = [], False, False, []
    for mode in args.compile:
        try:
            result, stepper = measure(cfg, args, batches, compile_model=mode == "on")
        except Exception as err:  # noqa: BLE001 - e.g. torch.compile failing on this machine: report, go on
            print(failed_row(mode, err, len(COLUMNS)), flush=True)
            failed = True
            continue
        results.append(result)
        print(table_row(result), flush=True)
        for line in warnings_for(result, cfg.train.compile_scope):
            print(line, flush=True)
        if args.profile and not profiled:
            print(f"\nprofile, compile {mode}:\n\n{profile_table(stepper, batches, cfg, args.profile_steps)}\n",
                  flush=True)  # fmt: skip
            profiled = True
        del stepper  # free the device before the next setting
        if args.torch_peer:
            try:
                peers.append(peer_row(result, measure_torch_peer(cfg, args, batches, mode == "on")))
            except Exception as err:  # noqa: BLE001
                peers.append(failed_row(mode, err, 6))
                failed = True
            print(f"torch peer: {peers[-1]}", flush=True)
    if profiled and len(results) > 1:  # the rows together again, below the profile
        print("\n".join([table_header(cfg, args, batches), *map(table_row, results)]), flush=True)
    if peers:
        precision = Precision(cfg.train.precision, torch.device(args.device)).name  # the peer's too
        print(f"\ntorch peer (scripts/bench/torch_peer.py, {precision}) on the same batches:\n\n{PEER_HEADER}\n"
              + "\n".join(peers), flush=True)  # fmt: skip
    return results, failed


def end_to_end(args: argparse.Namespace, overrides: list[str], results: list[Result]) -> bool:
    """tfx.train for ``--end-to-end`` updates per measured compile setting; True if any run failed."""
    lines, failed = [], False
    for result in results:
        try:
            lines.append(end_to_end_row(result, run_end_to_end(args, overrides, result.compile)))
        except Exception as err:  # noqa: BLE001
            lines.append(failed_row("on" if result.compile else "off", err, 6))
            failed = True
    print(f"\nend to end: python -m tfx.train +experiment={args.experiment} train.max_updates={args.end_to_end} "
          f"(the experiment's corpus; its training seconds include compilation, warm-up and data loading)\n\n"
          f"{E2E_HEADER}\n" + "\n".join(lines), flush=True)  # fmt: skip
    return failed


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:  # a missing GPU is one line, not a traceback; children get the concrete name
        args.device = str(resolve_device(args.device, setting="--device"))
    except DeviceError as err:
        sys.exit(f"error: {err}")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    overrides = [*args.overrides, f"train.device={args.device}", f"data.batching={args.batching}"]
    threads = (
        [f"train.threads={args.threads}"] if args.threads > 0 else []
    )  # tfx.training.build sets them, as tfx.train's
    cfg = compose(args.experiment, [*overrides, *threads])
    args.vocab = args.vocab or cfg.data.vocab_size
    batches = prepare_batches(cfg, args, torch.device(args.device))
    if args.peer:
        return peer_comparison(cfg, args, batches)
    print(table_header(cfg, args, batches), flush=True)
    results, failed = rows(cfg, args, batches)
    if args.end_to_end:
        failed = end_to_end(args, overrides, results) or failed
    if args.json:
        args.json.write_text(json.dumps([vars(r) for r in results], indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
