"""DeepNorm init (DeepNet, Wang et al. 2022, Fig. 2 and Table 1; microsoft/torchscale).

For an encoder-decoder with N encoder and M decoder layers, the weights of the residual
branches' value path (v_proj, out_proj of self- and encoder-attention, fc1, fc2) get Xavier
gain beta; q/k keep gain 1:

- encoder: beta = 0.87 * (N^4 M)^(-1/16)
- decoder: beta = (12 M)^(-1/4)

The skip weight alpha is architecture (``tfx.model.residual.DeepNorm``); this scheme only sets
values and refuses a model whose residual kind is not ``deepnorm``.

Differences from torchscale, each deliberate:
- The paper's beta for the encoder. torchscale's encoder divides by (N^4 M)^(1/16) / 1.15, i.e.
  multiplies by 1.15 * (N^4 M)^(-1/16), 1.32x the paper's 0.87 (its decoder matches the paper).
- tfx's Xavier base (uniform, gain 1, zero biases; embeddings N(0, d^-1/2)) times beta: the
  std the paper's ``xavier_normal_(w, gain=beta)`` gives, uniformly distributed as torchscale's
  attention weights are. torchscale starts q/k/v at gain 1/sqrt(2) and the FFN at nn.Linear's
  default (Kaiming-uniform, std 1/sqrt(3 fan_in), nonzero biases, which it divides too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tfx.init.scheme import Scheme, register
from tfx.init.xavier import ModelInputs, init_xavier, scale_, value_path_weights
from tfx.model import Transformer

if TYPE_CHECKING:
    from tfx.model.residual import Side


def deepnorm_beta(side: Side, n_enc: int, n_dec: int) -> float:
    """Xavier gain of the value-path weights of a ``side`` layer in an n_enc + n_dec model."""
    if side == "encoder":
        return 0.87 * (n_enc**4 * n_dec) ** (-1 / 16)
    return (12 * n_dec) ** -0.25


def init_deepnorm(model: Transformer, seed: int = 1, batch: ModelInputs | None = None) -> None:
    init_xavier(model, seed)
    n_enc, n_dec = len(model.encoder.layers), len(model.decoder.layers)
    for layer in model.encoder.layers:
        scale_(value_path_weights(layer), deepnorm_beta("encoder", n_enc, n_dec))
    for layer in model.decoder.layers:
        scale_(value_path_weights(layer), deepnorm_beta("decoder", n_enc, n_dec))


SCHEME = register(Scheme("deepnorm", init_deepnorm, needs_norm="deepnorm"))
