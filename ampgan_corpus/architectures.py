"""The planted corpus on real architectures: ampgan's zoo nets (`ampgan.models`: VisionTransformer,
CausalTransformer, ResNet) as a user changes them, each change a constructor knob that a preset
(`conf/experiment/diag_*.yaml`) sets. With every knob at its default each computes what the zoo's
net computes.

Transformers (`PlantedViT`, `PlantedLM`): their blocks are `PlantedBlock`s, whose attention is
`PlantedAttention`:
  qk_gain      the first block's q and k projections start `qk_gain` times larger (large init):
               q.k grows with qk_gain^2 and passes 65504 in float16, while FP32's softmax of
               big but finite logits is fine;
  prescale     q is multiplied by 1/sqrt(head_dim) before q.k (not the logits after it): the
               matmul's result is sqrt(head_dim) times smaller (scaled logits);
  qk_norm      q and k are layer-normalised per head before q.k (qk-norm, Dehghani et al. 2023):
               |logit| <= sqrt(head_dim) whatever the weights (the zoo's own `Attention(qk_norm=True)`).
Cell paths are the zoo's: `blocks.0.attn`, `blocks.0.attn.qkv`, `blocks.0.norm1`, `norm`, `head`
(plus `blocks.0.attn.q_norm` / `k_norm` with qk_norm). `PlantedViT` has two knobs of a user's own
pipeline as well: raw pixel counts in (`pixel_max`) and a hand-written LayerNorm on the patch
embedding (`embed_norm`, a `HandLayerNorm`).

`TwiceAveragedTokenCE`: the LM's loss as a user miswrites it, the mean over tokens divided by
the number of tokens once more.

`RawPixelResNet`: the zoo's ResNet fed raw sensor counts: the [-1, 1] images mapped to
0 .. `pixel_max` (a user who forgot to normalise 12-bit camera data).
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from ampgan.models.zoo import Attention, Block, CausalTransformer, ResNet, VisionTransformer
from ampgan.tasks.lm import TokenCrossEntropy


class PlantedAttention(Attention):
    """The zoo's multi-head attention with a large-init, a pre-scaling and a qk-norm knob (see the module)."""

    def __init__(self, dim: int, heads: int, causal_len: int = 0, qk_gain: float = 1.0, prescale: bool = False,
                 qk_norm: bool = False):
        super().__init__(dim, heads, causal_len, qk_norm)   # qk_norm: the zoo's own (q_norm, k_norm)
        self.prescale = bool(prescale)
        if qk_gain != 1.0:   # rows 0 .. 2*dim of the fused projection are q and k
            w = self.qkv.weight.asnumpy().copy()
            w[: 2 * dim] *= qk_gain
            self.qkv.weight.set_data(ms.Tensor(w))

    def construct(self, x):
        b, n, d = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, self.head_dim).transpose(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]                         # (b, heads, n, head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.prescale:
            logits = self.logits(ops.matmul(q * self.scale, k.swapaxes(-1, -2)))
        else:
            logits = self.logits(ops.matmul(q, k.swapaxes(-1, -2)) * self.scale)
        if self.causal:
            logits = logits + self.mask[:n, :n].astype(logits.dtype)
        out = ops.matmul(self.softmax(logits), v)
        return self.proj(out.transpose(0, 2, 1, 3).reshape(b, n, d))


class PlantedBlock(Block):
    """The zoo's pre-LN block with `PlantedAttention`."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int = 2, causal_len: int = 0, **attention):
        super().__init__(dim, heads, mlp_ratio, causal_len)
        self.attn = PlantedAttention(dim, heads, causal_len, **attention)


def _planted_blocks(dim: int, depth: int, heads: int, mlp_ratio: int, causal_len: int, qk_gain: float,
                    prescale: bool, qk_norm: bool) -> nn.SequentialCell:
    """`depth` planted blocks; the large init (qk_gain) in the first one only."""
    return nn.SequentialCell([PlantedBlock(dim, heads, mlp_ratio, causal_len,
                                           qk_gain=qk_gain if i == 0 else 1.0, prescale=prescale, qk_norm=qk_norm)
                              for i in range(depth)])


class HandLayerNorm(nn.Cell):
    """LayerNorm as users write it by hand, in one pass: the variance as the mean of squares minus
    the squared mean. Not `nn.LayerNorm`, so no AMP level keeps it in FP32: in float16 features
    beyond 256 square past 65504, and a mean beyond 256 makes the variance inf - inf = NaN."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.gamma = ms.Parameter(ms.Tensor(np.ones(dim, np.float32)), name="gamma")
        self.beta = ms.Parameter(ms.Tensor(np.zeros(dim, np.float32)), name="beta")
        self.eps = eps

    def construct(self, x):
        mean = x.mean(-1, keep_dims=True)
        var = (x * x).mean(-1, keep_dims=True) - mean * mean
        return (x - mean) / ops.sqrt(var + self.eps) * self.gamma.astype(x.dtype) + self.beta.astype(x.dtype)


