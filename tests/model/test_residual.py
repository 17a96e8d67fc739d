"""Each residual kind's arithmetic, written out by hand, and the factory wiring inside a Transformer."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from tests.conftest import PAD, VOCAB
from tfx.config import ModelConfig
from tfx.model import Transformer
from tfx.model.residual import RESIDUALS, Admin, DeepNorm, PostLN, PreLN, Residual, deepnorm_alpha, make_residual

D = 6


def branch(h: Tensor) -> Tensor:
    """A sublayer that is neither linear nor odd, so each kind's arithmetic shows in the output."""
    return torch.tanh(2.0 * h) + 0.5


def layer_norm(t: Tensor) -> Tensor:
    return F.layer_norm(t, (D,))


def with_affine(block: Residual) -> Residual:
    """A non-trivial LayerNorm gain and bias, so a missing norm or a swapped order is visible."""
    norm = getattr(block, "norm", None)
    if norm is not None:
        with torch.no_grad():
            norm.weight.copy_(torch.linspace(0.5, 1.5, D))
            norm.bias.copy_(torch.linspace(-0.2, 0.3, D))
    return block.eval()


def affine(t: Tensor) -> Tensor:
    return layer_norm(t) * torch.linspace(0.5, 1.5, D) + torch.linspace(-0.2, 0.3, D)


X = torch.randn(2, 3, D, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("none", lambda x: x + branch(x)),
        ("post", lambda x: affine(x + branch(x))),
        ("pre", lambda x: x + branch(affine(x))),
        ("deepnorm", lambda x: affine(deepnorm_alpha("decoder", 2, 3) * x + branch(x))),
    ],
)
def test_each_kind_computes_its_formula(kind: str, expected) -> None:
    block = with_affine(make_residual(kind, D, 0.0, "decoder", 2, 3))
    torch.testing.assert_close(block(X, branch), expected(X))


def test_admin_weights_the_skip_path_by_omega() -> None:
    block = with_affine(make_residual("admin", D, 0.0, "encoder", 2, 3))
    omega = torch.linspace(1.0, 3.0, D)
    with torch.no_grad():
        block.omega.copy_(omega)
    torch.testing.assert_close(block(X, branch), affine(omega * X + branch(X)))
    assert block.omega.requires_grad and block.side == "encoder"


def test_dropout_applies_to_the_branch_only() -> None:
    block = make_residual("none", D, 1.0, "encoder", 1, 1).train()  # p = 1 zeroes every branch output
    torch.testing.assert_close(block(X, branch), X)


def test_the_factory_builds_the_registered_class_with_its_depths() -> None:
    assert [type(make_residual(k, D, 0.1, "encoder", 6, 6)) for k in ("none", "post", "pre", "deepnorm", "admin")] == [
        Residual,
        PostLN,
        PreLN,
        DeepNorm,
        Admin,
    ]
    assert set(RESIDUALS) == {"none", "post", "pre", "deepnorm", "admin"}
    block = make_residual("deepnorm", D, 0.25, "encoder", 6, 12)
    assert block.alpha == pytest.approx(0.81 * (6**4 * 12) ** (1 / 16)) and block.dropout.p == 0.25
    assert make_residual("deepnorm", D, 0.0, "decoder", 6, 12).alpha == pytest.approx(36 ** (1 / 4))


@pytest.mark.parametrize(
    ("side", "n_enc", "n_dec", "alpha"),
    [
        ("encoder", 6, 6, 1.417938),
        ("decoder", 6, 6, 2.059767),
        ("encoder", 100, 100, 3.415742),
        ("decoder", 100, 100, 4.161791),
        ("encoder", 6, 12, 1.480716),
        ("decoder", 6, 12, 2.449490),
    ],
)
def test_deepnorm_alpha_literal_values(side: str, n_enc: int, n_dec: int, alpha: float) -> None:
    assert deepnorm_alpha(side, n_enc, n_dec) == pytest.approx(alpha, abs=1e-6)


def test_transformer_gives_every_block_its_side_and_both_depths() -> None:
    model = Transformer(VOCAB, PAD, encoder_layers=2, decoder_layers=3, d_model=8, ffn_dim=8, heads=2, norm="deepnorm")
    encoder_blocks = [m for layer in model.encoder.layers for m in layer.modules() if isinstance(m, DeepNorm)]
    decoder_blocks = [m for layer in model.decoder.layers for m in layer.modules() if isinstance(m, DeepNorm)]
    assert len(encoder_blocks) == 2 * 2 and len(decoder_blocks) == 3 * 3
    assert [b.alpha for b in encoder_blocks] == pytest.approx([0.81 * (2**4 * 3) ** (1 / 16)] * 4)
    assert [b.alpha for b in decoder_blocks] == pytest.approx([9 ** (1 / 4)] * 9)
    admin = Transformer(VOCAB, PAD, encoder_layers=1, decoder_layers=1, d_model=8, ffn_dim=8, heads=2, norm="admin")
    sides = [m.side for m in admin.modules() if isinstance(m, Admin)]
    assert sides == ["encoder"] * 2 + ["decoder"] * 3


def test_the_default_transformer_is_the_config_default_model() -> None:
    """Built with no arguments but the vocabulary: the shape ModelConfig's defaults describe."""
    cfg = ModelConfig()
    model = Transformer(VOCAB, PAD)
    enc, dec = model.encoder, model.decoder
    assert (len(enc.layers), len(dec.layers)) == (cfg.encoder_layers, cfg.decoder_layers)
    assert enc.embedding.embed.embedding_dim == cfg.d_model
    assert enc.layers[0].ffn.fc1.out_features == cfg.ffn_dim
    assert enc.layers[0].self_attn.heads == cfg.heads
    assert (model.norm, model.pad_id, model.vocab_size) == (cfg.norm, PAD, VOCAB)
    assert type(enc.layers[0].self_attn_block) is type(make_residual(cfg.norm, 8, 0.0, "encoder", 1, 1))
    assert enc.layers[0].self_attn_block.dropout.p == cfg.dropout and enc.embedding.dropout.p == cfg.dropout
    assert enc.layers[0].ffn.activation_dropout.p == cfg.activation_dropout
    assert enc.layers[0].self_attn.dropout == cfg.attention_dropout
    assert dec.layers[0].self_attn.dropout == dec.layers[0].encoder_attn.dropout == cfg.attention_dropout
    assert model.embeddings_shared == cfg.share_all_embeddings
    assert (dec.output_projection is None) == cfg.share_decoder_embeddings
    assert dec.embedding.positions.size(0) == cfg.max_positions
    assert enc.checkpoint_activations is cfg.checkpoint_activations is dec.checkpoint_activations


def test_an_untied_output_projection_has_no_bias() -> None:
    model = Transformer(VOCAB, PAD, 1, 1, 8, 8, 2, share_decoder_embeddings=False)
    assert model.decoder.output_projection.bias is None
    assert model.decoder.output_weight() is model.decoder.output_projection.weight
