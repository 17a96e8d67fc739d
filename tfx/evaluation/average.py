"""Average the parameters of several checkpoints of one run (Vaswani et al. 2017, section 6.1).

Averaging the last few epoch checkpoints is the standard last step of IWSLT/WMT recipes and is
worth a few tenths of BLEU. Only checkpoints of one model can be averaged: the model config, the
vocabulary size and the sentencepiece model must agree. The result holds the model, config and
tokenizer of the first input and no optimizer state, so it can be translated with but not resumed.

    python -m tfx.average --inputs a.pt b.pt --output avg.pt
    python -m tfx.average --run-dir outputs/RUN --last 5 --output avg.pt
    python -m tfx.average --run-dir outputs/RUN --best-window 10 --beam 4 --lenpen 0.3 --output avg.pt

``--best-window K`` tries every window of K adjacent numbered checkpoints, decodes the run's
VALIDATION split with each window's average, and keeps the best-scoring window. That is the T-Fixup
reference's procedure (``InferenceIWSLT.py`` averages checkpoints j-9..j for each j in 250..300 and
decodes each average) with one change: the reference scored each window on the test set, which makes
its reported number a best-of-51 on test; tfx scores on validation and leaves test untouched. Decoding
each window's average, rather than ranking windows by per-checkpoint validation scores, measures the
model that will be evaluated: an average is not the average of its members' BLEU.

``--last`` and ``--best-window`` choose among the run's numbered checkpoints by ``tfx.evaluate --avg``'s rule
(``tfx.checkpoints.numbered.window_checkpoints``): a checkpoint less than half a save interval before the newest
(a run stopped just after an epoch end) is left out; with fewer than ``--last N``, those there are.
"""

from __future__ import annotations

import argparse
import sys
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from tfx.checkpoints.load import CheckpointError, load_checkpoint
from tfx.checkpoints.numbered import checkpoint_dir, count, last_checkpoints, window_checkpoints
from tfx.evaluation.bleu import add_scoring_args
from tfx.evaluation.run_splits import valid_scorer
from tfx.evaluation.translate import add_decoding_args, check_decoding_args, run_reporting_errors
from tfx.files.atomic import atomic_save
from tfx.files.environment import Remedy


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


def _checked_load(path: Path | str, first: tuple[Path | str, dict[str, Any]] | None) -> dict[str, Any]:
    ckpt = load_checkpoint(path)
    if first is not None and (why := _mismatch(first[1], ckpt)):
        raise CheckpointError(f"cannot average {first[0]} and {path}: {why}")
    return ckpt


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
        ckpt = _checked_load(path, (paths[0], first))
        for k in sums:
            sums[k] += ckpt["model"][k].to(torch.float64)
        steps.append(ckpt.get("step"))
    return _averaged(first, sums, steps, paths)


def _averaged(
    first: dict[str, Any], sums: dict[str, torch.Tensor], steps: list[Any], paths: Sequence[str | Path]
) -> dict[str, Any]:
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


def windows(paths: Sequence[Path], k: int, candidates: int = 0) -> list[list[Path]]:
    """Every run of ``k`` adjacent checkpoints (oldest first); with ``candidates`` only the windows
    that end among the last ``candidates`` checkpoints (the reference tried those ending at epoch 250-300)."""
    if k < 1:
        raise CheckpointError(f"--best-window {k}: need at least 1 checkpoint")
    if len(paths) < k:
        raise CheckpointError(f"{count(len(paths), 'checkpoint')} to average: cannot choose a window of {k}")
    found = [list(paths[i : i + k]) for i in range(len(paths) - k + 1)]
    return found[-candidates:] if candidates else found


