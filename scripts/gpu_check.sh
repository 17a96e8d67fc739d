#!/usr/bin/env bash
# One command for a GPU machine: the CUDA tests, throughput/MFU, deep memory, a T-Fixup vs Post-LN pair.
#
#   scripts/gpu_check.sh OUT                  # one GPU, under 9 minutes (the time boxes below) -> OUT/report.md
#   scripts/gpu_check.sh --cpu-dry-run OUT    # every step at tiny sizes on CPU (a minute): checks the script
#
# Steps, each time-boxed (`timeout`), its status and seconds in the report, its full output in OUT/logs/:
# 1. pytest -m gpu: bf16 and fp16 (loss-scaled) steps, resume on CUDA = an uninterrupted run,
#    checkpoint -> tfx.translate on CUDA, a 1-GPU torchrun run.
# 2. scripts/bench_train.py at the iwslt sizes: target tokens/s and MFU against the bf16 peak,
#    train.compile off and on, with a torch.profiler breakdown (compile off).
# 3. scripts/deep_memory.py: 200+200 layers at d 512, activation checkpointing off and on,
#    torch.cuda.max_memory_allocated.
# 4. Multi30k De->En (+experiment=multi30k vs multi30k_postln, the same budget), validation BLEU.
# 5. Deep at width (issue 13): +experiment=deep (d 512, lr 3e-5) at 100+100 and 200+200 layers,
#    30 updates in bf16, then in fp32, via scripts/deep_width_table.py: passes when no update's
#    train loss is above update 1's and the last is below it.
# A failing or timed-out step does not stop the later ones; the exit status is 1 if any failed.
# Settings: DATA_DIR (Multi30k folder, default ../shared/data/multi30k relative to the repo),
# PAIR_MINUTES (training minutes per run, 0.4), T_TESTS, T_BENCH, T_MEMORY, T_PAIR, T_DEEP (seconds per step).
set -uo pipefail

usage() { echo "usage: $0 [--cpu-dry-run] OUT_DIR" >&2; exit 2; }
dry=0
if [[ "${1:-}" == "--cpu-dry-run" ]]; then dry=1; shift; fi
[[ $# -eq 1 && "$1" != -* ]] || usage
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$1/logs" || { echo "error: cannot create $1/logs: pass a writable OUT_DIR" >&2; exit 1; }
out="$(cd "$1" && pwd)"
export PYTHONPATH="${repo}${PYTHONPATH:+:${PYTHONPATH}}"
py="${PYTHON:-python}"
data_dir="${DATA_DIR:-${repo}/../shared/data/multi30k}"
[[ -d "${data_dir}" ]] && data_dir="$(cd "${data_dir}" && pwd)"  # relative to the caller's folder, not the repo
cd "${repo}" || exit 1

if [[ ${dry} == 0 ]] && ! "${py}" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
    echo "error: no CUDA device here; run scripts/gpu_check.sh --cpu-dry-run OUT_DIR to check the script on CPU" >&2
    exit 1
fi

if [[ ${dry} == 1 ]]; then  # tiny sizes, CPU, one thread: the same commands in seconds
    device=cpu
    t_tests=${T_TESTS:-120} t_bench=${T_BENCH:-120} t_memory=${T_MEMORY:-120} t_pair=${T_PAIR:-120}
    t_deep=${T_DEEP:-120}
    tests=(tests/test_gpu.py)  # skips without CUDA; collecting only this file saves seconds
    bench=(model.encoder_layers=1 model.decoder_layers=1 model.d_model=32 model.ffn_dim=64 data.max_tokens=256
        data.vocab_size=300 --steps 2 --warmup 1 --lengths 8 12 --profile-steps 1 --threads 1 --compile-backend eager)
    memory=(--layers 2 --d-model 16 --vocab 60 --sentences 2 --length 5 --steps 1 --threads 1)
    pair_data=(data=toy data.toy_train_size=200 data.toy_valid_size=16 data.toy_test_size=16 data.vocab_size=64)
    pair_budget=(train.max_updates=3 train.max_minutes=0 model.encoder_layers=1 model.decoder_layers=1
        model.d_model=32 model.ffn_dim=64 train.threads=1)
    deep=(--depths 1 --updates 2 model.d_model=32 model.ffn_dim=64)
    deep_precisions=(fp32)  # bf16 is emulated, and ~100x slower, on CPUs without AVX512-BF16
else
    device=cuda
    # the boxes add up to under 9 minutes: the device machine runs one command for at most 10
    t_tests=${T_TESTS:-90} t_bench=${T_BENCH:-120} t_memory=${T_MEMORY:-90} t_pair=${T_PAIR:-35}
    t_deep=${T_DEEP:-80}
    tests=(tests)
    bench=(--steps 30 --warmup 6)
    memory=(--layers 200 --d-model 512 --steps 2 --threads "$(nproc)")  # threads: the 1B-parameter build on CPU
    pair_data=(data.source=local data.local_dir="${data_dir}")
    pair_budget=(train.max_updates=0 train.max_minutes="${PAIR_MINUTES:-0.4}" data.max_tokens=4096)
    deep=(--depths 100 200 --updates 30)
    deep_precisions=(bf16 fp32)
fi

report="${out}/report.md"
steps_table=()
failed=0

# run_step NAME SECONDS CMD...: time-boxed, output to logs/NAME.log; records "| NAME | status | s |".
run_step() {
    local name="$1" limit="$2" start rc status
    shift 2
    echo "== ${name} (at most ${limit} s)" >&2
    start=$(date +%s)
    timeout -k 10 "${limit}" "$@" > "${out}/logs/${name}.log" 2>&1
    rc=$?
    case ${rc} in
        0) status=ok ;;
        124 | 137) status="timed out after ${limit} s"; failed=1 ;;
        *) status="failed (exit ${rc})"; failed=1 ;;
    esac
    steps_table+=("| ${name} | ${status} | $(($(date +%s) - start)) |")
    echo "   ${status}" >&2
    return 0
}

