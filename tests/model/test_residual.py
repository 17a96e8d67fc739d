"""Each residual kind's arithmetic, written out by hand, and the factory wiring inside a Transformer: a kind gets
where it sits (``ResidualContext``) and its own options from the ``ModelConfig``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from tests.conftest import PAD, VOCAB
from tfx.config import ModelConfig
from tfx.model import Transformer
from tfx.model.residual import (
    RESIDUALS,
    Admin,
    DeepNorm,
    DyT,
    Fixup,
    PostLN,
    PreLN,
    Residual,
    ResidualContext,
    ReZero,
    deepnorm_alpha,
    final_norm,
    kind_options,
    make_residual,
)

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


def residual(kind: str, d: int, dropout: float, side: str, n_enc: int, n_dec: int, **options) -> Residual:
    """The connection of kind ``kind`` at layer 0 of ``side`` in an n_enc + n_dec model of width ``d``; ``options``:
    the config's fields for the kind (``dyt_alpha``). The context is built by hand so dropout may be 1."""
    cfg = ModelConfig(encoder_layers=n_enc, decoder_layers=n_dec, d_model=d, heads=1, norm=kind, **options)
    return make_residual(cfg, ResidualContext(side, 0, n_enc, n_dec, d, dropout))


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
    block = with_affine(residual(kind, D, 0.0, "decoder", 2, 3))
    torch.testing.assert_close(block(X, branch), expected(X))


def test_admin_weights_the_skip_path_by_omega() -> None:
    block = with_affine(residual("admin", D, 0.0, "encoder", 2, 3))
    omega = torch.linspace(1.0, 3.0, D)
    with torch.no_grad():
        block.omega.copy_(omega)
    torch.testing.assert_close(block(X, branch), affine(omega * X + branch(X)))
    assert block.omega.requires_grad and block.side == "encoder"


def test_dropout_applies_to_the_branch_only() -> None:
    block = residual("none", D, 1.0, "encoder", 1, 1).train()  # p = 1 zeroes every branch output
    torch.testing.assert_close(block(X, branch), X)


def test_the_factory_builds_the_registered_class_with_its_depths() -> None:
    kinds = ("none", "post", "pre", "deepnorm", "admin", "dyt", "rezero", "fixup")
    assert [type(residual(k, D, 0.1, "encoder", 6, 6)) for k in kinds] == [
        Residual,
        PostLN,
        PreLN,
        DeepNorm,
        Admin,
        DyT,
        ReZero,
        Fixup,
    ]
    assert set(kinds) <= set(RESIDUALS)  # the kinds of tfx/model/residual.py; a plugin's may join them
    block = residual("deepnorm", D, 0.25, "encoder", 6, 12)
    assert block.alpha == pytest.approx(0.81 * (6**4 * 12) ** (1 / 16)) and block.dropout.p == 0.25
    assert residual("deepnorm", D, 0.0, "decoder", 6, 12).alpha == pytest.approx(36 ** (1 / 4))


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
    model = Transformer(
        ModelConfig(encoder_layers=2, decoder_layers=3, d_model=8, ffn_dim=8, heads=2, norm="deepnorm"), VOCAB, PAD
    )
    encoder_blocks = [m for layer in model.encoder.layers for m in layer.modules() if isinstance(m, DeepNorm)]
    decoder_blocks = [m for layer in model.decoder.layers for m in layer.modules() if isinstance(m, DeepNorm)]
    assert len(encoder_blocks) == 2 * 2 and len(decoder_blocks) == 3 * 3
    assert [b.alpha for b in encoder_blocks] == pytest.approx([0.81 * (2**4 * 3) ** (1 / 16)] * 4)
    assert [b.alpha for b in decoder_blocks] == pytest.approx([9 ** (1 / 4)] * 9)
    admin = Transformer(
        ModelConfig(encoder_layers=1, decoder_layers=1, d_model=8, ffn_dim=8, heads=2, norm="admin"), VOCAB, PAD
    )
    sides = [m.side for m in admin.modules() if isinstance(m, Admin)]
    assert sides == ["encoder"] * 2 + ["decoder"] * 3


