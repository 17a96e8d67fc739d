# Sourced first by the scripts for a GPU window (gpu_check.sh, gpu_converged.sh), with their arguments:
#   source "$(dirname "${BASH_SOURCE[0]}")/device_prelude.sh" "$@"
# It reads `[--cpu-dry-run] OUT_DIR` (sets dry=0/1 and out, OUT_DIR made and absolute), puts the repo on PYTHONPATH
# and cd's to it (sets repo), sets py (PYTHON, default python), installs WHEELS (a folder of wheels for packages
# the device machine's Python lacks: gpu_check.sh's header says which) into /tmp/tfx_site, and outside a dry run
# stops with a one-line error where torch sees no CUDA device.
script="$(basename "$0")"
usage() { echo "usage: ${script} [--cpu-dry-run] OUT_DIR" >&2; exit 2; }
dry=0
if [[ "${1:-}" == "--cpu-dry-run" ]]; then dry=1; shift; fi
[[ $# -eq 1 && "$1" != -* ]] || usage
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
mkdir -p "$1" || { echo "error: cannot create $1: pass a writable OUT_DIR" >&2; exit 1; }
out="$(cd "$1" && pwd)"
export PYTHONPATH="${repo}${PYTHONPATH:+:${PYTHONPATH}}"
py="${PYTHON:-python}"
cd "${repo}" || exit 1

if [[ -n "${WHEELS:-}" ]]; then
    "${py}" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/tfx_site \
        "${WHEELS}"/*.whl || { echo "error: installing the wheels in ${WHEELS} failed" >&2; exit 1; }
    export PYTHONPATH="/tmp/tfx_site:${PYTHONPATH}"
fi
if [[ ${dry} == 0 ]] && ! "${py}" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
    echo "error: no CUDA device here; run scripts/gpu/${script} --cpu-dry-run OUT_DIR to check the script on CPU" >&2
    exit 1
fi

# start_mps DIR: an MPS control daemon (pipes and logs under DIR), so that the kernels of many small training
# processes run on the GPU side by side instead of taking turns (time-slicing, where every host sync, e.g. each
# greedy-decoding step, waits for the other processes' slices). It leaves the GPU's settings as they are. Where the
# daemon is missing, does not start, or a CUDA client fails under it, it says so in one line, stops the daemon and
# returns 1: the processes then share the GPU by time-slicing. stop_mps ends it (call it on exit).
start_mps() {
    local dir="$1" why=""
    if ! command -v nvidia-cuda-mps-control > /dev/null; then
        echo "== MPS: off (no nvidia-cuda-mps-control on PATH): the processes time-slice the GPU" >&2
        return 1
    fi
    mkdir -p "${dir}/pipe" "${dir}/log"
    export CUDA_MPS_PIPE_DIRECTORY="${dir}/pipe" CUDA_MPS_LOG_DIRECTORY="${dir}/log"
    if ! nvidia-cuda-mps-control -d; then
        why="the daemon did not start"
    elif ! timeout 120 "${py}" -c 'import torch; assert torch.ones(1, device="cuda").add_(1).item() == 2' \
        2> "${dir}/log/client.err"; then
        why="a CUDA client failed under it"
    fi
    if [[ -n "${why}" ]]; then
        stop_mps
        echo "== MPS: off (${why}; logs in ${dir}/log): the processes time-slice the GPU" >&2
        return 1
    fi
    echo "== MPS: on (server $(echo get_server_list | timeout 10 nvidia-cuda-mps-control | tr '\n' ' '))" >&2
}

stop_mps() {
    [[ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ]] || return 0
    echo quit | timeout 30 nvidia-cuda-mps-control > /dev/null 2>&1
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}