def best_window(
    paths: Sequence[Path],
    k: int,
    score: Callable[[dict[str, Any]], float],
    candidates: int = 0,
    first_loaded: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], list[tuple[list[Path], float]]]:
    """(the average of the best-scoring window, every window with its score), ``score`` being higher-is-better.

    Each checkpoint is loaded once (``first_loaded``: the first window's first checkpoint, if the
    caller has it already): the window slides over a queue of ``k`` loaded models. Ties go to the
    earlier window, as in the reference's strict ``>`` comparison.
    """
    start = paths.index(windows(paths, k, candidates)[0][0])
    first = (paths[start], first_loaded if first_loaded is not None else load_checkpoint(paths[start]))
    loaded: deque[dict[str, Any]] = deque(maxlen=k)
    results: list[tuple[list[Path], float]] = []
    best: tuple[float, dict[str, Any]] | None = None
    for i, path in enumerate(paths[start:]):
        loaded.append(first[1] if i == 0 else _checked_load(path, first))
        if len(loaded) < k:
            continue
        window = list(paths[start + i - k + 1 : start + i + 1])
        sums = {
            key: sum(c["model"][key].to(torch.float64) for c in loaded)
            for key, v in loaded[0]["model"].items()
            if v.is_floating_point()
        }
        avg = _averaged(loaded[0], sums, [c.get("step") for c in loaded], window)
        value = float(score(avg))
        results.append((window, value))
        if best is None or value > best[0]:
            best = (value, avg)
    best[1]["window_scores"] = [[[p.name for p in w], v] for w, v in results]
    return best[1], results


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tfx.average", description=__doc__.split("\n\n")[0])
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--inputs", nargs="+", type=Path, help="checkpoints to average")
    src.add_argument(
        "--run-dir", type=Path, help="a run folder: average --last N or --best-window K of its checkpoints"
    )
    parser.add_argument("--last", type=int, metavar="N", help="with --run-dir: average the last N numbered checkpoints")
    parser.add_argument("--output", type=Path, required=True, help="where to write the averaged checkpoint")
    search = parser.add_argument_group("--best-window: choose the window on the run's valid split")
    search.add_argument("--best-window", type=int, metavar="K", help="with --run-dir: the best K adjacent checkpoints")
    search.add_argument("--candidates", type=int, default=0, help="only windows ending in the last N checkpoints")
    search.add_argument("--valid-max-sentences", type=int, default=0, help="decode at most N valid sentences")
    search.add_argument("--data-dir", type=Path, help="folder replacing the run's data.local_dir")
    search.add_argument("--quiet", action="store_true", help="no per-window scores on stderr")
    add_decoding_args(search)
    add_scoring_args(search)
    args = parser.parse_args(argv)
    check_decoding_args(parser, args)
    if args.run_dir is not None and (args.last is None) == (args.best_window is None):
        parser.error("--run-dir needs --last N or --best-window K")
    if args.inputs is not None and (args.last is not None or args.best_window is not None):
        parser.error("--last and --best-window go with --run-dir, not --inputs")
    if args.candidates < 0 or args.valid_max_sentences < 0:
        parser.error("--candidates and --valid-max-sentences must be >= 0")
    return args


def choose_window(args: argparse.Namespace) -> dict[str, Any]:
    """The average of the best ``--best-window`` window on the run's valid split (module docstring)."""
    paths = window_checkpoints(checkpoint_dir(args.run_dir))  # --avg's and --last's rule: no near duplicates
    first = windows(paths, args.best_window, args.candidates)[0][0]  # too few checkpoints fail before any model loads
    first_loaded = load_checkpoint(first)
    score = valid_scorer(first_loaded, args)

    def reported(ckpt: dict[str, Any]) -> float:
        value = score(ckpt)
        if not args.quiet:
            names = [Path(p).name for p in ckpt["averaged_from"]]
            print(f"window {names[0]} .. {names[-1]}: valid score {value:.2f}", file=sys.stderr)
        return value

    avg, _ = best_window(paths, args.best_window, reported, args.candidates, first_loaded)
    return avg


def average_and_save(args: argparse.Namespace) -> None:
    if args.best_window is not None:
        avg = choose_window(args)
    else:
        avg = average_checkpoints(args.inputs if args.inputs is not None else last_checkpoints(args.run_dir, args.last))
    atomic_save(avg, args.output)
    paths = [Path(p) for p in avg["averaged_from"]]
    if len(paths) == 1:  # a window of one: --output is its weights (the name is the user's)
        print(f"wrote the weights of {paths[0].name} (nothing to average it with) -> {args.output}")
    else:
        print(f"averaged {len(paths)} checkpoints ({', '.join(p.name for p in paths)}) -> {args.output}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    memory = "lower --best-window (it holds K checkpoints at once), or use a machine with more memory"
    remedy = Remedy({"--output": args.output}, memory=memory)
    return run_reporting_errors(lambda: average_and_save(args), "tfx.average", remedy)


if __name__ == "__main__":
    sys.exit(main())
