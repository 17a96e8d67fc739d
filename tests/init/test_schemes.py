from __future__ import annotations

import math

import pytest
import torch

from tests.conftest import random_batch, tiny_model
from tfx.data import Batch
from tfx.init import (
    SCHEMES,
    Scheme,
    apply_init,
    register,
    tfixup_decoder_scale,
    tfixup_embedding_scale,
    tfixup_encoder_scale,
)
from tfx.init.xavier import token_embeddings
from tfx.model import MultiheadAttention, has_layer_norm


def toy_batch(seed: int = 0) -> Batch:
    src, tgt = random_batch(seed=seed)
    return Batch(src, src.ne(0).sum(1), tgt, tgt, int(tgt.numel()), list(range(len(src))))


def scheme_norm(name: str) -> str:
    """A residual kind the scheme accepts (component_wise is meant for LayerNorm models)."""
    return next(iter(SCHEMES[name].norms()), "post" if name == "component_wise" else "none")


def xavier_std(w: torch.Tensor) -> float:
    fan_out, fan_in = w.shape
    return math.sqrt(2.0 / (fan_in + fan_out))


def test_scale_factors_match_paper_formulas() -> None:
    for n in (1, 6, 12, 200):
        assert tfixup_encoder_scale(n) == pytest.approx(0.67 * n ** (-1 / 4))
        assert tfixup_decoder_scale(n) == pytest.approx((9 * n) ** (-1 / 4))
        assert tfixup_embedding_scale(n) == pytest.approx((9 * n) ** (-1 / 4))
    assert tfixup_encoder_scale(6) == pytest.approx(0.42809, abs=1e-5)
    assert tfixup_decoder_scale(6) == pytest.approx(0.36889, abs=1e-5)


def _rel_std_error(w: torch.Tensor, expected: float) -> float:
    return abs(w.float().std().item() / expected - 1)


@pytest.mark.parametrize("n_layers", [6, 200])
def test_tfixup_weight_stds(n_layers: int) -> None:
    d = 64
    model = tiny_model(enc=n_layers, dec=n_layers, d=d, share_decoder_embeddings=True)
    apply_init(model, "tfixup", seed=3)
    assert not has_layer_norm(model)
    enc_f, dec_f = tfixup_encoder_scale(n_layers), tfixup_decoder_scale(n_layers)
    enc_layer, dec_layer = model.encoder.layers[n_layers // 2], model.decoder.layers[-1]
    scaled = [
        (enc_layer.self_attn.v_proj.weight, enc_f),
        (enc_layer.self_attn.out_proj.weight, enc_f),
        (enc_layer.ffn.fc1.weight, enc_f),
        (enc_layer.ffn.fc2.weight, enc_f),
        (dec_layer.self_attn.v_proj.weight, dec_f),
        (dec_layer.self_attn.out_proj.weight, dec_f),
        (dec_layer.encoder_attn.v_proj.weight, dec_f),
        (dec_layer.encoder_attn.out_proj.weight, dec_f),
        (dec_layer.ffn.fc1.weight, dec_f),
        (dec_layer.ffn.fc2.weight, dec_f),
    ]
    for w, factor in scaled:
        assert _rel_std_error(w, xavier_std(w) * factor) < 0.1
    for attn in (enc_layer.self_attn, dec_layer.self_attn, dec_layer.encoder_attn):
        for w in (attn.q_proj.weight, attn.k_proj.weight):  # q/k NOT scaled
            assert _rel_std_error(w, xavier_std(w)) < 0.1
        assert attn.v_proj.bias.abs().max() == 0 and attn.q_proj.bias.abs().max() == 0
    emb_std = d**-0.5
    enc_emb, dec_emb = model.encoder.embedding.embed.weight, model.decoder.embedding.embed.weight
    assert _rel_std_error(enc_emb[1:], emb_std * tfixup_embedding_scale(n_layers)) < 0.1
    assert _rel_std_error(dec_emb[1:], emb_std * tfixup_embedding_scale(n_layers)) < 0.1
    assert enc_emb[0].abs().max() == 0  # padding row


def test_tfixup_embeddings_use_their_own_stack_depth() -> None:
    model = tiny_model(enc=3, dec=48, d=64)
    apply_init(model, "tfixup")
    enc_emb, dec_emb = model.encoder.embedding.embed.weight[1:], model.decoder.embedding.embed.weight[1:]
    assert _rel_std_error(enc_emb, 64**-0.5 * tfixup_embedding_scale(3)) < 0.1
    assert _rel_std_error(dec_emb, 64**-0.5 * tfixup_embedding_scale(48)) < 0.1


def test_tfixup_shared_embedding_scaled_once_with_encoder_factor() -> None:
    model = tiny_model(enc=4, dec=16, d=64, share_all_embeddings=True)
    apply_init(model, "tfixup")
    emb = model.encoder.embedding.embed.weight[1:]
    assert _rel_std_error(emb, 64**-0.5 * tfixup_embedding_scale(4)) < 0.1


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_tfixup_refuses_layer_norm(norm: str) -> None:
    with pytest.raises(ValueError, match="model.norm=none"):
        apply_init(tiny_model(norm), "tfixup")


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_schemes_are_deterministic_per_seed(name: str) -> None:
    a, b, c = (tiny_model(scheme_norm(name), share_decoder_embeddings=False) for _ in range(3))
    apply_init(a, name, seed=5, batch=toy_batch())
    apply_init(b, name, seed=5, batch=toy_batch())
    apply_init(c, name, seed=6, batch=toy_batch())
    for (n, pa), pb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), n
    assert not torch.equal(a.encoder.layers[0].ffn.fc1.weight, c.encoder.layers[0].ffn.fc1.weight)


