"""Checkpoint (or run folder) -> translations of a test set -> BLEU with its signature.

    python -m tfx.evaluate outputs/RUN                       # checkpoint_best.pt, the run's test split
    python -m tfx.evaluate outputs/RUN --avg 5 --tok-bleu    # average the last 5 numbered checkpoints first
    python -m tfx.evaluate ckpt.pt --src test.de --ref test.en
    python -m tfx.evaluate ckpt.pt --src a.de b.de --ref a.en b.en --output a.hyp b.hyp  # one model load, two sets
    python -m tfx.evaluate ckpt.pt --src test.de --ref fairseq/test.en --refs-tokenized --compound-split

The split comes from the run's own data config (``config["data"]`` in the checkpoint): local files
``<local_dir>/<prefix>.<lang>`` (a relative ``local_dir`` starts at the current directory;
``--data-dir`` replaces it), or the toy/hub split rebuilt by ``tfx.data.prepare_data``. Hypotheses
go next to the checkpoint as ``<ckpt_stem>.<split>.hyp``, scores as ``<ckpt_stem>.<split>.bleu.json``.
Errors are one line on stderr and a non-zero exit status.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tfx.checkpoints.load import CheckpointError, git_sha
from tfx.checkpoints.numbered import best_checkpoint, checkpoint_dir, last_checkpoints
from tfx.data import DataError, read_parallel_text
from tfx.evaluation.average import average_checkpoints
from tfx.evaluation.bleu import add_scoring_args, score_all
from tfx.evaluation.run_splits import data_config, split_texts
from tfx.evaluation.translate import (
    add_decoding_args,
    check_decoding_args,
    load_model,
    run_reporting_errors,
    translate_with_args,
    write_text_atomic,
)
from tfx.files.atomic import atomic_save
from tfx.files.environment import Remedy
from tfx.runtime.distributed import resolve_device


def resolve_checkpoint(target: Path, avg: int | None) -> Path:
    """A checkpoint file as is; a run folder's ``checkpoint_best.pt``, or with ``avg`` the average of the last
    ``avg`` checkpoints of its window (``tfx.checkpoints.numbered.last_checkpoints``), written to
    ``checkpoint_avg<N>.pt`` beside them, N being how many it holds; a window of one is that checkpoint itself,
    evaluated under its own name (no average of one)."""
    if not avg:
        return best_checkpoint(target, otherwise="pass a checkpoint file, or --avg N")
    if target.is_file():
        raise CheckpointError(f"--avg {avg} needs a run folder, but {target} is a file")
    if not target.is_dir():
        raise CheckpointError(f"{target} does not exist: pass a checkpoint file or a run folder")
    paths = last_checkpoints(target, avg)
    if len(paths) == 1:
        return paths[0]
    out = checkpoint_dir(target) / f"checkpoint_avg{len(paths)}.pt"  # named for what it averages (fewer: short run)
    atomic_save(average_checkpoints(paths), out)
    print(f"averaged {', '.join(p.name for p in paths)} -> {out}", file=sys.stderr)
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tfx.evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument("target", type=Path, help="a checkpoint file or a run folder")
    parser.add_argument("--split", default="test", choices=("valid", "test"), help="split of the run's dataset")
    parser.add_argument("--avg", type=int, metavar="N", help="average the run's last N numbered checkpoints first")
    parser.add_argument("--src", type=Path, nargs="+", help="raw source file(s), instead of the split; need --ref")
    parser.add_argument("--ref", type=Path, nargs="+", help="raw reference file(s), line-aligned with --src, one each")
    parser.add_argument("--data-dir", type=Path, help="folder replacing the run's data.local_dir")
    add_scoring_args(parser)
    parser.add_argument("--output", type=Path, nargs="+",
                        help="hypothesis file, one per --src (default: <ckpt_stem>.<split>.hyp beside it)")  # fmt: skip
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_decoding_args(parser)
    args = parser.parse_args(argv)
    check_decoding_args(parser, args)
    if (args.src is None) != (args.ref is None):
        parser.error("--src and --ref go together")
    sets = len(args.src) if args.src else 1
    if args.src and len(args.ref) != sets:
        parser.error(f"--ref needs one file per --src ({sets}), got {len(args.ref)}")
    if args.output and len(args.output) != sets:
        parser.error(f"--output needs one file per test set ({sets}), got {len(args.output)}")
    if args.avg is not None and args.avg < 1:
        parser.error("--avg must be >= 1")
    return args


def evaluate(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Load the checkpoint once, then translate and score each test set (``--src``/``--ref`` pairs, else the run's
    split); prints each report and returns what was written to each JSON file."""
    ckpt_path = resolve_checkpoint(args.target, args.avg)
    device = resolve_device(args.device, setting="--device")
    model, tokenizer, config = load_model(ckpt_path, device)
    cfg = data_config(config, args.data_dir)
    if args.src is not None:
        sets = [(src.name, *read_parallel_text(src, ref)) for src, ref in zip(args.src, args.ref, strict=True)]
    else:
        sets = [(args.split, *split_texts(cfg, args.split, config.get("train", {}).get("seed", 1)))]
    if empty := next((name for name, src, _ in sets if not src), None):  # before any set is decoded
        raise DataError(f"{empty}: no sentences to translate")
    outputs = args.output or [ckpt_path.with_name(f"{ckpt_path.stem}.{name}.hyp") for name, _, _ in sets]
    reports = []
    for (split_name, src, refs), hyp_path in zip(sets, outputs, strict=True):
        hyps = translate_with_args(model, tokenizer, src, args, device, progress=not args.quiet)
        reports.append(_score(args, cfg, ckpt_path, split_name, src, refs, hyps, hyp_path))
    return reports


