#!/usr/bin/env bash
# Issue 52's published anchor in one GPU window (docs/converged.md, "The published anchor"): +experiment=multi30k_tiny,
# Multi30k En->De Transformer-tiny, fp32 as the anchor ran it, every run on the one GPU at once, for at most T_BOX s.
#
#   scripts/gpu/gpu_anchor.sh OUT                 # one GPU -> OUT/report.md
#   scripts/gpu/gpu_anchor.sh --cpu-dry-run OUT   # a tiny model on 400 pretokenized sentences on CPU: checks the script
#
# In this order, each run `python -m tfx.train +experiment=multi30k_tiny method=M optim.lr=LR train.seed=S
# train.device=cuda train.precision=fp32` in STUDY/runs/M_lrLR_seedS (hydra.run.dir):
# 1. at once: Post-LN at the anchor's lr 0.005, seeds 1 2 3, and T-Fixup's lr grid 5e-4 1e-3 2e-3 5e-3 at seed 1
#    (7 processes sharing the GPU through MPS where device_prelude.sh's start_mps gets it, else time-slicing);
# 2. as soon as the 4 grid runs have ended and are scored on valid: T-Fixup seeds 2 and 3 at the lr whose last-10
#    average scores best on valid (diverged runs left out);
# 3. each run, as soon as it ends (completed, early stop, diverged), evaluated as the docs say, on the GPU:
#    scripts/eval_bleu.sh RUN --avg 10 --beam 5 --lenpen 1 --max-len-a 0 --max-len-b 200 on valid, test2016, and
#    test2017 / test2018 / MSCOCO (--refs-tokenized, the pretokenized folder's files).
# At T_BOX s the runs still training get SIGTERM: each saves checkpoint_last.pt and the same command again (on the
# same machine, while it is warm: the study folder stays there) resumes it; ended runs do not train again, scored
# runs are not evaluated again. Evaluations still going at the box's end get T_EVAL s more. OUT/report.md is
# rewritten every time a run ends or is scored, so a call cut short still returns the table of what ran: run,
# method, lr, seed, updates, stop status, tokenized BLEU4 (tok:none on the release's lowercased, tokenized text:
# the anchor's metric) on valid / test2016 / test2017 / test2018 / MSCOCO, test2016's 1-4-gram precisions, BP and
# lengths (python -m tfx.studies.anchor_report). OUT also gets logs/ (each run's training and evaluation output),
# anchor_runs.tar.gz (every run's records, .hydra, hypotheses and scores, no checkpoints) and gpu.log.
# Settings: T_BOX (s of training, default 390), T_EVAL (default 90), POSTLN_SEEDS (default "1 2 3"), TFIXUP_LRS
# (default "5e-4 1e-3 2e-3 5e-3"), TFIXUP_SEEDS (the later seeds, default "2 3"), VALID_MAX_SENTENCES (greedy valid
# BLEU each epoch on this many sentences, default 100: the loss, which patience waits on, and the evaluation keep
# every sentence; docs/converged.md), TOK_DIR (the pretokenized corpus, default data/multi30k_tok; made from DATA_DIR,
# default ../shared/data/multi30k, when missing), STUDY_DIR (default /dev/shm/tfx_gpu_anchor where /dev/shm has 8 GB
# free, else outputs/gpu_anchor), TRAIN_ARGS (more tfx.train overrides for every run), MPS, WHEELS, PYTHON.
#
# On this workplace's device machine: the wheels of scripts/gpu/gpu_check.sh's header (.whl), and the pretokenized
# corpus with its sentencepiece cache, made once here in the repo root (both ignored by git; about 10 MB together):
#   python -m tfx.data.pretokenize ../shared/data/multi30k data/multi30k_tok
#   python -m tfx.train +experiment=multi30k_tiny train.max_updates=1 train.device=cpu hydra.run.dir=/tmp/anchor_prep
# (the second line fills data/cache with the 9712-piece model and the encoded corpus, so 7 runs do not each build
# them), then one device call, after gpu_check.sh's, carry [".whl", "data/multi30k_tok", "data/cache"], timeout_s 600
# (T_BOX 390 + at most 60 s of stopping + T_EVAL 90 + the start):
#   WHEELS=.whl PYTHON=python3 PYTHONUNBUFFERED=1 bash scripts/gpu/gpu_anchor.sh $OUT
# With less device time left, lower T_BOX (and the call's timeout_s) by as much.
set -uo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/device_prelude.sh" "$@"

