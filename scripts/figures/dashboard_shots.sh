#!/usr/bin/env bash
# docs/img/dashboard_*.png: train a T-Fixup and a Post-LN toy run (6+6 layers, 400 updates) into one
# logdir, serve it with TensorBoard on 127.0.0.1:6006 and screenshot three tabs with headless Chromium.
#
#   scripts/figures/dashboard_shots.sh [WORK_DIR]          # default /tmp/tfx-dashboard; about 5 minutes on 2 CPU cores
#   scripts/figures/dashboard_shots.sh WORK_DIR LOGDIR     # screenshots of runs that exist (e.g. a checkout's outputs/)
#
# Needs chromium and pngquant (Debian: apt-get install -y chromium pngquant). Runs that already exist in
# WORK_DIR/runs are reused. See docs/dashboard.md for what each picture shows.
set -euo pipefail
work=${1:-/tmp/tfx-dashboard}
repo=$(cd "$(dirname "$0")/../.." && pwd)
logdir=${2:-$work/runs}
mkdir -p "$work/runs" "$repo/docs/img"

for method in tfixup postln; do
  [[ -n ${2:-} || -d "$work/runs/$method" ]] && continue
  python -m tfx.train method=$method model.encoder_layers=6 model.decoder_layers=6 \
    train.max_updates=400 train.validate_every_updates=100 train.layer_stats_every_updates=20 \
    train.valid_max_sentences=100 train.progress=false hydra.run.dir="$work/runs/$method"
done

tensorboard --logdir "$logdir" --host 127.0.0.1 --port 6006 >"$work/tensorboard.log" 2>&1 &
tb=$!
trap 'kill $tb' EXIT
for _ in $(seq 60); do curl -sf http://127.0.0.1:6006/ >/dev/null && break; sleep 1; done

shoot() {  # shoot NAME FRAGMENT
  chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
    --disable-component-update --disable-sync --user-data-dir="$(mktemp -d)" --hide-scrollbars \
    --virtual-time-budget=15000 --window-size=1400,1000 --screenshot="$work/$1.png" \
    "http://127.0.0.1:6006/$2" 2>/dev/null
  pngquant --force --quality=60-85 --output "$repo/docs/img/dashboard_$1.png" "$work/$1.png"
}
shoot first_page ''   # where TensorBoard opens: Time Series
shoot custom_scalars '#custom_scalars'
shoot images '#images'
shoot hparams '#hparams'
ls -l "$repo"/docs/img/dashboard_*.png
