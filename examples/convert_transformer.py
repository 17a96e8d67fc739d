"""A plain PyTorch translator, converted to T-Fixup with one call, beside the same model with its LayerNorms.

The task is generated: reverse a sequence of symbols. Both models are the same ``nn.Transformer`` (Post-LN as torch
builds it) with a source and a target embedding; one is left as built, one goes through
``tfx.convert(model, method="tfixup")`` (LayerNorms removed, T-Fixup init). Both train with Adam at one constant
learning rate from the first update, no warmup, on the same batches, and the script prints both learning curves and
their greedy-decoding accuracy on held-out sequences.

    python examples/convert_transformer.py                # about 1-2 minutes on a 2-core CPU
    python examples/convert_transformer.py --steps 100    # a quick look
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

try:
    from tfx import convert
except ModuleNotFoundError:  # run as a file, only examples/ is on the path: tfx comes from `pip install -e .`
    sys.exit(f"error: {sys.executable} cannot import tfx; run `pip install -e .` in the repository root (README)")

PAD, BOS, EOS, FIRST_SYMBOL = 0, 1, 2, 3


def reversal_batch(batch: int, symbols: int, max_len: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """(source, target) (B, max_len + 1): random symbols then EOS, right-padded; the target is the source reversed."""
    lengths = torch.randint(max_len // 2, max_len + 1, (batch,), generator=g)
    src = torch.full((batch, max_len + 1), PAD)
    tgt = torch.full((batch, max_len + 1), PAD)
    for i, n in enumerate(lengths.tolist()):
        seq = torch.randint(FIRST_SYMBOL, FIRST_SYMBOL + symbols, (n,), generator=g)
        src[i, : n + 1] = torch.cat([seq, torch.tensor([EOS])])
        tgt[i, : n + 1] = torch.cat([seq.flip(0), torch.tensor([EOS])])
    return src, tgt


def sinusoids(positions: int, d: int) -> Tensor:
    """Vaswani et al.'s fixed positions (sin in the first half of the channels, cos in the second, as fairseq)."""
    half = d // 2
    freq = torch.exp(torch.arange(half) * -(math.log(10000.0) / (half - 1)))
    angles = torch.arange(positions)[:, None] * freq[None]
    return torch.cat([angles.sin(), angles.cos()], dim=1)  # (P, D)


class Translator(nn.Module):
    """Embeddings scaled by sqrt(d) + sinusoidal positions, ``nn.Transformer``, output tied to the target table."""

    def __init__(self, vocab: int, d: int, layers: int, dropout: float) -> None:
        super().__init__()
        self.scale = math.sqrt(d)
        self.src_embed = nn.Embedding(vocab, d, padding_idx=PAD)
        self.transformer = nn.Transformer(d, 4, layers, layers, 2 * d, dropout, batch_first=True)
        self.tgt_embed = nn.Embedding(vocab, d, padding_idx=PAD)
        self.register_buffer("positions", sinusoids(128, d), persistent=False)
        for table in (self.src_embed, self.tgt_embed):  # N(0, d^-1/2), as fairseq: x sqrt(d) gives unit-scale inputs
            nn.init.normal_(table.weight, std=d**-0.5)
            nn.init.zeros_(table.weight[PAD])

    def embed(self, table: nn.Embedding, tokens: Tensor) -> Tensor:
        return self.scale * table(tokens) + self.positions[: tokens.size(1)]  # (B, T, D)

    def forward(self, src: Tensor, prev: Tensor) -> Tensor:
        pad = src.eq(PAD)
        causal = nn.Transformer.generate_square_subsequent_mask(prev.size(1))
        hidden = self.transformer(
            self.embed(self.src_embed, src), self.embed(self.tgt_embed, prev), tgt_mask=causal, tgt_is_causal=True,
            src_key_padding_mask=pad, memory_key_padding_mask=pad,
        )  # fmt: skip
        return F.linear(hidden, self.tgt_embed.weight)  # (B, T, V)


@torch.no_grad()
def greedy_accuracy(model: Translator, src: Tensor, tgt: Tensor) -> float:
    """The share of held-out sequences decoded exactly (greedy, one token at a time)."""
    model.eval()
    out = torch.full((src.size(0), 1), BOS)
    for _ in range(tgt.size(1)):
        out = torch.cat([out, model(src, out)[:, -1].argmax(-1, keepdim=True)], dim=1)
    model.train()
    exact = (out[:, 1:] == tgt) | tgt.eq(PAD)
    return exact.all(dim=1).float().mean().item()


@dataclass
class Run:
    name: str
    model: Translator
    optimizer: torch.optim.Optimizer
    losses: list[float]


def train_step(run: Run, src: Tensor, tgt: Tensor) -> None:
    prev = torch.cat([torch.full((tgt.size(0), 1), BOS), tgt[:, :-1]], dim=1)  # teacher forcing
    logits = run.model(src, prev)
    loss = F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=PAD)
    run.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    run.optimizer.step()
    run.losses.append(loss.item())


def build_runs(args: argparse.Namespace, vocab: int) -> list[Run]:
    torch.manual_seed(args.seed)
    layernorm = Translator(vocab, args.d_model, args.layers, args.dropout)
    tfixup, report = convert(Translator(vocab, args.d_model, args.layers, args.dropout), "tfixup", seed=args.seed)
    stacks = ", ".join(f"{s.name} N={s.depth} x{s.layer_factor:.3f}" for s in report.stacks)
    scaled = sum(p.factor != 1 for p in report.parameters)
    print(f"converted: {len(report.norms)} LayerNorms removed, {scaled} weights scaled ({stacks})")
    return [
        Run(name, model, torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.9, 0.98)), [])
        for name, model in (("tfixup", tfixup), ("layernorm", layernorm))
    ]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=400, help="Adam updates per model")
    p.add_argument("--layers", type=int, default=2, help="encoder and decoder layers each")
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3, help="constant from the first update: no warmup")
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--symbols", type=int, default=16)
    p.add_argument("--max-len", type=int, default=10)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, dict]:
    """Train both models; returns each one's losses, held-out accuracy and model (the test reads them)."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    vocab = FIRST_SYMBOL + args.symbols
    runs = build_runs(args, vocab)
    data, held_out = torch.Generator().manual_seed(args.seed), torch.Generator().manual_seed(args.seed + 1000)
    test_src, test_tgt = reversal_batch(200, args.symbols, args.max_len, held_out)
    print(f"{'update':>6} " + " ".join(f"{r.name + ' loss':>15}" for r in runs))
    tic = time.perf_counter()
    for step in range(1, args.steps + 1):
        src, tgt = reversal_batch(args.batch, args.symbols, args.max_len, data)
        for run in runs:
            train_step(run, src, tgt)
        if step % args.log_every == 0 or step == args.steps:
            recent = [sum(r.losses[-args.log_every :]) / len(r.losses[-args.log_every :]) for r in runs]
            print(f"{step:>6} " + " ".join(f"{loss:>15.3f}" for loss in recent))
    seconds = time.perf_counter() - tic
    results = {
        r.name: {"losses": r.losses, "accuracy": greedy_accuracy(r.model, test_src, test_tgt), "model": r.model}
        for r in runs
    }
    scores = ", ".join(f"{name} {r['accuracy']:.1%}" for name, r in results.items())
    print(
        f"held-out exact-match accuracy (greedy, 200 sequences) after {args.steps} updates, {seconds:.0f} s: {scores}"
    )
    return results


if __name__ == "__main__":
    main()
