"""A Post-LN tfx model in fairseq 0.12.2's ``transformer`` format, so ``fairseq-generate`` runs the same network.

Used by ``scripts/bench/bench_decode.py --peer`` to time fairseq's beam search on exactly tfx's weights. Everything
here is plain torch (no fairseq import); ``scripts/bench/fairseq_convert.py``, run by fairseq's own Python, builds
fairseq's model from ``fairseq_arch_args`` and loads ``fairseq_state_dict`` into it with ``strict=True``.

What has to line up (read from fairseq 0.12.2's ``Dictionary``, ``LearnedPositionalEmbedding``,
``TransformerDecoderBase`` and ``SequenceGenerator``):

* **Dictionary.** fairseq's first four ids are ``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3; tfx's are
  PAD 0, UNK 1, BOS 2, EOS 3 (``tfx.data.vocab``). Other ids keep their number. The four specials are
  placed by what each decoder blocks: fairseq never generates ``<pad>`` and ``<unk>`` gets ``--unkpen``
  subtracted, tfx never generates PAD and BOS. So tfx PAD -> ``<pad>``, tfx BOS -> ``<unk>`` (blocked with
  ``--unkpen inf``), tfx EOS -> ``</s>``, and tfx UNK -> ``<s>`` (generatable on both sides; fairseq's
  printer drops ``<s>`` from the hypothesis string, see ``parse_hypothesis``). The swap is its own inverse.
  Symbols in ``dict.txt`` are ``t<tfx id>``: no piece text to escape, and hypotheses map straight back.
* **Start token.** fairseq's decoder starts from ``</s>``, tfx's from BOS. The output projection needs the
  EOS row at ``</s>`` and the decoder's input embedding needs the BOS row there, so the fairseq model is
  written untied (no ``--share-decoder-input-output-embed``): the same matrices, the same arithmetic.
* **Positions.** fairseq's sinusoidal table starts at ``padding_idx + 1``, i.e. the first token gets
  sin/cos of position 2, tfx's of position 0. tfx's table goes into fairseq *learned* positional
  embeddings (``--encoder-learned-pos --decoder-learned-pos``), row ``2 + t`` = tfx row ``t``.
* **Layers.** Post-LN with LayerNorm (fairseq ``normalize_before`` False): q/k/v/out projections, fc1/fc2,
  ``self_attn_layer_norm``, ``encoder_attn_layer_norm``, ``final_layer_norm`` (tfx's residual blocks'
  ``norm``); no stack-final LayerNorm; token embeddings scaled by sqrt(d) on both sides.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tfx.data import BOS, EOS, PAD, UNK
from tfx.model import Transformer

FAIRSEQ_PAD = 1  # fairseq Dictionary: <s> 0, <pad> 1, </s> 2, <unk> 3
FAIRSEQ_EOS = 2
N_SPECIALS = 4
# fairseq id -> tfx id for the four specials (see the module docstring for why this placement).
SPECIALS_TFX = (UNK, PAD, EOS, BOS)
FAIRSEQ_SYMBOLS = ("<s>", "<pad>", "</s>", "<unk>")


def fairseq_to_tfx(vocab_size: int) -> Tensor:
    """(V,) long: the tfx id held by each fairseq id."""
    order = torch.arange(vocab_size)
    order[:N_SPECIALS] = torch.tensor(SPECIALS_TFX)
    return order


def tfx_to_fairseq(vocab_size: int) -> Tensor:
    """(V,) long: the fairseq id of each tfx id (the inverse permutation)."""
    order = fairseq_to_tfx(vocab_size)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(vocab_size)
    return inverse


def symbol(tfx_id: int) -> str:
    """The ``dict.txt`` symbol of a tfx id (fairseq's own name for the four specials)."""
    if tfx_id in SPECIALS_TFX:
        return FAIRSEQ_SYMBOLS[SPECIALS_TFX.index(tfx_id)]
    return f"t{tfx_id}"


def dictionary_lines(vocab_size: int) -> list[str]:
    """``dict.txt`` (``symbol count`` lines): fairseq ids 4.. in order; fairseq adds the specials itself."""
    order = fairseq_to_tfx(vocab_size).tolist()
    return [f"{symbol(t)} 1" for t in order[N_SPECIALS:]]


def source_line(tfx_ids: list[int]) -> str:
    """A source sentence as fairseq raw text (``--dataset-impl raw`` appends ``</s>``): drop tfx's EOS."""
    ids = tfx_ids[:-1] if tfx_ids and tfx_ids[-1] == EOS else tfx_ids
    return " ".join(symbol(t) for t in ids)


def parse_hypothesis(text: str) -> list[int]:
    """tfx ids of a fairseq ``H-`` hypothesis string. fairseq's ``Dictionary.string`` drops ``<s>`` (tfx
    UNK), so a hypothesis that contains UNK comes back without it (``strip_unk`` on the tfx side to compare)."""
    ids = []
    for sym in text.split():
        if not sym.startswith("t") or not sym[1:].isdigit():
            raise ValueError(f"fairseq hypothesis symbol {sym!r} is not a t<id> symbol")
        ids.append(int(sym[1:]))
    return ids


def strip_unk(tfx_ids: list[int]) -> list[int]:
    """What fairseq prints of a hypothesis with these ids (its printer drops ``<s>``, i.e. tfx UNK)."""
    return [t for t in tfx_ids if t != UNK]


def check_convertible(model: Transformer) -> None:
    if model.norm != "post":
        raise ValueError(
            f"model.norm={model.norm!r}: fairseq's transformer is Post-LN with LayerNorm; convert a method=postln model"
        )


def fairseq_arch_args(model: Transformer) -> list[str]:
    """fairseq-train style arguments that build this model's architecture (sizes given explicitly)."""
    check_convertible(model)
    enc, dec = model.encoder.layers, model.decoder.layers
    attn = enc[0].self_attn if len(enc) else dec[0].self_attn
    d_model = attn.heads * attn.head_dim
    ffn = (enc[0] if len(enc) else dec[0]).ffn.fc1.out_features
    positions = model.decoder.embedding.positions.size(0)
    args = ["--arch", "transformer_iwslt_de_en", "--encoder-learned-pos", "--decoder-learned-pos"]
    for side, n in (("encoder", len(enc)), ("decoder", len(dec))):
        args += [f"--{side}-layers", str(n), f"--{side}-embed-dim", str(d_model)]
        args += [f"--{side}-ffn-embed-dim", str(ffn), f"--{side}-attention-heads", str(attn.heads)]
    args += ["--max-source-positions", str(positions), "--max-target-positions", str(positions)]
    return args + ["--dropout", "0.0", "--attention-dropout", "0.0", "--activation-dropout", "0.0"]


def fairseq_positions(table: Tensor, pad: int = FAIRSEQ_PAD) -> Tensor:
    """tfx's (P, D) position table as fairseq learned positions (P + pad + 1, D): position t at row pad+1+t;
    rows up to ``pad`` (the padding position) are zero."""
    out = table.new_zeros(table.size(0) + pad + 1, table.size(1))
    out[pad + 1 :] = table
    return out


def _layer_params(prefix: str, layer: torch.nn.Module, decoder: bool) -> dict[str, Tensor]:
    """One layer's tensors under fairseq's names (tfx keeps the same names for attention and fc1/fc2)."""
    norms = {"self_attn_layer_norm": layer.self_attn_block.norm, "final_layer_norm": layer.ffn_block.norm}
    modules = {"self_attn": layer.self_attn, "fc1": layer.ffn.fc1, "fc2": layer.ffn.fc2}
    if decoder:
        norms["encoder_attn_layer_norm"] = layer.encoder_attn_block.norm
        modules["encoder_attn"] = layer.encoder_attn
    out = {}
    for name, module in {**modules, **norms}.items():
        for key, value in module.state_dict().items():
            out[f"{prefix}.{name}.{key}"] = value
    return out


def fairseq_state_dict(model: Transformer) -> dict[str, Tensor]:
    """Every parameter of fairseq's model (``fairseq_arch_args``), from ``model``'s weights, fp32 on CPU."""
    check_convertible(model)
    vocab = model.vocab_size
    order = fairseq_to_tfx(vocab)
    enc_embed = model.encoder.embedding.embed.weight
    dec_embed = model.decoder.embedding.embed.weight
    dec_input = dec_embed[order].clone()
    dec_input[FAIRSEQ_EOS] = dec_embed[BOS]  # fairseq's decoder starts from </s>, tfx's from BOS
    sd = {
        "encoder.embed_tokens.weight": enc_embed[order],
        "encoder.embed_positions.weight": fairseq_positions(model.encoder.embedding.positions),
        "decoder.embed_tokens.weight": dec_input,
        "decoder.embed_positions.weight": fairseq_positions(model.decoder.embedding.positions),
        "decoder.output_projection.weight": model.decoder.output_weight()[order],
    }
    for i, layer in enumerate(model.encoder.layers):
        sd.update(_layer_params(f"encoder.layers.{i}", layer, decoder=False))
    for i, layer in enumerate(model.decoder.layers):
        sd.update(_layer_params(f"decoder.layers.{i}", layer, decoder=True))
    return {k: v.detach().float().cpu().contiguous() for k, v in sd.items()}


__all__ = [
    "dictionary_lines",
    "fairseq_arch_args",
    "fairseq_positions",
    "fairseq_state_dict",
    "fairseq_to_tfx",
    "parse_hypothesis",
    "source_line",
    "strip_unk",
    "symbol",
    "tfx_to_fairseq",
]