def test_the_default_transformer_is_the_config_default_model() -> None:
    """Built with no arguments but the vocabulary: the shape ModelConfig's defaults describe."""
    cfg = ModelConfig()
    model = Transformer(ModelConfig(), VOCAB, PAD)
    enc, dec = model.encoder, model.decoder
    assert (len(enc.layers), len(dec.layers)) == (cfg.encoder_layers, cfg.decoder_layers)
    assert enc.embedding.embed.embedding_dim == cfg.d_model
    assert enc.layers[0].ffn.fc1.out_features == cfg.ffn_dim
    assert enc.layers[0].self_attn.heads == cfg.heads
    assert (model.norm, model.pad_id, model.vocab_size) == (cfg.norm, PAD, VOCAB)
    assert type(enc.layers[0].self_attn_block) is type(residual(cfg.norm, 8, 0.0, "encoder", 1, 1))
    assert enc.layers[0].self_attn_block.dropout.p == cfg.dropout and enc.embedding.dropout.p == cfg.dropout
    assert enc.layers[0].ffn.activation_dropout.p == cfg.activation_dropout
    assert enc.layers[0].self_attn.dropout == cfg.attention_dropout
    assert dec.layers[0].self_attn.dropout == dec.layers[0].encoder_attn.dropout == cfg.attention_dropout
    assert model.embeddings_shared == cfg.share_all_embeddings
    assert (dec.output_projection is None) == cfg.share_decoder_embeddings
    assert dec.embedding.positions.size(0) == cfg.max_positions
    assert enc.checkpoint_activations is cfg.checkpoint_activations is dec.checkpoint_activations


def test_an_untied_output_projection_has_no_bias() -> None:
    model = Transformer(
        ModelConfig(encoder_layers=1, decoder_layers=1, d_model=8, ffn_dim=8, heads=2, share_decoder_embeddings=False),
        VOCAB,
        PAD,
    )
    assert model.decoder.output_projection.bias is None
    assert model.decoder.output_weight() is model.decoder.output_projection.weight


# DyT, ReZero and Fixup (issue 51). fp32 on CPU, like every test here.


def test_dynamic_tanh_is_weight_tanh_alpha_x_plus_bias() -> None:
    """DyT(x) = weight * tanh(alpha * x) + bias for a known input, alpha, weight and bias; at init weight 1,
    bias 0 and alpha the given value (jiachenzhu/DyT's DynamicTanh)."""
    block = residual("dyt", D, 0.0, "encoder", 2, 2, dyt_alpha=0.8).eval()
    dyt = block.norm
    assert dyt.alpha.tolist() == [pytest.approx(0.8)] and dyt.alpha.numel() == 1
    assert torch.equal(dyt.weight, torch.ones(D)) and torch.equal(dyt.bias, torch.zeros(D))
    x = torch.tensor([-4.0, -1.0, -0.25, 0.0, 0.5, 3.0])
    torch.testing.assert_close(dyt(x), torch.tanh(0.8 * x))
    with torch.no_grad():
        dyt.weight.copy_(torch.linspace(0.5, 1.5, D))
        dyt.bias.copy_(torch.linspace(-0.2, 0.3, D))
        dyt.alpha.fill_(1.7)
    expected = torch.linspace(0.5, 1.5, D) * torch.tanh(1.7 * x) + torch.linspace(-0.2, 0.3, D)
    torch.testing.assert_close(dyt(x), expected)
    # the residual: Pre-LN with DyT in the LayerNorm's place
    torch.testing.assert_close(block(X, branch), X + branch(dyt(X)))


def test_a_dyt_model_has_no_layer_norm_and_ends_each_stack_with_a_dyt() -> None:
    from tfx.model import has_layer_norm
    from tfx.model.residual import DynamicTanh

    model = Transformer(
        ModelConfig(encoder_layers=2, decoder_layers=3, d_model=8, ffn_dim=8, heads=2, norm="dyt", dyt_alpha=0.3),
        VOCAB,
        PAD,
    )
    assert not has_layer_norm(model)
    dyts = [m for m in model.modules() if isinstance(m, DynamicTanh)]
    assert len(dyts) == 2 * 2 + 3 * 3 + 2  # one per sublayer and one per stack end, as convert_ln_to_dyt leaves
    assert isinstance(model.encoder.final_norm, DynamicTanh) and isinstance(model.decoder.final_norm, DynamicTanh)
    assert [m.alpha.item() for m in dyts] == pytest.approx([0.3] * len(dyts))
    assert ModelConfig().dyt_alpha == 0.5  # the reference's init for non-LLM models


