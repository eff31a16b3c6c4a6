"""A user's attention classifier with a temperature on its logits (a contrastive-style sharpening).

In FP32 a temperature of 1e6 makes the softmax near one-hot and the net still trains. In float16
the product `scores * self.temperature` is inf on the first step: the scalar itself (1e6 /
sqrt(dim)) is above 65504, so no loss scale can make a step finite. Keep the product's line where
it is: diagnose's case `case_temperature_attention` expects this file's line 27.
"""

import mindspore as ms
from mindspore import nn, ops


class TemperatureAttention(nn.Cell):
    """Single-head attention whose logits are multiplied by a temperature."""

    def __init__(self, dim: int, temperature: float):
        super().__init__()
        self.q = nn.Dense(dim, dim)
        self.k = nn.Dense(dim, dim)
        self.v = nn.Dense(dim, dim)
        self.temperature = temperature / dim ** 0.5

    def construct(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        # scores of every token against every token, then sharpened by the temperature
        scores = ops.bmm(q, k.swapaxes(1, 2))
        scores = scores * self.temperature  # the user's own op (a Python `*`): line 27
        attn = ops.softmax(scores, -1)
        return ops.bmm(attn, v)


class TemperatureNet(nn.Cell):
    """Rows of an 8x8 digit as 8 tokens of 8 pixels, attention, mean over tokens, a linear head."""

    def __init__(self, num_classes: int, image_size: int = 8, dim: int = 16, temperature: float = 1e6):
        super().__init__()
        self.image_size = image_size
        self.embed = nn.Dense(image_size, dim)
        self.attn = TemperatureAttention(dim, temperature)
        self.head = nn.Dense(dim, num_classes)

    def construct(self, x):
        tokens = self.embed(x.reshape(x.shape[0], self.image_size, self.image_size).astype(ms.float32))
        return self.head(self.attn(tokens).mean(1))