# section TITLE LOG [FILTER]: the step's log (or its tail, on failure) as a report section.
section() {
    local title="$1" log="$2"
    printf '\n## %s\n\n' "${title}"
    grep -v -e '^USDT' -e 'profiler_st' "${log}" | tail -n "${3:-60}"
}

run_step gpu_tests "${t_tests}" "${py}" -m pytest -q -m gpu -p no:cacheprovider "${tests[@]}"
run_step throughput "${t_bench}" "${py}" scripts/bench_train.py --experiment iwslt --device "${device}" \
    --compile off on --profile "${bench[@]}"
run_step deep_memory "${t_memory}" "${py}" scripts/deep_memory.py --device "${device}" --timeout "${t_memory}" \
    "${memory[@]}"
for exp in multi30k multi30k_postln; do
    run_step "${exp}" "${t_pair}" "${py}" -m tfx.train +experiment="${exp}" "${pair_data[@]}" "${pair_budget[@]}" \
        train.device="${device}" train.validate_every_minutes=0 train.validate_every_updates=0 \
        train.save_every_epochs=0 train.valid_beam=1 train.progress=false \
        data.cache_dir="${out}/data_cache" hydra.run.dir="${out}/runs/${exp}"
done
for precision in "${deep_precisions[@]}"; do
    run_step "deep_${precision}" "${t_deep}" "${py}" scripts/deep_width_table.py --out "${out}/deep_${precision}" \
        --candidates adam_3e-5 --precision "${precision}" --device "${device}" --jobs 1 "${deep[@]}"
done
# One interpreter for the machine line and the pair's table (each start costs seconds on a small CPU).
summary="$("${py}" - "${out}/runs" <<'EOF'
import platform
import sys
from pathlib import Path

import torch

from tfx.checkpoint import CheckpointError, git_sha, load_checkpoint

cpu = f"CPU ({platform.processor() or platform.machine()})"
device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else cpu
print(f"{device} | torch {torch.__version__} (CUDA {torch.version.cuda}) | tfx {git_sha()}")
print("| run | norm / init / warmup | updates | train min | best valid BLEU |")
print("|---|---|---:|---:|---:|")
for name in ("multi30k", "multi30k_postln"):
    try:
        ckpt = load_checkpoint(Path(sys.argv[1]) / name / "checkpoints" / "checkpoint_last.pt")
    except CheckpointError:
        print(f"| {name} | - | - | - | no checkpoint: see logs/{name}.log |")
        continue
    c, s = ckpt["config"], ckpt["train_state"]
    recipe = f"{c['model']['norm']} / {c['init']['name']} / {c['optim']['warmup_updates']}"
    print(f"| {name} | {recipe} | {s['step']} | {s['train_seconds'] / 60:.2f} | {s['best_bleu']:.2f} |")
EOF
)"

{
    echo "# tfx GPU check$([[ ${dry} == 1 ]] && echo " (CPU dry run: tiny sizes, the figures mean nothing)")"
    echo
    head -n 1 <<< "${summary}"
    echo "$(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "| step | status | seconds |"
    echo "|---|---|---:|"
    printf '%s\n' "${steps_table[@]}"
    section "1. pytest -m gpu" "${out}/logs/gpu_tests.log" 15
    section "2. Training throughput (iwslt sizes, synthetic batches)" "${out}/logs/throughput.log" 40
    section "3. Peak memory, 200+200 layers, activation checkpointing off/on" "${out}/logs/deep_memory.log" 12
    printf '\n## 4. Multi30k De->En: T-Fixup vs Post-LN, the same budget (greedy validation BLEU)\n\n%s\n' "$(tail -n +2 <<< "${summary}")"
    for precision in "${deep_precisions[@]}"; do
        section "5. Deep at width, +experiment=deep, ${precision}" "${out}/logs/deep_${precision}.log" 8
    done
    echo
    echo "Logs: ${out}/logs/; runs (TensorBoard): ${out}/runs/"
} > "${report}.tmp" && mv "${report}.tmp" "${report}"
cat "${report}"
exit ${failed}
