#!/usr/bin/env bash
# One command for a GPU machine (issue 25): the CUDA tests, training throughput/MFU at the iwslt sizes (packed,
# static compile, 4096- and 32k-token batches, the torch peer), deep 200+200 s/update, deep memory.
#
#   scripts/gpu/gpu_check.sh OUT                  # one GPU, at most 535 s of time boxes -> OUT/report.md
#   scripts/gpu/gpu_check.sh --cpu-dry-run OUT    # every step at tiny sizes on CPU (a minute or two): checks the script
#
# Steps, in this order (the figure that matters most first), each time-boxed (`timeout`); each appends its section
# to OUT/report.md when it ends (its status and seconds, then its log's tail), so a window cut short still returns
# what ran; its full output is in OUT/logs/NAME.log; a table of every step's status closes the report:
# 1. throughput_4k (T_BENCH 150 s): scripts/bench/bench_train.py at the iwslt sizes (6+6, d 512), bf16, packed synthetic
#    batches of 4096 tokens (128 x 32), compile on (static) then off, each followed by scripts/bench/torch_peer.py on the
#    same batches with the same compile setting and precision; the compile-on row has the torch.profiler table.
#    Each row: tgt tokens/s, MFU on real tokens, the cold first update (compilation), graphs, recompiles,
#    kernels/update, GPU busy; a warning under a row names graph breaks and recompiles.
# 2. throughput_32k (T_BENCH_32K 85 s): the same, compile on only, data.max_tokens=32768 (1024 x 32).
# 3. deep_bench (T_DEEP_BENCH 115 s): bench_train.py with +experiment=deep (200+200 layers, d 512), 4096-token packed
#    batches, bf16, compile off then on (train.compile_scope=layers: one graph per layer kind, so the 400 layers
#    compile as two), 3 timed updates each: s/update and MFU.
# 4. deep_width (T_DEEP 240 s per precision; DEEP_AT_WIDTH=1 runs it, default off on a GPU: with it the boxes add up
#    to 775 s, over the device's 10-minute command limit, so lower the others' boxes or run it in its own call):
#    issue 13's +experiment=deep (lr 3e-5) at 100+100 and 200+200 layers, 30 updates, bf16 (DEEP_PRECISIONS="bf16
#    fp32" adds fp32), scripts/studies/deep_width_table.py; run folders on /dev/shm when it has 40 GB free.
# 5. deep_memory (T_MEMORY 60 s): scripts/studies/deep_memory.py, 200+200 layers, d 512, activation checkpointing off and
#    on, torch.cuda.max_memory_allocated.
# 6. gpu_tests (T_TESTS 100 s): pytest -m gpu: bf16 and fp16 (loss-scaled) steps, resume on CUDA = an uninterrupted
#    run, checkpoint -> tfx.translate on CUDA, a 1-GPU torchrun run, and test_an_update_makes_no_host_sync (padded
#    and packed) under torch.cuda.set_sync_debug_mode("error").
# 7. decode (T_DECODE 25 s): scripts/bench/bench_decode.py --random at the iwslt sizes, bf16, 1014 sentences (Multi30k
#    valid's count), validation's 4096-token batches: greedy (validation) and beam 5 (test), sentences/s.
# The boxes add up to 535 s (steps 1-3 and 5-7), under 9 minutes; the first compile of the whole model at the iwslt
# sizes took over 85 s with dynamic shapes on an H200 (docs/gpu-and-scaling.md "GPU"); tfx now compiles per layer
# (static: two graphs), so steps 1 and 2 leave room for two compiles each (tfx and the peer; 32k: tfx alone).
# A failing or timed-out step does not stop the later ones, and rows a bench step printed before its box ended
# stay in its log and its section; the exit status is 1 if any step failed.
# Settings: T_TESTS, T_BENCH, T_BENCH_32K, T_DEEP_BENCH, T_DEEP, T_MEMORY, T_DECODE (seconds per step),
# DEEP_AT_WIDTH, DEEP_PRECISIONS, WHEELS (a folder of wheels to install first into /tmp/tfx_site, see below), PYTHON.
#
# On this workplace's device machine (nvidia-h200): its python3 has torch but lacks hydra-core, omegaconf,
# antlr4-python3-runtime and sacremoses, so carry them as wheels. Once, here, in the repo root (pure-Python wheels;
# antlr4 4.9.3 is an sdist on PyPI, so build its wheel):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 -d .whl hydra-core==1.3.8 omegaconf==2.3.1 sacremoses==0.2.0
#   python3 -m pip wheel --no-deps -w .whl antlr4-python3-runtime==4.9.3
# then one device call, carry [".whl"], timeout_s 600 (the boxes end by 535 s, plus the report):
#   WHEELS=.whl PYTHON=python3 PYTHONUNBUFFERED=1 bash scripts/gpu/gpu_check.sh $OUT
# ($OUT/report.md and the 6 logs in $OUT/logs/ come back. If the call is cut short, report.md holds the steps that
# ended, in the order above: the 4096-token figure first.)
set -uo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/device_prelude.sh" "$@"
mkdir -p "${out}/logs" || exit 1

