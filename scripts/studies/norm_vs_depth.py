"""T-Fixup's depth argument in one table: output/input norm of N LayerNorm-free layers, Xavier vs T-Fixup.

Without LayerNorm each residual block adds its branch to the stream, so with Xavier weights the
norm compounds with depth (and overflows fp32 well before N = 200); T-Fixup's 0.67 * N^-1/4
encoder factor keeps the whole stack near norm-preserving at any depth (Huang et al. 2020, Sec. 3).

Two versions, both printed:

1. Simplified linearized block, reproducing the published table exactly. Per layer
   ``x <- x + (x @ Wv.T) @ Wo.T`` then ``x <- x + relu(x @ W1.T) @ W2.T``; rows of x are samples.
   Convention that reproduces it (fp32 throughout; checked against all variants below):
   for each depth N, ``torch.manual_seed(0)``, then per layer Xavier-uniform draws in the order
   Wv (d, d), Wo (d, d), W1 (4d, d), W2 (d, 4d) -- nn.Linear weight shapes, applied as ``x @ W.T``;
   then ``torch.manual_seed(1)`` and the input ``torch.randn(64, d)``. T-Fixup multiplies the same
   Xavier draws of all four matrices by 0.67 * N^-1/4. Ratio = mean row norm out / mean row norm in.
   Because each draw follows its own ``manual_seed``, drawing the input before or after the weights
   gives identical numbers. Variants that do NOT reproduce it (Xavier / T-Fixup at N = 6): untransposed
   ``x @ Wv @ Wo``, ``relu(x @ W2) @ W1`` 1.5429e+01 / 1.1042e+00; fp64 (different draws)
   2.0335e+01 / 1.1261e+00; draw order W1, W2, Wv, Wo 1.3993e+01 / 1.1253e+00; T-Fixup scaling only
   Wv, Wo 2.3679e+00 or only W1, W2 7.8507e+00; mean of per-row ratios 1.5535e+01 / 1.1489e+00.
   Published (``%.4e``): Xavier 1.5594e+01 / 2.9281e+02 / nan, T-Fixup 1.1502e+00 / 1.1698e+00 /
   1.1337e+00 at N = 6 / 12 / 200. Xavier's nan at 200 is fp32 overflow (inf - inf), printed as computed.
2. tfx's real encoder layers: a ``Transformer`` with N encoder layers (norm none, dropout 0,
   4 heads, FFN 4d) initialized by tfx's own ``xavier`` / ``tfixup`` schemes (seed 0); its
   encoder layers run on a random (8, 8, d) input (64 rows, ``manual_seed(1)``), no padding.
   Softmax attention averages over positions, so this is not the linearized block's number.
3. The same real encoder stack (layers only, not the stack-final module) for the normalization-free
   methods of issue 51, each with its residual kind and init: ``dyt`` (Pre-LN with DyT, alpha 0.5,
   Xavier), ``rezero`` (resweight 0, Xavier), ``fixup`` (Fixup's zeroed branch ends). ReZero and
   Fixup start as the identity on the residual stream (ratio exactly 1 at any depth); DyT's branches
   see tanh-bounded inputs, so its stream grows additively with depth, not multiplicatively.

Usage: ``python scripts/studies/norm_vs_depth.py [--depths 6 12 200] [--d-model 32] [--plot out.png]``

Needs tfx installed (``pip install -e .`` in the checkout): it imports tfx as a package.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable

import _require_tfx  # noqa: F401  (a one-line error, not a traceback, without `pip install -e .`)
import torch
from torch import Tensor, nn

# Run as a plain file from a checkout without `pip install -e .`: make the repo root importable.
from tfx.init import apply_init, tfixup_encoder_scale
from tfx.model import ModelConfig, Transformer

SCHEMES = ("xavier", "tfixup")
# method -> (residual kind, init scheme), as conf/method/<name>.yaml sets them
NORM_FREE_METHODS = {"dyt": ("dyt", "xavier"), "rezero": ("rezero", "xavier"), "fixup": ("fixup", "fixup")}
PUBLISHED_DEPTHS = (6, 12, 200)


def _mean_row_norm(x: Tensor) -> Tensor:
    return x.norm(dim=-1).mean()


def _xavier(*shape: int) -> Tensor:
    return nn.init.xavier_uniform_(torch.empty(*shape))


def linearized_weights(n_layers: int, d: int) -> list[tuple[Tensor, Tensor, Tensor, Tensor]]:
    """Per layer (Wv, Wo, W1, W2) as nn.Linear weights, drawn in that order after ``manual_seed(0)``."""
    torch.manual_seed(0)
    return [(_xavier(d, d), _xavier(d, d), _xavier(4 * d, d), _xavier(d, 4 * d)) for _ in range(n_layers)]


def linearized_ratio(n_layers: int, scheme: str, d: int = 32, samples: int = 64) -> float:
    """Mean row norm out / in of the simplified block stack (see the module docstring)."""
    weights = linearized_weights(n_layers, d)
    torch.manual_seed(1)
    x = x_in = torch.randn(samples, d)  # (samples, d): one row per sample
    s = tfixup_encoder_scale(n_layers) if scheme == "tfixup" else 1.0
    for wv, wo, w1, w2 in weights:
        x = x + (x @ (s * wv).T) @ (s * wo).T
        x = x + torch.relu(x @ (s * w1).T) @ (s * w2).T
    return (_mean_row_norm(x) / _mean_row_norm(x_in)).item()


@torch.no_grad()
def encoder_ratio(n_layers: int, scheme: str, d: int = 32, heads: int = 4, norm: str = "none") -> float:
    """Mean row norm out / in of tfx's real ``EncoderLayer`` stack of residual kind ``norm``, initialized by
    tfx's scheme."""
    cfg = ModelConfig(
        encoder_layers=n_layers,
        decoder_layers=1,
        d_model=d,
        ffn_dim=4 * d,
        heads=heads,
        norm=norm,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
    )
    model = Transformer(cfg, vocab_size=8, pad_id=0)
    apply_init(model, scheme, seed=0)
    model.eval()
    torch.manual_seed(1)
    x = x_in = torch.randn(8, 8, d)  # (B, T, D): 64 rows, no padding
    for layer in model.encoder.layers:
        x = layer(x, None)
    return (_mean_row_norm(x) / _mean_row_norm(x_in)).item()


