"""DeepNorm (DeepNet, Wang et al. 2022): alpha and beta against the paper's numbers, weight stds."""

from __future__ import annotations

import math

import pytest
import torch

from tests.conftest import tiny_model
from tests.init.test_schemes import DEC_SCALED, ENC_SCALED, xavier_std
from tfx.init import apply_init, deepnorm_beta
from tfx.model.residual import DeepNorm, ResidualContext, deepnorm_alpha


def test_alpha_beta_literal_values() -> None:
    """Encoder 0.81 (N^4 M)^(1/16) and 0.87 (N^4 M)^(-1/16), decoder (3M)^(1/4) and (12M)^(-1/4), worked
    out by hand: at N = M = 6, 6^(5/16) = 1.7505, 18^(1/4) = 2.0598, 72^(1/4) = 2.9130; at 100,
    100^(5/16) = 4.2170, 300^(1/4) = 4.1618, 1200^(1/4) = 5.8857."""
    assert [deepnorm_alpha(s, 6, 6) for s in ("encoder", "decoder")] == pytest.approx([1.4179, 2.0598], abs=1e-4)
    assert [deepnorm_beta(s, 6, 6) for s in ("encoder", "decoder")] == pytest.approx([0.4970, 0.3433], abs=1e-4)
    assert [deepnorm_alpha(s, 100, 100) for s in ("encoder", "decoder")] == pytest.approx([3.4157, 4.1618], abs=1e-4)
    assert [deepnorm_beta(s, 100, 100) for s in ("encoder", "decoder")] == pytest.approx([0.2063, 0.1699], abs=1e-4)


def test_alpha_depends_on_both_depths_and_side() -> None:
    model = tiny_model("deepnorm", enc=3, dec=5)
    blocks = [m for m in model.encoder.modules() if isinstance(m, DeepNorm)]
    assert len(blocks) == 6 and {b.alpha for b in blocks} == {deepnorm_alpha("encoder", 3, 5)}
    blocks = [m for m in model.decoder.modules() if isinstance(m, DeepNorm)]
    assert len(blocks) == 15 and {b.alpha for b in blocks} == {deepnorm_alpha("decoder", 3, 5)}


def test_forward_is_layer_norm_of_alpha_skip_plus_branch() -> None:
    block = DeepNorm(ResidualContext(side="encoder", layer=0, n_enc=6, n_dec=6, d_model=8, dropout=0.0))
    x = torch.randn(2, 3, 8)
    expected = torch.nn.functional.layer_norm(deepnorm_alpha("encoder", 6, 6) * x + 2 * x, (8,))
    torch.testing.assert_close(block(x, lambda h: 2 * h), expected)


@pytest.mark.parametrize("n", [6, 100])
def test_weight_stds(n: int) -> None:
    """v/out/fc1/fc2 at Xavier std times beta (every layer), q/k at plain Xavier, biases 0."""
    d = 64
    model = tiny_model("deepnorm", enc=n, dec=n, d=d)
    apply_init(model, "deepnorm", seed=3)
    betas = {"encoder": deepnorm_beta("encoder", n, n), "decoder": deepnorm_beta("decoder", n, n)}
    for side, names in (("encoder", ENC_SCALED), ("decoder", DEC_SCALED)):
        layers = getattr(model, side).layers
        for name in names:  # pooled over all layers: a small relative error even at d 32
            ws = torch.cat([layer.get_submodule(name).weight.flatten() for layer in layers])
            expected = xavier_std(layers[0].get_submodule(name).weight) * betas[side]
            assert ws.std().item() == pytest.approx(expected, rel=0.03), (side, name)
        q = torch.cat([layer.self_attn.q_proj.weight.flatten() for layer in layers])
        assert q.std().item() == pytest.approx(math.sqrt(2 / (2 * d)), rel=0.03)
        assert all(layer.ffn.fc1.bias.abs().max() == 0 for layer in layers)


def test_refuses_other_residual_kinds() -> None:
    with pytest.raises(ValueError, match="init.name=deepnorm needs model.norm=deepnorm"):
        apply_init(tiny_model("post"), "deepnorm")
