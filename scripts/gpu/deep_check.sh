#!/usr/bin/env bash
# 200+200 layers at d_model 512, as one prepared command: the memory table, then a short deep run.
#
#   scripts/gpu/deep_check.sh OUT_DIR                    # a GPU: ~1B parameters, bf16, ~10 minutes on one H100/H200
#   DEVICE=cpu UPDATES=5 MEMORY=0 scripts/gpu/deep_check.sh OUT_DIR   # the same run on CPU (minutes per update)
#
# 1. scripts/studies/deep_memory.py at d_model $D_MODEL, 50/100/200 layers per side, activation checkpointing
#    off and on (CUDA: torch.cuda.max_memory_allocated; CPU: peak RSS) -> OUT_DIR/memory.md.
#    Skipped with MEMORY=0.
# 2. python -m tfx.train +experiment=deep (T-Fixup, no LayerNorm, no warmup) for $UPDATES updates
#    on $DATA (default: the toy task, which needs no files), TensorBoard and log in OUT_DIR/deep.
#    Multi30k instead: DATA=multi30k DATA_DIR=../shared/data/multi30k.
# Settings: DEVICE (auto), D_MODEL (512), UPDATES (300), MAX_TOKENS (4096), THREADS (torch CPU threads, 0 = all).
set -euo pipefail

if [[ $# -ne 1 ]]; then
    echo "usage: $0 OUT_DIR  (settings via DEVICE, D_MODEL, UPDATES, MAX_TOKENS, DATA, DATA_DIR, MEMORY, THREADS)" >&2
    exit 2
fi
out="$1"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export PYTHONPATH="${repo}${PYTHONPATH:+:${PYTHONPATH}}"
py="${PYTHON:-python}"
device="${DEVICE:-auto}"
d_model="${D_MODEL:-512}"
threads="${THREADS:-0}"
mkdir -p "${out}"

if [[ "${MEMORY:-1}" != 0 ]]; then
    mem_device="${device}"
    [[ "${mem_device}" == auto ]] && mem_device="$("${py}" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')"
    # Write beside, then rename: an interrupted run never leaves a partial table behind.
    "${py}" "${repo}/scripts/studies/deep_memory.py" --device "${mem_device}" --d-model "${d_model}" \
        --threads "$([[ "${threads}" == 0 ]] && nproc || echo "${threads}")" > "${out}/memory.md.tmp"
    mv "${out}/memory.md.tmp" "${out}/memory.md"
    cat "${out}/memory.md"
fi

data_args=(data="${DATA:-toy}")
[[ -n "${DATA_DIR:-}" ]] && data_args+=(data.local_dir="${DATA_DIR}")
start=$(date +%s)
"${py}" -m tfx.train +experiment=deep "${data_args[@]}" \
    model.d_model="${d_model}" model.ffn_dim="$((2 * d_model))" \
    data.max_tokens="${MAX_TOKENS:-4096}" train.device="${device}" train.threads="${threads}" \
    train.max_updates="${UPDATES:-300}" train.log_every_updates=10 train.layer_stats_every_updates=50 \
    train.validate_every_updates=0 train.save_every_updates=0 train.valid_max_sentences=16 train.valid_beam=1 \
    hydra.run.dir="${out}/deep"
echo "deep run: $(( $(date +%s) - start )) s wall; curves: tensorboard --logdir ${out}/deep/tb"
