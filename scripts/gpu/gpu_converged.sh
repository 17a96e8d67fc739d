#!/usr/bin/env bash
# The converged comparison in one GPU window (issue 26): scripts/studies/converged_study.py --preset gpu at 3+3 layers (the
# arms the CPU studies tuned, each at its setting, seeds 1 2 3) and at 12+12 (the same settings, seeds DEEP_SEEDS),
# both at once on one GPU, for at most T_STUDY seconds. Then both studies are stopped (a run saves and resumes),
# replotted, and their tables, figures and records (no checkpoints) are written to OUT.
#
#   scripts/gpu/gpu_converged.sh OUT                 # one GPU -> OUT/report.md
#   scripts/gpu/gpu_converged.sh --cpu-dry-run OUT   # a tiny model on a 400-sentence corpus on CPU: checks the script
#
# The studies live in STUDY_DIR (default: /dev/shm/tfx_gpu_converged where /dev/shm has 48 GB free, since 30 runs
# write checkpoints every few seconds; else outputs/gpu_converged, ignored by git; a folder left by an earlier call
# is used again), so the same command again on the same machine (the device machine while it is warm) resumes them:
# ended runs do not train again, scored decodes are not redone. The processes share the GPU through MPS
# (device_prelude.sh's start_mps; MPS=0: time-slicing, as the first 2026-12-04 window did). OUT gets report.md
# (both tables and where each study stands), converged_3.tar.gz and converged_12.tar.gz (study.json,
# converged_study.md and the figures, each run's metrics.jsonl, train.log and test decodes), study_3.log and
# study_12.log, and gpu.log (nvidia-smi every 10 s: utilization and memory).
# What fits (one H200, 2026-12-04, docs/converged.md): the 3+3 table converged in 10 min beside the 12+12 study;
# the 12+12 table needs about 13 min alone (DEPTHS=12), i.e. a window of its own.
# Settings: T_STUDY (seconds of training, default 480), DEPTHS (default "3 12"; "3" alone gives the 3+3 runs the
# whole GPU), DEEP_SEEDS (default "1 2 3"), DATA_DIR (default ../shared/data/multi30k, else .gpu_data/multi30k),
# STUDY_DIR, STUDY_ARGS (more converged_study.py options for both studies, e.g. "--patience 5": docs/converged.md
# found patience 3 too short on the GPU), WHEELS (as in scripts/gpu/gpu_check.sh), PYTHON.
#
# Issue 51's 12+12 table of the normalization-free arms, 3 seeds, each at its 3+3 setting as the CPU finalists chose
# it (docs/converged.md: ReZero and Fixup 5e-4,0.1,0; DyT 1e-3,0.3,0), with T-Fixup at its setting, in a window
# of its own:
#   DEPTHS=12 STUDY_ARGS="--arms rezero fixup dyt tfixup --tuned rezero=5e-4,0.1,0 fixup=5e-4,0.1,0
#   dyt=1e-3,0.3,0" (one line) WHEELS=.whl PYTHON=python3 bash scripts/gpu/gpu_converged.sh $OUT
# (the grid's most cautious corner, as the CPU ran it first: rezero=5e-4,0.3,1000 fixup=5e-4,0.3,1000 dyt=5e-4,0.3,1000)
# On this workplace's device machine: the wheels of scripts/gpu/gpu_check.sh's header, and the corpus, which does not
# travel from ../shared (data/cache, the encoded corpus, saves each run a few seconds):
#   mkdir -p .gpu_data && cp -r ../shared/data/multi30k .gpu_data/ && echo /.gpu_data/ >> .git/info/exclude
# then one device call, carry [".whl", ".gpu_data", "data/cache"], timeout_s 600 (T_STUDY plus at most 90 s):
#   WHEELS=.whl PYTHON=python3 PYTHONUNBUFFERED=1 bash scripts/gpu/gpu_converged.sh $OUT
set -uo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/device_prelude.sh" "$@"

data="${DATA_DIR:-}"
if [[ -z "${data}" ]]; then
    data="${repo}/../shared/data/multi30k"
    [[ -f "${data}/train.de" ]] || data="${repo}/.gpu_data/multi30k"
