"""tfx/model/attention.py: self-attention projects q, k and v as one GEMM and encoder-decoder attention k and v,
with the separate modules' weights: the same outputs as projecting each on its own (CPU, fp32, 1e-6), in
training and while decoding step by step with a cache."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from tfx.model.attention import KVCache, MultiheadAttention

GEMMS = (torch.ops.aten.addmm, torch.ops.aten.mm, torch.ops.aten.bmm)


class CountGemms(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.count += func.overloadpacket in GEMMS
        return func(*args, **(kwargs or {}))


def separate(attn: MultiheadAttention, query: torch.Tensor, kv: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """The attention with q, k and v projected one by one (what tfx did before, and fairseq does)."""
    heads = lambda x: x.view(x.size(0), x.size(1), attn.heads, attn.head_dim).transpose(1, 2)  # noqa: E731
    q, k, v = heads(attn.q_proj(query)), heads(attn.k_proj(kv)), heads(attn.v_proj(kv))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal).transpose(1, 2).reshape(query.shape)
    return attn.out_proj(out)


def test_self_and_cross_attention_are_one_projection_gemm_with_the_same_outputs() -> None:
    torch.manual_seed(0)
    attn = MultiheadAttention(32, 4)
    x, source = torch.randn(3, 7, 32), torch.randn(3, 5, 32)
    with CountGemms() as gemms:
        out = attn(x, x, causal=True)
    assert gemms.count == 2  # q/k/v together, then out_proj
    torch.testing.assert_close(out, separate(attn, x, x, causal=True), rtol=1e-6, atol=1e-6)
    with CountGemms() as gemms:
        out = attn(x, source)
    assert gemms.count == 3  # q; k/v together; out_proj
    torch.testing.assert_close(out, separate(attn, x, source), rtol=1e-6, atol=1e-6)


def test_decoding_step_by_step_matches_the_whole_sequence() -> None:
    torch.manual_seed(1)
    attn, x = MultiheadAttention(32, 4).eval(), torch.randn(2, 6, 32)
    self_cache, steps = KVCache(4), []
    with torch.no_grad():
        for t in range(6):
            steps.append(attn(x[:, t : t + 1], x[:, t : t + 1], cache=self_cache))
        torch.testing.assert_close(torch.cat(steps, 1), separate(attn, x, x, causal=True), rtol=1e-5, atol=1e-6)
        source, cross_cache = torch.randn(2, 5, 32), KVCache()
        first = attn(x[:, :1], source, cache=cross_cache, static_kv=True)
        with CountGemms() as gemms:
            second = attn(x[:, 1:2], source, cache=cross_cache, static_kv=True)
        assert gemms.count == 2  # the source's keys and values come from the cache: q and out_proj only
        torch.testing.assert_close(torch.cat([first, second], 1), separate(attn, x[:, :2], source), rtol=1e-5,
                                   atol=1e-6)  # fmt: skip
