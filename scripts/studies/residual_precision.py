"""How far bf16 rounding moves a T-Fixup model's output and gradient: the residual stream in fp32 (tfx) or in bf16.

Under bf16 autocast tfx keeps the residual stream (embeddings + positions, every ``x + f(x)``) in fp32: autocast
rounds each GEMM's inputs and output to bf16, and the sum stays fp32. A bf16 stream would save the fp32 -> bf16 cast
of each sublayer's input, but it rounds the stream itself after every residual add, and with 8 significant bits a
branch's update below 2^-8 of the stream's value is rounded away. This script measures the effect: in fp32 on CPU,
it emulates autocast by rounding to bf16 where autocast does (GEMM inputs, weights and outputs), and the bf16 stream
by rounding also after the embedding and after every residual add; it prints the relative error of the logits and of
the whole gradient (label-smoothed loss) against plain fp32, at each depth, on random tokens with T-Fixup's
initialization (``+experiment=deep``'s model at d 512, eval mode: no dropout).

    python scripts/studies/residual_precision.py --depths 6 50 200
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator

import _require_tfx  # noqa: F401  (a one-line error, not a traceback, without `pip install -e .`)
import torch
import torch.nn.functional as F
from torch import Tensor

from tfx.config import compose_config
from tfx.init import apply_init
from tfx.model import build_model
from tfx.model import residual as residual_module
from tfx.model import transformer as transformer_module


def bf16(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.to(torch.bfloat16).to(t.dtype)


@contextlib.contextmanager
def rounded(stream: bool) -> Iterator[None]:
    """Round to bf16 where autocast does (GEMM inputs, weights, outputs); with ``stream`` also the residual
    stream: the embedding output and every residual sum."""
    linear, add, embed = F.linear, residual_module.Residual.forward, transformer_module.TokenEmbedding.forward

    def linear_bf16(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        return bf16(linear(bf16(x), bf16(weight), bf16(bias)))

    F.linear = linear_bf16
    if stream:
        residual_module.Residual.forward = lambda self, x, branch: bf16(add(self, x, branch))
        transformer_module.TokenEmbedding.forward = lambda self, *a, **k: bf16(embed(self, *a, **k))
    try:
        yield
    finally:
        F.linear, residual_module.Residual.forward, transformer_module.TokenEmbedding.forward = linear, add, embed


def logits_and_grads(model: torch.nn.Module, src: Tensor, prev: Tensor, tgt: Tensor) -> tuple[Tensor, list[Tensor]]:
    model.zero_grad(set_to_none=True)
    logits = model(src, prev)
    F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), label_smoothing=0.1).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)  # the grads stay with the caller, not in the model (200+200: 4 GB each)
    return logits.detach(), grads


def relative(a: list[Tensor], ref: list[Tensor]) -> float:
    """||a - ref|| / ||ref|| over all tensors together, one tensor at a time (no concatenated copy)."""
    diff = sum(float((x - y).square().sum()) for x, y in zip(a, ref, strict=True))
    return (diff / sum(float(y.square().sum()) for y in ref)) ** 0.5


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depths", type=int, nargs="+", default=[6, 50, 200], help="layers per side")
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--length", type=int, default=16)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"T-Fixup, d {args.d_model}, {args.batch} x {args.length} random tokens, fp32 CPU with bf16 rounding "
          "emulated; relative error against plain fp32")  # fmt: skip
    print(
        "| layers per side | logits, fp32 stream | logits, bf16 stream | gradient, fp32 stream | "
        "gradient, bf16 stream |"
    )
    print("|---:|---:|---:|---:|---:|")
    for depth in args.depths:
        cfg = compose_config(["+experiment=deep", f"model.encoder_layers={depth}", f"model.decoder_layers={depth}",
                              f"model.d_model={args.d_model}"])  # fmt: skip
        model = build_model(cfg.model, args.vocab, pad_id=1)
        apply_init(model, cfg.init.name, seed=1)
        model.eval()
        gen = torch.Generator().manual_seed(0)
        src, tgt = (torch.randint(4, args.vocab, (args.batch, args.length), generator=gen) for _ in range(2))
        prev = torch.cat([torch.full((args.batch, 1), 2), tgt[:, :-1]], dim=1)
        ref_logits, ref_grads = logits_and_grads(model, src, prev, tgt)
        cells = []
        for stream in (False, True):
            with rounded(stream):
                logits, grads = logits_and_grads(model, src, prev, tgt)
            cells.append((relative([logits], [ref_logits]), relative(grads, ref_grads)))
            del grads
        (logits_32, grad_32), (logits_16, grad_16) = cells
        print(f"| {depth} | {logits_32:.2e} | {logits_16:.2e} | {grad_32:.2e} | {grad_16:.2e} |", flush=True)


if __name__ == "__main__":
    main()