def method_ratio(n_layers: int, method: str, d: int = 32) -> float:
    """``encoder_ratio`` for a normalization-free method: its residual kind and its init."""
    norm, scheme = NORM_FREE_METHODS[method]
    return encoder_ratio(n_layers, scheme, d, norm=norm)


def ratio_table(
    fn: Callable[[int, str], float], depths: list[int], columns: tuple[str, ...] = SCHEMES
) -> dict[str, list[float]]:
    return {column: [fn(n, column) for n in depths] for column in columns}


def format_table(title: str, depths: list[int], ratios: dict[str, list[float]]) -> str:
    """``%.4e`` per cell; nan/inf printed as computed."""
    lines = [title, f"{'N':>6}" + "".join(f"{s:>12}" for s in ratios)]
    for i, n in enumerate(depths):
        lines.append(f"{n:>6}" + "".join(f"{ratios[s][i]:>12.4e}" for s in ratios))
    return "\n".join(lines)


def plot(path: str, depths: list[int], tables: dict[str, dict[str, list[float]]]) -> None:
    """Log-scale ratio vs depth; non-finite points (overflow) are not drawn, the legend says from where."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("error: --plot needs matplotlib (pip install 'tfx[plot]')")
    fig, ax = plt.subplots(figsize=(6, 4))
    for (version, ratios), style in zip(tables.items(), ("-", "--"), strict=True):
        for scheme, color in zip(SCHEMES, ("tab:red", "tab:blue"), strict=True):
            ys = [y if math.isfinite(y) else math.nan for y in ratios[scheme]]
            overflow = [n for n, y in zip(depths, ratios[scheme], strict=True) if not math.isfinite(y)]
            note = f"; inf/nan from N={overflow[0]}, not drawn" if overflow else ""
            ax.plot(depths, ys, style, color=color, marker="o", label=f"{scheme} ({version}{note})")
    ax.set(xscale="log", yscale="log", xlabel="encoder layers N", ylabel="output / input mean row norm")
    ax.set_title("LayerNorm-free stack: norm growth with depth")
    ax.axhline(1.0, color="gray", lw=0.5)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depths", type=int, nargs="+", default=list(PUBLISHED_DEPTHS))
    p.add_argument("--d-model", type=int, default=32, help="width of both versions (published table: 32)")
    p.add_argument("--plot", metavar="PNG", help="also write a log-scale plot")
    p.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (tiny matmuls: more threads only add sync)"
    )
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    d = args.d_model
    tables = {
        "linearized": ratio_table(lambda n, s: linearized_ratio(n, s, d), args.depths),
        "tfx encoder": ratio_table(lambda n, s: encoder_ratio(n, s, d), args.depths),
    }
    print(
        format_table(
            f"1. simplified linearized block (d={d}, FFN 4d, 64 samples): out/in mean row norm",
            args.depths,
            tables["linearized"],
        )
    )
    print()
    print(
        format_table(
            f"2. tfx EncoderLayer stack (norm none, d={d}, 4 heads, FFN 4d, 8x8 tokens): out/in",
            args.depths,
            tables["tfx encoder"],
        )
    )
    print()
    methods = ratio_table(lambda n, m: method_ratio(n, m, d), args.depths, tuple(NORM_FREE_METHODS))
    print(
        format_table(
            f"3. tfx EncoderLayer stack per normalization-free method (its norm and init, d={d}): out/in",
            args.depths,
            methods,
        )
    )
    if args.plot:
        plot(args.plot, args.depths, tables)
    return 0


if __name__ == "__main__":
    sys.exit(main())
