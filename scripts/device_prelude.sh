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
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
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
    echo "error: no CUDA device here; run scripts/${script} --cpu-dry-run OUT_DIR to check the script on CPU" >&2
    exit 1
fi
