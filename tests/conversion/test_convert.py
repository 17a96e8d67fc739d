"""``tfx.convert`` on torch's own stacks and on described blocks: what it finds, scales, removes and refuses, and
that the converted layers compute x + f(x) in every mode torch has a fast path for. CPU, fp32; tiny models."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tfx import convert
from tfx.conversion import METHODS, Block, Method, RemovedNorm, register_method
from tfx.init.tfixup import tfixup_decoder_scale, tfixup_embedding_scale, tfixup_encoder_scale
from tfx.model.kinds.derf import DynamicErf
from tfx.model.residual import DynamicTanh

D, HEADS = 16, 4
pytestmark = pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")


def norms_left(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, nn.LayerNorm)]


def encoder(n: int = 3, batch_first: bool = True, norm_first: bool = False) -> nn.TransformerEncoder:
    layer = nn.TransformerEncoderLayer(D, HEADS, 2 * D, dropout=0.0, batch_first=batch_first, norm_first=norm_first)
    return nn.TransformerEncoder(layer, n, norm=nn.LayerNorm(D))


def decoder(n: int = 2, batch_first: bool = True, norm_first: bool = False) -> nn.TransformerDecoder:
    layer = nn.TransformerDecoderLayer(D, HEADS, 2 * D, dropout=0.0, batch_first=batch_first, norm_first=norm_first)
    return nn.TransformerDecoder(layer, n, norm=nn.LayerNorm(D))


class Classifier(nn.Module):
    """An encoder-only model: token table, learned positions, nn.TransformerEncoder, a linear head."""

    def __init__(self, n: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(30, D, padding_idx=0)
        self.pos_embed = nn.Embedding(16, D)
        self.encoder = encoder(n)
        self.head = nn.Linear(D, 5)


# -- a manual forward: what a converted layer must compute (post- and pre-LN alike, once the norms are gone) --


def attention(attn: nn.MultiheadAttention, q_in: Tensor, kv_in: Tensor, key_pad: Tensor | None, causal: bool) -> Tensor:
    """Batch-first (B, T, D) multi-head attention from the packed weights, with F.scaled_dot_product_attention."""
    d, h = attn.embed_dim, attn.num_heads
    w, b = attn.in_proj_weight, attn.in_proj_bias
    q, k, v = (F.linear(x, w[i * d : (i + 1) * d], b[i * d : (i + 1) * d]) for i, x in enumerate((q_in, kv_in, kv_in)))
    q, k, v = (x.unflatten(-1, (h, d // h)).transpose(1, 2) for x in (q, k, v))  # (B, H, T, Dh)
    mask = torch.ones(q.size(2), k.size(2), dtype=torch.bool)
    if causal:
        mask = mask.tril()
    if key_pad is not None:
        mask = mask & ~key_pad[:, None, None, :]  # (B, 1, T, S)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, T, Dh)
    return attn.out_proj(out.transpose(1, 2).flatten(2))


def ffn(layer: nn.Module, x: Tensor) -> Tensor:
    return layer.linear2(F.relu(layer.linear1(x)))


def manual_encoder(stack: nn.TransformerEncoder, x: Tensor, pad: Tensor) -> Tensor:
    for layer in stack.layers:
        x = x + attention(layer.self_attn, x, x, pad, causal=False)
        x = x + ffn(layer, x)
    return x


def manual_decoder(stack: nn.TransformerDecoder, y: Tensor, memory: Tensor, pad: Tensor) -> Tensor:
    for layer in stack.layers:
        y = y + attention(layer.self_attn, y, y, None, causal=True)
        y = y + attention(layer.multihead_attn, y, memory, pad, causal=False)
        y = y + ffn(layer, y)
    return y


MODES = {
    "train": (True, torch.enable_grad),
    "eval": (False, torch.enable_grad),
    "no_grad": (False, torch.no_grad),
    "inference_mode": (False, torch.inference_mode),
}


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("norm_first", [False, True])
def test_a_converted_transformer_computes_x_plus_f_x_in_every_mode(
    mode: str, batch_first: bool, norm_first: bool
) -> None:
    """fp32 CPU, atol 1e-5 on the unpadded positions. Eval without grad is where torch's fused encoder kernel (which
    applies LayerNorm itself) and the nested-tensor path would run; they must not: the result is the manual one."""
    torch.manual_seed(0)
    model = nn.Transformer(D, HEADS, 2, 2, 2 * D, dropout=0.0, batch_first=batch_first, norm_first=norm_first)
    convert(model, seed=0)
    training, context = MODES[mode]
    model.train(training)
    x, y = torch.randn(3, 7, D), torch.randn(3, 5, D)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[0, 4:] = True  # left-aligned padding: what the nested-tensor path needs to kick in
    causal = nn.Transformer.generate_square_subsequent_mask(5)
    xs, ys = (x, y) if batch_first else (x.transpose(0, 1), y.transpose(0, 1))
    with context():
        memory = model.encoder(xs, src_key_padding_mask=pad)
        out = model.decoder(ys, memory, tgt_mask=causal, tgt_is_causal=True, memory_key_padding_mask=pad)
    if not batch_first:
        memory, out = memory.transpose(0, 1), out.transpose(0, 1)
    with torch.no_grad():
        want_memory = manual_encoder(model.encoder, x, pad)
        want_out = manual_decoder(model.decoder, y, want_memory, pad)
    torch.testing.assert_close(memory[~pad], want_memory[~pad], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=1e-5)


def test_torch_s_fast_path_would_run_on_a_removed_norm_so_the_check_above_can_fail() -> None:
    """Undo the switch: the fused kernel reads the removed norm's weight and fails (the pitfall convert avoids)."""
    model = encoder(2).eval()
    convert(model)
    for layer in model.layers:
        layer.activation_relu_or_gelu = 1
    model.use_nested_tensor = True
    with torch.no_grad(), pytest.raises(AttributeError, match="RemovedNorm"):
        model(torch.randn(2, 4, D), src_key_padding_mask=torch.zeros(2, 4, dtype=torch.bool))