data="${DATA_DIR:-${repo}/../shared/data/multi30k}"
tok="${TOK_DIR:-${repo}/data/multi30k_tok}"
shm=/dev/shm/tfx_gpu_anchor disk="${repo}/outputs/gpu_anchor"
shm_free_gb=$(df --output=avail -BG /dev/shm 2> /dev/null | tail -n 1 | tr -dc 0-9)
if [[ -n "${STUDY_DIR:-}" ]]; then study="${STUDY_DIR}"
elif [[ -d "${shm}" ]]; then study="${shm}"
elif [[ -d "${disk}" ]]; then study="${disk}"
elif ((${shm_free_gb:-0} >= 8)); then study="${shm}"
else study="${disk}"
fi
t_box=${T_BOX:-390} t_eval=${T_EVAL:-90}
read -r -a postln_seeds <<< "${POSTLN_SEEDS:-1 2 3}"
read -r -a tfixup_lrs <<< "${TFIXUP_LRS:-5e-4 1e-3 2e-3 5e-3}"
read -r -a tfixup_seeds <<< "${TFIXUP_SEEDS:-2 3}"
read -r -a extra <<< "${TRAIN_ARGS:-}"
device=cuda
common=(train.device=cuda train.precision=fp32 train.threads=2
    "train.valid_max_sentences=${VALID_MAX_SENTENCES:-100}")
if [[ ${dry} == 1 ]]; then  # the same commands: a tiny model on a tiny pretokenized corpus, CPU, fp32, a short box
    t_box=${T_BOX:-240}
    study="${STUDY_DIR:-${out}/study}"
    device=cpu
    raw="${out}/tiny_raw"
    mkdir -p "${raw}"
    for lang in de en; do
        head -n 400 "${data}/train.${lang}" > "${raw}/train.${lang}" || exit 1
        for split in valid test test_2017_flickr test_2018_flickr test_2017_mscoco; do
            head -n 30 "${data}/${split}.${lang}" > "${raw}/${split}.${lang}" || exit 1
        done
    done
    tok="${out}/tiny_tok"
    [[ -f "${tok}/train.de" ]] || "${py}" -m tfx.data.pretokenize "${raw}" "${tok}" > /dev/null || exit 1
    rm -rf "${raw}"
    common=(train.device=cpu train.precision=fp32 train.threads=1 train.max_updates=90 model.encoder_layers=1
        model.decoder_layers=1 model.d_model=16 model.ffn_dim=32 model.heads=2 data.vocab_size=200
        data.max_tokens=256 data.cache_dir="${out}/cache" optim.budget_warmup=8 train.keep_last=3)
fi
if [[ ! -f "${tok}/train.de" ]]; then
    echo "== no pretokenized corpus in ${tok}: tokenizing ${data} (see the header to carry it instead)" >&2
    "${py}" -m tfx.data.pretokenize "${data}" "${tok}" > /dev/null \
        || { echo "error: no Multi30k in ${data}: set DATA_DIR or TOK_DIR (see the header)" >&2; exit 1; }
fi
tok="$(cd "${tok}" && pwd)"
mkdir -p "${study}/runs" "${out}/logs" || exit 1
study="$(cd "${study}" && pwd)"
echo "== study in ${study}, corpus ${tok}" >&2
sharing="time-slicing"
[[ ${dry} == 1 ]] && sharing="nothing (CPU)"
if [[ ${dry} == 0 && ${MPS:-1} == 1 ]] && start_mps /tmp/tfx_mps; then sharing="MPS"; fi
trap stop_mps EXIT
monitor=""
if [[ ${dry} == 0 ]] && command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,memory.total --format=csv -l 10 \
        > "${out}/gpu.log" 2>&1 &
    monitor=$!
fi
machine="$("${py}" -c 'import platform, torch
print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU ({platform.machine()})",
      f"| torch {torch.__version__}")')"
started="$(date -u '+%Y-%m-%d %H:%M UTC')"
start=$(date +%s)

declare -A train_pid=() eval_pid=()  # by run name: the training and evaluation processes this call started
tfixup_lr="" best_why=""

ended() {  # RUN ended (completed, early stop, diverged): it does not train again (tfx/reporting/metrics_log.py's "end" record)
    local last
    last="$(grep -s '^{"event": "end"' "$1/metrics.jsonl" | tail -n 1)"
    [[ -n "${last}" && "${last}" != *'"status": "stopped'* ]]
}