if [[ ${dry} == 1 ]]; then  # tiny sizes, CPU, one thread, fp32, eager backend (trace only): the same commands
    device=cpu
    t_tests=${T_TESTS:-120} t_bench=${T_BENCH:-120} t_bench_32k=${T_BENCH_32K:-120} t_deep_bench=${T_DEEP_BENCH:-120}
    t_deep=${T_DEEP:-120} t_memory=${T_MEMORY:-120} t_decode=${T_DECODE:-120}
    deep_at_width=${DEEP_AT_WIDTH:-1}  # checked here, so the GPU run can turn it on
    # Hydra overrides (bench_train.py takes them before its options) and options, for the bench steps
    bench_over=(model.encoder_layers=1 model.decoder_layers=1 model.d_model=32 model.ffn_dim=64 data.vocab_size=300
        train.precision=fp32)
    bench=(--steps 2 --warmup 1 --lengths 8 --profile-steps 1 --threads 1 --compile-backend eager)
    tokens_4k=256 tokens_32k=1024
    deep_over=(model.encoder_layers=2 model.decoder_layers=2 model.d_model=32 model.ffn_dim=64 data.vocab_size=300
        train.precision=fp32)
    deep_bench=(--steps 2 --warmup 1 --lengths 8 --threads 1 --compile-backend eager)
    deep=(--depths 1 --updates 2 model.d_model=32 model.ffn_dim=64)
    read -r -a deep_precisions <<< "${DEEP_PRECISIONS:-fp32}"  # bf16 is emulated, ~100x slower, on most CPUs
    memory=(--layers 2 --d-model 16 --vocab 60 --sentences 2 --length 5 --steps 1 --threads 1)
    decode=(--d-model 32 --layers 1 --vocab 300 --limit 64 --uncached-limit 4 --threads 1)
else
    device=cuda
    # 100 + 150 + 85 + 115 + 60 + 25 = 535 s: the device machine runs one command for at most 10 minutes
    t_tests=${T_TESTS:-100} t_bench=${T_BENCH:-150} t_bench_32k=${T_BENCH_32K:-85} t_deep_bench=${T_DEEP_BENCH:-115}
    t_deep=${T_DEEP:-240} t_memory=${T_MEMORY:-60} t_decode=${T_DECODE:-25}
    deep_at_width=${DEEP_AT_WIDTH:-0}
    bench_over=(train.precision=bf16)
    bench=(--steps 30 --warmup 3 --lengths 32 --threads "$(nproc)")  # one length: one shape, compiled once
    tokens_4k=4096 tokens_32k=32768
    deep_over=(train.precision=bf16)
    deep_bench=(--steps 3 --warmup 1 --lengths 32 --threads "$(nproc)")  # threads: the 1B-parameter build on CPU
    deep=(--depths 100 200 --updates 30)
    read -r -a deep_precisions <<< "${DEEP_PRECISIONS:-bf16}"
    memory=(--layers 200 --d-model 512 --steps 2 --threads "$(nproc)")  # threads: the 1B-parameter build on CPU
    decode=(--d-model 512 --layers 6 --vocab 10000 --limit 1014 --uncached-limit 20 --bf16)  # iwslt sizes
fi
deep_out="${out}"
shm_free_kb=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 {print $4}')
if [[ ${dry} == 0 && ${deep_at_width} == 1 && -w /dev/shm && ${shm_free_kb:-0} -gt 40000000 ]]; then
    deep_out="$(mktemp -d /dev/shm/tfx_gpu_check.XXXXXX)"  # two checkpoints of 200+200 fit
    trap 'rm -rf "${deep_out}"' EXIT
fi

report="${out}/report.md"
steps_table=()
failed=0
section_no=0

