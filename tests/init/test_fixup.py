"""Fixup as hongyi-zhang/Fixup's fairseq/ applies it to the Transformer: every weight against the formula.

fp32 on CPU. Each model is compared, parameter by parameter and exactly, with the Xavier base of the same
seed times the factor the reference's code gives that weight (0 for the branch ends)."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import tiny_model
from tfx.init import apply_init, fixup_attention_scale, fixup_branches, fixup_ffn_scale
from tfx.init.fixup import ENCODER_ATTENTION_BLOCKS


def test_scale_factors_literal_values() -> None:
    """L = 2 N_enc + 3 N_dec; q/k/v x L^(-1/6), fc1 x L^(-1/2). At 6 + 6 (the reference's IWSLT model)
    L = 30: 30^(-1/6) = 0.56730, 30^(-1/2) = 0.18257; at 100 + 100, L = 500: 0.35495, 0.044721;
    the encoder-attention's fixed 12^(-1/6) = 0.66090."""
    assert fixup_branches(6, 6) == 30 and fixup_branches(100, 100) == 500 and fixup_branches(3, 5) == 21
    assert fixup_attention_scale(30) == pytest.approx(0.56730, abs=1e-5)
    assert fixup_ffn_scale(30) == pytest.approx(0.18257, abs=1e-5)
    assert fixup_attention_scale(500) == pytest.approx(0.35495, abs=1e-5)
    assert fixup_ffn_scale(500) == pytest.approx(0.044721, abs=1e-6)
    assert fixup_attention_scale(ENCODER_ATTENTION_BLOCKS) == pytest.approx(0.66090, abs=1e-5)


def expected_factors(n_enc: int, n_dec: int, untied: bool) -> dict[str, float]:
    """Parameter name -> its factor over the Xavier base, written out from transformer_zero.py and
    multihead_attention_zero.py (every name not listed keeps factor 1)."""
    n = fixup_branches(n_enc, n_dec)
    attn, ffn, cross = n ** (-1 / 6), n**-0.5, 12 ** (-1 / 6)
    factors = {}
    for side, count in (("encoder", n_enc), ("decoder", n_dec)):
        for i in range(count):
            layer = f"{side}.layers.{i}"
            attns = {"self_attn": attn} | ({"encoder_attn": cross} if side == "decoder" else {})
            for name, qkv in attns.items():
                factors |= {f"{layer}.{name}.{p}_proj.weight": qkv for p in "qkv"}
                factors[f"{layer}.{name}.out_proj.weight"] = 0.0
            factors[f"{layer}.ffn.fc1.weight"] = ffn
            factors[f"{layer}.ffn.fc2.weight"] = 0.0
    if untied:
        factors["decoder.output_projection.weight"] = 0.0
    return factors


@pytest.mark.parametrize(("n_enc", "n_dec", "untied"), [(2, 3, True), (6, 6, False), (1, 12, True)])
def test_every_weight_is_the_xavier_base_times_the_references_factor(n_enc: int, n_dec: int, untied: bool) -> None:
    base = tiny_model("fixup", enc=n_enc, dec=n_dec, share_decoder_embeddings=not untied)
    model = tiny_model("fixup", enc=n_enc, dec=n_dec, share_decoder_embeddings=not untied)
    apply_init(base, "xavier", seed=4)
    apply_init(model, "fixup", seed=4)
    factors = expected_factors(n_enc, n_dec, untied)
    expected = base.state_dict()
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, expected[name] * factors.get(name, 1.0), rtol=0, atol=0, msg=name)
    assert set(factors) <= set(expected)  # every factor named a real parameter
    zeroed = [n for n, f in factors.items() if f == 0.0]
    assert all(model.state_dict()[n].abs().max() == 0 for n in zeroed)
    assert all(model.state_dict()[n].abs().max() > 0 for n in set(factors) - set(zeroed))


def test_scalars_start_at_shift_0_scale_1_and_the_model_is_the_identity_on_its_stream() -> None:
    """Zeroed branch ends: each layer returns its input; the stacks end with (x - 0) * 1 and x - 0."""
    model = tiny_model("fixup", enc=3, dec=2)
    apply_init(model, "fixup", seed=1)
    shifts = [p for n, p in model.named_parameters() if n.endswith("shift")]
    scales = [p for n, p in model.named_parameters() if n.endswith("scale")]
    assert len(shifts) == 3 * 2 + 2 * 3 + 2 and len(scales) == 3 * 2 + 2 * 3 + 1
    assert all(p.item() == 0 for p in shifts) and all(p.item() == 1 for p in scales)
    x = torch.randn(2, 5, 32)
    for layer in model.encoder.layers:
        assert torch.equal(layer(x, None), x)
    for layer in model.decoder.layers:
        assert torch.equal(layer(x[:, :3], x, None), x[:, :3])


@pytest.mark.parametrize("norm", ["none", "pre", "rezero"])
def test_refuses_other_residual_kinds(norm: str) -> None:
    with pytest.raises(ValueError, match="init.name=fixup needs model.norm=fixup"):
        apply_init(tiny_model(norm), "fixup")


@pytest.mark.parametrize("experiment", ["multi30k", "iwslt"])
def test_method_fixup_unties_the_classifier_so_it_starts_at_0_and_the_model_predicts_uniformly(experiment: str) -> None:
    """The reference's IWSLT model has its own classifier (``embed_out``), zeroed at init: Fixup's rule 1. Tied
    to the input table (the experiments' default for every other method), it could not be zeroed, and a model
    that is the identity on its stream would start by predicting its input token (22.9 bits on Multi30k, not
    log2 V). ``method=fixup`` unties it; the other methods stay tied. fp32, CPU."""
    from tfx.config import compose_config
    from tfx.model.transformer import Transformer

    small = ["model.encoder_layers=2", "model.decoder_layers=2", "model.d_model=32", "model.ffn_dim=64"]
    cfg = compose_config([f"+experiment={experiment}", "method=fixup", *small])
    assert not cfg.model.share_decoder_embeddings
    assert compose_config([f"+experiment={experiment}", "method=tfixup"]).model.share_decoder_embeddings
    vocab = 50
    model = Transformer(cfg.model, vocab, pad_id=1)
    apply_init(model, cfg.init.name, seed=3)
    assert model.decoder.output_projection is not None
    assert model.decoder.output_projection.weight.abs().max() == 0
    assert model.decoder.embedding.embed.weight.abs().max() > 0  # the input table keeps N(0, d^-1/2)
    src, prev = torch.randint(2, vocab, (3, 7)), torch.randint(2, vocab, (3, 5))
    logits = model.eval()(src, prev)
    assert torch.equal(logits, torch.zeros_like(logits))  # uniform: loss ln V for every target