# launch NAME METHOD LR SEED: the run in its own process group (the stop below reaches it alone), unless it ended
launch() {
    local name="$1" method="$2" lr="$3" seed="$4" run="${study}/runs/$1"
    if ended "${run}"; then echo "== ${name}: ended before, not trained again" >&2; return; fi
    setsid "${py}" -m tfx.train +experiment=multi30k_tiny "method=${method}" "optim.lr=${lr}" "train.seed=${seed}" \
        "hydra.run.dir=${run}" "data.local_dir=${tok}" "${common[@]}" "${extra[@]}" \
        >> "${out}/logs/${name}.train.log" 2>&1 &
    train_pid[${name}]=$!
    echo "== ${name}: training (pid $!)" >&2
}

# evaluate NAME: the docs' three eval_bleu.sh commands (valid first: the lr choice reads it), in the background in
# its own process group; RUN/evaluated marks a run scored on all five sets
evaluate() {
    local name="$1" run="${study}/runs/$1"
    [[ -f "${run}/evaluated" ]] && return
    PYTHON="${py}" setsid bash -c 'set -e; run="$1" tok="$2"
        decode=(--beam 5 --lenpen 1 --max-len-a 0 --max-len-b 200 --device "$3" --quiet)
        rm -f "${run}"/checkpoints/checkpoint_avg*  # one averaged checkpoint: of the run as it ended
        scripts/eval_bleu.sh "${run}" --avg 10 --split valid "${decode[@]}"
        scripts/eval_bleu.sh "${run}" --avg 10 "${decode[@]}"
        avg="$(ls -t "${run}"/checkpoints/checkpoint_avg*.pt | head -n 1)"
        scripts/eval_bleu.sh "${avg}" --refs-tokenized "${decode[@]}" \
            --src "${tok}"/test_2017_flickr.en "${tok}"/test_2018_flickr.en "${tok}"/test_2017_mscoco.en \
            --ref "${tok}"/test_2017_flickr.de "${tok}"/test_2018_flickr.de "${tok}"/test_2017_mscoco.de
        touch "${run}/evaluated"' _ "${run}" "${tok}" "${device}" >> "${out}/logs/${name}.eval.log" 2>&1 &
    eval_pid[${name}]=$!
    echo "== ${name}: evaluating (pid $!)" >&2
}

report() {  # OUT/report.md from the study folder as it stands now
    local table
    table="$("${py}" -m tfx.studies.anchor_report "${study}" --refs "${tok}" 2> "${out}/logs/report.err")" \
        || table="(the table failed: $(tail -n 1 "${out}/logs/report.err"))"
    {
        echo "# tfx published anchor: Multi30k En->De Transformer-tiny, one GPU window" \
            "$([[ ${dry} == 1 ]] && echo "(CPU dry run: tiny sizes, the figures mean nothing)")"
        echo
        echo "${machine} | fp32 | started ${started} | $(($(date +%s) - start)) s so far, box ${t_box} s" \
            "| GPU shared by ${sharing} | study ${study}"
        echo
        echo "Tokenized BLEU4 (lowercased, Moses-tokenized text, sacreBLEU tok:none: the anchor's metric) of each run's"
        echo "last-10 average (--avg 10), beam 5, lenpen 1, max length 200. T-Fixup's later seeds: ${best_why:-not yet}."
        echo
        echo "${table}"
        echo
        echo "$1"
    } > "${out}/report.md.tmp" && mv "${out}/report.md.tmp" "${out}/report.md"
}

training() { local pid; for pid in "${train_pid[@]}"; do kill -0 "${pid}" 2> /dev/null && return 0; done; return 1; }
evaluating() { local pid; for pid in "${eval_pid[@]}"; do kill -0 "${pid}" 2> /dev/null && return 0; done; return 1; }

runs=()
for seed in "${postln_seeds[@]}"; do runs+=("postln 0.005 ${seed}"); done
for lr in "${tfixup_lrs[@]}"; do runs+=("tfixup ${lr} 1"); done
for spec in "${runs[@]}"; do
    read -r method lr seed <<< "${spec}"
    launch "${method}_lr$(printf '%g' "${lr}")_seed${seed}" "${method}" "${lr}" "${seed}"
done
grid=()
for lr in "${tfixup_lrs[@]}"; do grid+=("tfixup_lr$(printf '%g' "${lr}")_seed1"); done
report "Training (box ${t_box} s)."