def test_component_wise_recipe() -> None:
    torch.manual_seed(0)
    model = tiny_model("post", d=64, share_decoder_embeddings=False)
    apply_init(model, "component_wise")
    layer = model.encoder.layers[0]
    assert torch.allclose(layer.ffn.fc1.bias, torch.full_like(layer.ffn.fc1.bias, 0.01))
    fc1 = layer.ffn.fc1.weight
    assert _rel_std_error(fc1, math.sqrt(2.0 / fc1.shape[1])) < 0.1  # Kaiming fan_in relu
    fc2 = layer.ffn.fc2.weight
    assert _rel_std_error(fc2, 0.8 * xavier_std(fc2)) < 0.1
    head = model.decoder.output_projection.weight
    assert _rel_std_error(head, 0.5 * xavier_std(head)) < 0.1
    ln = layer.self_attn_block.norm.weight
    assert 0 < (ln - 1).abs().max() < 0.1
    q = layer.self_attn.q_proj.weight
    ratio = q.std().item() / (xavier_std(q) / math.sqrt(2))
    assert 0.85 < ratio < 1.05


@pytest.mark.parametrize(("n_enc", "n_dec", "shared"), [(3, 4, False), (2, 2, True)])
def test_tfixup_scales_every_layer_of_every_stack(n_enc: int, n_dec: int, shared: bool) -> None:
    """T-Fixup = the Xavier base (same seed) times the paper's factor, checked on every parameter of
    every layer: a layer skipped (layer 0, the last one) or a weight missed shows up exactly."""
    kw = {"share_all_embeddings": True} if shared else {}
    base, model = tiny_model(enc=n_enc, dec=n_dec, **kw), tiny_model(enc=n_enc, dec=n_dec, **kw)
    apply_init(base, "xavier", seed=5)
    apply_init(model, "tfixup", seed=5)
    enc_f, dec_f, emb_f = tfixup_encoder_scale(n_enc), tfixup_decoder_scale(n_dec), tfixup_embedding_scale(n_enc)
    scaled = {f"encoder.layers.{i}.{w}.weight": enc_f for i in range(n_enc) for w in ENC_SCALED}
    scaled |= {f"decoder.layers.{i}.{w}.weight": dec_f for i in range(n_dec) for w in DEC_SCALED}
    scaled["encoder.embedding.embed.weight"] = emb_f
    scaled["decoder.embedding.embed.weight"] = emb_f if shared else tfixup_embedding_scale(n_dec)
    expected = base.state_dict()
    checked = 0
    for name, value in model.state_dict().items():
        factor = scaled.get(name, 1.0)
        torch.testing.assert_close(value, expected[name] * factor, rtol=0, atol=0, msg=name)
        checked += factor != 1.0
    assert checked == len(scaled)


