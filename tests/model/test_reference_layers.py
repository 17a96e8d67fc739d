"""Our Post-LN / Pre-LN encoder layer against torch.nn.TransformerEncoderLayer."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from tfx.model import EncoderLayer
from tfx.model.config import ModelConfig
from tfx.model.residual import ResidualContext, make_residual


def _copy_into_torch(ours: EncoderLayer, ref: nn.TransformerEncoderLayer) -> None:
    attn = ours.self_attn
    with torch.no_grad():
        ref.self_attn.in_proj_weight.copy_(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
        ref.self_attn.in_proj_bias.copy_(torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]))
        ref.self_attn.out_proj.load_state_dict(attn.out_proj.state_dict())
        ref.linear1.load_state_dict(ours.ffn.fc1.state_dict())
        ref.linear2.load_state_dict(ours.ffn.fc2.state_dict())
        ref.norm1.load_state_dict(ours.self_attn_block.norm.state_dict())
        ref.norm2.load_state_dict(ours.ffn_block.norm.state_dict())


@pytest.mark.parametrize(("norm", "norm_first"), [("post", False), ("pre", True)])
def test_encoder_layer_matches_torch(norm: str, norm_first: bool) -> None:
    torch.manual_seed(0)
    d, heads, ffn = 32, 4, 64
    cfg = ModelConfig(encoder_layers=1, decoder_layers=1, d_model=d, ffn_dim=ffn, heads=heads, norm=norm, dropout=0.0)
    residual = functools.partial(make_residual, cfg, ResidualContext.of(cfg, "encoder", 0))
    ours = EncoderLayer(d, heads, ffn, residual, attention_dropout=0.0, activation_dropout=0.0).eval()
    for p in ours.parameters():  # non-trivial LayerNorm and bias values
        nn.init.normal_(p, std=0.3)
    ref = nn.TransformerEncoderLayer(d, heads, ffn, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    _copy_into_torch(ours, ref)
    x = torch.randn(3, 7, d)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[0, 5:] = True
    expected = ref(x, src_key_padding_mask=pad)
    actual = ours(x, pad)
    torch.testing.assert_close(actual[~pad], expected[~pad], atol=1e-5, rtol=1e-5)
