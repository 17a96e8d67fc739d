"""Plant each bug issue 16 lists in a scratch copy of the tree and check the fast tests catch it.

    python scripts/audit/planted_bugs.py            # every bug
    python scripts/audit/planted_bugs.py lenpen ddp # the bugs whose id contains one of the words
    python scripts/audit/planted_bugs.py --list     # their ids and what each plants, nothing run

Each bug is an exact text replacement in one source file (the copy only: the working tree is never
touched) followed by ``pytest -m "not slow" -x`` on the test files that should catch it. A failing
test run is "caught"; a replacement whose text is no longer in the source is reported as "stale"
(the code moved on: update the entry). Not part of CI: an audit of the suite, like
``scripts/audit/mutation_check.sh``.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[2]
AVERAGE = [
    "tests/evaluation/test_average.py",
    "tests/evaluation/test_average_values.py",
    "tests/evaluation/test_average_cli.py",
]


def wiring(*names: str) -> list[str]:
    """Tests of tests/test_train_wiring.py by name (the whole file takes minutes on a busy machine)."""
    return [f"tests/test_train_wiring.py::test_{name}" for name in names]


FIRST_UPDATE = "first_update_uses_label_smoothing_and_divides_by_the_update_token_count"
TWO_RANKS = "two_rank_step_scales_by_world_size_over_the_global_token_count"
BEST = "best_checkpoint_pruning_and_validation_loss_units"


class Bug(NamedTuple):
    id: str
    what: str
    file: str
    edits: list[tuple[str, str]]  # (old, new): each old must occur in the file
    tests: list[str]


BUGS = [
    Bug("lenpen-off", "length penalty off in the beam step and length_normalized", "tfx/evaluation/decode.py", [
        ("norm = (step + 1) ** lenpen", "norm = 1.0"),
        ("return logprob / (n_tokens + 1) ** lenpen", "return logprob"),
    ], ["tests/evaluation/test_decode.py"]),
    Bug("average-by-2", "tfx.average divides by a constant 2", "tfx/evaluation/average.py", [
        ("(sums[k] / len(paths))", "(sums[k] / 2)"),
    ], AVERAGE),
    Bug("average-ends", "tfx.average averages only the first and last checkpoint", "tfx/evaluation/average.py", [
        ("for path in paths[1:]:", "for path in paths[-1:]:"),
        ("(sums[k] / len(paths))", "(sums[k] / min(len(paths), 2))"),
    ], AVERAGE),
    Bug("spm-key-vocab", "sentencepiece cache key without vocab_size", "tfx/data/vocab.py", [
        ('"vocab_size": vocab_size,\n', ""),
    ], ["tests/data/test_corpus.py"]),
    Bug("spm-key-type", "sentencepiece cache key without model_type", "tfx/data/vocab.py", [
        ('"model_type": model_type,\n', ""),
    ], ["tests/data/test_corpus.py"]),
    Bug("spm-key-coverage", "sentencepiece cache key without character_coverage", "tfx/data/vocab.py", [
        ('"coverage": character_coverage,\n', ""),
    ], ["tests/data/test_corpus.py"]),
    Bug("corpus-key-tokenizer", "encoded-corpus cache key without the tokenizer fingerprint", "tfx/data/corpus.py", [
        ('settings = {"tokenizer": tokenizer.fingerprint, "text"', 'settings = {"text"'),
    ], ["tests/data/test_corpus.py"]),
    Bug("tfixup-enc-layer0", "T-Fixup scaling skipped on encoder layer 0", "tfx/init/tfixup.py", [
        ("for layer in model.encoder.layers:", "for layer in model.encoder.layers[1:]:"),
    ], ["tests/init/"]),
    Bug("tfixup-dec-layer0", "T-Fixup scaling skipped on decoder layer 0", "tfx/init/tfixup.py", [
        ("for layer in model.decoder.layers:", "for layer in model.decoder.layers[1:]:"),
    ], ["tests/init/"]),
    Bug("positions-sine", "cosine positions replaced with sine", "tfx/model/transformer.py", [
        ("torch.cos(angles)", "torch.sin(angles)"),
    ], ["tests/model/"]),
    Bug("embed-scale", "no sqrt(d) embedding scale", "tfx/model/transformer.py", [
        ("self.scale = math.sqrt(embed.embedding_dim)", "self.scale = 1.0"),
    ], ["tests/model/"]),
    Bug("ddp-world-size", "DDP: no world-size factor on the loss", "tfx/training/step.py", [
        ("loss * self.world_size / denominator", "loss / denominator"),
    ], wiring(TWO_RANKS)),
    Bug("ddp-local-tokens", "DDP: loss divided by this rank's tokens (no all-reduce)", "tfx/training/step.py", [
        ("return distributed.all_reduce_sum(on_device, self.device)", "return on_device"),
    ], wiring(TWO_RANKS)),
    Bug("no-token-norm", "loss not divided by the update's token count", "tfx/training/step.py", [
        ("loss * self.world_size / denominator", "loss * self.world_size"),
    ], wiring(FIRST_UPDATE, TWO_RANKS)),
    Bug("diag-sum", "diagnostics sum per-tensor norms instead of the L2 norm", "tfx/reporting/statistics.py", [
        ("return torch.stack(norms).norm() if norms", "return torch.stack(norms).sum() if norms"),
    ], ["tests/reporting/test_statistics.py", "tests/reporting/test_init_report.py"]),
    Bug("diag-rms-sqrt", "activation RMS without the sqrt", "tfx/reporting/statistics.py", [
        ("return sq.mean().sqrt()", "return sq.mean()"),
        ("/ keep.sum().clamp(min=1.0)).sqrt()", "/ keep.sum().clamp(min=1.0))"),
    ], ["tests/reporting/test_statistics.py", "tests/reporting/test_init_report.py"]),
    Bug("average-no-spm-check", "tfx.average without the sentencepiece-bytes check", "tfx/evaluation/average.py", [
        ('    if first.get("spm_model") != other.get("spm_model"):\n'
         '        return "their sentencepiece models differ"\n', ""),
    ], AVERAGE),
    Bug("train-smoothing", "trainer ignores optim.label_smoothing (uses 0.1)", "tfx/training/step.py", [
        ("label_smoothed_loss(logits, batch.target, self.opt.label_smoothing, PAD)",
         "label_smoothed_loss(logits, batch.target, 0.1, PAD)"),
    ], wiring(FIRST_UPDATE)),
    Bug("train-schedule-from-1", "schedule indexed from update 1", "tfx/training/trainer.py", [
        ("lr = lr_at(self.queue.step, self.cfg.optim)", "lr = lr_at(self.queue.step + 1, self.cfg.optim)"),
    ], wiring("schedule_starts_at_update_zero")),
    Bug("best-always", "checkpoint_best.pt written at every validation", "tfx/training/validation.py", [
        ("improved = result.bleu > self.state.best_bleu", "improved = True"),
    ], wiring(BEST)),
    Bug("valid-loss-nats", "validation loss in nats, not bits", "tfx/evaluation/validate.py", [
        ("loss_sum / ntokens / math.log(2), nll_sum", "loss_sum / ntokens, nll_sum"),
    ], wiring(BEST)),
    Bug("resume-restarts-epoch", "resume restarts the epoch from its first batch", "tfx/training/resume.py", [
        ('state = TrainState(**ckpt["train_state"])',
         'state = TrainState(**{**ckpt["train_state"], "batch_in_epoch": 0})'),
    ], wiring("resume_across_an_epoch_boundary_equals_uninterrupted")),
    Bug("epoch-not-passed", "every epoch shuffled as epoch 1", "tfx/training/trainer.py", [
        ("batches = self.batches.epoch(self.state.epoch)", "batches = self.batches.epoch(1)"),
    ], wiring("each_epoch_is_shuffled_with_its_own_number")),
    Bug("keep-last-off-by-one", "keep_last keeps one checkpoint too many", "tfx/checkpoints/manager.py", [
        ("numbered_checkpoints(self.dir)[: -self.keep_last]", "numbered_checkpoints(self.dir)[: -self.keep_last - 1]"),
    ], wiring(BEST, "keep_last_prunes_by_update_not_by_file_name")),
    Bug("keep-last-by-name", "keep_last prunes by file name, not by step", "tfx/checkpoints/numbered.py", [
        ("return [p for _, _, p in sorted(found)]", "return sorted(p for _, _, p in found)"),
    ], wiring("keep_last_prunes_by_update_not_by_file_name")),
    Bug("max-epochs-off-by-one", "max_epochs stops one epoch early", "tfx/checkpoints/train_state.py", [
        ("self.epoch > t.max_epochs", "self.epoch >= t.max_epochs"),
    ], wiring("max_epochs_runs_whole_epochs")),
    Bug("max-minutes-seconds", "max_minutes read as seconds", "tfx/checkpoints/train_state.py", [
        ("self.train_seconds >= 60 * t.max_minutes", "self.train_seconds >= t.max_minutes"),
    ], wiring("max_minutes_counts_minutes_of_training_time")),
    Bug("max-minutes-ignored", "max_minutes ignored", "tfx/checkpoints/train_state.py", [
        ("return not (t.max_minutes and self.train_seconds >= 60 * t.max_minutes)", "return True"),
    ], wiring("max_minutes_stops_after_the_first_update", "max_minutes_counts_minutes_of_training_time")),
    Bug("validate-minutes-seconds", "validate_every_minutes read as seconds", "tfx/training/validation.py", [
        (">= 60 * t.validate_every_minutes", ">= t.validate_every_minutes"),
    ], wiring("validate_every_minute_of_training_time")),
    Bug("validate-minutes-ignored", "validate_every_minutes ignored", "tfx/training/validation.py", [
        ("or bool(minutes_due)", "or False"),
    ], wiring("validate_every_minutes_validates_when_due", "validate_every_minute_of_training_time")),
]  # fmt: skip


def copy_tree(dest: Path) -> None:
    for name in ("tfx", "tests", "conf", "scripts", "pyproject.toml"):
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "mutants"))
        else:
            shutil.copy(src, dest / name)


def check(bug: Bug, tree: Path) -> tuple[str, float]:
    path = tree / bug.file
    original = path.read_text()
    text = original
    for old, new in bug.edits:
        if old not in text:
            return "stale", 0.0
        text = text.replace(old, new)
    path.write_text(text)
    start = time.perf_counter()
    try:
        cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-m", "not slow", "-p", "no:cacheprovider", *bug.tests]
        run = subprocess.run(cmd, cwd=tree, capture_output=True, text=True)
    finally:
        path.write_text(original)
    seconds = time.perf_counter() - start
    if run.returncode == 1:
        failed = [line.split(" ")[1] for line in run.stdout.splitlines() if line.startswith("FAILED ")]
        return "caught by " + (failed[0] if failed else "a failing test"), seconds
    return ("MISSED" if run.returncode == 0 else f"pytest exit {run.returncode}"), seconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("words", nargs="*", help="run the bugs whose id contains one of these (default: every bug)")
    p.add_argument("--list", action="store_true", help="print the chosen bugs' ids and what each plants; run nothing")
    args = p.parse_args(argv)
    if unmatched := [w for w in args.words if not any(w in b.id for b in BUGS)]:
        print(f"no planted bug's id contains {', '.join(unmatched)} (--list shows them)", file=sys.stderr)
        return 2
    chosen = [b for b in BUGS if not args.words or any(w in b.id for w in args.words)]
    if args.list:
        print("\n".join(f"{bug.id}: {bug.what}" for bug in chosen))
        return 0
    missed = 0
    with tempfile.TemporaryDirectory(prefix="tfx-planted-") as tmp:
        tree = Path(tmp)
        copy_tree(tree)
        print("| bug | planted | result | s |\n|---|---|---|---|")
        for bug in chosen:
            result, seconds = check(bug, tree)
            missed += not result.startswith("caught")
            print(f"| {bug.id} | {bug.what} | {result} | {seconds:.0f} |", flush=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
