"""Build fairseq's transformer from its own arch arguments, load tfx's converted weights, save a checkpoint.

Runs under fairseq's Python (fairseq 0.12.2 does not import on 3.11), called by ``scripts/bench/bench_decode.py
--peer``; the weights come from ``tfx.evaluation.fairseq_format.fairseq_state_dict`` as an ``.npz`` (plain arrays, no
pickles across torch versions):

    VENV/bin/python scripts/bench/fairseq_convert.py DATA_DIR WEIGHTS.npz OUT.pt [--check IN.npz OUT.npz] -- ARCH_ARGS

``DATA_DIR`` holds ``dict.de.txt``/``dict.en.txt``. Loading is ``strict``: a tensor tfx did not provide, or
one fairseq does not have, is an error. ``--check`` writes fairseq's teacher-forced log-probabilities
(N, T, V) for the ``src_tokens``/``src_lengths``/``prev_output_tokens`` arrays in ``IN.npz`` (fairseq ids).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch
from fairseq import options, tasks


def build(data_dir: str, arch_args: list[str]):
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [data_dir, "--task", "translation", "-s", "de", "-t", "en", *arch_args])
    task = tasks.setup_task(args)
    return args, task, task.build_model(args)


def load_weights(model: torch.nn.Module, path: str) -> None:
    """Load every tensor; fairseq's encoder layers derive their fused copies (``in_proj_weight``, ``fc1_weight``,
    for its fast path) from q/k/v/fc1/fc2 while loading, and the ``.version`` buffers are format markers."""
    arrays = np.load(path)
    weights = {k: torch.from_numpy(arrays[k]) for k in arrays.files}
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    wrong = [k for k, v in weights.items() if k in shapes and tuple(v.shape) != shapes[k]]
    if wrong:
        raise SystemExit(
            f"fairseq_convert: {wrong[0]} has shape {tuple(weights[wrong[0]].shape)}, fairseq's {shapes[wrong[0]]}"
        )
    result = model.load_state_dict(weights, strict=False)
    missing = [k for k in result.missing_keys if not k.endswith(".version")]
    if missing or result.unexpected_keys:
        raise SystemExit(f"fairseq_convert: missing {missing[:5]}, unexpected {result.unexpected_keys[:5]}")


def save_checkpoint(args: argparse.Namespace, model: torch.nn.Module, path: str) -> None:
    """The fields fairseq's ``load_checkpoint_to_cpu`` reads (it turns ``args`` into its config)."""
    state = {
        "args": args,
        "model": model.state_dict(),
        "optimizer_history": [
            {
                "criterion_name": "CrossEntropyCriterion",
                "optimizer_name": "Adam",
                "lr_scheduler_state": {},
                "num_updates": 0,
            }
        ],
        "extra_state": {"train_iterator": {"epoch": 1}},
        "last_optimizer_state": None,
    }
    torch.save(state, path)


def teacher_forced(model: torch.nn.Module, path_in: str, path_out: str) -> None:
    batch = np.load(path_in)
    model.eval()
    with torch.no_grad():
        out = model(
            torch.from_numpy(batch["src_tokens"]),
            torch.from_numpy(batch["src_lengths"]),
            torch.from_numpy(batch["prev_output_tokens"]),
        )
        lprobs = model.get_normalized_probs(out, log_probs=True)
    np.savez(path_out, lprobs=lprobs.float().numpy())


def main() -> int:
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir")
    parser.add_argument("weights")
    parser.add_argument("out")
    parser.add_argument("--check", nargs=2, metavar=("IN", "OUT"))
    own = parser.parse_args(argv[:split])
    args, _, model = build(own.data_dir, argv[split + 1 :])
    load_weights(model, own.weights)
    save_checkpoint(args, model, own.out)
    if own.check:
        teacher_forced(model, *own.check)
    return 0


if __name__ == "__main__":
    sys.exit(main())
