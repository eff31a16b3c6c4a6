"""A user's classifier that sharpens its logits on a schedule, as annealed-temperature recipes do
(Gumbel-softmax, self-distillation): every training step multiplies the sharpening by `growth`.

The sharpening starts at 1 and grows by 5% a step (1.05**150 = 1.5e3, 1.05**200 = 1.7e4,
1.05**250 = 2e5). The logits, of order 1 to 10 on digits, times it pass 65504 somewhere between
step 150 and 250, in float16 only: FP32's logits reach 1e6, its softmax is one-hot and it keeps
training. So the failure shows late, long after a 50-step replay. Keep the product's line where
it is: diagnose's case `case_annealed_sharpening` expects this file's line 24.
"""

import mindspore as ms
from mindspore import nn, ops


class Sharpen(nn.Cell):
    """Logits times a sharpening factor that grows by `growth` on every training step."""

    def __init__(self, growth: float):
        super().__init__()
        self.growth = growth
        self.factor = ms.Parameter(ms.Tensor(1.0, ms.float32), name="factor", requires_grad=False)

    def construct(self, logits):
        sharpened = logits * self.factor.astype(logits.dtype)  # the user's own op (a Python `*`): line 24
        if self.training:
            ops.assign(self.factor, self.factor * self.growth)
        return sharpened


class AnnealedNet(nn.Cell):
    """An MLP on flattened images, a linear head, then the annealed sharpening."""

    def __init__(self, in_channels: int, image_size: int, num_classes: int, width: int = 64, growth: float = 1.05):
        super().__init__()
        self.body = nn.SequentialCell([nn.Dense(in_channels * image_size * image_size, width), nn.ReLU()])
        self.head = nn.Dense(width, num_classes)
        self.sharpen = Sharpen(growth)

    def construct(self, x):
        return self.sharpen(self.head(self.body(x.reshape(x.shape[0], -1))))