def test_nn_transformer_keeps_every_name_and_loses_every_layernorm() -> None:
    model = nn.Transformer(D, HEADS, 2, 3, 2 * D, dropout=0.0)
    before = {n for n, _ in model.named_parameters()}
    norms = norms_left(model)
    model_out, report = convert(model)
    assert model_out is model and norms_left(model) == []
    assert {n.name for n in report.norms} == set(norms) and len(norms) == 2 * 2 + 3 * 3 + 2
    assert all(isinstance(model.get_submodule(n), RemovedNorm) for n in norms)
    assert {n.now for n in report.norms} == {"removed (identity)"} and "LayerNorm((16,)" in report.norms[0].was
    assert {n for n, _ in model.named_parameters()} == {n for n in before if not n.startswith(tuple(norms))}


def test_the_report_gives_each_scaled_weight_its_factor_and_leaves_q_k_alone() -> None:
    """Encoder 0.67 N^-1/4, decoder (9N)^-1/4 on v rows (rows 2d:3d of in_proj), out_proj, linear1/2; q/k rows and
    biases keep the Xavier / zero base."""
    model = nn.Transformer(D, HEADS, 2, 3, 2 * D, dropout=0.0)
    _, report = convert(model, seed=1)
    enc, dec = tfixup_encoder_scale(2), tfixup_decoder_scale(3)
    assert [(s.name, s.side, s.depth, s.layer_factor) for s in report.stacks] == [
        ("encoder", "encoder", 2, enc),
        ("decoder", "decoder", 3, dec),
    ]
    packed = report.change("decoder.layers.1.multihead_attn.in_proj_weight")
    assert (packed.factor, packed.rows, packed.init) == (dec, (2 * D, 3 * D), "xavier_uniform per q/k/v third")
    assert report.factor("encoder.layers.0.linear2.weight") == enc
    assert report.factor("decoder.layers.2.self_attn.out_proj.weight") == dec
    assert report.change("encoder.layers.0.self_attn.in_proj_bias") == type(packed)(
        "encoder.layers.0.self_attn.in_proj_bias", "zeros"
    )
    scaled = [p for p in report.parameters if p.factor != 1.0]
    assert len(scaled) == 2 * 4 + 3 * 6 and report.untouched == []
    weight = model.decoder.layers[0].self_attn.in_proj_weight.detach()
    bound = (6 / (2 * D)) ** 0.5  # Xavier of one (d, d) projection
    q, v = weight[:D].abs().max(), weight[2 * D :].abs().max()
    assert bound * dec < q <= bound and v <= bound * dec
    assert "decoder.layers.0.linear1.weight: xavier_uniform x 0.4387" in str(report)


