"""T-Fixup (Huang, Perez, Ba, Volkovs, ICML 2020, Sec. 3): train without LayerNorm or warmup.

Recipe, matching the paper and the authors' fairseq fork:

1. Xavier-init every parameter except the input embeddings; embeddings ~ N(0, d^-1/2).
2. No LayerNorm anywhere (a model that still has one is refused).
3. Encoder: scale ``v_proj``, ``out_proj``, ``fc1`` and ``fc2`` weights by 0.67 * N_enc^-1/4.
4. Decoder: scale ``v_proj`` and ``out_proj`` of self- *and* encoder-attention, ``fc1`` and
   ``fc2`` by (9 * N_dec)^-1/4.
5. Scale the input embeddings by (9 * N)^-1/4: the encoder's by N_enc, the decoder's by
   N_dec (the paper's Eq. and the reference both use (9N)^-1/4 for *both* embeddings;
   some write-ups use 0.67 * N^-1/4 for the encoder embedding, tfx does not). With all
   embeddings shared, the one table gets the encoder's factor.

q/k projections and all biases are untouched.

Gain convention: tfx's Xavier base uses gain 1 for every projection. The reference
starts from fairseq's gain 1/sqrt(2) for q/k/v and multiplies ``v_proj`` by sqrt(2)
before the T-Fixup factor, so its ``v_proj`` ends at gain 1 x factor -- exactly tfx's
value. Its q/k keep gain 1/sqrt(2); tfx's are at gain 1 (plain Xavier, as the paper
says). q/k only set the initial attention temperature and do not enter T-Fixup's bound.
"""

from __future__ import annotations

from tfx.init.scheme import Scheme, register
from tfx.init.xavier import ModelInputs, init_xavier, scale_, value_path_weights
from tfx.model import Transformer, has_layer_norm


def tfixup_encoder_scale(n_layers: int) -> float:
    """0.67 * N^-1/4 for the encoder's v/out/FFN weights."""
    return 0.67 * n_layers**-0.25


def tfixup_decoder_scale(n_layers: int) -> float:
    """(9N)^-1/4 for the decoder's v/out/FFN weights."""
    return (9 * n_layers) ** -0.25


def tfixup_embedding_scale(n_layers: int) -> float:
    """(9N)^-1/4 for an input embedding, N = layers of the stack it feeds."""
    return (9 * n_layers) ** -0.25


def init_tfixup(model: Transformer, seed: int = 1, batch: ModelInputs | None = None) -> None:
    if has_layer_norm(model):
        raise ValueError(
            f"init.name=tfixup needs a LayerNorm-free model (model.norm=none), got model.norm={model.norm!r}"
        )
    tfixup_weights(model, seed)


def tfixup_weights(model: Transformer, seed: int) -> None:
    """Steps 1, 3, 4 and 5 above on any model, LayerNorm or not: the one copy of the recipe, which ``init_tfixup``
    (LayerNorm refused) and ``tfixup_ln`` (Post-/Pre-LN kept) share."""
    init_xavier(model, seed)
    n_enc, n_dec = len(model.encoder.layers), len(model.decoder.layers)
    for layer in model.encoder.layers:
        scale_(value_path_weights(layer), tfixup_encoder_scale(n_enc))
    for layer in model.decoder.layers:
        scale_(value_path_weights(layer), tfixup_decoder_scale(n_dec))
    enc_embed, dec_embed = model.encoder.embedding.embed, model.decoder.embedding.embed
    scale_([enc_embed.weight], tfixup_embedding_scale(n_enc))
    if dec_embed is not enc_embed:
        scale_([dec_embed.weight], tfixup_embedding_scale(n_dec))


SCHEME = register(Scheme("tfixup", init_tfixup, needs_norm="none"))
