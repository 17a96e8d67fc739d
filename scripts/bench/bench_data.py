"""Measure the data path at scale: preparation time and memory, warm load, first update, two ranks.

    python scripts/bench/bench_data.py --pairs 4500000            # a generated WMT-sized corpus (issue 53's figures)
    python scripts/bench/bench_data.py --pairs 1000000 --ranks 2  # ... and two ranks under torchrun (gloo, CPU)
    python scripts/bench/bench_data.py --local-dir ../shared/data/multi30k --phases cold warm

``--pairs N`` writes N pairs of Multi30k training sentences joined 1-3 at a time (``tfx.data.scale``) into
``--work`` (kept there for the next run). Each phase runs in a fresh process so its memory is its own:

- cold: ``prepare_data`` with an empty cache (vocabulary on a sample, encoding in ``--workers`` processes);
  peak memory is the PSS of the process and its workers summed, sampled every 0.2 s (shared pages once);
- warm: ``prepare_data`` again, on the filled cache;
- first: ``+experiment=multi30k`` on the corpus, from process start to the end of the first update (a Trainer,
  as ``python -m tfx.train`` builds it), beside the same on Multi30k itself: the difference is what the
  corpus adds (time and memory above the model's own);
- ranks: the same first update under ``torchrun --nproc_per_node R`` (gloo): each rank's heap (anonymous
  memory: what it holds of its own) beside the same on Multi30k, the mapped files (page cache, shared by the
  ranks), USS, and the cache files each rank mapped.

Prints one table; ``--json FILE`` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import _require_tfx  # noqa: F401  (a one-line error, not a traceback, without `pip install -e .`)

from tfx.data.scale import memory_mb, tree_pss_mb, write_joined_corpus

CHECKOUT = Path(__file__).resolve().parents[2]
MULTI30K = CHECKOUT.parent / "shared" / "data" / "multi30k"
PHASES = ("cold", "warm", "first", "ranks")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, help="generate a corpus of this many pairs from --source")
    p.add_argument("--local-dir", type=Path, help="measure this corpus (train/valid/test.<lang>) instead")
    p.add_argument("--source", type=Path, default=MULTI30K, help="the corpus --pairs joins sentences of")
    p.add_argument("--work", type=Path, default=Path("/tmp/tfx-bench-data"), help="generated corpora and caches")
    p.add_argument("--phases", nargs="+", choices=PHASES, default=["cold", "warm", "first"])
    p.add_argument("--ranks", type=int, default=2, help="ranks of the ranks phase")
    p.add_argument("--workers", type=int, default=0, help="data.num_workers (0 = every core)")
    p.add_argument("--threads", type=int, default=2, help="train.threads of the first-update phases")
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument("overrides", nargs="*", help="more KEY=VALUE for every phase (e.g. data.spm_model_type=unigram)")
    p.add_argument("--child", choices=["prepare", "first"], help=argparse.SUPPRESS)
    return p.parse_args()


# --- children: one measurement each, in a fresh process -----------------------------------------


def overrides_for(corpus: Path, cache: Path, args: argparse.Namespace) -> list[str]:
    return [
        "+experiment=multi30k",
        f"data.local_dir={corpus}",
        f"data.cache_dir={cache}",
        f"data.num_workers={args.workers}",
        f"train.threads={args.threads}",
        *args.overrides,
    ]


def child_prepare(overrides: list[str]) -> dict:
    from tfx.config import compose_config
    from tfx.data import prepare_data

    cfg = compose_config(overrides)
    start = time.perf_counter()
    corpus = prepare_data(cfg.data, seed=cfg.train.seed)
    train = corpus.splits["train"]
    return {
        "seconds": time.perf_counter() - start,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "pairs": len(train),
        "tokens": int(train.src_sizes.sum() + train.tgt_sizes.sum()),
    }


def child_first_update(overrides: list[str], run_dir: Path) -> dict:
    from tfx.config import compose_config
    from tfx.train import Trainer

    cfg = compose_config([*overrides, "train.max_updates=1"])
    trainer = Trainer(cfg, run_dir / f"rank{os.environ.get('RANK', '0')}")
    try:
        plan = trainer.batches.epoch(1)
        trainer.train_step([trainer.batches.collate(plan[0])])
        stores = sorted({str(getattr(s, "base", s).path) for split in trainer.corpus.splits.values()
                         for s in (split.src, split.tgt)})  # fmt: skip
        return {"rank": int(os.environ.get("RANK", 0)), **memory_mb(), "stores": stores}
    finally:
        trainer.close()


def run_child(mode: str, overrides: list[str], args: argparse.Namespace, extra: list[str] = ()) -> dict:
    """``mode`` in a fresh process; its JSON line, wall seconds and peak tree PSS (sampled)."""
    cmd = [*extra, str(Path(__file__).resolve()), "--child", mode, "--work", str(args.work), *overrides]
    cmd = cmd if extra else [sys.executable, *cmd]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=CHECKOUT, stdout=subprocess.PIPE, text=True)
    peak = [0.0]

    def sample() -> None:
        while proc.poll() is None:
            peak[0] = max(peak[0], tree_pss_mb(proc.pid))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    lines, first_line_at = [], None
    for line in proc.stdout:
        if line.startswith("{"):
            lines.append(json.loads(line))
            first_line_at = first_line_at or time.perf_counter() - start
    if proc.wait():
        sys.exit(f"error: the {mode} phase failed (exit {proc.returncode}): {' '.join(cmd)}")
    sampler.join()
    return {"results": lines, "wall": first_line_at, "peak_tree_pss_mb": peak[0]}


# --- the parent ---------------------------------------------------------------------------------


def corpus_dir(args: argparse.Namespace) -> Path:
    if args.local_dir:
        return args.local_dir
    folder = args.work / f"joined-{args.pairs}"
    if not (folder / "test.en").exists():
        print(f"writing {args.pairs} pairs to {folder} ...", flush=True)
        write_joined_corpus(args.source, folder, args.pairs)
    return folder


def main() -> int:
    args = parse_args()
    if args.child:
        run_dir = args.work / "runs" / f"{os.getpid()}"
        result = (
            child_prepare(args.overrides) if args.child == "prepare" else child_first_update(args.overrides, run_dir)
        )
        print(json.dumps(result), flush=True)
        return 0
    if not args.pairs and not args.local_dir:
        sys.exit("error: give --pairs N (a generated corpus) or --local-dir DIR")
    corpus = corpus_dir(args)
    cache = args.work / f"cache-{corpus.name}"
    on = overrides_for(corpus, cache, args)
    reference = overrides_for(MULTI30K, args.work / "cache-multi30k", args)
    figures: dict = {"corpus": str(corpus), "overrides": on}
    if "cold" in args.phases:
        shutil.rmtree(cache, ignore_errors=True)
        figures["cold"] = run_child("prepare", on, args)
    if "warm" in args.phases:
        figures["warm"] = run_child("prepare", on, args)
    if "first" in args.phases or "ranks" in args.phases:
        run_child("prepare", reference, args)  # the reference's cache, warm before it is timed
    if "first" in args.phases:
        figures["first"] = run_child("first", on, args)
        figures["first_multi30k"] = run_child("first", reference, args)
    if "ranks" in args.phases:
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.ranks)]
        gloo = ["train.device=cpu"]
        figures["ranks"] = run_child("first", [*on, *gloo], args, torchrun)
        figures["ranks_multi30k"] = run_child("first", [*reference, *gloo], args, torchrun)
    report(figures)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


def report(f: dict) -> None:
    print(f"\ncorpus {f['corpus']}  ({' '.join(f['overrides'][2:])})")
    for phase in ("cold", "warm"):
        if phase in f:
            r = f[phase]["results"][0]
            print(f"{phase:5s} prepare {r['seconds']:7.1f} s | {r['pairs']} pairs, {r['tokens'] / 1e6:.1f}M tokens | "
                  f"peak memory {f[phase]['peak_tree_pss_mb']:6.0f} MB (PSS, workers included), "
                  f"main process peak RSS {r['peak_rss_mb']:.0f} MB")  # fmt: skip
    if "first" in f:
        big, small = f["first"], f["first_multi30k"]
        print(f"first update {big['wall']:5.1f} s from process start (Multi30k: {small['wall']:.1f} s); "
              f"RSS then {big['results'][0]['rss']:.0f} MB (Multi30k: {small['results'][0]['rss']:.0f} MB, "
              f"so {big['results'][0]['rss'] - small['results'][0]['rss']:.0f} MB above the model's own)")  # fmt: skip
    if "ranks" in f:
        ranks = sorted(f["ranks"]["results"], key=lambda r: r["rank"])
        small = {r["rank"]: r for r in f["ranks_multi30k"]["results"]}
        same = all(r["stores"] == ranks[0]["stores"] for r in ranks)
        for r in ranks:
            base = small[r["rank"]]
            print(f"rank {r['rank']}: heap (anonymous) {r['anon']:.0f} MB, Multi30k {base['anon']:.0f} MB: "
                  f"{r['anon'] - base['anon']:.0f} MB of its own for the corpus; mapped files "
                  f"{r['rss'] - r['anon']:.0f} MB (Multi30k {base['rss'] - base['anon']:.0f}; the page cache, shared); "
                  f"USS {r['uss']:.0f} MB (Multi30k {base['uss']:.0f})")  # fmt: skip
        print(f"every rank mapped the same {len(ranks[0]['stores'])} cache files: {same}")


if __name__ == "__main__":
    sys.exit(main())
