"""The init report: one real forward *and* backward pass on a batch, before training (``python -m tfx.diagnostics``).

Is the init sane? Without LayerNorm a bad init shows up as per-layer gradient or output norms that
grow (or shrink) with depth. A widely copied version of this check runs under ``torch.no_grad()`` and
then reads ``.grad``, which is always empty; ours forces grad mode on and takes the gradients from
``torch.autograd.grad``, so they are real and the model's own ``.grad`` is never touched. The command
line builds, inits and reports on a random batch; ``tfx/diagnostics.py`` is its ``python -m`` entry.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tfx.config import ModelConfig
from tfx.init import SCHEMES, apply_init
from tfx.model import Transformer, build_model
from tfx.model.residual import RESIDUALS
from tfx.reporting.statistics import PAD_ID, ActivationRMS, _norm_of, _stat_key, named_layers


@dataclass
class InitReport:
    """What one forward/backward pass says about an initialized model (layers: enc..., dec...)."""

    layers: list[str]  # "enc/0", ..., "dec/N-1"
    grad_norms: list[float]  # L2 norm of the loss gradient over all parameters of each layer
    act_rms: list[float]  # RMS of each layer's output over non-pad positions
    grad_norm_ratio: float  # max / min of grad_norms: ~1 means every depth learns at a similar rate
    output_std: float  # std of the logits at non-pad decoder positions
    loss: float  # mean token cross-entropy over non-pad targets

    def as_dict(self) -> dict[str, float]:
        """Flat dict in the trainer's key format, plus the summary numbers."""
        out = {_stat_key(n, "grad_norm"): g for n, g in zip(self.layers, self.grad_norms, strict=True)}
        out.update({_stat_key(n, "act_rms"): a for n, a in zip(self.layers, self.act_rms, strict=True)})
        out.update(grad_norm_ratio=self.grad_norm_ratio, output_std=self.output_std, loss=self.loss)
        return out


def default_target(prev_output_tokens: Tensor, pad_id: int) -> Tensor:
    """Targets when none are given: ``prev_output_tokens`` shifted left by one, PAD at the end.

    Teacher forcing feeds ``prev = [BOS] + target[:-1]``, so position t predicts ``prev[t+1]``;
    the last position has no next token and is ignored (PAD).
    """
    target = torch.full_like(prev_output_tokens, pad_id)
    target[:, :-1] = prev_output_tokens[:, 1:]
    return target


def _capture_modes(model: nn.Module) -> list[tuple[nn.Module, bool]]:
    return [(m, m.training) for m in model.modules()]


def init_report(
    model: Transformer, src_tokens: Tensor, prev_output_tokens: Tensor, target: Tensor | None = None
) -> InitReport:
    """One forward + backward pass on a real batch; the model's ``.grad`` and train/eval modes are left as found.

    Runs in eval mode (dropout off) so the numbers describe the init, not one dropout draw.
    ``target=None`` uses ``default_target(prev_output_tokens)``. Gradients come from
    ``torch.autograd.grad`` under ``torch.enable_grad()``: real even if the caller is in
    ``no_grad``, and never accumulated into ``.grad``.
    """
    device = next(model.parameters()).device
    src_tokens, prev_output_tokens = src_tokens.to(device), prev_output_tokens.to(device)
    target = default_target(prev_output_tokens, model.pad_id) if target is None else target.to(device)
    if not target.ne(model.pad_id).any():
        raise ValueError("init_report needs at least one non-pad target token")
    layers = named_layers(model)
    params = [[p for p in layer.parameters() if p.requires_grad] for _, layer in layers]
    flat = [p for group in params for p in group]
    modes = _capture_modes(model)
    model.eval()
    try:
        with torch.enable_grad(), ActivationRMS(model) as acts:
            logits = model(src_tokens, prev_output_tokens)  # (B, T, V)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), target.flatten(), ignore_index=model.pad_id)
            grads = torch.autograd.grad(loss, flat, allow_unused=True)
    finally:
        for module, training in modes:
            module.train(training)
    grad_iter = iter(grads)
    grad_norms = torch.stack([_norm_of([next(grad_iter) for _ in group]).cpu() for group in params]).tolist()
    act = acts.stats()
    real = prev_output_tokens.ne(model.pad_id)  # (B, T)
    lo, hi = min(grad_norms), max(grad_norms)
    return InitReport(
        layers=[name for name, _ in layers],
        grad_norms=grad_norms,
        act_rms=[act[_stat_key(name, "act_rms")] for name, _ in layers],
        grad_norm_ratio=hi / lo if lo > 0 else math.inf,
        output_std=logits.detach()[real].float().std().item(),
        loss=loss.item(),
    )