# run_step NAME SECONDS TITLE TAIL CMD...: time-boxed, output to logs/NAME.log; then appends to the report a section
# "## N. TITLE" with the row "| NAME | status | s |" and the last TAIL lines of the log, so the report holds every
# step that ended even if this script is stopped before the end.
run_step() {
    local name="$1" limit="$2" title="$3" tail_lines="$4" start rc status row
    shift 4
    echo "== ${name} (at most ${limit} s)" >&2
    start=$(date +%s)
    timeout -k 10 "${limit}" "$@" > "${out}/logs/${name}.log" 2>&1
    rc=$?
    case ${rc} in
        0) status=ok ;;
        124 | 137) status="timed out after ${limit} s"; failed=1 ;;
        *) status="failed (exit ${rc})"; failed=1 ;;
    esac
    row="| ${name} | ${status} | $(($(date +%s) - start)) |"
    steps_table+=("${row}")
    section_no=$((section_no + 1))
    {
        printf '\n## %s. %s\n\n| step | status | seconds |\n|---|---|---:|\n%s\n\n' "${section_no}" "${title}" "${row}"
        grep -v -e '^USDT' -e 'profiler_st' "${out}/logs/${name}.log" | tail -n "${tail_lines}"
    } >> "${report}"
    echo "   ${status}" >&2
    return 0
}

machine="$("${py}" - <<'PY'
import platform

import torch

from tfx.checkpoints.load import git_sha

cpu = f"CPU ({platform.processor() or platform.machine()})"
device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else cpu
print(f"{device} | torch {torch.__version__} (CUDA {torch.version.cuda}) | tfx {git_sha()}")
PY
)"
{
    echo "# tfx GPU check$([[ ${dry} == 1 ]] && echo " (CPU dry run: tiny sizes, the figures mean nothing)")"
    echo
    echo "${machine}"
    echo "started $(date -u '+%Y-%m-%d %H:%M UTC'); each step's section is appended when the step ends"
} > "${report}"

run_step throughput_4k "${t_bench}" \
    "Throughput, iwslt sizes, packed ${tokens_4k}-token batches: compile on/off, torch peer" 45 \
    "${py}" scripts/bench/bench_train.py "${bench_over[@]}" "data.max_tokens=${tokens_4k}" --experiment iwslt \
    --device "${device}" --batching packed --compile on off --torch-peer --profile "${bench[@]}"
run_step throughput_32k "${t_bench_32k}" \
    "Throughput, iwslt sizes, packed ${tokens_32k}-token batches, compile on" 12 \
    "${py}" scripts/bench/bench_train.py "${bench_over[@]}" "data.max_tokens=${tokens_32k}" --experiment iwslt \
    --device "${device}" --batching packed --compile on "${bench[@]}"
run_step deep_bench "${t_deep_bench}" \
    "Deep, +experiment=deep, ${tokens_4k}-token packed batches, compile off/on" 12 \
    "${py}" scripts/bench/bench_train.py "${deep_over[@]}" "data.max_tokens=${tokens_4k}" --experiment deep \
    --device "${device}" --batching packed --compile off on "${deep_bench[@]}"
if [[ ${deep_at_width} == 1 ]]; then
    for precision in "${deep_precisions[@]}"; do
        run_step "deep_width_${precision}" "${t_deep}" "Deep at width, +experiment=deep, ${precision}" 8 \
            "${py}" scripts/studies/deep_width_table.py --out "${deep_out}/deep_${precision}" --candidates adam_3e-5 \
            --precision "${precision}" --device "${device}" --jobs 1 "${deep[@]}"
        # the per-update losses, kept beside the logs (the run folders may be on /dev/shm, removed at exit)
        cat "${deep_out}/deep_${precision}"/runs/*/train.log > "${out}/logs/deep_width_${precision}_train.log" \
            2>/dev/null
    done
else
    steps_table+=("| deep_width | skipped (DEEP_AT_WIDTH=1 runs it) | 0 |")
fi
run_step deep_memory "${t_memory}" "Peak memory, 200+200 layers, activation checkpointing off/on" 12 \
    "${py}" scripts/studies/deep_memory.py --device "${device}" --timeout "${t_memory}" "${memory[@]}"
# only the file that holds the gpu tests: collecting every test module costs seconds of the box
run_step gpu_tests "${t_tests}" "pytest -m gpu" 15 \
    "${py}" -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py
# greedy (validation's search) and beam 5 (test's), validation's batches (4096 padded source tokens)
run_step decode "${t_decode}" \
    "Decoding, iwslt sizes, untrained weights (every sentence runs to its length limit): greedy, beam 5" 12 \
    bash -c 'for beam in 1 5; do "$0" scripts/bench/bench_decode.py --random --device "$1" --beam "${beam}" \
    --max-tokens 4096 "${@:2}" || exit 1; done' "${py}" "${device}" "${decode[@]}"

{
    printf '\n## Every step\n\n| step | status | seconds |\n|---|---|---:|\n'
    printf '%s\n' "${steps_table[@]}"
    echo
    echo "ended $(date -u '+%Y-%m-%d %H:%M UTC'). Logs, with each deep-at-width run's per-update losses: ${out}/logs/"
} >> "${report}"
cat "${report}"
exit ${failed}
