#!/usr/bin/env bash
# One command for a GPU machine: the CUDA tests, deep at width in bf16, throughput/MFU, deep memory.
#
#   scripts/gpu_check.sh OUT                  # one GPU, about 9 minutes (the time boxes below) -> OUT/report.md
#   scripts/gpu_check.sh --cpu-dry-run OUT    # every step at tiny sizes on CPU (a minute): checks the script
#
# Steps, in this order (what no CPU here can do first), each time-boxed (`timeout`), its status and seconds in
# the report, its full output in OUT/logs/:
# 1. pytest -m gpu: bf16 and fp16 (loss-scaled) steps, resume on CUDA = an uninterrupted run,
#    checkpoint -> tfx.translate on CUDA, a 1-GPU torchrun run.
# 2. Deep at width (issue 13): +experiment=deep (d 512, lr 3e-5) at 100+100 and 200+200 layers, 30 updates
#    in bf16 (DEEP_PRECISIONS="bf16 fp32" adds fp32, which a CPU can also run), via scripts/deep_width_table.py:
#    passes when no update's train loss is above update 1's and the last is below it. Each run ends by
#    writing its checkpoint (weights and Adam moments), so the runs go to /dev/shm when it has room.
# 3. scripts/bench_train.py at the iwslt sizes: target tokens/s and MFU against the bf16 peak,
#    train.compile off and on, with a torch.profiler breakdown (compile off).
# 4. scripts/deep_memory.py: 200+200 layers at d 512, activation checkpointing off and on,
#    torch.cuda.max_memory_allocated.
# The boxes are sized from the first run on an H200 (docs/gpu-and-scaling.md "GPU"). A failing or timed-out step does not stop
# the later ones; the exit status is 1 if any failed.
# Settings: T_TESTS, T_DEEP, T_BENCH, T_MEMORY (seconds per step), DEEP_PRECISIONS.
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
cd "${repo}" || exit 1

if [[ ${dry} == 0 ]] && ! "${py}" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
    echo "error: no CUDA device here; run scripts/gpu_check.sh --cpu-dry-run OUT_DIR to check the script on CPU" >&2
    exit 1
fi

if [[ ${dry} == 1 ]]; then  # tiny sizes, CPU, one thread: the same commands in seconds
    device=cpu
    t_tests=${T_TESTS:-120} t_deep=${T_DEEP:-120} t_bench=${T_BENCH:-120} t_memory=${T_MEMORY:-120}
    deep=(--depths 1 --updates 2 model.d_model=32 model.ffn_dim=64)
    read -r -a deep_precisions <<< "${DEEP_PRECISIONS:-fp32}"  # bf16 is emulated, ~100x slower, on most CPUs
    bench=(model.encoder_layers=1 model.decoder_layers=1 model.d_model=32 model.ffn_dim=64 data.max_tokens=256
        data.vocab_size=300 --steps 2 --warmup 1 --lengths 8 12 --profile-steps 1 --threads 1 --compile-backend eager)
    memory=(--layers 2 --d-model 16 --vocab 60 --sentences 2 --length 5 --steps 1 --threads 1)
else
    device=cuda
    # 90 + 240 + 140 + 70 = 540 s: the device machine runs one command for at most 10 minutes; the steps' measured
    # times, which these boxes come from, are in docs/gpu-and-scaling.md "GPU"
    t_tests=${T_TESTS:-90} t_deep=${T_DEEP:-240} t_bench=${T_BENCH:-140} t_memory=${T_MEMORY:-70}
    deep=(--depths 100 200 --updates 30)
    read -r -a deep_precisions <<< "${DEEP_PRECISIONS:-bf16}"
    bench=(--steps 30 --warmup 4 --lengths 32)  # one length: compile once, not once per shape
    memory=(--layers 200 --d-model 512 --steps 2 --threads "$(nproc)")  # threads: the 1B-parameter build on CPU
fi
deep_out="${out}"
shm_free_kb=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 {print $4}')
if [[ ${dry} == 0 && -w /dev/shm && ${shm_free_kb:-0} -gt 40000000 ]]; then  # two checkpoints of 200+200 fit
    deep_out="$(mktemp -d /dev/shm/tfx_gpu_check.XXXXXX)"
    trap 'rm -rf "${deep_out}"' EXIT
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

# section TITLE LOG [LINES]: the step's log (or its tail) as a report section.
section() {
    local title="$1" log="$2"
    printf '\n## %s\n\n' "${title}"
    grep -v -e '^USDT' -e 'profiler_st' "${log}" | tail -n "${3:-60}"
}

# only the file that holds the gpu tests: collecting every test module costs seconds of the box
run_step gpu_tests "${t_tests}" "${py}" -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py
for precision in "${deep_precisions[@]}"; do
    run_step "deep_${precision}" "${t_deep}" "${py}" scripts/deep_width_table.py --out "${deep_out}/deep_${precision}" \
        --candidates adam_3e-5 --precision "${precision}" --device "${device}" --jobs 1 "${deep[@]}"
    # the per-update losses, kept beside the logs (the run folders may be on /dev/shm, removed at exit)
    cat "${deep_out}/deep_${precision}"/runs/*/train.log > "${out}/logs/deep_${precision}_train.log" 2>/dev/null
done
run_step throughput "${t_bench}" "${py}" scripts/bench_train.py --experiment iwslt --device "${device}" \
    --compile off on --profile "${bench[@]}"
run_step deep_memory "${t_memory}" "${py}" scripts/deep_memory.py --device "${device}" --timeout "${t_memory}" \
    "${memory[@]}"
machine="$("${py}" - <<'PY'
import platform

import torch

from tfx.checkpoint import git_sha

cpu = f"CPU ({platform.processor() or platform.machine()})"
device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else cpu
print(f"{device} | torch {torch.__version__} (CUDA {torch.version.cuda}) | tfx {git_sha()}")
PY
)"

{
    echo "# tfx GPU check$([[ ${dry} == 1 ]] && echo " (CPU dry run: tiny sizes, the figures mean nothing)")"
    echo
    echo "${machine}"
    echo "$(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "| step | status | seconds |"
    echo "|---|---|---:|"
    printf '%s\n' "${steps_table[@]}"
    section "1. pytest -m gpu" "${out}/logs/gpu_tests.log" 15
    for precision in "${deep_precisions[@]}"; do
        section "2. Deep at width, +experiment=deep, ${precision}" "${out}/logs/deep_${precision}.log" 8
    done
    section "3. Training throughput (iwslt sizes, synthetic batches)" "${out}/logs/throughput.log" 40
    section "4. Peak memory, 200+200 layers, activation checkpointing off/on" "${out}/logs/deep_memory.log" 12
    echo
    echo "Logs, with each deep run's per-update losses: ${out}/logs/"
} > "${report}.tmp" && mv "${report}.tmp" "${report}"
cat "${report}"
exit ${failed}
