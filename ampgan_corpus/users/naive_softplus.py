"""A user's MLP with a hand-written "sharp" softplus, log(1 + exp(beta * x)) / beta.

With beta = 20 the exponent passes float16's 11.09 (exp(11.09) = 65504) as soon as a hidden
pre-activation exceeds 0.55: inf in float16, and inf / inf later is NaN. FP32 holds exp(20 * x)
up to x = 4.4, which these activations never reach. Diagnose's case `case_naive_softplus` expects
the `ops.exp` on this file's line 20.
"""

from mindspore import nn, ops


class SharpSoftplus(nn.Cell):
    """softplus(beta * x) / beta, written the naive way."""

    def __init__(self, beta: float):
        super().__init__()
        self.beta = beta

    def construct(self, x):
        return ops.log(1.0 + ops.exp(self.beta * x)) / self.beta


class SoftplusMLP(nn.Cell):
    """Flattened image -> Dense -> sharp softplus -> Dense."""

    def __init__(self, num_classes: int, in_features: int = 64, hidden: int = 64, beta: float = 20.0):
        super().__init__()
        self.fc1 = nn.Dense(in_features, hidden)
        self.act = SharpSoftplus(beta)
        self.fc2 = nn.Dense(hidden, num_classes)

    def construct(self, x):
        return self.fc2(self.act(self.fc1(x.reshape(x.shape[0], -1))))
