"""Average the parameters of several checkpoints of one run (Vaswani et al. 2017, section 6.1).

Averaging the last few epoch checkpoints is the standard last step of IWSLT/WMT recipes and is
worth a few tenths of BLEU. Only checkpoints of one model can be averaged: the model config, the
vocabulary size and the sentencepiece model must agree. The result holds the model, config and
tokenizer of the first input and no optimizer state, so it can be translated with but not resumed.

    python -m tfx.average --inputs a.pt b.pt --output avg.pt
    python -m tfx.average --run-dir outputs/RUN --last 5 --output avg.pt
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from tfx.checkpoint import CheckpointError, atomic_save, load_checkpoint

NUMBERED = re.compile(r"^checkpoint_(\d+)_(\d+)\.pt$")  # checkpoint_<epoch>_<step>.pt, written by tfx.train


def checkpoint_dir(run_dir: str | Path) -> Path:
    """``RUN/checkpoints`` when it exists (a run folder), else the folder itself."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"run folder {run_dir} does not exist")
    sub = run_dir / "checkpoints"
    return sub if sub.is_dir() else run_dir


def numbered_checkpoints(folder: str | Path) -> list[Path]:
    """``checkpoint_<epoch>_<step>.pt`` files in ``folder``, oldest (lowest step) first."""
    found = [(int(m[2]), int(m[1]), p) for p in Path(folder).iterdir() if (m := NUMBERED.match(p.name))]
    return [p for _, _, p in sorted(found)]


def last_checkpoints(run_dir: str | Path, n: int) -> list[Path]:
    """The ``n`` numbered checkpoints with the highest step ("the last N")."""
    if n < 1:
        raise CheckpointError(f"--last {n}: need at least 1 checkpoint")
    folder = checkpoint_dir(run_dir)
    paths = numbered_checkpoints(folder)
    if len(paths) < n:
        raise CheckpointError(
            f"{folder} has {len(paths)} numbered checkpoint(s) (checkpoint_<epoch>_<step>.pt): "
            f"cannot average the last {n}"
        )
    return paths[-n:]


def _mismatch(first: dict[str, Any], other: dict[str, Any]) -> str | None:
    """What makes two checkpoints different models, or None."""
    model_a, model_b = first["config"].get("model", {}), other["config"].get("model", {})
    diff = sorted(k for k in model_a.keys() | model_b.keys() if model_a.get(k) != model_b.get(k))
    if diff:
        k = diff[0]
        return f"model.{k} differs ({model_a.get(k)} vs {model_b.get(k)})"
    if first.get("vocab_size") != other.get("vocab_size"):
        return f"vocab_size differs ({first.get('vocab_size')} vs {other.get('vocab_size')})"
    if first.get("spm_model") != other.get("spm_model"):
        return "their sentencepiece models differ"
    if first["model"].keys() != other["model"].keys():
        return "their parameter names differ"
    return None


def average_checkpoints(paths: Sequence[str | Path]) -> dict[str, Any]:
    """A checkpoint dict whose ``model`` is the mean of the inputs' float tensors.

    Sums are kept in float64 (each input is loaded, added and released, so memory holds two
    models at most); results are cast back to each tensor's dtype. Non-float tensors are taken
    from the first input.
    """
    if not paths:
        raise CheckpointError("no checkpoints to average")
    first = load_checkpoint(paths[0])
    sums = {k: v.to(torch.float64) for k, v in first["model"].items() if v.is_floating_point()}
    steps = [first.get("step")]
    for path in paths[1:]:
        ckpt = load_checkpoint(path)
        why = _mismatch(first, ckpt)
        if why:
            raise CheckpointError(f"cannot average {paths[0]} and {path}: {why}")
        for k in sums:
            sums[k] += ckpt["model"][k].to(torch.float64)
        steps.append(ckpt.get("step"))
    state = {k: (sums[k] / len(paths)).to(v.dtype) if k in sums else v for k, v in first["model"].items()}
    known = [s for s in steps if isinstance(s, int)]
    return {
        "model": state,
        "config": first["config"],
        "spm_model": first.get("spm_model"),
        "vocab_size": first.get("vocab_size"),
        "step": max(known) if known else 0,
        "averaged_from": [str(p) for p in paths],
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tfx.average", description=__doc__.split("\n\n")[0])
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--inputs", nargs="+", type=Path, help="checkpoints to average")
    src.add_argument("--run-dir", type=Path, help="a run folder: average its last --last numbered checkpoints")
    parser.add_argument("--last", type=int, help="with --run-dir: how many of the newest numbered checkpoints")
    parser.add_argument("--output", type=Path, required=True, help="where to write the averaged checkpoint")
    args = parser.parse_args(argv)
    if args.run_dir is not None and args.last is None:
        parser.error("--run-dir needs --last N")
    if args.inputs is not None and args.last is not None:
        parser.error("--last goes with --run-dir, not --inputs")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        paths = args.inputs if args.inputs is not None else last_checkpoints(args.run_dir, args.last)
        atomic_save(average_checkpoints(paths), args.output)
    except (CheckpointError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"averaged {len(paths)} checkpoints ({', '.join(p.name for p in paths)}) -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
