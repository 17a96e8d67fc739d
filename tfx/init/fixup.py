"""Fixup (Zhang, Dauphin, Ma, ICLR 2019) as its authors applied it to the Transformer.

Reference: hongyi-zhang/Fixup, ``fairseq/fairseq/models/transformer_zero.py`` and
``fairseq/fairseq/modules/multihead_attention_zero.py`` (architecture ``transformer_zero_iwslt_de_en``).
Fixup's rule: with L residual branches in the network, each branch of m layers gets its last
layer zeroed and the others scaled by L^(-1/(2m-2)), so every branch starts as zero and the
network as the identity on its residual stream. The reference counts L = 2 N_enc + 3 N_dec
(``num_blocks``) and sets, from Xavier-uniform:

- attention q/k/v (one packed ``in_proj_weight``) x L^(-1/6), ``out_proj`` = 0;
- FFN ``fc1`` x L^(-1/2), ``fc2`` = 0;
- the decoder's encoder-attention q/k/v x 12^(-1/6): its ``MultiheadAttentionZero`` is built
  without ``num_blocks``, so the class default 12 applies whatever the depth. tfx does the same;
  the paper's rule would use L;
- an untied output projection (``embed_out``) = 0 ("initialize the classification layer to 0");
- token embeddings N(0, d^-1/2), as tfx's base.

The scalar biases and multipliers are architecture (``tfx.model.residual.Fixup``); this scheme
only sets weights and refuses a model whose residual kind is not ``fixup``.

Differences, each deliberate (docs/methods.md, "Fixup"):
- tfx's Xavier base draws q, k and v as three (d, d) matrices at gain 1; the reference draws them
  as one (3d, d) matrix, an effective gain 1/sqrt(2) before the L^(-1/6) factor. tfx keeps its one
  base for every scheme (as for T-Fixup and DeepNorm).
- The reference's projections have no biases (``bias=False``) and its FFN has two more scalar
  shifts (after fc1, before fc2); tfx's projections keep their per-channel biases, zero at init, which
  contain those scalars. At init the function is the same.
"""

from __future__ import annotations

import torch

from tfx.init.scheme import Scheme, register
from tfx.init.xavier import ModelInputs, init_xavier, scale_
from tfx.model import DecoderLayer, EncoderLayer, MultiheadAttention, Transformer
from tfx.model.residual import Fixup

# MultiheadAttentionZero's default num_blocks, which the reference's encoder-attention keeps at any depth.
ENCODER_ATTENTION_BLOCKS = 12


def fixup_branches(n_enc: int, n_dec: int) -> int:
    """L: residual branches of an n_enc + n_dec encoder-decoder (2 per encoder layer, 3 per decoder layer)."""
    return 2 * n_enc + 3 * n_dec


def fixup_attention_scale(n_branches: int) -> float:
    """L^(-1/6) for q/k/v: Fixup's L^(-1/(2m-2)) with the reference's m = 4 for an attention branch."""
    return n_branches ** (-1 / 6)


def fixup_ffn_scale(n_branches: int) -> float:
    """L^(-1/2) for fc1: Fixup's L^(-1/(2m-2)) with m = 2 layers in the FFN branch."""
    return n_branches**-0.5


def _qkv(attn: MultiheadAttention) -> list[torch.Tensor]:
    return [attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]


def _zero_branch_ends(layer: EncoderLayer | DecoderLayer) -> None:
    """The last layer of every branch (attention out_proj, fc2) to 0: each branch starts as zero."""
    attns = [layer.self_attn] + ([layer.encoder_attn] if isinstance(layer, DecoderLayer) else [])
    scale_([a.out_proj.weight for a in attns] + [layer.ffn.fc2.weight], 0.0)


def _scale_layer(layer: EncoderLayer | DecoderLayer, n_branches: int) -> None:
    scale_(_qkv(layer.self_attn), fixup_attention_scale(n_branches))
    if isinstance(layer, DecoderLayer):
        scale_(_qkv(layer.encoder_attn), fixup_attention_scale(ENCODER_ATTENTION_BLOCKS))
    scale_([layer.ffn.fc1.weight], fixup_ffn_scale(n_branches))
    _zero_branch_ends(layer)


def init_fixup(model: Transformer, seed: int = 1, batch: ModelInputs | None = None) -> None:
    if not any(isinstance(m, Fixup) for m in model.modules()):
        raise ValueError(
            f"init.name=fixup needs model.norm=fixup (its scalar biases and multipliers), got {model.norm!r}"
        )
    init_xavier(model, seed)
    n_branches = fixup_branches(len(model.encoder.layers), len(model.decoder.layers))
    for layer in [*model.encoder.layers, *model.decoder.layers]:
        _scale_layer(layer, n_branches)
    if model.decoder.output_projection is not None:  # tied, the table is the input embedding: left as it is
        scale_([model.decoder.output_projection.weight], 0.0)


SCHEME = register(Scheme("fixup", init_fixup, needs_norm="fixup"))


__all__ = [
    "ENCODER_ATTENTION_BLOCKS",
    "fixup_attention_scale",
    "fixup_branches",
    "fixup_ffn_scale",
    "init_fixup",
]