class PlantedViT(VisionTransformer):
    """The zoo's VisionTransformer with planted blocks (knobs: see the module), and two of a user's
    own: `pixel_max` > 0 feeds raw pixel counts (the [-1, 1] images mapped to 0 .. pixel_max);
    `embed_norm` normalises the patch embedding with a `HandLayerNorm` (cell path `embed_norm`)."""

    def __init__(self, in_channels: int, num_classes: int, image_size: int, patch: int = 2, dim: int = 32,
                 depth: int = 2, heads: int = 4, mlp_ratio: int = 2, qk_gain: float = 1.0, prescale: bool = False,
                 qk_norm: bool = False, pixel_max: float = 0.0, embed_norm: bool = False):
        super().__init__(in_channels, num_classes, image_size, patch, dim, depth, heads, mlp_ratio)
        self.blocks = _planted_blocks(dim, depth, heads, mlp_ratio, 0, qk_gain, prescale, qk_norm)
        self.pixel_max = float(pixel_max)
        self.embed_norm = HandLayerNorm(dim) if embed_norm else nn.Identity()

    def construct(self, x):
        if self.pixel_max > 0:
            x = (x + 1.0) * (0.5 * self.pixel_max)
        h = self.patch(x)                                    # (b, dim, s, s)
        b, d = h.shape[0], h.shape[1]
        h = self.embed_norm(h.reshape(b, d, -1).transpose(0, 2, 1))
        h = self.blocks(h + self.pos.astype(h.dtype))
        return self.head(self.norm(h).mean(1))


class PlantedLM(CausalTransformer):
    """The zoo's CausalTransformer with planted blocks (knobs: see the module)."""

    def __init__(self, vocab_size: int, seq_len: int, dim: int = 64, depth: int = 2, heads: int = 4,
                 mlp_ratio: int = 4, qk_gain: float = 1.0, prescale: bool = False, qk_norm: bool = False):
        super().__init__(vocab_size, seq_len, dim, depth, heads, mlp_ratio)
        self.blocks = _planted_blocks(dim, depth, heads, mlp_ratio, seq_len, qk_gain, prescale, qk_norm)


class TwiceAveragedTokenCE(TokenCrossEntropy):
    """The mean next-token cross-entropy divided by the number of tokens again (a mean of a mean):
    every gradient is 1/(batch x seq_len) of the right one. Adam's steps do not depend on the
    gradient's scale, so FP32 trains as before; float16 at loss scale 1 flushes what falls below 6e-8."""

    def construct(self, logits, labels):
        return super().construct(logits, labels) / (labels.shape[0] * labels.shape[1])


class RawPixelResNet(ResNet):
    """The zoo's ResNet fed raw sensor counts: images in [-1, 1] mapped to 0 .. `pixel_max`."""

    def __init__(self, in_channels: int, num_classes: int, width: int = 16, blocks: tuple[int, ...] = (1, 1, 1),
                 pixel_max: float = 1.0):
        super().__init__(in_channels, num_classes, width, tuple(blocks))
        self.pixel_max = float(pixel_max)

    def construct(self, x):
        return super().construct((x + 1.0) * (0.5 * self.pixel_max))


__all__ = ["HandLayerNorm", "PlantedAttention", "PlantedBlock", "PlantedLM", "PlantedViT", "RawPixelResNet",
           "TwiceAveragedTokenCE"]