def test_an_encoder_only_classifier_scales_its_token_table_by_its_depth_and_leaves_positions() -> None:
    """nn.TransformerEncoder alone: the reference's encoder half (layers 0.67 N^-1/4, its table (9N)^-1/4); a table
    named ``pos*`` is a position table and left as it was; the head is Xavier, unscaled."""
    model = Classifier(n=3)
    positions = model.pos_embed.weight.detach().clone()
    _, report = convert(model)
    assert report.factor("embed.weight") == tfixup_embedding_scale(3)
    assert report.factor("encoder.layers.2.linear1.weight") == tfixup_encoder_scale(3)
    assert report.change("head.weight").factor == 1.0 and "pos_embed.weight" in report.untouched
    assert torch.equal(model.pos_embed.weight, positions) and model.embed.weight[0].abs().sum() == 0


def test_a_decoder_only_stack_gets_the_decoder_factors() -> None:
    """nn.TransformerDecoder alone (memory from elsewhere): (9N)^-1/4 on self- and cross-attention and the FFN, and
    its token table (9N)^-1/4; it runs in eval mode without grad."""
    model = nn.ModuleDict({"tgt_embed": nn.Embedding(20, D), "decoder": decoder(4)})
    _, report = convert(model)
    factor = tfixup_decoder_scale(4)
    assert {p.factor for p in report.parameters if "layers" in p.name and p.factor != 1.0} == {factor}
    assert report.factor("tgt_embed.weight") == tfixup_embedding_scale(4)
    model.eval()
    with torch.no_grad():
        assert model["decoder"](torch.randn(2, 3, D), torch.randn(2, 5, D)).isfinite().all()


def test_a_causal_lm_built_on_nn_transformer_encoder_gets_the_encoder_factor() -> None:
    """A decoder-only LM of self-attention + FFN blocks is, in torch, an nn.TransformerEncoder run with a causal mask:
    the same blocks as T-Fixup's encoder, so the encoder's 0.67 N^-1/4 (docs/convert.md says why)."""
    model = nn.ModuleDict({"tok_embed": nn.Embedding(20, D), "blocks": encoder(6)})
    _, report = convert(model)
    assert report.factor("blocks.layers.5.self_attn.out_proj.weight") == tfixup_encoder_scale(6)


def test_a_stack_side_can_be_chosen_with_a_block_over_torch_s_own_layers() -> None:
    block = Block(layers="blocks.layers.*", attention=["self_attn"], ffn=["linear*"], norms=["norm*"], side="decoder")
    model = nn.ModuleDict({"blocks": encoder(6)})
    _, report = convert(model, blocks=[block], extra_norms=["blocks.norm"])  # the stack's final norm: not in a layer
    assert report.factor("blocks.layers.5.linear2.weight") == tfixup_decoder_scale(6)
    assert norms_left(model) == []


class GPTBlock(nn.Module):
    """A block torch does not know: pre-LN, one packed q/k/v Linear, an MLP in a Sequential."""

    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = (t.unflatten(-1, (HEADS, D // HEADS)).transpose(1, 2) for t in self.qkv(self.ln1(x)).chunk(3, -1))
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, n: int = 4) -> None:
        super().__init__()
        self.wte = nn.Embedding(30, D)
        self.blocks = nn.ModuleList(GPTBlock() for _ in range(n))
        self.ln_f = nn.LayerNorm(D)

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.wte(tokens)
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)


GPT_BLOCK = Block(layers="blocks.*", value=["qkv[2/3]"], out=["proj"], ffn=["mlp.*"], norms=["ln*"])


def test_a_described_custom_block_is_converted_with_its_packed_value_rows() -> None:
    model = GPT(n=4)
    _, report = convert(model, blocks=[GPT_BLOCK], extra_norms=["ln_f"], seed=0)
    factor = tfixup_encoder_scale(4)
    qkv = report.change("blocks.3.qkv.weight")
    assert (qkv.factor, qkv.rows, qkv.init) == (factor, (2 * D, 3 * D), "xavier_uniform per row chunk (1/3)")
    assert report.factor("blocks.0.mlp.2.weight") == factor and report.factor("wte.weight") == (9 * 4) ** -0.25
    assert norms_left(model) == [] and len(report.norms) == 2 * 4 + 1
    weight, bound = model.blocks[0].qkv.weight.detach(), (6 / (2 * D)) ** 0.5
    assert factor * bound < weight[D : 2 * D].abs().max() <= bound and weight[2 * D :].abs().max() <= factor * bound
    assert model(torch.randint(0, 30, (2, 6))).isfinite().all()


@pytest.mark.parametrize(
    ("build", "kwargs", "message"),
    [
        (lambda: encoder(2), {"method": "adamw"}, r"method='adamw': use one of \['derf', 'dyt', 'tfixup'"),
        (lambda: encoder(2), {"method": "rezero"}, "scalar inside every residual branch"),
        (lambda: encoder(2), {"method": "fixup"}, "use tfx's own model with method=fixup"),
        (lambda: nn.Sequential(nn.Linear(D, D), nn.LayerNorm(D)), {}, "found no nn.TransformerEncoderLayer"),
        (lambda: nn.ModuleDict({"e": encoder(2), "head_norm": nn.LayerNorm(D)}), {}, "cannot account for 'head_norm'"),
        (lambda: GPT(), {"blocks": [GPT_BLOCK]}, "cannot account for 'ln_f'"),
        (lambda: GPT(), {"blocks": [Block(layers="blocks.*", ffn=["fc*"])]}, "ffn pattern 'fc\\*' matches no Linear"),
        (lambda: GPT(), {"blocks": [Block(layers="layers.*", ffn=["mlp.*"])]}, "matches no module of GPT"),
        (
            lambda: nn.ModuleDict({"a": nn.Embedding(9, D), "b": nn.Embedding(9, D), "t": nn.Transformer(D, HEADS)}),
            {},
            r"cannot tell which stack embedding\(s\) \['a', 'b'\] feed",
        ),
    ],
)
def test_what_it_cannot_account_for_is_refused_in_one_line_and_left_untouched(build, kwargs, message) -> None:
    model = build()
    before = {n: w.detach().clone() for n, w in model.state_dict().items()}
    with pytest.raises(ValueError, match=message) as refused:
        convert(model, **kwargs)
    assert "\n" not in str(refused.value)
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[n], w) for n, w in before.items())


