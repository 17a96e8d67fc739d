"""The torch-only peer: the best plain PyTorch does with the same batches, for ``bench_train.py --torch-peer``.

``nn.Transformer`` (Post-LN, ReLU, batch-first) with one shared embedding table tied to the output
projection, fairseq's sqrt(d) embedding scale and sinusoidal positions, ``F.cross_entropy`` with
label smoothing, fused AdamW (betas 0.9/0.98, as the T-Fixup recipe), bf16 autocast where the
device has it, and ``torch.compile`` (static shapes: one compiled graph per batch shape). Nothing
of tfx's is imported, so the comparison measures tfx's code against torch's own modules.

Usage (standalone; ``bench_train.py --torch-peer`` runs it on tfx's batches in the same invocation)::

    python scripts/torch_peer.py --device cuda --compile --steps 30     # iwslt sizes, 4096-token batches
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn.functional as F
from torch import Tensor, nn

PAD, BOS = 0, 2  # tfx's special ids (fairseq's dictionary order)


class PeerTransformer(nn.Module):
    def __init__(self, vocab: int, d_model: int, heads: int, ffn_dim: int, n_enc: int, n_dec: int, dropout: float):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model, padding_idx=PAD)
        nn.init.normal_(self.embed.weight, std=d_model**-0.5)
        self.scale = math.sqrt(d_model)
        half = d_model // 2
        freq = torch.exp(torch.arange(half) * -(math.log(10000.0) / (half - 1)))
        angles = torch.arange(1024)[:, None] * freq[None]
        self.register_buffer("positions", torch.cat([angles.sin(), angles.cos()], 1), persistent=False)
        self.dropout = nn.Dropout(dropout)
        self.transformer = nn.Transformer(
            d_model, heads, n_enc, n_dec, ffn_dim, dropout, batch_first=True, norm_first=False
        )

    def embed_tokens(self, tokens: Tensor) -> Tensor:
        return self.dropout(self.scale * self.embed(tokens) + self.positions[: tokens.size(1)])

    def forward(self, src: Tensor, prev: Tensor) -> Tensor:
        causal = nn.Transformer.generate_square_subsequent_mask(prev.size(1), device=prev.device, dtype=torch.bool)
        hidden = self.transformer(
            self.embed_tokens(src), self.embed_tokens(prev), tgt_mask=causal,
            src_key_padding_mask=src.eq(PAD), memory_key_padding_mask=src.eq(PAD), tgt_is_causal=True,
        )  # fmt: skip
        return F.linear(hidden, self.embed.weight)  # tied output projection


class PeerTrainer:
    """Model + fused AdamW + bf16 autocast + compile; ``step`` is one update, no host sync."""

    def __init__(
        self,
        vocab: int,
        sizes: dict[str, int],
        device: torch.device,
        compile_model: bool,
        lr: float = 5e-4,
        backend: str = "inductor",
    ):
        """``backend``: torch.compile's (``eager`` traces only: a quick dry run on CPU)."""
        self.device = device
        self.model = PeerTransformer(vocab, **sizes, dropout=0.3).to(device).train()
        fused = device.type == "cuda"
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0,
                                           fused=fused, foreach=not fused)  # fmt: skip
        self.bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        self.loss_fn = torch.compile(self._loss, dynamic=False, backend=backend) if compile_model else self._loss

    def _loss(self, src: Tensor, prev: Tensor, target: Tensor, ntokens: Tensor) -> Tensor:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            logits = self.model(src, prev)
        loss = F.cross_entropy(logits.float().flatten(0, 1), target.flatten(), ignore_index=PAD,
                               label_smoothing=0.1, reduction="sum")  # fmt: skip
        return loss / ntokens

    def step(self, src: Tensor, prev: Tensor, target: Tensor, ntokens: float) -> None:
        self.loss_fn(src, prev, target, torch.tensor(float(ntokens), device=self.device)).backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def time_steps(trainer: PeerTrainer, batches: list, warmup: int, steps: int) -> tuple[float, float]:
    """(seconds, target tokens) of ``steps`` updates after ``warmup`` untimed ones, cycling ``batches``."""
    for i in range(warmup):
        trainer.step(*batches[i % len(batches)])
    if trainer.device.type == "cuda":
        torch.cuda.synchronize(trainer.device)
    tic, tokens = time.perf_counter(), 0.0
    for i in range(steps):
        batch = batches[(warmup + i) % len(batches)]
        trainer.step(*batch)
        tokens += batch[-1]
    if trainer.device.type == "cuda":
        torch.cuda.synchronize(trainer.device)
    return time.perf_counter() - tic, tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--length", type=int, default=32, help="every sentence this long (no padding)")
    p.add_argument("--vocab", type=int, default=10000)
    p.add_argument("--sizes", default="512,4,1024,6,6", help="d_model,heads,ffn_dim,n_enc,n_dec (iwslt)")
    args = p.parse_args()
    d, h, f, e, n = (int(x) for x in args.sizes.split(","))
    device = torch.device(args.device)
    torch.manual_seed(0)
    rows = max(1, args.max_tokens // args.length)
    src = torch.randint(4, args.vocab, (rows, args.length), device=device)
    target = torch.randint(4, args.vocab, (rows, args.length), device=device)
    prev = torch.cat([torch.full_like(target[:, :1], BOS), target[:, :-1]], 1)
    trainer = PeerTrainer(args.vocab, dict(d_model=d, heads=h, ffn_dim=f, n_enc=e, n_dec=n), device, args.compile)
    seconds, tokens = time_steps(trainer, [(src, prev, target, target.numel())], args.warmup, args.steps)
    print(f"torch peer: {tokens / seconds:.0f} target tokens/s ({1e3 * seconds / args.steps:.1f} ms/update)")


if __name__ == "__main__":
    main()
