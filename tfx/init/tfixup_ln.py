"""T-Fixup's initialization on a model that keeps its LayerNorms (Post-LN or Pre-LN): an ablation, not the paper's.

layer6ai-labs/T-Fixup#7 (open, unanswered since 2021-07-16) asks whether LayerNorm on top of T-Fixup helps; the
paper compares T-Fixup only with LayerNorm models at their own init and warmup. This scheme answers it in tfx:
exactly ``tfixup``'s weights (``tfixup.tfixup_weights``: the Xavier base, embeddings N(0, d^-1/2), v/out/FFN by
0.67 N_enc^-1/4 and (9 N_dec)^-1/4, embeddings by (9N)^-1/4, q/k and biases untouched) with every LayerNorm at
weight 1, bias 0. The methods ``tfixup_postln`` and ``tfixup_preln`` train it without warmup, as ``tfixup``.

The reference (layer6ai-labs/T-Fixup, fairseq/models/transformer.py and fairseq/modules/transformer_layer.py) has
two independent flags with no help text: ``--Tfixup`` (the scaling) and ``--dont-use-layernorm`` (drop every
LayerNorm). ``--Tfixup`` alone is this scheme on Post-LN, with ``--encoder/decoder-normalize-before`` on Pre-LN;
nothing checks the pair. Its README and example script only run both flags together, and it says nothing of the
combination: no note, no result.

What LayerNorm does to the argument: the factors were derived for the LN-free net (Sec. 3 bounds the Adam update's
change of the output when nothing rescales the residual stream), and that bound is not claimed here.

- Post-LN, LN(x + f(x)): every sublayer's output is rescaled to unit RMS anyway, so the embedding factor only sets
  the tokens' weight against the (unscaled) positions before the first LayerNorm, and the branch factors only set
  how small f(x) is against x inside each LayerNorm: a branch closer to the identity, the direction DeepNorm and
  Admin take by up-weighting x instead.
- Pre-LN, x + f(LN(x)): each branch reads a unit-RMS input, so the factors scale each branch's contribution to the
  stream directly, and the embedding factor sets the stream's starting size against them; the final LayerNorm
  rescales what the stack leaves.
"""

from __future__ import annotations

from tfx.init.scheme import Scheme, register
from tfx.init.tfixup import tfixup_weights
from tfx.init.xavier import ModelInputs
from tfx.model import Transformer

LAYER_NORM_KINDS = ("post", "pre")  # where T-Fixup's layers keep their LayerNorms; `none` is plain `tfixup`


def init_tfixup_ln(model: Transformer, seed: int = 1, batch: ModelInputs | None = None) -> None:
    if model.norm not in LAYER_NORM_KINDS:
        raise ValueError(
            f"init.name=tfixup_ln needs model.norm=post or pre (got {model.norm!r}); "
            "a LayerNorm-free model takes init.name=tfixup"
        )
    tfixup_weights(model, seed)


SCHEME = register(Scheme("tfixup_ln", init_tfixup_ln, needs_norm=LAYER_NORM_KINDS))