# every 5 s until the box ends or nothing is left to do: evaluate each run that ended, then T-Fixup's later seeds
while (($(date +%s) - start < t_box)); do
    changed=0
    for run in "${study}"/runs/*/; do
        name="$(basename "${run}")"
        [[ -n "${train_pid[${name}]:-}" ]] && kill -0 "${train_pid[${name}]}" 2> /dev/null && continue
        if [[ -z "${eval_pid[${name}]:-}" && ! -f "${run}/evaluated" ]] && ended "${run}"; then
            evaluate "${name}"
            changed=1
        fi
    done
    if [[ -z "${tfixup_lr}" ]]; then
        grid_done=1  # each grid run scored on valid, or out of the race (its training or evaluation failed)
        for name in "${grid[@]}"; do
            compgen -G "${study}/runs/${name}/checkpoints/checkpoint_avg*.valid.bleu.json" > /dev/null && continue
            for pid in "${train_pid[${name}]:-}" "${eval_pid[${name}]:-}"; do
                [[ -n "${pid}" ]] && kill -0 "${pid}" 2> /dev/null && grid_done=0
            done
        done
        if ((grid_done)); then
            if tfixup_lr="$("${py}" -m tfx.studies.anchor_report "${study}" --best-lr tfixup 2> "${out}/logs/best_lr.err")"
            then
                best_why="$(tail -n 1 "${out}/logs/best_lr.err"), seeds ${tfixup_seeds[*]} at it"
                for seed in "${tfixup_seeds[@]}"; do
                    launch "tfixup_lr${tfixup_lr}_seed${seed}" tfixup "${tfixup_lr}" "${seed}"
                done
            else
                tfixup_lr=none best_why="none: $(tail -n 1 "${out}/logs/best_lr.err")"
            fi
            changed=1
        fi
    fi
    for name in "${!eval_pid[@]}"; do  # an evaluation that ended since the last report
        if ! kill -0 "${eval_pid[${name}]}" 2> /dev/null && [[ ! -f "${out}/logs/${name}.reported" ]]; then
            touch "${out}/logs/${name}.reported"
            changed=1
        fi
    done
    ((changed)) && report "Training (box ${t_box} s)."
    training || evaluating || break
    sleep 5
done
rm -f "${out}"/logs/*.reported

if training; then  # the box ended: each run saves checkpoint_last.pt and can resume
    echo "== box of ${t_box} s ended: stopping the runs still training" >&2
    for pid in "${train_pid[@]}"; do kill -TERM "${pid}" 2> /dev/null; done
    for _ in $(seq 60); do training || break; sleep 1; done
    for pid in "${train_pid[@]}"; do kill -KILL -- "-${pid}" 2> /dev/null; done
fi
wait "${train_pid[@]}" 2> /dev/null
for run in "${study}"/runs/*/; do  # runs that ended at the box's end are evaluated too
    name="$(basename "${run}")"
    [[ -z "${eval_pid[${name}]:-}" && ! -f "${run}/evaluated" ]] && ended "${run}" && evaluate "${name}"
done
report "Box ended; evaluating (at most ${t_eval} s)."
eval_start=$(date +%s)
while evaluating && (($(date +%s) - eval_start < t_eval)); do sleep 2; done
for pid in "${eval_pid[@]}"; do kill -TERM -- "-${pid}" 2> /dev/null; done  # its group: bash and the decoder
wait "${eval_pid[@]}" 2> /dev/null
[[ -n "${monitor}" ]] && kill "${monitor}" 2> /dev/null

left=0 unscored=0
for run in "${study}"/runs/*/; do
    ended "${run}" || left=$((left + 1))
    [[ -f "${run}/evaluated" ]] || unscored=$((unscored + 1))
done
[[ -z "${tfixup_lr}" || ${tfixup_lr} == none ]] && left=$((left + ${#tfixup_seeds[@]}))
status="Ended after $(($(date +%s) - start)) s: ${left} run(s) still to train (T-Fixup's later seeds counted until"
status+=" they start), ${unscored} not scored; the same command again on this machine resumes them."
((left == 0 && unscored == 0)) && status="Ended after $(($(date +%s) - start)) s: every run ended and is scored."
report "${status}"
tar -czf "${out}/anchor_runs.tar.gz" -C "${study}" --exclude='*.pt' --exclude='tb' runs \
    || echo "(tar of ${study}/runs failed)" >&2
[[ ${dry} == 1 ]] && rm -rf "${out}/tiny_tok" "${out}/cache"
cat "${out}/report.md"
((left == 0 && unscored == 0))
