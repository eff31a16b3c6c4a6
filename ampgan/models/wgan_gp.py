"""WGAN-GP generator and critic. The critic has no batch norm (the penalty is per sample)."""

from __future__ import annotations

from mindspore import nn, ops

from ampgan.models.layers import mlp, upsamples_for


class Generator(nn.Cell):
    """z -> sample. MLP for 2-D points; Dense + transposed convs + tanh for (1, S, S) images."""

    def __init__(self, z_dim: int, sample_shape: tuple[int, ...], hidden: int, depth: int):
        super().__init__()
        sample_shape = self.sample_shape = tuple(sample_shape)
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
    """sample -> score. MLP for points; strided convs + Dense for images. No normalisation layers."""

    def __init__(self, sample_shape: tuple[int, ...], hidden: int, depth: int):
        super().__init__()
        sample_shape = tuple(sample_shape)
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

    def construct(self, x):
        return ops.squeeze(self.score(self.features(x)), -1)
