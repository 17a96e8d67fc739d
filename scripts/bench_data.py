"""Time the data pipeline on a local corpus: cold prepare, warm prepare, one epoch of batches.

    python scripts/bench_data.py --local-dir ../shared/data/multi30k

Cold uses a fresh temporary cache (sentencepiece training + encoding of every split); warm
repeats it on the now-filled cache; epoch is ``make_batches`` + ``collate`` over train.

Needs tfx installed (``pip install -e .`` in the checkout): it imports tfx as a package.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import _require_tfx  # noqa: F401  (a one-line error, not a traceback, without `pip install -e .`)

from tfx.config import DataConfig
from tfx.data import DataError, collate, make_batches, prepare_data

TARGETS = {"cold": 20.0, "warm": 3.0, "epoch": 2.0}  # seconds, on 2 cores, for Multi30k


def parse_args() -> argparse.Namespace:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument(
        "--local-dir", default="../shared/data/multi30k", help="folder of train/valid/test.<lang> files"
    )
    parser.add_argument("--src-lang", default="de")
    parser.add_argument("--tgt-lang", default="en")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--model-type", default="bpe", choices=("bpe", "unigram"))
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=0, help="encoding threads (0 = all cores)")
    return parser.parse_args()


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def main() -> int:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="tfx-bench-") as cache:
        cfg = DataConfig(
            source="local",
            name=Path(args.local_dir).name,
            local_dir=args.local_dir,
            src_lang=args.src_lang,
            tgt_lang=args.tgt_lang,
            vocab_size=args.vocab_size,
            spm_model_type=args.model_type,
            cache_dir=cache,
            max_tokens=args.max_tokens,
            num_workers=args.threads,
        )
        try:
            corpus, cold = timed(lambda: prepare_data(cfg))
            _, warm = timed(lambda: prepare_data(cfg))
        except DataError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
    train = corpus.splits["train"]

    def epoch() -> int:
        return sum(collate(train, b).ntokens for b in make_batches(train, cfg.max_tokens, seed=1, epoch=1))

    ntokens, epoch_s = timed(epoch)
    sizes = {name: len(split) for name, split in corpus.splits.items()}
    print(
        f"corpus {args.local_dir} {args.src_lang}->{args.tgt_lang}: {sizes}, "
        f"vocab {corpus.tokenizer.vocab_size}, {ntokens} target tokens per epoch"
    )
    for name, seconds in (("cold", cold), ("warm", warm), ("epoch", epoch_s)):
        verdict = "ok" if seconds <= TARGETS[name] else "SLOW"
        print(f"{name:5s} {seconds:6.2f} s  (target <= {TARGETS[name]:g} s) {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