def format_report(report: InitReport) -> str:
    """A printable per-layer table followed by the summary numbers."""
    lines = [f"{'layer':<8}{'grad_norm':>12}{'act_rms':>12}"]
    for name, grad, act in zip(report.layers, report.grad_norms, report.act_rms, strict=True):
        lines.append(f"{name:<8}{grad:>12.4e}{act:>12.4e}")
    lines.append(
        f"loss {report.loss:.4f} | logits std {report.output_std:.4e} | grad-norm max/min {report.grad_norm_ratio:.3f}"
    )
    return "\n".join(lines)


def random_tokens(
    batch: int, length: int, vocab: int, pad_id: int, generator: torch.Generator, min_length: int | None = None
) -> Tensor:
    """Right-padded random ids >= 4 (0-3 are specials), lengths drawn from [min_length, length]
    (default [length/2, length]; ``min_length=length`` gives no padding). The one random-batch
    builder of the diagnostics and the memory and decoding benchmarks."""
    tokens = torch.randint(4, vocab, (batch, length), generator=generator)
    low = max(1, length // 2) if min_length is None else min_length
    lengths = torch.randint(low, length + 1, (batch,), generator=generator)
    tokens[torch.arange(length)[None, :] >= lengths[:, None]] = pad_id
    return tokens


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    defaults = ModelConfig()
    p = argparse.ArgumentParser(prog="python -m tfx.diagnostics", description=__doc__.splitlines()[0])
    p.add_argument("--encoder-layers", type=int, default=defaults.encoder_layers)
    p.add_argument("--decoder-layers", type=int, default=defaults.decoder_layers)
    p.add_argument("--d-model", type=int, default=defaults.d_model)
    p.add_argument("--ffn-dim", type=int, default=defaults.ffn_dim)
    p.add_argument("--heads", type=int, default=defaults.heads)
    p.add_argument("--norm", default=defaults.norm, help=" | ".join(RESIDUALS))
    p.add_argument("--init", default="tfixup", help=" | ".join(SCHEMES))
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--src-len", type=int, default=20)
    p.add_argument("--tgt-len", type=int, default=20)
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args(argv)


def _build(args: argparse.Namespace, src: Tensor, prev: Tensor) -> Transformer:
    """Model from CLI settings via the same config checks training uses; ValueError on a bad combo.
    ``src``/``prev`` are the batch a data-dependent init (Admin) profiles."""
    fields: dict[str, Any] = dict(
        encoder_layers=args.encoder_layers,
        decoder_layers=args.decoder_layers,
        d_model=args.d_model,
        ffn_dim=args.ffn_dim,
        heads=args.heads,
        norm=args.norm,
    )
    if args.vocab <= 4:
        raise ValueError(f"--vocab={args.vocab} must exceed the 4 special ids")
    model = build_model(ModelConfig(**fields), vocab_size=args.vocab, pad_id=PAD_ID)
    batch = SimpleNamespace(src_tokens=src, prev_output_tokens=prev)
    apply_init(model, args.init, seed=args.seed, batch=batch)  # T-Fixup raises on a model with LayerNorm
    return model


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    try:
        gen = torch.Generator().manual_seed(args.seed)
        src = random_tokens(args.batch, args.src_len, args.vocab, PAD_ID, gen)
        prev = random_tokens(args.batch, args.tgt_len, args.vocab, PAD_ID, gen)
        model = _build(args, src, prev)
        report = init_report(model, src, prev)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"init={args.init} norm={args.norm} enc={args.encoder_layers} dec={args.decoder_layers} d={args.d_model}")
    print(format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
