"""Derf (tfx/model/kinds/derf.py): its arithmetic against the formula computed apart (Python's math.erf), its
reference inits, its gradients, where it sits in a model, and its options as the config carries them. fp32 on
CPU, as every test here; the toy and 100+100-layer runs are tests/test_train.py's normalization-free ones."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import Tensor

from tests.conftest import PAD, VOCAB, random_batch
from tfx.config import compose_config
from tfx.init import apply_init
from tfx.model import ModelConfig, Transformer, build_model, has_layer_norm
from tfx.model.kinds.derf import Derf, DerfOptions, DynamicErf
from tfx.model.residual import ResidualContext, make_residual

D = 6
X = torch.randn(2, 3, D, generator=torch.Generator().manual_seed(0)) * 2.0  # reaches erf's flat tails


def branch(h: Tensor) -> Tensor:
    """A sublayer that is neither linear nor odd, so a missing or misplaced Derf shows in the output."""
    return torch.tanh(2.0 * h) + 0.5


def reference_derf(x: Tensor, alpha: float, shift: float, weight: Tensor, bias: Tensor) -> Tensor:
    """weight * erf(alpha * x + shift) + bias, elementwise with Python's math.erf in float64 (not torch.erf)."""
    erf = torch.tensor([math.erf(alpha * v + shift) for v in x.double().flatten().tolist()], dtype=torch.float64)
    return (weight.double() * erf.view(x.shape) + bias.double()).float()


def derf_block(**options: float) -> Derf:
    cfg = ModelConfig(encoder_layers=2, decoder_layers=2, d_model=D, heads=1, norm="derf", norm_options=options)
    block = make_residual(cfg, ResidualContext("encoder", 0, 2, 2, D, 0.0))
    assert isinstance(block, Derf)
    return block.eval()


def test_derf_starts_at_the_reference_inits_and_computes_its_formula() -> None:
    """alpha 0.5 and shift 0, each one scalar; weight 1 and bias 0 per channel (zlab-princeton/Derf's
    Dynamic_erf); then, at other values, weight * erf(alpha * x + shift) + bias, and the residual is Pre-LN's."""
    derf = derf_block().norm
    assert (derf.alpha.shape, derf.shift.shape) == ((1,), (1,))
    assert (derf.alpha.item(), derf.shift.item()) == (0.5, 0.0)
    assert torch.equal(derf.weight, torch.ones(D)) and torch.equal(derf.bias, torch.zeros(D))
    torch.testing.assert_close(derf(X), reference_derf(X, 0.5, 0.0, torch.ones(D), torch.zeros(D)))
    weight, bias = torch.linspace(0.5, 1.5, D), torch.linspace(-0.2, 0.3, D)
    with torch.no_grad():
        derf.alpha.fill_(1.7)
        derf.shift.fill_(-0.4)
        derf.weight.copy_(weight)
        derf.bias.copy_(bias)
    torch.testing.assert_close(derf(X), reference_derf(X, 1.7, -0.4, weight, bias))
    block = derf_block()
    torch.testing.assert_close(block(X, branch), X + branch(block.norm(X)))


def test_alpha_and_shift_get_the_gradients_of_the_formula() -> None:
    """d/d alpha = sum(weight * erf'(u) * x) and d/d shift = sum(weight * erf'(u)), u = alpha * x + shift,
    erf'(u) = 2 / sqrt(pi) * exp(-u^2): both scalars learn, with the gradients the formula gives."""
    derf = DynamicErf(D, alpha=0.8, shift=0.3)
    with torch.no_grad():
        derf.weight.copy_(torch.linspace(0.5, 1.5, D))
    derf(X).sum().backward()
    slope = 2 / math.sqrt(math.pi) * torch.exp(-((0.8 * X + 0.3) ** 2)) * derf.weight.detach()
    torch.testing.assert_close(derf.alpha.grad, (slope * X).sum().view(1))
    torch.testing.assert_close(derf.shift.grad, slope.sum().view(1))
    assert derf.alpha.grad.abs().item() > 0 and derf.shift.grad.abs().item() > 0


