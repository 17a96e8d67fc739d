"""The torch-only peer: the best plain PyTorch does with the same batches, for ``bench_train.py --torch-peer``.

``nn.Transformer`` (Post-LN, ReLU, batch-first) with one shared embedding table tied to the output
projection, fairseq's sqrt(d) embedding scale and sinusoidal positions, ``F.cross_entropy`` with
label smoothing, fused AdamW (betas 0.9/0.98, as the T-Fixup recipe; fused on CPU too, as tfx's),
bf16 autocast where the device has it natively (CUDA with bf16; CPUs with AVX512-BF16/AMX, as tfx's
``train.precision=auto``), and ``torch.compile`` with inductor (static shapes: one compiled graph
per batch shape) on CUDA and CPU alike. ``bench_train.py --torch-peer`` passes tfx's own precision,
so both sides run the same arithmetic on every device. Nothing of tfx's is imported, so the
comparison measures tfx's code against torch's own modules.

Run alone by ``scripts/bench/torch_peer.py``; ``scripts/bench/bench_train.py --torch-peer`` runs it on tfx's
batches in the same invocation.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

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


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` runs bf16 matmuls natively: CUDA with bf16, or a CPU with AVX512-BF16/AMX (oneDNN's
    answer). Elsewhere bf16 is emulated, on CPUs ~100x slower than fp32, so the peer stays in fp32 there."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PeerTrainer:
    """Model + fused AdamW + bf16 autocast + compile; ``step`` is one update, no host sync."""

    def __init__(
        self,
        vocab: int,
        sizes: dict[str, int],
        device: torch.device,
        compile_model: bool,
        lr: float = 5e-4,
        backend: str | Callable = "inductor",
        bf16: bool | None = None,
        dropout: float = 0.3,
    ):
        """``backend``: torch.compile's, a name or a callable (``eager`` traces only: a quick dry run on CPU; tests
        wrap inductor to see its graph). ``bf16``: autocast to
        bf16 (None: where the device has it natively, ``native_bf16``); bench_train.py passes tfx's precision.
        ``dropout``: the iwslt recipe's 0.3 (tests set 0, to compare compiled and eager losses)."""
        self.device = device
        self.model = PeerTransformer(vocab, **sizes, dropout=dropout).to(device).train()
        fused = device.type in (
            "cuda",
            "cpu",
        )  # one kernel per parameter, as tfx.optim.optimizers's (CPU since torch 2.4)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0,
                                           fused=fused, foreach=not fused)  # fmt: skip
        self.bf16 = native_bf16(device) if bf16 is None else bf16
        self.loss_fn = torch.compile(self._loss, dynamic=False, backend=backend) if compile_model else self._loss

    def _loss(self, src: Tensor, prev: Tensor, target: Tensor, ntokens: Tensor) -> Tensor:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            logits = self.model(src, prev)
        loss = F.cross_entropy(logits.float().flatten(0, 1), target.flatten(), ignore_index=PAD,
                               label_smoothing=0.1, reduction="sum")  # fmt: skip
        return loss / ntokens

    def step(self, src: Tensor, prev: Tensor, target: Tensor, ntokens: float) -> Tensor:
        """One update; returns its loss per token, detached, on the device (not read: no host sync)."""
        loss = self.loss_fn(src, prev, target, torch.tensor(float(ntokens), device=self.device))
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()


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