ENC_SCALED = ("self_attn.v_proj", "self_attn.out_proj", "ffn.fc1", "ffn.fc2")
DEC_SCALED = (*ENC_SCALED, "encoder_attn.v_proj", "encoder_attn.out_proj")


def test_unknown_scheme_is_named_with_the_choices() -> None:
    names = r"\['admin', 'component_wise', 'deepnorm', 'fixup', 'tfixup', 'tfixup_ln', 'xavier'\]"
    with pytest.raises(ValueError, match=rf"init.name='bogus': use one of {names}"):
        apply_init(tiny_model(), "bogus")


def test_xavier_embeddings_are_centred_and_shared_tables_listed_once() -> None:
    model = tiny_model(d=64, share_all_embeddings=True)
    assert token_embeddings(model) == [model.encoder.embedding.embed]
    apply_init(model, "xavier", seed=2)
    emb = model.encoder.embedding.embed.weight[1:]
    assert abs(emb.mean().item()) < 0.025 and _rel_std_error(emb, 64**-0.5) < 0.1  # mean 0, std d^-1/2


def test_component_wise_attention_gains() -> None:
    """q/k/v: Xavier-uniform at gain 1/sqrt(2) times one multiplier in [0.9, 1] per head (the rows of a
    head share it, and heads differ); out_proj: Xavier gain 0.8."""
    torch.manual_seed(0)
    model = tiny_model("post", d=64, enc=2, dec=2)
    apply_init(model, "component_wise")
    ratios = []
    for attn in (m for m in model.modules() if isinstance(m, MultiheadAttention)):
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
            fan_out, fan_in = proj.weight.shape
            bound = math.sqrt(6.0 / (fan_in + fan_out)) / math.sqrt(2)
            per_head = proj.weight.detach().abs().view(attn.heads, -1).amax(dim=1) / bound  # (H,)
            ratios += per_head.tolist()
        assert _rel_std_error(attn.out_proj.weight, 0.8 * xavier_std(attn.out_proj.weight)) < 0.1
    assert max(ratios) <= 1.0 and min(ratios) > 0.88
    assert min(ratios) < 0.97  # multipliers below 1 exist: not plain Xavier at gain 1/sqrt(2)


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_default_seed_is_one(name: str) -> None:
    """``apply_init`` and every scheme default to seed 1 (the trainer's ``train.seed`` default)."""
    a, b, c = (tiny_model(scheme_norm(name)) for _ in range(3))
    apply_init(a, name, batch=toy_batch())
    SCHEMES[name].init(b, batch=toy_batch())
    apply_init(c, name, seed=1, batch=toy_batch())
    for (key, x), y, z in zip(a.state_dict().items(), b.state_dict().values(), c.state_dict().values(), strict=True):
        assert torch.equal(x, z) and torch.equal(y, z), key


def test_a_scheme_is_one_record_in_its_own_file_and_a_name_is_taken_once() -> None:
    """Each scheme file registers its ``Scheme``; what the trainer and the config check read comes from it."""
    assert {"xavier", "tfixup", "component_wise", "deepnorm", "admin", "fixup"} <= set(SCHEMES)
    assert all(scheme.init.__module__ == f"tfx.init.{name}" for name, scheme in SCHEMES.items())
    assert (SCHEMES["tfixup"].needs_norm, SCHEMES["admin"].needs_batch, SCHEMES["xavier"].needs_norm) == (
        "none", True, None,
    )  # fmt: skip
    assert SCHEMES["tfixup_ln"].norms() == ("post", "pre") and SCHEMES["tfixup"].norms() == ("none",)
    assert SCHEMES["tfixup_ln"].fits("pre") and not SCHEMES["tfixup_ln"].fits("none")
    assert SCHEMES["xavier"].norms() == () and SCHEMES["xavier"].fits("dyt")
    with pytest.raises(ValueError, match="registered twice"):
        register(Scheme("xavier", SCHEMES["tfixup"].init))
    assert SCHEMES["xavier"].init.__name__ == "init_xavier"
