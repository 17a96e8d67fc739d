"""Peak training memory of 50-200-layer LayerNorm-free Transformers, with and without activation checkpointing.

Without checkpointing, backward needs every layer's intermediate tensors, so activation memory
grows linearly with depth and dominates at 200+200 layers; ``checkpoint_activations`` keeps
only each layer's input and recomputes the rest in backward (~1 extra forward of compute).

Each measurement runs in a fresh subprocess (``--measure``), because a process's peak RSS
(``getrusage(RUSAGE_SELF).ru_maxrss``) never goes down: it builds the model (T-Fixup, norm
none, the deep experiment's dropout 0.3 / 0 / 0), then runs ``--steps`` forward + backward passes
(label-smoothed loss, no optimizer step, grads cleared between steps) of one fixed random batch
of ``--sentences x --length`` tokens per side. On CPU it reports:

- ``params MB``: fp32 parameter bytes; the gradients take as much again during backward;
- ``RSS built``: resident memory after build + init (Python, torch, and the parameters);
- ``peak RSS``: the process's peak; ``peak - built`` is what training added;
- ``~activations``: ``peak - built - params MB`` (the gradients), i.e. saved activations plus
  the allocator's temporaries.

glibc's malloc keeps freed mid-size blocks (an activation here is ~1 MB) in its heap, so by
default peak RSS measures heap fragmentation as much as tensors (at 50 layers, checkpointing
off, 2.3 GB added instead of 1.5 GB). Children therefore run with ``MALLOC_MMAP_THRESHOLD_=65536``:
blocks >= 64 KiB are mmap'd and returned to the OS when freed, so peak RSS tracks peak live
bytes (at some speed cost). ``--default-malloc`` measures what an untuned process sees.

With CUDA (``--device cuda``, default when available) it reports ``torch.cuda.max_memory_allocated``
instead, which counts tensors only, and the allocated bytes after build.

``--build`` instead times building + T-Fixup-initializing one 200+200 model per ``--build-d-model``
(fresh subprocess each; d_model 512 is ~1B parameters = 4 GB fp32).

Usage: ``python scripts/studies/deep_memory.py [--layers 50 100 200] [--d-model 128] [--build --build-d-model 128 512]``

Needs tfx installed (``pip install -e .`` in the checkout): it imports tfx as a package.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import _require_tfx  # noqa: F401  (a one-line error, not a traceback, without `pip install -e .`)
import torch
from torch.utils.checkpoint import checkpoint

from tfx.init import apply_init
from tfx.model import ModelConfig, Transformer

# Run as a plain file from a checkout without `pip install -e .`: make the repo root importable.
from tfx.optim.loss import label_smoothed_loss
from tfx.reporting.init_report import random_tokens
from tfx.runtime.distributed import DeviceError, resolve_device

PAD = 1  # any id: the random batch has no padding
MB = 2**20
MMAP_THRESHOLD = 64 * 1024  # bytes; glibc mmaps (and unmaps at free) blocks at least this big


def current_rss_mb() -> float:
    """Resident memory now (``VmRSS``), in MiB; Linux only."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024 / MB
    return float("nan")


def peak_rss_mb() -> float:
    """This process's peak resident memory in MiB (``ru_maxrss`` is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MB


def build(layers: int, d_model: int, ffn_dim: int, heads: int, vocab: int, checkpoint: bool) -> Transformer:
    """The deep experiment's model (conf/model/deep.yaml) at the given width, T-Fixup-initialized."""
    cfg = ModelConfig(
        encoder_layers=layers, decoder_layers=layers, d_model=d_model, ffn_dim=ffn_dim, heads=heads, norm="none",
        dropout=0.3, attention_dropout=0.0, activation_dropout=0.0, checkpoint_activations=checkpoint,
    )  # fmt: skip
    model = Transformer(cfg, vocab, PAD)
    apply_init(model, "tfixup", seed=1)
    return model


