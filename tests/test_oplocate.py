"""Op-level locate: the first op whose float16 result leaves float16's range, in a user's own net
(a file outside the package), its cell, shape, source line and FP32 value; kept-FP32 cells and
NaN-fed ops are not blamed; every hook is gone afterwards, also when the forward raises; and
diagnose names the op on the planted forward-overflow case."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops
from mindspore.ops.primitive import Primitive

from ampgan.amp.float16 import FP16_MAX
from ampgan.amp.policy import apply_amp
from ampgan.diagnose.oplocate import OpRecorder, first_bad_gradient, first_bad_op, record_ops

USER_ATTENTION = '''
import numpy as np
import mindspore as ms
from mindspore import nn, ops


class Attention(nn.Cell):
    """Single-head attention; q and k are the input itself (identity weights, no bias)."""

    def __init__(self, dim: int):
        super().__init__()
        self.q = nn.Dense(dim, dim, weight_init="ones", has_bias=False)
        self.k = nn.Dense(dim, dim, weight_init="ones", has_bias=False)
        self.v = nn.Dense(dim, dim, has_bias=False)
        eye = ms.Tensor(np.eye(dim, dtype=np.float32))
        self.q.weight.set_data(eye)
        self.k.weight.set_data(eye)

    def construct(self, x):
        q, k = self.q(x), self.k(x)
        logits = ops.matmul(q, k.swapaxes(-1, -2))   # the q.k product
        return ops.matmul(ops.softmax(logits, -1), self.v(x))


class UserNet(nn.Cell):
    def __init__(self, dim: int = 8):
        super().__init__()
        self.embed = nn.Dense(dim, dim)
        self.attn = Attention(dim)
        self.head = nn.Dense(dim, 3)

    def construct(self, x):
        return self.head(self.attn(x).mean(1))


class Mask(nn.Cell):
    """The model's own -inf: a causal mask, there in FP32 too."""

    def construct(self, logits):
        n = logits.shape[-1]
        upper = ms.Tensor(np.triu(np.ones((n, n), np.bool_), 1))
        return ops.softmax(ops.masked_fill(logits, upper, float("-inf")), -1)


class Scale(nn.Cell):
    def __init__(self, factor: float):
        super().__init__()
        self.factor = factor

    def construct(self, x):
        return x * self.factor


class Chain(nn.Cell):
    """mask (the model's own -inf), then `big` (x times big_factor), then `amp_cell` (times 2)."""

    def __init__(self, big_factor: float):
        super().__init__()
        self.mask = Mask()
        self.big = Scale(big_factor)
        self.amp_cell = Scale(2.0)

    def construct(self, x):
        masked = self.mask(x)
        return self.amp_cell(self.big(x)) + masked


class Raises(nn.Cell):
    def construct(self, x):
        y = x * 2
        raise RuntimeError("the user's forward fails")
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """`userattn.py` in a folder outside the repo, imported as a user's module."""
    folder = tmp_path / "user_code"
    folder.mkdir()
    (folder / "userattn.py").write_text(textwrap.dedent(USER_ATTENTION))
    monkeypatch.syspath_prepend(str(folder))
    yield importlib.import_module("userattn")
    sys.modules.pop("userattn", None)


