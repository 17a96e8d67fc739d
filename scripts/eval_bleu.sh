#!/usr/bin/env bash
# Checkpoint or run folder -> translations -> sacreBLEU with its signature (and chrF).
#
#   scripts/eval_bleu.sh RUN_DIR_OR_CHECKPOINT [--split test] [--avg N] [--beam 5] [--lenpen 1.0]
#                        [--src FILE --ref FILE] [--data-dir DIR] [--tok-bleu] [--device auto]
#
# RUN_DIR uses checkpoints/checkpoint_best.pt, or with --avg N the average of the last N numbered
# checkpoints (written to checkpoints/checkpoint_avgN.pt): tfx.evaluate's rule, the same as tfx.average --last N
# (docs/evaluation.md, "Averaging": fewer on a short run, a final checkpoint's near duplicate left out, a single
# one evaluated under its own name). --tok-bleu adds the tokenized, lowercased
# BLEU that IWSLT'14 papers report (labelled as such; never compare it with sacreBLEU).
# All options: python -m tfx.evaluate --help. Paths are taken relative to the current directory.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ $# -lt 1 ]]; then
    echo "usage: $0 RUN_DIR_OR_CHECKPOINT [options]  (see: python -m tfx.evaluate --help)" >&2
    exit 2
fi
export PYTHONPATH="${repo}${PYTHONPATH:+:${PYTHONPATH}}"
exec "${PYTHON:-python}" -m tfx.evaluate "$@"
