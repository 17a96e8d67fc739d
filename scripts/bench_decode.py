"""Beam-search speed with and without the decoder's key/value cache (and BLEU when a reference exists).

    python scripts/bench_decode.py outputs/RUN/checkpoints/checkpoint_best.pt            # Multi30k test.de
    python scripts/bench_decode.py CKPT --src test.de --ref test.en --limit 500 --uncached-limit 50
    python scripts/bench_decode.py --random --d-model 512 --layers 6 --vocab 10000     # no checkpoint needed

Both paths decode the same batches; the uncached one (the whole prefix recomputed every step) runs
on the first ``--uncached-limit`` sentences only, and the speed-up compares both on that subset.
Outputs on the subset must be identical. On a shared machine pass ``--threads 1`` for stable numbers.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tfx.bleu import corpus_bleu  # noqa: E402
from tfx.data import EOS, PAD, read_parallel_text  # noqa: E402
from tfx.decode import beam_search, length_batches, pad_batch  # noqa: E402
from tfx.diagnostics import random_tokens  # noqa: E402
from tfx.distributed import resolve_device  # noqa: E402
from tfx.model import Transformer  # noqa: E402
from tfx.translate import load_model, read_text_lines  # noqa: E402

MULTI30K = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"


def decode_all(model: Transformer, src_ids: list[list[int]], args: argparse.Namespace, use_cache: bool):
    """(outputs in input order, seconds, output tokens incl. EOS)."""
    device = next(model.parameters()).device
    out: list[list[int]] = [[] for _ in src_ids]
    dtype = torch.bfloat16 if args.bf16 else None
    start = time.perf_counter()
    for batch in length_batches([len(x) for x in src_ids], args.max_tokens, None):
        hyps = beam_search(
            model,
            pad_batch([src_ids[i] for i in batch], device),
            beam=args.beam,
            use_cache=use_cache,
            autocast_dtype=dtype,
        )
        for i, h in zip(batch, hyps, strict=True):
            out[i] = h
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return out, seconds, sum(len(h) + 1 for h in out)


def random_setup(args: argparse.Namespace, device: torch.device):
    """An untrained model and random sources of 8-40 tokens: measures the decoder, not the translations."""
    torch.manual_seed(0)
    d, n_layers = args.d_model, args.layers
    model = Transformer(args.vocab, PAD, n_layers, n_layers, d_model=d, ffn_dim=2 * d, heads=4, dropout=0.0)
    model = model.to(device).eval()
    g = torch.Generator().manual_seed(0)
    n = args.limit or 200
    tokens = random_tokens(n, 40, args.vocab, PAD, g, min_length=8)  # (n, 40), right-padded
    src = [row[row != PAD][:-1].tolist() + [EOS] for row in tokens]  # 8-40 tokens ending with EOS
    return model, None, src, None


def checkpoint_setup(args: argparse.Namespace, device: torch.device):
    model, tokenizer, _ = load_model(args.checkpoint, device)
    src_file = args.src or MULTI30K / "test.de"
    ref_file = args.ref or (MULTI30K / "test.en" if args.src is None else None)
    if ref_file is not None:
        sentences, refs = read_parallel_text(src_file, ref_file)
    else:
        sentences, refs = read_text_lines(src_file), None
    if args.limit:
        sentences = sentences[: args.limit]
        refs = refs[: args.limit] if refs is not None else None
    src = [x + [EOS] for x in tokenizer.encode_batch(sentences)]
    return model, tokenizer, src, refs


def report(name: str, n_sent: int, seconds: float, n_tok: int) -> None:
    print(
        f"{name:>24}: {n_sent:5d} sentences in {seconds:7.2f} s = {n_sent / seconds:8.1f} sent/s, "
        f"{n_tok / seconds:9.1f} tok/s"
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, nargs="?", help="a tfx checkpoint (omit with --random)")
    parser.add_argument("--src", type=Path, help="raw source sentences (default: Multi30k test.de)")
    parser.add_argument("--ref", type=Path, help="references for BLEU (default: Multi30k test.en with the default src)")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--limit", type=int, default=0, help="decode only the first N sentences (0 = all)")
    parser.add_argument("--uncached-limit", type=int, default=100, help="sentences for the slow uncached path")
    parser.add_argument("--max-tokens", type=int, default=4096, help="padded source tokens per batch")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast")
    parser.add_argument("--random", action="store_true", help="benchmark an untrained model on random ids")
    parser.add_argument("--d-model", type=int, default=256, help="--random model width")
    parser.add_argument("--layers", type=int, default=3, help="--random encoder and decoder depth")
    parser.add_argument("--vocab", type=int, default=8000, help="--random vocabulary size")
    args = parser.parse_args()
    if (args.checkpoint is None) != args.random:
        parser.error("pass a CHECKPOINT or --random (not both)")
    return args


def main() -> int:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device, setting="--device")
    model, tokenizer, src, refs = random_setup(args, device) if args.random else checkpoint_setup(args, device)
    subset = src[: args.uncached_limit]
    print(
        f"{len(src)} sentences, {sum(map(len, src))} source tokens, beam {args.beam}, device {device}, "
        f"{torch.get_num_threads()} threads"
    )
    cached, sec, n_tok = decode_all(model, src, args, use_cache=True)
    report("cached (all)", len(src), sec, n_tok)
    sub_cached, sec_c, tok_c = decode_all(model, subset, args, use_cache=True)
    report("cached (subset)", len(subset), sec_c, tok_c)
    sub_uncached, sec_u, tok_u = decode_all(model, subset, args, use_cache=False)
    report("uncached (subset)", len(subset), sec_u, tok_u)
    same = sum(a == b for a, b in zip(sub_cached, sub_uncached, strict=True))
    print(f"speed-up cached/uncached: {sec_u / sec_c:.1f}x   identical outputs: {same}/{len(subset)}")
    if refs is not None and tokenizer is not None:
        print(corpus_bleu([tokenizer.decode(h) for h in cached], refs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
