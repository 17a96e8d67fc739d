#!/usr/bin/env bash
# docs/img/dashboard_*.png: TensorBoard in headless Chromium, served on 127.0.0.1:6006.
#
#   scripts/figures/dashboard_shots.sh [WORK_DIR]          # default /tmp/tfx-dashboard; about 10 minutes on 2 CPU cores
#   scripts/figures/dashboard_shots.sh WORK_DIR LOGDIR     # all four pictures of runs that exist (e.g. a checkout's outputs/)
#
# Without LOGDIR it trains two sets and shoots each:
# - WORK_DIR/runs: a T-Fixup and a Post-LN toy run, 6+6 layers, 400 updates -> custom_scalars, images;
# - WORK_DIR/outputs, as the README's commands lay it out (run from WORK_DIR, Hydra's own folders): the toy run, its
#   Post-LN twin and a two-point sweep, 400 updates each -> first_page (where TensorBoard opens), hparams.
# Needs chromium and pngquant (Debian: apt-get install -y chromium pngquant). Runs that already exist are reused.
# See docs/dashboard.md for what each picture shows.
set -euo pipefail
work=$(mkdir -p "${1:-/tmp/tfx-dashboard}" && cd "${1:-/tmp/tfx-dashboard}" && pwd)
repo=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$work/runs" "$repo/docs/img"

if [[ -z ${2:-} ]]; then
  for method in tfixup postln; do
    [[ -d "$work/runs/$method" ]] && continue
    python -m tfx.train method=$method model.encoder_layers=6 model.decoder_layers=6 \
      train.max_updates=400 train.validate_every_updates=100 train.layer_stats_every_updates=20 \
      train.valid_max_sentences=100 train.progress=false hydra.run.dir="$work/runs/$method"
  done
  if [[ ! -d "$work/outputs" ]]; then
    budget=(train.max_updates=400 train.validate_every_updates=100 train.progress=false)
    (cd "$work" && python -m tfx.train "${budget[@]}" && python -m tfx.train method=postln "${budget[@]}" &&
      python -m tfx.train -m optim.lr=1e-3 model.dropout=0.1,0.3 "${budget[@]}")
  fi
fi

tb=
stop() { [[ -n $tb ]] && kill "$tb" && wait "$tb" 2>/dev/null; tb=; }
trap stop EXIT
serve() {  # serve LOGDIR: TensorBoard on 127.0.0.1:6006 until stop
  stop
  tensorboard --logdir "$1" --host 127.0.0.1 --port 6006 >"$work/tensorboard.log" 2>&1 &
  tb=$!
  for _ in $(seq 60); do curl -sf http://127.0.0.1:6006/ >/dev/null && break; sleep 1; done
}
shoot() {  # shoot NAME FRAGMENT: a fresh browser profile, so no pinned card or setting carries over
  chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
    --disable-component-update --disable-sync --user-data-dir="$(mktemp -d)" --hide-scrollbars \
    --virtual-time-budget=15000 --window-size=1400,1000 --screenshot="$work/$1.png" \
    "http://127.0.0.1:6006/$2" 2>/dev/null
  pngquant --force --quality=60-85 --output "$repo/docs/img/dashboard_$1.png" "$work/$1.png"
}

serve "${2:-$work/runs}"
shoot custom_scalars '#custom_scalars'
shoot images '#images'
[[ -z ${2:-} ]] && serve "$work/outputs"
shoot first_page ''   # where TensorBoard opens: Time Series
shoot hparams '#hparams'
stop
ls -l "$repo"/docs/img/dashboard_*.png
