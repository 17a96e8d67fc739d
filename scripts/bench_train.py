"""Training throughput at a named experiment's sizes: target tokens/s, model FLOPs utilization, profile.

Builds the experiment's model (``+experiment=NAME`` plus any Hydra overrides), its init, the
trainer's fused AdamW and ``train.precision`` (tfx/precision.py: autocast, fp16 loss scaling,
unscale + clip), optionally ``torch.compile`` as the trainer wraps it, and times the trainer's
update (forward, label-smoothed loss, backward, clip, optimizer step) on synthetic batches: random
token ids at the experiment's vocabulary size, ``max_tokens`` per batch, cycling through a few
sentence lengths as token bucketing does. No corpus is read, so data loading is not in the figure.
``--real-data`` times tfx.train's own first batches instead: the experiment's corpus (e.g.
``data=multi30k``), its sentencepiece vocabulary, ``make_batches`` with the run's seed and epoch 1,
collated before the clock starts, tokens counted as the trainer does (non-pad target tokens).

``--peer`` (implies ``--real-data``) runs ``../shared/bench/fairseq_peer.sh`` in the same invocation
(fairseq 0.12.2, ``transformer_iwslt_de_en``, tied decoder embeddings, dropout 0.3, max_tokens 4096,
Multi30k De->En with its own 8k joint BPE, ``OMP_NUM_THREADS=--threads``) and prints both target
tokens/s and their ratio. Both sides are steady state: fairseq's figure is its ``train_inner`` log
lines after the first (``--log-interval 10``: updates 11..N), tfx's the ``--steps`` updates after
``--warmup``. ``--repeat R`` alternates the two R times, so a busy machine shows up as spread.

Model FLOPs utilization (MFU, as in PaLM, Chowdhery et al. 2022, appendix B) counts the FLOPs the
model needs, not what the kernels do (no recomputation, no padding):

- matmuls: 6 x parameters x tokens (2 forward, 4 backward), each parameter counted on the stream it
  runs over: encoder layers on source tokens, decoder layers and the output projection (d x V,
  tied or not) on target tokens; embedding lookups are free;
- attention scores and values: 12 x d x T_q x T_k per layer and sentence (encoder self, decoder
  self without the causal saving, decoder cross).

MFU = those FLOPs per second / the device's dense bf16 peak: ``PEAK_TFLOPS`` by device name
(``--peak-tflops`` overrides, and is needed on CPUs). ``--profile`` adds a ``torch.profiler``
breakdown of one step by operator family (self time, so nothing is counted twice).

Usage::

    python scripts/bench_train.py --experiment iwslt --compile off on          # GPU
    python scripts/bench_train.py --experiment iwslt --profile --device cpu --steps 3 model.encoder_layers=2
    python scripts/bench_train.py --experiment iwslt --device cpu --threads 1 --peer --warmup 2 --steps 10 \
        data=multi30k data.local_dir=../shared/data/multi30k train.precision=fp32   # tfx vs fairseq

Needs tfx installed (``pip install -e .`` in the checkout): it imports tfx as a package.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from tfx.config import Config, compose_config
from tfx.criterion import label_smoothed_loss
from tfx.data import BOS, PAD, collate, make_batches, prepare_data
from tfx.distributed import DeviceError, resolve_device
from tfx.init import apply_init
from tfx.model import Transformer, build_model
from tfx.optim import build_optimizer, lr_at, set_lr
from tfx.precision import Precision

PEER_SCRIPT = Path(__file__).resolve().parents[2] / "shared" / "bench" / "fairseq_peer.sh"
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


def synthetic_batches(vocab: int, max_tokens: int, lengths: list[int], device: torch.device, seed: int = 0):
    """One (src, prev_output_tokens, target, ntokens) per length: ``max_tokens // length`` sentences, no padding."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for n in lengths:
        rows = max(1, max_tokens // n)
        src = torch.randint(4, vocab, (rows, n), generator=g)
        target = torch.randint(4, vocab, (rows, n), generator=g)
        prev = torch.cat([torch.full((rows, 1), BOS), target[:, :-1]], dim=1)
        batches.append((src.to(device), prev.to(device), target.to(device), target.numel()))
    return batches


def real_batches(cfg: Config, count: int, device: torch.device) -> tuple[list, int]:
    """tfx.train's first ``count`` batches of epoch 1 (same corpus, vocabulary, seed and plan), and the vocab size."""
    corpus = prepare_data(cfg.data, seed=cfg.train.seed, splits=("train",))
    train = corpus.splits["train"]
    plan = make_batches(train, cfg.data.max_tokens, cfg.data.max_sentences, shuffle=True, seed=cfg.train.seed)
    batches = []
    for indices in plan[:count]:
        b = collate(train, indices).to(device)
        batches.append((b.src_tokens, b.prev_output_tokens, b.target, b.ntokens))
    return batches, corpus.tokenizer.vocab_size


def layer_params(layers: torch.nn.Module) -> int:
    return sum(p.numel() for p in layers.parameters())


def matmul_flops(model: Transformer, d_model: int, vocab: int, src: torch.Tensor, tgt: torch.Tensor) -> float:
    """6 x parameters x tokens, each stack on its own stream, plus the output projection (see the docstring)."""
    enc, dec = layer_params(model.encoder.layers), layer_params(model.decoder.layers)
    return 6.0 * (enc * src.numel() + (dec + d_model * vocab) * tgt.numel())


def attention_flops(model: Transformer, d_model: int, src: torch.Tensor, tgt: torch.Tensor) -> float:
    """12 x d x T_q x T_k per layer and sentence: QK^T and AV, forward (4) and backward (8)."""
    rows, s_len = src.shape
    t_len = tgt.shape[1]
    n_enc, n_dec = len(model.encoder.layers), len(model.decoder.layers)
    return 12.0 * d_model * rows * (n_enc * s_len * s_len + n_dec * (t_len * t_len + t_len * s_len))


def step_flops(model: Transformer, d_model: int, vocab: int, src: torch.Tensor, tgt: torch.Tensor) -> float:
    """Model FLOPs of one training update on this batch."""
    return matmul_flops(model, d_model, vocab, src, tgt) + attention_flops(model, d_model, src, tgt)


@dataclass
class Result:
    compile: bool
    params_m: float
    tokens_per_step: float
    step_s: float
    tokens_per_s: float
    tflops: float
    mfu: float | None


class Bench:
    """The model, optimizer and precision of one experiment, stepped like ``Trainer.train_step``."""

    def __init__(self, cfg: Config, vocab: int, device: torch.device, compile_backend: str | None) -> None:
        torch.manual_seed(cfg.train.seed)
        self.cfg, self.device = cfg, device
        self.model = build_model(cfg.model, vocab, PAD)
        apply_init(self.model, cfg.init.name, seed=cfg.train.seed)
        self.model.to(device).train()
        self.net = self.model
        if compile_backend:  # as Trainer._wrap (which uses the default backend, inductor)
            self.net = torch.compile(self.model, dynamic=True, backend=compile_backend)
        self.optimizer = build_optimizer(self.model, cfg.optim, device)
        self.precision = Precision(cfg.train.precision, device)
        self.updates = 0

    def step(self, src: torch.Tensor, prev: torch.Tensor, target: torch.Tensor, ntokens: float) -> None:
        opt = self.cfg.optim
        set_lr(self.optimizer, lr_at(self.updates, opt))
        with self.precision.autocast():
            logits = self.net(src, prev)
            loss, _ = label_smoothed_loss(logits, target, opt.label_smoothing, PAD)
        self.precision.backward(loss / ntokens)
        clip = opt.clip_norm if opt.clip_norm > 0 else float("inf")
        grad_norm = self.precision.unscale_and_clip(self.optimizer, self.model.parameters(), clip)
        self.precision.step(self.optimizer, grad_norm, loss_finite=True)
        self.optimizer.zero_grad(set_to_none=True)
        self.updates += 1


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


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(cfg: Config, args: argparse.Namespace, compile_model: bool) -> tuple[Result, Bench, list]:
    device = torch.device(args.device)
    if args.real_data:
        batches, args.vocab = real_batches(cfg, args.warmup + args.steps, device)
    else:
        batches = synthetic_batches(args.vocab, cfg.data.max_tokens, args.lengths, device)
    bench = Bench(cfg, args.vocab, device, args.compile_backend if compile_model else None)
    for i in range(args.warmup):  # compiles every length bucket, warms allocator and kernels
        bench.step(*batches[i % len(batches)])
    sync(device)
    timed = [batches[(args.warmup + i if args.real_data else i) % len(batches)] for i in range(args.steps)]
    tic = time.perf_counter()
    for batch in timed:
        bench.step(*batch)
    sync(device)
    seconds = time.perf_counter() - tic
    tokens = sum(ntokens for *_, ntokens in timed)
    flops = sum(step_flops(bench.model, cfg.model.d_model, args.vocab, src, target) for src, _, target, _ in timed)
    peak = peak_tflops(device, args.peak_tflops)
    tflops = flops / seconds / 1e12
    result = Result(
        compile=compile_model,
        params_m=sum(p.numel() for p in bench.model.parameters()) / 1e6,
        tokens_per_step=tokens / args.steps,
        step_s=seconds / args.steps,
        tokens_per_s=tokens / seconds,
        tflops=tflops,
        mfu=tflops / peak if peak else None,
    )
    return result, bench, batches


def profile_table(bench: Bench, batches: list, steps: int) -> str:
    """Self time per operator family over ``steps`` updates, per update."""
    from torch.profiler import ProfilerActivity, profile

    cuda = bench.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for i in range(steps):
            bench.step(*batches[i % len(batches)])
        sync(bench.device)
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


def table_header(cfg: Config, args: argparse.Namespace) -> str:
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    peak = peak_tflops(device, args.peak_tflops)
    m = cfg.model
    return "\n".join([
        f"{args.experiment}: {m.encoder_layers}+{m.decoder_layers} layers, d {m.d_model}, ffn {m.ffn_dim}, "
        f"{m.heads} heads, vocab {args.vocab}, max_tokens {cfg.data.max_tokens}, lengths {args.lengths}, "
        f"precision {Precision(cfg.train.precision, device).name}, {name}, "
        f"peak {f'{peak:g} TFLOP/s' if peak else 'unknown (--peak-tflops)'}; "
        f"{args.steps} timed updates after {args.warmup} warm-up",
        "",
        "| compile | params (M) | tgt tokens/update | ms/update | tgt tokens/s | model TFLOP/s | MFU |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ])  # fmt: skip


def table_row(r: Result) -> str:
    mfu = f"{100 * r.mfu:.1f}%" if r.mfu is not None else "n/a"
    return (
        f"| {'on' if r.compile else 'off'} | {r.params_m:.1f} | {r.tokens_per_step:.0f} | {1e3 * r.step_s:.1f} "
        f"| {r.tokens_per_s:.0f} | {r.tflops:.3g} | {mfu} |"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model.encoder_layers=2 train.precision=fp16")
    p.add_argument("--experiment", default="iwslt")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:N")
    p.add_argument("--compile", nargs="+", choices=["off", "on"], default=["off"], help="one row each")
    p.add_argument("--compile-backend", default="inductor", help="eager: trace only (a quick dry run on CPU)")
    p.add_argument("--steps", type=int, default=30, help="timed updates")
    p.add_argument("--warmup", type=int, default=6, help="untimed updates first (compilation happens here)")
    p.add_argument("--lengths", type=int, nargs="+", default=[24, 32, 40], help="sentence lengths to cycle")
    p.add_argument("--vocab", type=int, default=None, help="default: the experiment's data.vocab_size")
    p.add_argument("--peak-tflops", type=float, default=None, help="the device's dense bf16 peak (TFLOP/s)")
    p.add_argument("--profile", action="store_true", help="add a torch.profiler breakdown of the first setting")
    p.add_argument("--profile-steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    p.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    p.add_argument("--real-data", action="store_true", help="time tfx.train's first batches of the corpus")
    p.add_argument("--peer", action="store_true", help="also run fairseq_peer.sh; implies --real-data")
    p.add_argument("--peer-script", type=Path, default=PEER_SCRIPT)
    p.add_argument("--peer-updates", type=int, default=2 * PEER_LOG_INTERVAL, help="fairseq updates (timed: after 10)")
    p.add_argument("--peer-timeout", type=float, default=1800.0, help="seconds (the first run installs fairseq)")
    p.add_argument("--repeat", type=int, default=1, help="with --peer: alternate tfx and fairseq this many times")
    args = p.parse_args(argv)
    if args.peer:
        args.real_data = True
        if args.peer_updates < 2 * PEER_LOG_INTERVAL:
            p.error(f"--peer-updates must be >= {2 * PEER_LOG_INTERVAL}: fairseq's first log interval is warm-up")
        if args.threads <= 0 or args.compile != ["off"]:
            p.error("--peer needs --threads N (the same on both sides) and --compile off")
    return args


def peer_comparison(cfg: Config, args: argparse.Namespace) -> int:
    """Alternate tfx and fairseq ``--repeat`` times; one row each, then the ratio of the medians."""
    print(f"\npeer: {args.peer_script} {args.peer_updates} {args.threads} (timed: updates "
          f"{PEER_LOG_INTERVAL + 1}..{args.peer_updates})\n", flush=True)  # fmt: skip
    print("| run | system | timed updates | tgt tokens | s | tgt tokens/s |\n|---|---|---:|---:|---:|---:|", flush=True)
    ours, theirs = [], []
    for r in range(1, args.repeat + 1):
        result, bench, _ = measure(cfg, args, compile_model=False)
        del bench
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:  # a missing GPU is one line, not a traceback; children get the concrete name
        args.device = str(resolve_device(args.device, setting="--device"))
    except DeviceError as err:
        sys.exit(f"error: {err}")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    overrides = [*args.overrides, f"train.device={args.device}"]
    cfg = compose(args.experiment, overrides)
    args.vocab = args.vocab or cfg.data.vocab_size
    if args.peer:
        return peer_comparison(cfg, args)
    print(table_header(cfg, args), flush=True)
    results, profiled, failed = [], False, False
    # Each row, and the profile of the first setting measured, as soon as they exist: a later setting
    # failing or timing out (torch.compile can take minutes) keeps them.
    for mode in args.compile:
        try:
            result, bench, batches = measure(cfg, args, compile_model=mode == "on")
        except Exception as err:  # noqa: BLE001 - e.g. torch.compile failing on this machine: report, go on
            first_line = (str(err).strip().splitlines() or [""])[0]
            print(f"| {mode} | failed: {type(err).__name__}: {first_line} |||||", flush=True)
            failed = True
            continue
        results.append(result)
        print(table_row(result), flush=True)
        if args.profile and not profiled:
            print(f"\nprofile, compile {mode}:\n\n{profile_table(bench, batches, args.profile_steps)}\n", flush=True)
            profiled = True
        del bench, batches  # free the device before the next setting
    if profiled and len(results) > 1:  # the rows together again, below the profile
        print("\n".join([table_header(cfg, args), *map(table_row, results)]), flush=True)
    if args.json:
        args.json.write_text(json.dumps([vars(r) for r in results], indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
