"""Nets people actually train, small enough for the CPU: a ResNet, a pre-LayerNorm vision
transformer and a causal transformer language model (model=lm). Each is a `model.net` target (`model.net._target_=ampgan.models.ResNet`) and takes
the data's shape by name, as a user's net does.

Their float16 hazards are the real ones: BatchNorm statistics and residual sums (ResNet); the
q.k logits, the softmax, LayerNorm and GELU (transformer). Cell paths for `amp.keep_fp32`:
`stem`, `stages.0.0.conv1`, `head` (ResNet); `patch`, `blocks.0.attn`, `blocks.0.attn.qkv`,
`blocks.0.norm1`, `blocks.0.mlp`, `norm`, `head` (transformer); `embed`, `blocks.0.attn`, `norm`,
`head` (language model); with `qk_norm`, `blocks.0.attn.q_norm` and `k_norm` too. The attention
logits are the output of `blocks.0.attn.logits` (an identity cell: the headroom records them).
"""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
from mindspore import nn, ops
from mindspore.common.initializer import TruncatedNormal, initializer


# ---------------------------------------------------------------- ResNet
class BasicBlock(nn.Cell):
    """conv-BN-ReLU-conv-BN plus the input (a 1x1 conv + BN when the shape changes), then ReLU."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, pad_mode="same")
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, pad_mode="same")
        self.bn2 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU()
        self.down = None
        if stride != 1 or c_in != c_out:
            self.down = nn.SequentialCell([nn.Conv2d(c_in, c_out, 1, stride=stride), nn.BatchNorm2d(c_out)])

    def construct(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        skip = x if self.down is None else self.down(x)
        return self.relu(out + skip)


class ResNet(nn.Cell):
    """A stem, `len(blocks)` stages of BasicBlocks (each after the first halves the map and
    doubles the width), global average pooling, a Dense head."""

    def __init__(self, in_channels: int, num_classes: int, width: int = 16, blocks: tuple[int, ...] = (1, 1, 1)):
        super().__init__()
        self.stem = nn.SequentialCell([nn.Conv2d(in_channels, width, 3, pad_mode="same"), nn.BatchNorm2d(width),
                                       nn.ReLU()])
        stages, c = [], width
        for i, n in enumerate(blocks):
            c_out = width * 2 ** i
            stage = [BasicBlock(c, c_out, stride=1 if i == 0 else 2)] + [BasicBlock(c_out, c_out) for _ in range(n - 1)]
            stages.append(nn.SequentialCell(stage))
            c = c_out
        self.stages = nn.SequentialCell(stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.head = nn.Dense(c, num_classes)

    def construct(self, x):
        return self.head(self.flatten(self.pool(self.stages(self.stem(x)))))


# ---------------------------------------------------------------- transformer
class Attention(nn.Cell):
    """Multi-head self-attention: softmax(q k^T / sqrt(d)) v, heads merged by a Dense.

    `qk_norm`: q and k are layer-normalised per head before q.k (qk-layernorm, Dehghani et al.
    2023; Wortsman et al. 2023): |logit| <= sqrt(head_dim) times the norms' gains, whatever the
    weights. The scaled logits q.k / sqrt(d) pass through `logits`, an identity cell, before the
    causal mask: a leaf cell whose output the activation headroom records, so a run logs its
    largest attention logit as `act/blocks.<i>.attn.logits/max_abs` (an identity adds no op)."""

    def __init__(self, dim: int, heads: int, causal_len: int = 0, qk_norm: bool = False):
        """`causal_len` > 0: a causal mask for sequences up to that length (token i sees 0..i)."""
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not a multiple of heads {heads}")
        self.heads, self.head_dim = heads, dim // heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.qkv = nn.Dense(dim, 3 * dim)
        self.proj = nn.Dense(dim, dim)
        self.softmax = nn.Softmax(axis=-1)
        self.qk_norm = bool(qk_norm)
        if self.qk_norm:
            self.q_norm = nn.LayerNorm((self.head_dim,))
            self.k_norm = nn.LayerNorm((self.head_dim,))
        self.logits = nn.Identity()   # the attention logits as a cell output (activation headroom)
        self.causal = causal_len > 0
        # added to the logits: 0 where a token may look, -1e4 (finite in float16) where it may not
        self.mask = ms.Tensor(np.triu(np.full((causal_len, causal_len), -1e4, np.float32), 1)) if self.causal else None

    def construct(self, x):
        b, n, d = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, self.head_dim).transpose(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]                         # (b, heads, n, head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        logits = self.logits(ops.matmul(q, k.swapaxes(-1, -2)) * self.scale)  # (b, heads, n, n)
        if self.causal:
            logits = logits + self.mask[:n, :n].astype(logits.dtype)
        out = ops.matmul(self.softmax(logits), v)                # (b, heads, n, head_dim)
        return self.proj(out.transpose(0, 2, 1, 3).reshape(b, n, d))


class Block(nn.Cell):
    """Pre-LayerNorm transformer block: x + attn(LN(x)), then x + MLP(LN(x)) with GELU."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int = 2, causal_len: int = 0, qk_norm: bool = False):
        super().__init__()
        self.norm1 = nn.LayerNorm((dim,))
        self.attn = Attention(dim, heads, causal_len, qk_norm)
        self.norm2 = nn.LayerNorm((dim,))
        self.mlp = nn.SequentialCell([nn.Dense(dim, mlp_ratio * dim), nn.GELU(), nn.Dense(mlp_ratio * dim, dim)])

    def construct(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Cell):
    """Patch embedding (a strided conv), learned positions, pre-LN blocks, a final LayerNorm,
    the tokens' mean, a Dense head (ViT, Dosovitskiy et al. 2021, with mean pooling)."""

    def __init__(self, in_channels: int, num_classes: int, image_size: int, patch: int = 2, dim: int = 32,
                 depth: int = 2, heads: int = 4, mlp_ratio: int = 2):
        super().__init__()
        if image_size % patch:
            raise ValueError(f"image_size {image_size} is not a multiple of patch {patch}")
        tokens = (image_size // patch) ** 2
        self.patch = nn.Conv2d(in_channels, dim, patch, stride=patch, has_bias=True)
        self.pos = ms.Parameter(initializer(TruncatedNormal(0.02), (1, tokens, dim), ms.float32), name="pos")
        self.blocks = nn.SequentialCell([Block(dim, heads, mlp_ratio) for _ in range(depth)])
        self.norm = nn.LayerNorm((dim,))
        self.head = nn.Dense(dim, num_classes)

    def construct(self, x):
        h = self.patch(x)                                    # (b, dim, s, s)
        b, d = h.shape[0], h.shape[1]
        h = h.reshape(b, d, -1).transpose(0, 2, 1)           # (b, tokens, dim)
        h = self.blocks(h + self.pos.astype(h.dtype))
        return self.head(self.norm(h).mean(1))


class CausalTransformer(nn.Cell):
    """A GPT-style language model: token embedding, learned positions, pre-LN causal blocks, a
    final LayerNorm and a Dense head to next-token logits `(batch, seq_len, vocab_size)`.
    `qk_norm=True` layer-normalises q and k in every block (`Attention`; `+model.net.qk_norm=true`)."""

    def __init__(self, vocab_size: int, seq_len: int, dim: int = 64, depth: int = 2, heads: int = 4,
                 mlp_ratio: int = 4, qk_norm: bool = False):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim, embedding_table=TruncatedNormal(0.02))
        self.pos = ms.Parameter(initializer(TruncatedNormal(0.02), (1, seq_len, dim), ms.float32), name="pos")
        self.blocks = nn.SequentialCell([Block(dim, heads, mlp_ratio, causal_len=seq_len, qk_norm=qk_norm)
                                         for _ in range(depth)])
        self.norm = nn.LayerNorm((dim,))
        self.head = nn.Dense(dim, vocab_size)

    def construct(self, tokens):
        h = self.embed(tokens)                               # (b, n, dim)
        h = self.blocks(h + self.pos[:, : tokens.shape[1]].astype(h.dtype))
        return self.head(self.norm(h))