def test_rezero_layers_are_the_identity_at_init_and_resweight_learns() -> None:
    """resweight = 0: every encoder and decoder layer returns its input exactly, so the stacks pass the
    embeddings through unchanged. The decoder's resweights get a gradient at once; the encoder's only once
    the decoder's encoder-attention is switched on (its resweight != 0), as in the reference."""
    torch.manual_seed(0)
    model = Transformer(
        ModelConfig(encoder_layers=2, decoder_layers=3, d_model=8, ffn_dim=16, heads=2, norm="rezero", dropout=0.0),
        VOCAB,
        PAD,
    )
    src = torch.randint(4, VOCAB, (2, 5))
    tgt = torch.randint(4, VOCAB, (2, 4))
    x = torch.randn(2, 5, 8)
    for layer in model.encoder.layers:
        assert torch.equal(layer(x, None), x)
    for layer in model.decoder.layers:
        assert torch.equal(layer(x[:, :4], x, None), x[:, :4])
    enc = model.encode(src)
    torch.testing.assert_close(enc.hidden, model.encoder.embedding(src).masked_fill(enc.padding_mask[..., None], 0))
    model(src, tgt).logsumexp(-1).sum().backward()
    assert all(layer.self_attn_block.resweight.grad.abs().item() > 0 for layer in model.decoder.layers)
    assert all(layer.self_attn_block.resweight.grad.item() == 0 for layer in model.encoder.layers)
    model.zero_grad()
    with torch.no_grad():
        for layer in model.decoder.layers:
            layer.self_attn_block.resweight.fill_(0.1)
    model(src, tgt).logsumexp(-1).sum().backward()
    assert all(layer.self_attn_block.resweight.grad.abs().item() > 0 for layer in model.encoder.layers)


def test_rezero_sublayers_of_a_layer_share_one_resweight() -> None:
    """One scalar per layer, as RZTXEncoderLayer / RZTXDecoderLayer keep: the same Parameter in every
    block of the layer, another one in the next layer; the optimizer sees each once."""
    model = Transformer(
        ModelConfig(encoder_layers=2, decoder_layers=2, d_model=8, ffn_dim=8, heads=2, norm="rezero"), VOCAB, PAD
    )
    enc0, enc1, dec0 = model.encoder.layers[0], model.encoder.layers[1], model.decoder.layers[0]
    assert enc0.self_attn_block.resweight is enc0.ffn_block.resweight
    assert dec0.self_attn_block.resweight is dec0.encoder_attn_block.resweight is dec0.ffn_block.resweight
    assert enc0.self_attn_block.resweight is not enc1.self_attn_block.resweight
    resweights = [p for n, p in model.named_parameters() if n.endswith("resweight")]
    assert len(resweights) == 4 and all(p.item() == 0 for p in resweights)
    with torch.no_grad():
        enc0.ffn_block.resweight.fill_(0.5)
    block = enc0.self_attn_block.eval()
    torch.testing.assert_close(block(X, branch), X + 0.5 * branch(X))
    state = model.state_dict()  # both names saved; loading writes the one tensor twice, the same value
    model.load_state_dict(state)
    assert enc0.self_attn_block.resweight.item() == 0.5


