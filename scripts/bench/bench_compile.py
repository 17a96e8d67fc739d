"""Cold ``torch.compile`` time by ``train.compile_scope`` and depth: what the first training update costs.

Each row is a fresh process with an empty inductor cache (a cold start, as a new run on a new machine): it
builds the model at the given depth, compiles it as ``tfx.runtime.compilation.compile_for_training`` does (``layers``:
one graph per layer kind; ``model``: the whole forward; ``off``: eager), runs one forward + backward of a packed
batch (one shape, so a static compile), then times ``--steps`` more. ``frames`` is what dynamo compiled.

    python scripts/bench/bench_compile.py --depths 6 48 --scopes off layers model --d-model 128     # CPU, one thread
    python scripts/bench/bench_compile.py --device cuda --depths 6 200 --d-model 512 --precision bf16
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import _require_tfx  # noqa: F401  (a one-line error, not a traceback, without `pip install -e .`)


def one(scope: str, layers: int, d_model: int, device: str, precision: str, steps: int, backend: str) -> dict:
    """One row, in this process (the parent starts a fresh one per row)."""
    import torch
    from torch._dynamo.utils import counters

    from tfx.model import build_model
    from tfx.model.packing import Packing
    from tfx.runtime.compilation import compile_for_training

    torch.manual_seed(0)
    torch.set_num_threads(1 if device == "cpu" else torch.get_num_threads())
    sizes = {"d_model": d_model, "ffn_dim": 2 * d_model, "heads": 4}
    model = build_model({"encoder_layers": layers, "decoder_layers": layers, **sizes}, 1000, 1).to(device)
    rows, sentences, length = 8, 4, 16  # packed: 8 rows of 4 sentences of 16 tokens
    src, tgt = (torch.randint(4, 1000, (rows, sentences * length), device=device) for _ in range(2))
    segments = torch.arange(1, sentences + 1, device=device).repeat_interleave(length).expand(rows, -1).contiguous()
    positions = torch.arange(length, device=device).repeat(sentences).expand(rows, -1).contiguous()
    packing = Packing(segments, segments, positions, positions)
    net = model if scope == "off" else compile_for_training(model, scope, dynamic=False, backend=backend)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32

    def step() -> None:
        with torch.autocast(torch.device(device).type, dtype, enabled=precision == "bf16"):
            loss = net(src, tgt, packing=packing).float().logsumexp(-1).mean()
        loss.backward()
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    tic = time.perf_counter()
    step()
    first = time.perf_counter() - tic
    tic = time.perf_counter()
    for _ in range(steps):
        step()
    return {"scope": scope, "layers": layers, "first_s": first, "step_ms": 1000 * (time.perf_counter() - tic) / steps,
            "frames": int(counters["frames"]["ok"])}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depths", type=int, nargs="+", default=[6, 48], help="encoder = decoder layers, one row each")
    p.add_argument("--scopes", nargs="+", choices=["off", "layers", "model"], default=["off", "layers", "model"])
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--steps", type=int, default=3, help="timed steps after the first")
    p.add_argument("--timeout", type=float, default=900, help="seconds per row")
    p.add_argument("--backend", default="inductor", help="aot_eager: trace forward and backward only (a dry run)")
    p.add_argument("--one", nargs=2, metavar=("SCOPE", "LAYERS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        row = one(args.one[0], int(args.one[1]), args.d_model, args.device, args.precision, args.steps, args.backend)
        print(json.dumps(row))
        return 0
    print(f"d {args.d_model}, {args.device}, {args.precision}, {args.backend}, packed 8 x 64 tokens, cold cache\n")
    print("| scope | layers (enc = dec) | first update s | ms/update after | frames compiled |")
    print("|---|---:|---:|---:|---:|")
    for layers in args.depths:
        for scope in args.scopes:
            with tempfile.TemporaryDirectory() as cache:
                cmd = [sys.executable, __file__, "--one", scope, str(layers), "--d-model", str(args.d_model),
                       "--device", args.device, "--precision", args.precision, "--steps", str(args.steps),
                       "--backend", args.backend]  # fmt: skip
                env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
                try:
                    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
                except subprocess.TimeoutExpired:
                    print(f"| {scope} | {layers} | over {args.timeout:.0f} | | |", flush=True)
                    continue
            if done.returncode:
                print(f"| {scope} | {layers} | failed: {(done.stderr.strip().splitlines() or ['?'])[-1]} | | |")
                continue
            r = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"| {scope} | {layers} | {r['first_s']:.1f} | {r['step_ms']:.0f} | {r['frames']} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