def test_a_derf_model_has_no_layer_norm_and_a_derf_at_every_pre_ln_position() -> None:
    """Each sublayer's block normalizes its input with a Derf (2 per encoder layer, 3 per decoder layer), each
    stack ends with one, and no nn.LayerNorm is left: convert_ln_to_derf applied to tfx's Pre-LN model. Every
    Derf starts at model.norm_options, and Xavier (method=derf's init) leaves it there."""
    cfg = ModelConfig(encoder_layers=2, decoder_layers=3, d_model=8, ffn_dim=8, heads=2, norm="derf",
                      norm_options={"alpha": 0.3, "shift": 0.1})  # fmt: skip
    model = Transformer(cfg, VOCAB, PAD)
    assert not has_layer_norm(model)
    blocks = [b for layer in [*model.encoder.layers, *model.decoder.layers] for b in layer.children()
              if isinstance(b, Derf)]  # fmt: skip
    assert len(blocks) == 2 * 2 + 3 * 3 and all(isinstance(b.norm, DynamicErf) for b in blocks)
    assert isinstance(model.encoder.final_norm, DynamicErf) and isinstance(model.decoder.final_norm, DynamicErf)
    derfs = [m for m in model.modules() if isinstance(m, DynamicErf)]
    assert len(derfs) == 2 * 2 + 3 * 3 + 2
    apply_init(model, "xavier")  # method=derf's scheme sets linear weights and embeddings, never a Derf's
    assert [(m.alpha.item(), m.shift.item()) for m in derfs] == [pytest.approx((0.3, 0.1))] * len(derfs)
    assert all(torch.equal(m.weight, torch.ones(8)) and not m.bias.any() for m in derfs)
    src, tgt = random_batch()
    assert torch.isfinite(model(src, tgt)).all()


def test_derfs_options_are_declared_by_the_kind_and_carried_by_the_config() -> None:
    """model.norm_options fills in Derf's declared defaults, takes an int for a float (as Hydra reads alpha=1),
    and refuses a bad setting in one line naming it."""
    assert ModelConfig(norm="derf").norm_options == dataclasses.asdict(DerfOptions()) == {"alpha": 0.5, "shift": 0.0}
    options = ModelConfig(norm="derf", norm_options={"alpha": 1}).norm_options
    assert options == {"alpha": 1.0, "shift": 0.0} and isinstance(options["alpha"], float)
    refusals = {
        "model.norm_options.alhpa: model.norm=derf has no such option (its options: alpha, shift)": {"alhpa": 1.0},
        "model.norm_options.alpha=0.0 must be positive": {"alpha": 0},
        "model.norm_options.shift=nan must be finite": {"shift": float("nan")},
        "model.norm_options.alpha='big' must be a float": {"alpha": "big"},
        "model.norm_options.alpha=True must be a float": {"alpha": True},
    }
    for message, given in refusals.items():
        with pytest.raises(ValueError, match=f"^{message.replace('(', '[(]').replace(')', '[)]')}$"):
            ModelConfig(norm="derf", norm_options=given)
    with pytest.raises(ValueError, match=r"^model\.norm_options\.alpha: model\.norm=pre has no such option"):
        ModelConfig(norm="pre", norm_options={"alpha": 0.5})


def test_a_derf_checkpoints_config_rebuilds_its_model() -> None:
    """A checkpoint records ModelConfig as a dict (its norm_options resolved): the dict rebuilds the same model and
    loads its weights; a dict from before norm_options existed rebuilds with Derf's defaults."""
    cfg = ModelConfig(encoder_layers=1, decoder_layers=1, d_model=8, ffn_dim=8, heads=2, norm="derf",
                      norm_options={"alpha": 0.25})  # fmt: skip
    saved = dataclasses.asdict(cfg)
    assert saved["norm_options"] == {"alpha": 0.25, "shift": 0.0}
    model, rebuilt = Transformer(cfg, VOCAB, PAD), build_model(saved, VOCAB, PAD)
    assert rebuilt.cfg == cfg and rebuilt.encoder.final_norm.alpha.item() == 0.25
    rebuilt.load_state_dict(model.state_dict())
    src, tgt = random_batch()
    torch.testing.assert_close(rebuilt.eval()(src, tgt), model.eval()(src, tgt))
    del saved["norm_options"]
    assert build_model(saved, VOCAB, PAD).cfg.norm_options == {"alpha": 0.5, "shift": 0.0}


def test_method_derf_composes_with_its_options_overridable() -> None:
    """conf/method/derf.yaml lists exactly Derf's declared defaults, so model.norm_options.alpha=A needs no '+'."""
    cfg = compose_config(["method=derf"])
    assert (cfg.method, cfg.model.norm, cfg.init.name) == ("derf", "derf", "xavier")
    assert cfg.model.norm_options == dataclasses.asdict(DerfOptions())
    cfg = compose_config(["method=derf", "model.norm_options.alpha=0.25"])
    model = build_model(cfg.model, VOCAB, PAD)
    assert {m.alpha.item() for m in model.modules() if isinstance(m, DynamicErf)} == {0.25}