def test_rezero_sharing_is_one_model_option() -> None:
    """``model.rezero_shared`` (default true, as above) is ReZero's one setting: false gives each sublayer its own
    resweight; the other kinds refuse no model for it, and an option no kind declares is refused."""
    assert ModelConfig().rezero_shared
    model = Transformer(
        ModelConfig(
            encoder_layers=2, decoder_layers=2, d_model=8, ffn_dim=8, heads=2, norm="rezero", rezero_shared=False
        ),
        VOCAB,
        PAD,
    )
    enc0, dec0 = model.encoder.layers[0], model.decoder.layers[0]
    assert enc0.self_attn_block.resweight is not enc0.ffn_block.resweight
    assert dec0.self_attn_block.resweight is not dec0.encoder_attn_block.resweight
    assert len([n for n, _ in model.named_parameters() if n.endswith("resweight")]) == 10
    Transformer(
        ModelConfig(
            encoder_layers=1, decoder_layers=1, d_model=8, ffn_dim=8, heads=2, norm="post", rezero_shared=False
        ),
        VOCAB,
        PAD,
    )
    with pytest.raises(TypeError, match="dyt_alhpa"):  # a misspelt option is no ModelConfig field
        ModelConfig(norm="dyt", dyt_alhpa=0.3)


def test_a_kind_gets_where_it_sits_and_only_its_own_options() -> None:
    """Each connection's context names its side, its layer and both depths; the stack's end gets the depth as its
    layer. A kind's constructor receives the config fields it names in ``options`` and no other."""
    seen: list[tuple[ResidualContext, dict]] = []

    class Spy(ReZero):
        def __init__(self, at: ResidualContext, **options) -> None:
            seen.append((at, options))
            super().__init__(at, **options)

        @classmethod
        def final_module(cls, at: ResidualContext, **options) -> torch.nn.Module:
            seen.append((at, options))
            return torch.nn.Identity()

    cfg = ModelConfig(encoder_layers=2, decoder_layers=3, d_model=8, ffn_dim=8, heads=2, norm="rezero", dropout=0.2)
    assert kind_options(Spy, cfg) == {"rezero_shared": True} and kind_options(DyT, cfg) == {"dyt_alpha": 0.5}
    RESIDUALS["spy"] = Spy
    try:
        Transformer(ModelConfig(**{**vars(cfg), "norm": "spy"}), VOCAB, PAD)
    finally:
        del RESIDUALS["spy"]
    where = [(at.side, at.layer) for at, _ in seen]
    assert where == [("encoder", 0)] * 2 + [("encoder", 1)] * 2 + [("encoder", 2)] + [
        ("decoder", i) for i in (0, 0, 0, 1, 1, 1, 2, 2, 2)
    ] + [("decoder", 3)]
    assert {(at.n_enc, at.n_dec, at.d_model, at.dropout) for at, _ in seen} == {(2, 3, 8, 0.2)}
    assert all(options == {"rezero_shared": True} for _, options in seen)
    assert ResidualContext.of(cfg, "decoder", 1).depth == 3 and ResidualContext.of(cfg, "encoder", 1).depth == 2
    assert isinstance(final_norm(ModelConfig(norm="pre", d_model=8, heads=2), "encoder"), torch.nn.LayerNorm)


def test_fixup_is_skip_plus_scaled_branch_of_shifted_input() -> None:
    """x + scale * f(x - shift): the reference's LayerShift (x - bias) before the branch and LayerScale after."""
    block = residual("fixup", D, 0.0, "decoder", 2, 3).eval()
    assert (block.shift.item(), block.scale.item()) == (0.0, 1.0)
    with torch.no_grad():
        block.shift.fill_(0.3)
        block.scale.fill_(-1.5)
    torch.testing.assert_close(block(X, branch), X + -1.5 * branch(X - 0.3))


def test_fixup_stacks_end_like_the_reference() -> None:
    """Encoder: scale0(shift0(x)); decoder: shift0(x) only (its scale0 is commented out in the reference)."""
    model = Transformer(
        ModelConfig(encoder_layers=1, decoder_layers=1, d_model=8, ffn_dim=8, heads=2, norm="fixup"), VOCAB, PAD
    )
    enc, dec = model.encoder.final_norm, model.decoder.final_norm
    with torch.no_grad():
        enc.shift.fill_(0.2)
        enc.scale.fill_(3.0)
        dec.shift.fill_(-0.4)
    torch.testing.assert_close(enc(X), (X - 0.2) * 3.0)
    torch.testing.assert_close(dec(X), X + 0.4)
    assert dec.scale is None
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in model.modules())