def _score(args: argparse.Namespace, cfg: Any, ckpt_path: Path, split_name: str, src: list[str], refs: list[str],
           hyps: list[str], hyp_path: Path) -> dict[str, Any]:  # fmt: skip
    """Write the hypotheses, score them, print the report and write it beside them as ``.bleu.json``."""
    write_text_atomic(hyp_path, hyps)
    # A run trained on tokenized text (data.tokenized) writes tokenized output; its own split is tokenized too.
    results = score_all(
        hyps, refs, cfg.tgt_lang, args, cfg.tokenized, refs_tokenized=cfg.tokenized and args.src is None
    )
    print(f"checkpoint: {ckpt_path}  split: {split_name} ({len(src)} sentences, {cfg.src_lang}->{cfg.tgt_lang})")
    print(f"decoding: beam {args.beam}, lenpen {args.lenpen}, max_len {args.max_len_a}*src+{args.max_len_b}")
    print(f"hypotheses: {hyp_path}")
    for result in results:
        print(result)
    report = {
        "checkpoint": str(ckpt_path),
        "split": split_name,
        "sentences": len(src),
        "decoding": {
            "beam": args.beam,
            "lenpen": args.lenpen,
            "max_len_a": args.max_len_a,
            "max_len_b": args.max_len_b,
        },
        "scores": [dataclasses.asdict(r) for r in results],
        "git_sha": git_sha(),
    }
    write_text_atomic(hyp_path.with_name(hyp_path.name.removesuffix(".hyp") + ".bleu.json"), [json.dumps(report)])
    return report


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    remedy = Remedy({"--output": written_folder(args)}, memory="lower --max-tokens or --beam")
    return run_reporting_errors(lambda: evaluate(args), "tfx.evaluate", remedy)


def written_folder(args: argparse.Namespace) -> Path:
    """Where the files go: the folder of ``--output``, else the checkpoint's (hypotheses, an ``--avg`` checkpoint)."""
    if args.output:
        return args.output[0].parent
    return args.target if args.target.is_dir() else args.target.parent


if __name__ == "__main__":
    sys.exit(main())