@pytest.mark.parametrize(
    "depths",  # each table -> the depth N of the stack it should feed (encoder 2, decoder 4)
    [
        {"src_embed": 2, "tgt_embed": 4},  # by name
        {"shared": 2},  # one table for both sides: the encoder's, as tfx's shared embeddings
        {"tgt_tokens": 4},  # one table named for the target (a source of continuous inputs)
    ],
)
def test_the_default_embedding_rule(depths: dict[str, int]) -> None:
    model = nn.ModuleDict({name: nn.Embedding(9, D) for name in depths} | {"t": nn.Transformer(D, HEADS, 2, 4)})
    _, report = convert(model)
    assert {n: report.factor(f"{n}.weight") for n in depths} == {n: (9 * N) ** -0.25 for n, N in depths.items()}


def test_embeddings_can_be_named_when_the_default_rule_cannot_tell() -> None:
    model = nn.ModuleDict({"a": nn.Embedding(9, D), "b": nn.Embedding(9, D), "t": nn.Transformer(D, HEADS, 2, 4)})
    _, report = convert(model, embeddings={"a": "encoder", "b": "t.decoder"})
    assert (report.factor("a.weight"), report.factor("b.weight")) == ((9 * 2) ** -0.25, (9 * 4) ** -0.25)


@pytest.mark.parametrize(("method", "kind"), [("dyt", DynamicTanh), ("derf", DynamicErf)])
def test_dyt_and_derf_replace_every_norm_and_keep_the_xavier_base_unscaled(method: str, kind: type) -> None:
    model = nn.Transformer(D, HEADS, 2, 2, 2 * D, dropout=0.0, batch_first=True, norm_first=True).eval()
    _, report = convert(model, method)
    assert norms_left(model) == [] and len(report.norms) == 2 * 2 + 2 * 3 + 2
    assert all(isinstance(model.get_submodule(n.name), kind) for n in report.norms)
    assert {p.factor for p in report.parameters} == {1.0} and {s.layer_factor for s in report.stacks} == {1.0}
    assert model.encoder.layers[0].norm1.alpha.item() == 0.5
    with torch.no_grad():
        assert model(torch.randn(2, 5, D), torch.randn(2, 4, D)).isfinite().all()


def test_another_norm_replacement_is_one_registration() -> None:
    """The hook a Derf-style replacement uses: a Method record, then convert(model, method=its name)."""
    method = register_method(Method("halved_test", lambda norm: nn.Identity(), False, "for this test"))
    try:
        model = encoder(2)
        _, report = convert(model, "halved_test")
        assert report.method == "halved_test" and {n.now for n in report.norms} == {"Identity()"}
        with pytest.raises(ValueError, match="registered twice"):
            register_method(Method("halved_test", lambda norm: norm, False, "another"))
    finally:
        METHODS.pop(method.name)
    with pytest.raises(ValueError, match="refused by design"):
        register_method(Method("rezero", lambda norm: norm, False, "no"))