fi
[[ -f "${data}/train.de" ]] || { echo "error: no Multi30k in ${data}: set DATA_DIR (see the header)" >&2; exit 1; }
shm=/dev/shm/tfx_gpu_converged disk="${repo}/outputs/gpu_converged"
shm_free_gb=$(df --output=avail -BG /dev/shm 2> /dev/null | tail -n 1 | tr -dc 0-9)
if [[ -n "${STUDY_DIR:-}" ]]; then studies="${STUDY_DIR}"
elif [[ -d "${shm}" ]]; then studies="${shm}"
elif [[ -d "${disk}" ]]; then studies="${disk}"
elif ((${shm_free_gb:-0} >= 48)); then studies="${shm}"
else studies="${disk}"
fi
t_study=${T_STUDY:-480}
read -r -a deep_seeds <<< "${DEEP_SEEDS:-1 2 3}"
read -r -a extra <<< "${STUDY_ARGS:-}"
common=(--preset gpu "${extra[@]}")
if [[ ${dry} == 1 ]]; then  # the same commands: a tiny model and corpus, CPU, fp32, two arms, a short box
    t_study=${T_STUDY:-150}
    studies="${STUDY_DIR:-${out}/studies}"
    tiny="${out}/tiny_corpus"
    mkdir -p "${tiny}"
    for lang in de en; do
        head -n 400 "${data}/train.${lang}" > "${tiny}/train.${lang}"
        for split in valid test test_2017_flickr test_2018_flickr; do
            head -n 30 "${data}/${split}.${lang}" > "${tiny}/${split}.${lang}"
        done
    done
    data="${tiny}"
    common+=(--arms tfixup postln --max-epochs 3 --patience 1 model.d_model=16 model.ffn_dim=32 model.heads=2
        data.vocab_size=200 data.max_tokens=512 train.device=cpu train.precision=fp32)
fi
mkdir -p "${studies}"
echo "== studies in ${studies}" >&2
sharing="time-slicing"
if [[ ${dry} == 0 && ${MPS:-1} == 1 ]] && start_mps /tmp/tfx_mps; then sharing="MPS"; fi
trap stop_mps EXIT

monitor="" snapshot=""
if [[ ${dry} == 0 ]] && command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,memory.total --format=csv -l 10 \
        > "${out}/gpu.log" 2>&1 &
    monitor=$!
    (sleep 90 && nvidia-smi > "${out}/nvidia-smi.txt" 2>&1) &  # the processes, once every run has started
    snapshot=$!
fi

start=$(date +%s)
pids=()
read -r -a depths <<< "${DEPTHS:-3 12}"
for name in "${depths[@]}"; do
    layers=(--layers "${name}")
    [[ ${dry} == 1 && ${name} -gt 3 ]] && layers=(--layers 2)  # the deeper table, tiny
    [[ ${name} != 3 ]] && layers+=(--seeds "${deep_seeds[@]}")
    # its own process group, so that the stop below reaches the study and nothing else
    setsid "${py}" scripts/studies/converged_study.py --out "${studies}/converged_${name}" --data-dir "${data}" \
        "${common[@]}" "${layers[@]}" > "${out}/study_${name}.log" 2>&1 &
    pids+=($!)
done
echo "== studies started (layers ${depths[*]}; pids ${pids[*]}), at most ${t_study} s" >&2

alive() { local pid; for pid in "${pids[@]}"; do kill -0 "${pid}" 2> /dev/null && return 0; done; return 1; }
while alive && (($(date +%s) - start < t_study)); do sleep 5; done
if alive; then  # the box ended: each study stops its runs, which save checkpoint_last and can resume
    echo "== box of ${t_study} s ended: stopping the studies" >&2
    for pid in "${pids[@]}"; do kill -TERM "${pid}" 2> /dev/null; done
    for _ in $(seq 60); do alive || break; sleep 1; done
    for pid in "${pids[@]}"; do kill -KILL -- "-${pid}" 2> /dev/null; done
fi
codes=()
for pid in "${pids[@]}"; do wait "${pid}"; codes+=($?); done
elapsed=$(($(date +%s) - start))
[[ -n "${monitor}" ]] && kill "${monitor}" "${snapshot}" 2> /dev/null

machine="$("${py}" -c 'import platform, torch
print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU ({platform.machine()})",
      f"| torch {torch.__version__}")')"
{
    echo "# tfx converged comparison, GPU window$([[ ${dry} == 1 ]] && echo " (CPU dry run: tiny sizes)")"
    echo
    echo "${machine} | $(date -u '+%Y-%m-%d %H:%M UTC') | ${elapsed} s (box ${t_study} s) | exit codes by" \
        "depth: ${codes[*]} (0: every run ended; otherwise the same command resumes) | GPU shared by ${sharing}"
    for name in "${depths[@]}"; do
        study="${studies}/converged_${name}"
        echo
        echo "## converged_${name}"
        echo
        if [[ -f "${study}/study.json" ]]; then
            "${py}" scripts/studies/converged_study.py --out "${study}" --replot > /dev/null 2> "${out}/replot_${name}.err" \
                && cat "${study}/converged_study.md" || echo "(replot failed: $(tail -n 1 "${out}/replot_${name}.err"))"
            tar -czf "${out}/converged_${name}.tar.gz" -C "${study}" --exclude='*.pt' --exclude='tb' . \
                || echo "(tar of ${study} failed)"
        else
            echo "(no study.json: the study did not start; see study_${name}.log)"
        fi
    done
} > "${out}/report.md.tmp" && mv "${out}/report.md.tmp" "${out}/report.md"
rm -f "${out}"/replot_*.err
[[ ${dry} == 1 ]] && rm -rf "${out}/tiny_corpus"
cat "${out}/report.md"
[[ "${codes[*]}" =~ ^[0\ ]+$ ]]  # every study ended
