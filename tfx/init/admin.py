"""Admin (adaptive model initialization; Liu et al. 2020, EMNLP; Transformer-Clinic).

Post-LN with a learnable vector omega on each skip path, LN(omega * x + f(x))
(``tfx.model.residual.Admin``). omega is set by one profiling forward pass over a training
batch, following Clinic's ``--init-type adaptive-profiling`` (fairseq/modules/transformer_layer.py):
each stack keeps a running ratio r, starting at 1; sublayer i, in forward order, gets
omega_i = r, and then r = sqrt(Var[omega_i * x_i] + Var[f_i(x_i)]), x_i its input and f_i its
dropped-out output. Since x_i is a LayerNorm output (variance about 1), omega_i^2 is about
1 + the summed output variances of the sublayers before it: the cumulative variance the skip
path must match. Encoder and decoder count separately (the decoder's self-attention,
encoder-attention and FFN in turn). As in Clinic the pass runs in training mode (dropout on) and
the variances are over every element of the batch, padding included.

The weights start from tfx's Xavier base (Clinic keeps fairseq's, q/k/v at gain 1/sqrt(2)).
omega is a parameter from then on: it trains and is saved, so a resumed run reads it from the
checkpoint instead of profiling again (``tfx.train`` skips the init on resume).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tfx.init.scheme import Scheme, register
from tfx.init.xavier import ModelInputs, init_xavier
from tfx.model import Transformer
from tfx.model.residual import Admin


def _variance(t: Tensor) -> float:
    return torch.var(t.detach().float(), correction=0).item()  # np.var, as Clinic


def profile_omega(model: Transformer, batch: ModelInputs) -> dict[str, float]:
    """Set every Admin block's omega in one forward pass; returns the final ratio per stack."""
    ratio = {"encoder": 1.0, "decoder": 1.0}
    skip_var: dict[str, float] = {}

    def set_omega(block: Admin, args: tuple) -> None:
        block.omega.fill_(ratio[block.side])
        skip_var[block.side] = _variance(block.omega * args[0])

    def accumulate(block: Admin, branch_out: Tensor) -> None:
        ratio[block.side] = math.sqrt(skip_var[block.side] + _variance(branch_out))

    hooks = []
    for block in (m for m in model.modules() if isinstance(m, Admin)):
        hooks.append(block.register_forward_pre_hook(set_omega))
        hooks.append(block.dropout.register_forward_hook(lambda _m, _i, out, b=block: accumulate(b, out)))
    was_training = model.training
    try:
        model.train()
        with torch.no_grad():
            model(batch.src_tokens, batch.prev_output_tokens)
    finally:
        model.train(was_training)
        for hook in hooks:
            hook.remove()
    return ratio


def init_admin(model: Transformer, seed: int = 1, batch: ModelInputs | None = None) -> None:
    if batch is None:
        raise ValueError("init.name=admin sets omega from a forward pass over a training batch: pass batch=")
    init_xavier(model, seed)
    profile_omega(model, batch)


SCHEME = register(Scheme("admin", init_admin, needs_norm="admin", needs_batch=True))


__all__ = ["init_admin", "profile_omega"]