def twins(make, level: str = "O2", keep_fp32=()):
    """(AMP net, FP32 twin) of `make()`, the twin holding the AMP net's initial weights."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    fp32, amp = make(), make()
    for p, q in zip(amp.get_parameters(), fp32.get_parameters()):
        q.set_data(ms.Tensor(p.asnumpy()))
    return apply_amp(amp, level, list(keep_fp32)), amp, fp32


def hit_for(make, x: np.ndarray, **amp):
    net_amp, amp_root, fp32 = twins(make, **amp)
    inputs = ms.Tensor(x)
    amp_calls = record_ops({"": amp_root}, lambda: net_amp(inputs))
    fp32_calls = record_ops({"": fp32}, lambda: fp32(inputs))
    return first_bad_op(amp_calls, fp32_calls), amp_calls


def test_a_users_attention_overflow_is_the_qk_matmul_at_its_line(user_module):
    x = np.full((2, 4, 8), 100.0, np.float32)      # q.k = 8 * 100 * 100 = 8e4: beyond float16, not FP32
    hit, calls = hit_for(user_module.UserNet, x)
    assert hit is not None
    assert hit.cell == "attn"
    assert hit.op == "ops.matmul"       # as the user wrote it; not the softmax, which gets the inf
    assert hit.shape == (2, 4, 4)
    assert not np.isfinite(hit.amp_max)
    assert np.isfinite(hit.fp32_max) and hit.fp32_max > FP16_MAX
    assert hit.fp32_max == pytest.approx(8e4, rel=1e-3)
    source = Path(user_module.__file__)
    line = 1 + source.read_text().splitlines().index(
        next(t for t in source.read_text().splitlines() if "the q.k product" in t))
    assert (Path(hit.file).resolve(), hit.line) == (source.resolve(), line)
    softmax = [c for c in calls if "softmax" in c.op.lower() and c.cell == "attn"]
    assert softmax and softmax[0].nonfinite > 0 and softmax[0].nonfinite_in > 0  # NaN-fed: not the origin


def test_an_op_in_a_cell_kept_in_fp32_is_blamed_only_beyond_float16s_range(user_module):
    x = np.full((1, 4, 4), 100.0, np.float32)
    # big: 100 * 600 = 6e4 in FP32 (kept) is within float16's range; amp_cell's 1.2e5 in float16 is not
    hit, _ = hit_for(lambda: user_module.Chain(600.0), x, keep_fp32=["big"])
    assert (hit.cell, hit.op, hit.shape) == ("amp_cell", "Tensor.__mul__", (1, 4, 4))
    assert not np.isfinite(hit.amp_max) and hit.fp32_max == pytest.approx(1.2e5)
    # big: 100 * 700 = 7e4, finite in FP32, but cast back to float16 it is inf: that op is the origin
    hit, _ = hit_for(lambda: user_module.Chain(700.0), x, keep_fp32=["big"])
    assert (hit.cell, hit.op) == ("big", "Tensor.__mul__")
    assert hit.amp_max == pytest.approx(7e4) and hit.fp32_max == pytest.approx(7e4)
    # nothing beyond the range: the masks' -inf (the model's own, in FP32 too) is not float16's
    hit, calls = hit_for(lambda: user_module.Chain(1.0), x, keep_fp32=["big"])
    assert hit is None
    assert any(c.cell == "mask" and c.nonfinite > 0 for c in calls)


def test_an_op_fed_nan_is_not_the_origin(user_module):
    x = np.full((1, 4, 4), 100.0, np.float32)
    x[0, 0, 0] = np.nan          # NaN in the data: in the FP32 twin too, nothing is float16's
    hit, calls = hit_for(lambda: user_module.Chain(1.0), x)
    assert hit is None and calls[-1].nonfinite > 0
    # float16's inf at `big` (100 * 1000), NaN-free data: `amp_cell` gets inf and is not blamed
    hit, _ = hit_for(lambda: user_module.Chain(1000.0), np.full((1, 4, 4), 100.0, np.float32))
    assert (hit.cell, hit.op) == ("big", "Tensor.__mul__")


def _entry_points():
    return (ops.matmul, ops.softmax, ms.mint.matmul, ms.ops.functional.cast, vars(Primitive)["__call__"],
            vars(type(ops.operations.MatMul()))["__call__"], "__mul__" in vars(ms.Tensor),
            "__getitem__" in vars(ms.Tensor), vars(ms.Tensor)["__matmul__"], vars(ms.Tensor)["astype"])


def test_every_hook_is_removed_afterwards_also_when_the_forward_raises(user_module):
    before = _entry_points()
    net = user_module.UserNet()
    x = ms.Tensor(np.ones((2, 4, 8), np.float32))
    rec = OpRecorder({"": net})
    with rec.active():
        assert ops.matmul is not before[0] and "__mul__" in vars(ms.Tensor)   # hooked while active
        net(x)
    assert _entry_points() == before
    seen = len(rec.calls)
    assert seen > 0
    net(x)
    ops.matmul(x, x.swapaxes(-1, -2))
    assert len(rec.calls) == seen                                     # the originals run now
    assert not net.attn._forward_pre_hook and not net.attn._forward_hook
    with pytest.raises(RuntimeError, match="the user's forward fails"):
        record_ops({"": user_module.Raises()}, lambda: user_module.Raises()(x))
    assert _entry_points() == before


def test_diagnose_names_the_op_and_its_line_on_the_planted_forward_overflow():
    from ampgan.diagnose.case import DiagnoseConfig
    from tests.test_diagnose_corpus import run

    quick = ["diagnose.steps=1"] + (["diagnose.horizon=0"] if "horizon" in DiagnoseConfig.__dataclass_fields__ else [])
    located = run("diag_forward_overflow", *quick).analysis.located
    assert located is not None and located.phase == "forward" and located.where == "head"
    op = located.op
    assert op is not None and (op.cell, op.op) == ("head", "Tensor.__mul__")
    nets = Path(__file__).resolve().parents[1] / "ampgan_corpus" / "nets.py"
    lines = nets.read_text().splitlines()
    scaling = 1 + lines.index(next(t for t in lines if "features * self.scale" in t))   # the cosine head's x 1e5
    assert (Path(op.file).resolve(), op.line) == (nets, scaling)
    assert not np.isfinite(op.amp_max) and FP16_MAX < op.fp32_max < np.inf
    assert op.describe() in located.describe() and f"nets.py:{scaling}" in located.describe()


def test_a_backward_overflow_names_the_op_whose_output_gradient_leaves_float16s_range(user_module):
    """The forward is small; the loss times 1e5 (a loss scale) sends a gradient of 1e5 into the
    net's float16 output: the net's last op (the sum in its own construct) is the first whose
    output gradient is inf (the FP32 twin's is 1e5)."""
    net_amp, amp_root, fp32 = twins(lambda: user_module.Chain(1.0))
    x = ms.Tensor(np.full((1, 4, 4), 0.01, np.float32))

    def backward(net):
        def scaled(x):
            return net(x).sum() * 1e5
        return lambda: ms.value_and_grad(scaled, 0)(x)     # Chain has no weights: d/dx

    amp_calls = record_ops({"": amp_root}, backward(net_amp), gradients=True)
    fp32_calls = record_ops({"": fp32}, backward(fp32), gradients=True)
    assert first_bad_op(amp_calls, fp32_calls) is None                        # the forward is fine
    hit = first_bad_gradient(amp_calls, fp32_calls, 1.0)
    assert hit is not None and hit.gradient
    assert (hit.cell, hit.op, hit.shape, hit.in_net) == ("", "Tensor.__add__", (1, 4, 4), True)
    assert not np.isfinite(hit.amp_max) and hit.fp32_max == pytest.approx(1e5)
    source = Path(user_module.__file__).read_text().splitlines()
    assert "self.amp_cell(self.big(x)) + masked" in source[hit.line - 1]
    assert "gradient at its output" in hit.describe()
