"""A torch-native translator converted by ``tfx.convert`` is tfx's own T-Fixup model: same initial weights, draw
for draw, and the same logits once tfx's weights are copied in. CPU, fp32.

The native model embeds as tfx does (``tfx.model.transformer``): sqrt(d) * table + fairseq's sinusoidal positions,
padded source positions zeroed, the decoder's output projection tied to its input table; ``nn.Transformer`` in
between. Its modules come in tfx's order (encoder layers, decoder layers; in each, attention q/k/v/out then the
FFN), so one seed gives tfx's draws exactly (tfx.conversion.weights).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tests.conftest import PAD, VOCAB, random_batch, tiny_model
from tfx import convert
from tfx.init import apply_init
from tfx.model import Transformer
from tfx.model.transformer import sinusoidal_table

ENC, DEC, D = 2, 3, 32
pytestmark = pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")


class NativeTranslator(nn.Module):
    """tfx's ``Transformer`` in torch's own modules: the model a user would write."""

    def __init__(self, batch_first: bool = True, norm_first: bool = False) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.src_embed = nn.Embedding(VOCAB, D, padding_idx=PAD)
        self.transformer = nn.Transformer(
            D, 4, ENC, DEC, 2 * D, dropout=0.0, batch_first=batch_first, norm_first=norm_first
        )
        self.tgt_embed = nn.Embedding(VOCAB, D, padding_idx=PAD)
        self.register_buffer("positions", sinusoidal_table(64, D), persistent=False)

    def embed(self, table: nn.Embedding, tokens: Tensor) -> Tensor:
        return math.sqrt(D) * table(tokens) + self.positions[: tokens.size(1)]  # (B, T, D)

    def forward(self, src: Tensor, prev: Tensor) -> Tensor:
        pad = src.eq(PAD)  # (B, S)
        x = self.embed(self.src_embed, src).masked_fill(pad[..., None], 0.0)
        y = self.embed(self.tgt_embed, prev)
        if not self.batch_first:
            x, y = x.transpose(0, 1), y.transpose(0, 1)  # (S, B, D), (T, B, D)
        causal = nn.Transformer.generate_square_subsequent_mask(prev.size(1))
        h = self.transformer(
            x, y, tgt_mask=causal, src_key_padding_mask=pad, memory_key_padding_mask=pad, tgt_is_causal=True
        )
        if not self.batch_first:
            h = h.transpose(0, 1)
        return F.linear(h, self.tgt_embed.weight)  # (B, T, V), tied as tfx's default


def native_names(ours: Transformer) -> dict[str, Tensor]:
    """tfx's parameters under the native model's names (q/k/v packed into in_proj)."""

    def attention(prefix: str, attn: nn.Module) -> dict[str, Tensor]:
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        return {
            f"{prefix}.in_proj_weight": torch.cat([p.weight for p in projections]),
            f"{prefix}.in_proj_bias": torch.cat([p.bias for p in projections]),
            f"{prefix}.out_proj.weight": attn.out_proj.weight,
            f"{prefix}.out_proj.bias": attn.out_proj.bias,
        }

    def ffn(prefix: str, layer: nn.Module) -> dict[str, Tensor]:
        fc1, fc2 = layer.ffn.fc1, layer.ffn.fc2
        names = {"linear1.weight": fc1.weight, "linear1.bias": fc1.bias, "linear2.weight": fc2.weight}
        return {f"{prefix}.{k}": v for k, v in {**names, "linear2.bias": fc2.bias}.items()}

    found = {"src_embed.weight": ours.encoder.embedding.embed.weight}
    found["tgt_embed.weight"] = ours.decoder.embedding.embed.weight
    for i, layer in enumerate(ours.encoder.layers):
        prefix = f"transformer.encoder.layers.{i}"
        found |= attention(f"{prefix}.self_attn", layer.self_attn) | ffn(prefix, layer)
    for i, layer in enumerate(ours.decoder.layers):
        prefix = f"transformer.decoder.layers.{i}"
        found |= attention(f"{prefix}.self_attn", layer.self_attn) | ffn(prefix, layer)
        found |= attention(f"{prefix}.multihead_attn", layer.encoder_attn)
    return found


def tfixup_pair(seed: int, **native: bool) -> tuple[Transformer, NativeTranslator]:
    ours = tiny_model("none", enc=ENC, dec=DEC, d=D)
    apply_init(ours, "tfixup", seed=seed)
    theirs, _ = convert(NativeTranslator(**native), "tfixup", seed=seed)
    return ours, theirs


def test_the_converted_model_starts_from_tfx_s_exact_t_fixup_weights() -> None:
    """Same seed, same draws: every parameter equal bit for bit (fp32, CPU), and nothing else in the model."""
    ours, theirs = tfixup_pair(seed=3)
    expected = native_names(ours)
    got = dict(theirs.named_parameters())
    assert sorted(got) == sorted(expected)
    assert [n for n, w in expected.items() if not torch.equal(got[n], w)] == []


def test_the_same_seed_gives_different_draws_than_another() -> None:
    """The equality above is the seed's, not a constant init (zeros would also be equal)."""
    a, b = tfixup_pair(seed=3)[1], tfixup_pair(seed=4)[1]
    assert not torch.equal(
        a.transformer.encoder.layers[0].linear1.weight, b.transformer.encoder.layers[0].linear1.weight
    )


@pytest.mark.parametrize(("batch_first", "norm_first"), [(True, False), (False, True)])
@pytest.mark.parametrize("mode", ["train", "eval", "no_grad", "inference_mode"])
def test_logits_equal_tfx_s_with_its_weights_copied_in(batch_first: bool, norm_first: bool, mode: str) -> None:
    """fp32 on CPU, atol 1e-5: the native model (Post- or Pre-LN before conversion: the same once its norms are gone)
    computes tfx's function, in train mode (dropout 0), eval mode (torch's fast paths eligible) and without grad."""
    ours, theirs = tfixup_pair(seed=5, batch_first=batch_first, norm_first=norm_first)
    torch.manual_seed(0)
    with torch.no_grad():  # random weights, so that the check is not about the init's small values
        for w in ours.parameters():
            w.normal_(0, 0.2)
        ours.encoder.embedding.embed.weight[PAD] = 0.0
        for name, w in native_names(ours).items():
            theirs.get_parameter(name).copy_(w)
    src, prev = random_batch(b=3, s=7, t=6)
    ours.train(mode == "train")
    theirs.train(mode == "train")
    expected = ours(src, prev).detach()
    context = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}.get(mode, torch.enable_grad)
    with context():
        got = theirs(src, prev)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
