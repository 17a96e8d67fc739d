"""The torch-only peer alone (``tfx.bench.torch_peer``): the best plain PyTorch does at a size, in target tokens/s.

``nn.Transformer`` (Post-LN) with fused AdamW, bf16 autocast where the device has it natively and ``torch.compile``
with inductor; what it is and why is ``tfx.bench.torch_peer``'s docstring. ``bench_train.py --torch-peer`` runs it
on tfx's own batches in the same invocation.

Usage::

    python scripts/bench/torch_peer.py --device cuda --compile --steps 30     # iwslt sizes, 4096-token batches
    python scripts/bench/torch_peer.py --device cpu --compile --precision fp32 --steps 5 --sizes 512,4,1024,1,1
"""

from __future__ import annotations

import argparse

import _require_tfx  # noqa: F401  (a one-line error, not a traceback, without `pip install -e .`)
import torch

from tfx.bench.torch_peer import BOS, PeerTrainer, time_steps


def main() -> None:
    """Time the peer on random full rows (no padding) of ``--length`` tokens."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--length", type=int, default=32, help="every sentence this long (no padding)")
    p.add_argument("--vocab", type=int, default=10000)
    p.add_argument("--sizes", default="512,4,1024,6,6", help="d_model,heads,ffn_dim,n_enc,n_dec (iwslt)")
    p.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto", help="auto: bf16 where native")
    args = p.parse_args()
    d, h, f, e, n = (int(x) for x in args.sizes.split(","))
    device = torch.device(args.device)
    torch.manual_seed(0)
    rows = max(1, args.max_tokens // args.length)
    src = torch.randint(4, args.vocab, (rows, args.length), device=device)
    target = torch.randint(4, args.vocab, (rows, args.length), device=device)
    prev = torch.cat([torch.full_like(target[:, :1], BOS), target[:, :-1]], 1)
    bf16 = None if args.precision == "auto" else args.precision == "bf16"
    sizes = dict(d_model=d, heads=h, ffn_dim=f, n_enc=e, n_dec=n)
    trainer = PeerTrainer(args.vocab, sizes, device, args.compile, bf16=bf16)
    seconds, tokens = time_steps(trainer, [(src, prev, target, target.numel())], args.warmup, args.steps)
    print(f"torch peer ({'bf16' if trainer.bf16 else 'fp32'}): {tokens / seconds:.0f} target tokens/s "
          f"({1e3 * seconds / args.steps:.1f} ms/update)")  # fmt: skip


if __name__ == "__main__":
    main()
