"""tfx.evaluation.fairseq_format: the dictionary permutation, the position offset, a fairseq-convention forward pass.

The forward pass below follows fairseq 0.12.2's conventions (decoder starts from ``</s>``, learned positions
at ``padding_idx + 1 + t``, Post-LN layers under fairseq's parameter names) on the converted state dict
alone, so a wrong row, name or offset shows here without fairseq installed; the slow test in
``tests/scripts/bench/test_bench_decode.py`` runs fairseq itself.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import VOCAB, random_batch, tiny_model
from tfx.data import BOS, EOS, PAD, UNK
from tfx.evaluation.fairseq_format import (
    dictionary_lines,
    fairseq_arch_args,
    fairseq_positions,
    fairseq_state_dict,
    fairseq_to_tfx,
    parse_hypothesis,
    source_line,
    strip_unk,
    symbol,
    tfx_to_fairseq,
)
from tfx.init import apply_init

FS_PAD, FS_EOS = 1, 2


def test_specials_go_where_each_decoder_blocks_them_and_other_ids_stay() -> None:
    to_fs = tfx_to_fairseq(VOCAB)
    assert (to_fs[PAD], to_fs[EOS], to_fs[BOS], to_fs[UNK]) == (1, 2, 3, 0)  # <pad>, </s>, <unk>, <s>
    assert torch.equal(to_fs[4:], torch.arange(4, VOCAB))
    assert torch.equal(fairseq_to_tfx(VOCAB)[to_fs], torch.arange(VOCAB))


def test_dictionary_and_text_round_trip() -> None:
    lines = dictionary_lines(VOCAB)
    assert len(lines) == VOCAB - 4 and lines[0] == "t4 1" and lines[-1] == f"t{VOCAB - 1} 1"
    assert symbol(UNK) == "<s>"
    assert source_line([5, UNK, 7, EOS]) == "t5 <s> t7"  # fairseq appends </s> itself
    assert parse_hypothesis("t5 t17") == [5, 17] and parse_hypothesis("") == []
    assert strip_unk([5, UNK, 7]) == [5, 7]  # what fairseq prints of it: its printer drops <s>
    with pytest.raises(ValueError, match="<unk>"):
        parse_hypothesis("t5 <unk>")


def test_positions_start_after_the_padding_index() -> None:
    table = torch.randn(6, 4)
    out = fairseq_positions(table, pad=1)
    assert out.shape == (8, 4) and torch.equal(out[2:], table) and not out[:2].any()


def test_only_post_ln_converts() -> None:
    with pytest.raises(ValueError, match="method=postln"):
        fairseq_state_dict(tiny_model("none"))
    args = fairseq_arch_args(tiny_model("post", enc=2, dec=3, d=32))
    assert args[args.index("--decoder-layers") + 1] == "3" and "--share-decoder-input-output-embed" not in args


def _attention(sd: dict, prefix: str, x: torch.Tensor, kv: torch.Tensor, heads: int, mask=None, causal=False):
    def proj(name: str, t: torch.Tensor) -> torch.Tensor:
        y = F.linear(t, sd[f"{prefix}.{name}.weight"], sd[f"{prefix}.{name}.bias"])
        return y.view(*t.shape[:2], heads, -1).transpose(1, 2)  # (B, H, T, Dh)

    out = F.scaled_dot_product_attention(
        proj("q_proj", x), proj("k_proj", kv), proj("v_proj", kv), mask, is_causal=causal
    )
    out = out.transpose(1, 2).reshape(x.shape)
    return F.linear(out, sd[f"{prefix}.out_proj.weight"], sd[f"{prefix}.out_proj.bias"])


def _norm(sd: dict, prefix: str, x: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], sd[f"{prefix}.weight"], sd[f"{prefix}.bias"])


def _ffn(sd: dict, prefix: str, x: torch.Tensor) -> torch.Tensor:
    h = F.relu(F.linear(x, sd[f"{prefix}.fc1.weight"], sd[f"{prefix}.fc1.bias"]))
    return F.linear(h, sd[f"{prefix}.fc2.weight"], sd[f"{prefix}.fc2.bias"])


def _embed(sd: dict, side: str, tokens: torch.Tensor) -> torch.Tensor:
    """fairseq: sqrt(d) * embed + learned position (make_positions: pad+1+t for real tokens, pad at pads)."""
    real = tokens.ne(FS_PAD)
    positions = torch.cumsum(real, dim=1) * real + FS_PAD
    emb = sd[f"{side}.embed_tokens.weight"]
    return math.sqrt(emb.size(1)) * emb[tokens] + sd[f"{side}.embed_positions.weight"][positions]


def fairseq_logits(sd: dict, src: torch.Tensor, prev: torch.Tensor, heads: int, n_enc: int, n_dec: int):
    """Post-LN encoder-decoder logits the way fairseq computes them, from fairseq-format tensors and ids."""
    pad = src.eq(FS_PAD)
    x = _embed(sd, "encoder", src).masked_fill(pad[..., None], 0.0)
    may_attend = ~pad[:, None, None, :]
    for i in range(n_enc):
        p = f"encoder.layers.{i}"
        x = _norm(sd, f"{p}.self_attn_layer_norm", x + _attention(sd, f"{p}.self_attn", x, x, heads, may_attend))
        x = _norm(sd, f"{p}.final_layer_norm", x + _ffn(sd, p, x))
    y = _embed(sd, "decoder", prev)
    for i in range(n_dec):
        p = f"decoder.layers.{i}"
        y = _norm(sd, f"{p}.self_attn_layer_norm", y + _attention(sd, f"{p}.self_attn", y, y, heads, causal=True))
        y = _norm(sd, f"{p}.encoder_attn_layer_norm", y + _attention(sd, f"{p}.encoder_attn", y, x, heads, may_attend))
        y = _norm(sd, f"{p}.final_layer_norm", y + _ffn(sd, p, y))
    return F.linear(y, sd["decoder.output_projection.weight"])


@pytest.mark.parametrize("share_all", [False, True])
def test_fairseq_convention_forward_gives_tfx_log_probs(share_all: bool) -> None:
    """The converted tensors, read under fairseq's names, ids and start token, give tfx's distribution
    over the same tokens (vocabulary permuted), at every position of a padded batch."""
    torch.manual_seed(0)
    model = tiny_model("post", enc=2, dec=2, share_all_embeddings=share_all).eval()
    apply_init(model, "xavier")
    model.double()  # fp32 values (the converted tensors are fp32) in float64 arithmetic: any mismatch is a bug
    src, prev = random_batch()
    src[1, 3] = UNK  # a special inside the source
    src[:, -1] = torch.where(src[:, -1].eq(PAD), PAD, EOS)
    prev[:, 0] = BOS
    with torch.no_grad():
        ours = model(src, prev).log_softmax(-1)[:, :, fairseq_to_tfx(VOCAB)]
        sd = {k: v.double() for k, v in fairseq_state_dict(model).items()}
        to_fs = tfx_to_fairseq(VOCAB)
        fs_prev = to_fs[prev]
        fs_prev[:, 0] = FS_EOS  # fairseq's decoder starts from </s>
        theirs = fairseq_logits(sd, to_fs[src], fs_prev, heads=4, n_enc=2, n_dec=2).log_softmax(-1)
    torch.testing.assert_close(theirs, ours, atol=1e-10, rtol=1e-10)