def fixed_batch(sentences: int, length: int, vocab: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(src, tgt) random ids >= 4 (ids 0-3 are specials), (sentences, length) each, no padding."""
    g = torch.Generator().manual_seed(0)
    src, tgt = (random_tokens(sentences, length, vocab, PAD, g, min_length=length) for _ in range(2))
    return src.to(device), tgt.to(device)


def warm_up_checkpointing() -> None:
    """Call ``torch.utils.checkpoint`` once on a scalar, in both modes.

    Its first call lazily imports modules worth ~70 MB of RSS; warming up before the
    "built" snapshot keeps that constant out of the checkpointing-on activation column.
    """
    x = torch.ones((), requires_grad=True)
    checkpoint(torch.relu, x, use_reentrant=False).backward()


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """One (layers, checkpointing) measurement in this (fresh) process."""
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    warm_up_checkpointing()
    model = build(args.layers, args.d_model, args.ffn_dim, args.heads, args.vocab, args.checkpoint).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    src, tgt = fixed_batch(args.sentences, args.length, args.vocab, device)
    built = torch.cuda.memory_allocated(device) / MB if device.type == "cuda" else current_rss_mb()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    model.train()
    seconds = []
    for _ in range(args.steps):
        tic = time.perf_counter()
        loss, _ = label_smoothed_loss(model(src, tgt), tgt, 0.1, PAD)
        (loss / tgt.numel()).backward()
        model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - tic)
    peak = torch.cuda.max_memory_allocated(device) / MB if device.type == "cuda" else peak_rss_mb()
    return {
        "layers": args.layers, "checkpoint": args.checkpoint, "device": device.type, "params_m": n_params / 1e6,
        "params_mb": n_params * 4 / MB, "built_mb": built, "peak_mb": peak, "s_per_step": min(seconds),
    }  # fmt: skip


def time_build(args: argparse.Namespace) -> dict[str, Any]:
    """Seconds to construct a 200+200 model and to T-Fixup-initialize it, in this (fresh) process."""
    torch.set_num_threads(args.threads)
    tic = time.perf_counter()
    cfg = ModelConfig(encoder_layers=args.layers, decoder_layers=args.layers, d_model=args.d_model,
                      ffn_dim=args.ffn_dim, heads=args.heads, norm="none")  # fmt: skip
    model = Transformer(cfg, args.vocab, PAD)
    built = time.perf_counter()
    apply_init(model, "tfixup", seed=1)
    done = time.perf_counter()
    n_params = sum(p.numel() for p in model.parameters())
    return {
        "layers": args.layers, "d_model": args.d_model, "ffn_dim": args.ffn_dim, "params_m": n_params / 1e6,
        "construct_s": built - tic, "init_s": done - built, "peak_rss_mb": peak_rss_mb(),
    }  # fmt: skip


def child(args: argparse.Namespace, extra: list[str], timeout: float) -> dict[str, Any]:
    """Run this script on one setting in a fresh interpreter; its last stdout line is JSON."""
    cmd = [sys.executable, str(Path(__file__).resolve()), *extra, *common_flags(args)]
    env = dict(os.environ)
    if not args.default_malloc:
        env["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)  # see the module docstring
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def common_flags(args: argparse.Namespace) -> list[str]:
    return [
        "--heads", str(args.heads), "--vocab", str(args.vocab), "--sentences", str(args.sentences),
        "--length", str(args.length), "--steps", str(args.steps), "--threads", str(args.threads),
        "--device", args.device,
    ]  # fmt: skip


def memory_table(rows: list[dict[str, Any]]) -> str:
    cuda = rows and rows[0]["device"] == "cuda"
    built, peak = ("alloc built", "max alloc") if cuda else ("RSS built", "peak RSS")
    lines = [
        f"| layers/side | ckpt | params (M) | params MB | {built} MB | {peak} MB | peak - built MB "
        "| ~activations MB | s/step |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        added = r["peak_mb"] - r["built_mb"]
        lines.append(
            f"| {r['layers']} | {'on' if r['checkpoint'] else 'off'} | {r['params_m']:.1f} | {r['params_mb']:.0f} "
            f"| {r['built_mb']:.0f} | {r['peak_mb']:.0f} | {added:.0f} | {added - r['params_mb']:.0f} "
            f"| {r['s_per_step']:.2f} |"
        )
    return "\n".join(lines)


def build_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| layers/side | d_model | ffn | params (M) | construct s | T-Fixup init s | peak RSS MB |",
             "|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        lines.append(
            f"| {r['layers']} | {r['d_model']} | {r['ffn_dim']} | {r['params_m']:.0f} | {r['construct_s']:.1f} "
            f"| {r['init_s']:.1f} | {r['peak_rss_mb']:.0f} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, nargs="+", default=[50, 100, 200], help="layers per side")
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--ffn-dim", type=int, default=None, help="default: 2 x d_model")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8000, help="joint vocabulary (sets the logits' size)")
    p.add_argument("--sentences", type=int, default=64)
    p.add_argument("--length", type=int, default=32, help="tokens per sentence, each side")
    p.add_argument("--steps", type=int, default=2, help="forward/backward passes; the fastest is reported")
    p.add_argument("--threads", type=int, default=1, help="1 is steadiest on a shared machine")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:N")
    p.add_argument("--default-malloc", action="store_true", help="keep glibc's default mmap threshold")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per measurement")
    p.add_argument("--build", action="store_true", help="time build + init of 200+200 models instead")
    p.add_argument("--build-d-model", type=int, nargs="+", default=[128, 512])
    # internal: one measurement in this process
    p.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--time-build", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--checkpoint", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.ffn_dim = args.ffn_dim or 2 * args.d_model
    if args.measure or args.time_build:
        args.layers = args.layers[0]  # a child measures one depth
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:  # a missing GPU is one line, not a traceback; children get the concrete name
        args.device = str(resolve_device(args.device, setting="--device"))
    except DeviceError as err:
        sys.exit(f"error: {err}")
    if args.measure:
        print(json.dumps(measure(args)))
        return 0
    if args.time_build:
        print(json.dumps(time_build(args)))
        return 0
    if args.build:
        rows = [child(args, ["--time-build", "--layers", "200", "--d-model", str(d), "--ffn-dim", str(2 * d)],
                      args.timeout) for d in args.build_d_model]  # fmt: skip
        print(f"build + T-Fixup init, 200+200 layers, {args.threads} thread(s), fresh process each:")
        print(build_table(rows))
        return 0
    rows = []
    for layers in args.layers:
        for ckpt in (False, True):
            extra = ["--measure", "--layers", str(layers), "--d-model", str(args.d_model), "--ffn-dim",
                     str(args.ffn_dim)] + (["--checkpoint"] if ckpt else [])  # fmt: skip
            rows.append(child(args, extra, args.timeout))
            print(f"measured {layers} layers/side, checkpointing {'on' if ckpt else 'off'}", file=sys.stderr)
    print(
        f"d_model {args.d_model}, ffn {args.ffn_dim}, {args.heads} heads, vocab {args.vocab}, batch "
        f"{args.sentences}x{args.length} tokens per side, {args.steps} fwd+bwd steps, {args.device}, "
        f"{args.threads} thread(s), fresh process each, "
        f"{'default malloc' if args.default_malloc else f'MALLOC_MMAP_THRESHOLD_={MMAP_THRESHOLD}'}:"
    )
    print(memory_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
