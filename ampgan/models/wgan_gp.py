"""WGAN-GP generator and critic. The critic has no batch norm (the penalty is per sample)."""

from __future__ import annotations

from mindspore import nn, ops

from ampgan.models.layers import mlp, scale_init, upsamples_for


class Generator(nn.Cell):
    """z -> sample. MLP for 2-D points; Dense + transposed convs + tanh for (1, S, S) images."""

    def __init__(self, z_dim: int, sample_shape: tuple[int, ...], hidden: int, depth: int):
        super().__init__()
        self.sample_shape = tuple(sample_shape)
        if len(sample_shape) == 1:
            self.body = mlp([z_dim] + [hidden] * depth + [sample_shape[0]])
        else:
            n_up = upsamples_for(sample_shape[-1])
            ch = hidden * 2 ** (n_up - 1)
            self.project = nn.Dense(z_dim, ch * 16)
            self.map_channels = ch
            ups: list[nn.Cell] = [nn.ReLU()]
            for i in range(n_up):
                out = sample_shape[0] if i == n_up - 1 else ch // 2
                ups.append(nn.Conv2dTranspose(ch, out, 4, stride=2, pad_mode="same", has_bias=True))
                ups.append(nn.Tanh() if i == n_up - 1 else nn.ReLU())
                ch //= 2
            self.body = nn.SequentialCell(ups)
        self.is_image = len(sample_shape) > 1

    def construct(self, z):
        if self.is_image:
            h = self.project(z).reshape((-1, self.map_channels, 4, 4))
            return self.body(h)
        return self.body(z)


class Critic(nn.Cell):
    """sample -> score. MLP for points; strided convs + Dense for images. No normalisation layers.

    Two knobs for planted float16 failures (diagnose's corpus), both off by default:
    `gain` multiplies every initial weight and bias (0.01: gradients far below float16's
    range); `input_scale` multiplies the input and divides the first layer's initial weights
    by the same factor, so the function is unchanged but the gradient with respect to the
    scaled input (the penalty's inner gradient) is 1/input_scale times larger.
    """

    def __init__(self, sample_shape: tuple[int, ...], hidden: int, depth: int, gain: float = 1.0,
                 input_scale: float = 1.0):
        super().__init__()
        self.input_scale = float(input_scale)
        if len(sample_shape) == 1:
            self.features = nn.SequentialCell([nn.Identity()])
            self.score = mlp([sample_shape[0]] + [hidden] * depth + [1])
        else:
            n_down = upsamples_for(sample_shape[-1])
            convs: list[nn.Cell] = []
            ch_in, ch = sample_shape[0], hidden
            for _ in range(n_down):
                convs += [nn.Conv2d(ch_in, ch, 4, stride=2, pad_mode="same", has_bias=True), nn.ReLU()]
                ch_in, ch = ch, ch * 2
            convs.append(nn.Flatten())
            self.features = nn.SequentialCell(convs)
            self.score = nn.Dense(ch_in * 16, 1)
        if gain != 1.0 or input_scale != 1.0:
            scale_init(self, gain, first_layer=1.0 / self.input_scale)

    def construct(self, x):
        if self.input_scale != 1.0:
            x = x * self.input_scale
        return ops.squeeze(self.score(self.features(x)), -1)
