"""Op-level locate: the first operator whose float16 result leaves float16's range, its cell and source line.

A cell is too coarse an answer (one attention cell holds a q.k matmul, a softmax, a Dense), so
at the failing sub-step diagnose replays the forward pass and the loss once more, uncompiled
(PYNATIVE), with an API hook that observes every operator call, as MindSpore's TroubleShooter
and msProbe do. The entry points MindSpore 2.10 really goes through (measured; the name an op
is recorded under in brackets):
  - primitives: every `Primitive` subclass's `__call__` (1244 of the 1926 classes define their
    own: the generated ones call pyboost directly). nn.Dense [Reshape, MatMul, BiasAdd],
    nn.LayerNorm [LayerNorm], nn.Softmax [Softmax], nn.BatchNorm2d [BatchNorm], nn.Conv2d [Conv2D];
  - functions of `mindspore.ops`, `mindspore.ops.functional`, `mindspore.mint` and
    `mindspore.mint.nn.functional`: ops.matmul [ops.matmul, MatMulExt below it], ops.softmax
    [ops.softmax], nn.GELU [ops.gelu], nn.CrossEntropyLoss [ops.cross_entropy]; mint's are C++
    overloads that call no Python primitive;
  - Tensor methods and operators: `q @ k` [Tensor.__matmul__], `x * y` [Tensor.__mul__],
    `x.sum()` [Tensor.sum]: methods of the C++ base class `TensorPy` that call no Python
    primitive, shadowed on `Tensor` itself.
Only the outermost call is recorded (a call made while another hooked call runs is that call's
implementation), so `ops.softmax(x)` is one op, not a function and a primitive. Everything is
put back when the block ends, also when the forward raises. PYNATIVE's mixed precision casts
an op's inputs in C++: under O2 a cell's input casts are not op calls.

Each call is recorded (`OpCall`) with the innermost named cell running it (forward pre/post
hooks keep a stack of running cells; paths are `cell_paths`', MindSpore's and ampgan's AMP
wrappers transparent), its occurrence index among that cell's calls of that op, the output's
shape, dtype, max |x| and non-finite count, the inputs' non-finite and NaN counts, whether it
computes in FP32 inside a cell kept in FP32, and the source line: the first stack frame outside
MindSpore's package and ampgan's AMP and diagnose code (the user's net, or ampgan's own models
and loss).

The origin (`first_bad_op`) is the first call in execution order whose inputs hold no NaN and no
more infinities than the FP32 twin's same call (a call fed float16's inf or NaN is not the
origin; what a kernel makes of NaN differs between float16 and FP32) while its output holds
more (or, computing in FP32 in a cell kept in FP32, exceeds 65504: cast back to float16 it
would be inf). The twin's call is matched by (cell path, op name, occurrence index), casts left
out on both sides (the twin has none of AMP's). Comparing counts with the twin, not with zero,
leaves the model's own infinities (a -inf attention mask) alone. In an inference-mode forward
pass (diagnose's inference stage) a call computing in float16 whose FP32 input exceeds 65504 is
an origin too: PYNATIVE's AMP casts it down in C++ (inf), as an O3 BatchNorm's moving variance,
while the call's own output may stay finite (normalised to ~0). In the backward phase
(`first_bad_gradient`) a tensor hook on each op's output sees the gradient reaching it.
"""

from __future__ import annotations

from pathlib import Path

import contextlib
import os
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import mindspore as ms
import numpy as np
from mindspore import mint, nn, ops
from mindspore.common import _tensor_cpp_method
from mindspore.ops import functional as ms_functional
from mindspore.ops.primitive import Primitive

from ampgan.amp.float16 import FP16_MAX
from ampgan.amp.cell_paths import cell_paths, is_wrapper

# wrappers whose one child is the cell a keep-list names: (wrapper class, the child's attribute)
_MS_DIR = os.path.dirname(ms.__file__) + os.sep
_AMPGAN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# frames that are never the user's source line: MindSpore, ampgan's AMP wrappers, diagnose's own hooks
_NOT_SOURCE = (_MS_DIR, os.path.join(_AMPGAN_DIR, "amp") + os.sep, os.path.join(_AMPGAN_DIR, "diagnose") + os.sep)
# a cast is AMP's, not the model's computation: left out when matching AMP's calls with the twin's
_CASTS = frozenset({"Cast", "ops.cast", "functional.cast", "Tensor.astype", "Tensor.to", "Tensor.half",
                    "Tensor.float", "MixedPrecisionCast", "functional.mixed_precision_cast"})
# functions that run other code (gradients, transforms, decorators) rather than compute one op:
# recording them as the outermost call would hide every op inside them
_NOT_OPS = frozenset({"grad", "value_and_grad", "vjp", "jvp", "vmap", "jacfwd", "jacrev", "hessian",
                      "stop_gradient", "depend", "constexpr", "primitive", "custom_info_register", "kernel",
                      "ms_kernel", "print_", "deprecated", "is_tensor", "isconstant", "cpu_ms_kernel"})
_OP_MODULES = ("mindspore.ops.function.", "mindspore.ops.functional_overload", "mindspore.ops.auto_generate",
               "mindspore.mint")
# ... and whole modules of them: higher-order derivatives, communication, debugging, resharding
_NOT_OP_MODULES = ("mindspore.ops.function.grad", "mindspore.ops.function.vmap_func", "mindspore.ops.function.comm_func",
                   "mindspore.ops.function.debug_func", "mindspore.ops.function.reshard_func")
# Tensor operators (C++ ones not in MindSpore's list of C++ methods, and Python ones) and the
# Python methods worth naming as the user wrote them (the primitives below them are hooked anyway)
_TENSOR_OPERATORS = ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
                     "__rtruediv__", "__matmul__", "__rmatmul__", "__pow__", "__rpow__", "__neg__", "__abs__",
                     "__mod__", "__rmod__", "__floordiv__", "__rfloordiv__", "__getitem__", "astype", "swapaxes",
                     "softmax", "norm")


class CellHooks:
    """Forward hooks on every named cell of `roots` (`cell_paths`, AMP wrappers left out: their
    child is hooked), a pre-hook too when `pre`, and on the roots themselves when `with_roots`
    (their path: the root's name, "" for the classifier); `close()` removes them. Subclasses
    override `entered(cell)` and `finished(cell, inputs, output)`; `self.paths`: id(cell) -> path."""

    def __init__(self, roots: dict[str, nn.Cell], pre: bool = False, with_roots: bool = False):
        self.paths = cell_paths(roots)
        if with_roots:
            self.paths.update({id(net): root for root, net in roots.items() if id(net) not in self.paths})
        self.handles = []
        for net in roots.values():
            for _, cell in net.cells_and_names():
                if id(cell) in self.paths and not is_wrapper(cell):
                    if pre:
                        self.handles.append(cell.register_forward_pre_hook(self._pre))
                    self.handles.append(cell.register_forward_hook(self._post))

    def _pre(self, cell, inputs):
        self.entered(cell)

    def _post(self, cell, inputs, output):
        self.finished(cell, inputs, output)

    def entered(self, cell) -> None:
        pass

    def finished(self, cell, inputs, output) -> None:
        pass

    def close(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()


def tensors(value) -> list:
    """The tensors in an argument or output: itself, or the members of a tuple/list (one level)."""
    items = value if isinstance(value, (tuple, list)) else (value,)
    return [t for t in items if isinstance(t, ms.Tensor)]


def peak_and_nonfinite(values) -> tuple[float, int, int]:
    """(max |x| over the tensors, inf when any element is not finite; their non-finite count; their NaN count)."""
    peak, bad, nan = 0.0, 0, 0
    for t in values:
        a = np.abs(t.asnumpy().astype(np.float64)) if t.size else np.zeros(1)
        n = int(a.size - np.isfinite(a).sum())
        bad += n
        nan += int(np.isnan(a).sum()) if n else 0
        peak = max(peak, float("inf") if n else float(a.max()))
    return peak, bad, nan


@dataclass
class OpCall:
    """One recorded operator call."""

    op: str               # "MatMul" (a primitive), "ops.softmax", "mint.matmul", "Tensor.__matmul__"
    cell: str             # the innermost named cell running it; a root's own body: the root's name ("" for
                          # the classifier); "" outside every net too (the loss: `in_net` False)
    index: int            # its occurrence among `cell`'s calls of `op` (casts not counted: -1)
    shape: tuple
    dtype: str
    peak: float           # max |output| (inf when not finite)
    nonfinite: int        # non-finite output elements
    nonfinite_in: int     # non-finite elements in its tensor inputs
    nan_in: int           # NaN elements among them
    fp32_kept: bool       # computes in FP32 inside a cell kept in FP32 (its result goes back to float16)
    in_net: bool          # called while one of the nets runs (not in the loss)
    file: str
    line: int
    cast_in_peak: float = 0.0   # computing in float16: max |x| of its FP32 inputs (cast down for it in C++)
    cast_in_shape: tuple = ()   # ... the shape of the input holding it
    grad_order: int = -1  # when its output's gradient arrived in the backward pass (0 first; -1 never)
    grad_peak: float = float("nan")   # max |gradient| at its output (inf when not finite)
    grad_nonfinite: int = 0

    @property
    def is_cast(self) -> bool:
        return self.op in _CASTS

    @property
    def key(self) -> tuple[str, str, int]:
        return self.cell, self.op, self.index


@dataclass
class OpHit:
    """The op where float16 leaves its range: what `Located.op` holds."""

    op: str
    cell: str
    shape: tuple
    amp_max: float        # max |x| of its AMP output (inf when not finite)
    fp32_max: float       # the FP32 twin's same op (nan when the twin has no such op: a cast)
    file: str
    line: int
    in_net: bool = True   # False: in the loss computation, outside every net
    gradient: bool = False   # the values are the gradient at its output (backward), not the output
    cast_input: bool = False   # the values are an FP32 input the op computes with in float16 (inf once cast)

    @property
    def site(self) -> str:
        """`Tensor.__mul__ at temperature_attention.py:27`: the op and its source line, short."""
        return f"{self.op} at {Path(self.file).name}:{self.line}"

    def describe(self) -> str:
        scaled = " (times AMP's loss scale)" if self.gradient else ""
        twin = f"FP32 {self.fp32_max:.4g}{scaled}" if not np.isnan(self.fp32_max) else "no FP32 counterpart"
        where = f"cell {self.cell}" if self.cell else ("the net" if self.in_net else "the loss")
        value = ("FP32 input cast to float16" if self.cast_input else
                 "gradient at its output" if self.gradient else "output")
        return (f"op {self.op} in {where}, {value} {list(self.shape)}: AMP max|x| {self.amp_max:.4g} "
                f"(float16 max {FP16_MAX:g}), {twin}, at {self.file}:{self.line}")


def source_line() -> tuple[str, int]:
    """(file, line) of the innermost frame outside MindSpore, ampgan's AMP code and diagnose."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(_NOT_SOURCE) and not name.startswith("<"):
            return name, frame.f_lineno
        frame = frame.f_back
    return "?", 0


class _Patches:
    """Attribute replacements that are all undone by `restore()` (in reverse order)."""

    def __init__(self):
        self.undo: list[tuple[object, str, bool, object]] = []

    def set(self, owner, name: str, value) -> None:
        self.undo.append((owner, name, name in vars(owner), vars(owner).get(name)))
        setattr(owner, name, value)

    def restore(self) -> None:
        while self.undo:
            owner, name, had, old = self.undo.pop()
            if had:
                setattr(owner, name, old)
            else:
                delattr(owner, name)


def _subclasses(cls: type) -> list[type]:
    out, todo = [], [cls]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in out:
                out.append(sub)
                todo.append(sub)
    return out


def _op_functions(module, label: str) -> Iterator[tuple[str, str, Callable]]:
    """(attribute, op name, function) for the operator functions a module offers."""
    for name, fn in sorted(vars(module).items()):
        origin = getattr(fn, "__module__", None) or ""
        if (isinstance(fn, types.FunctionType) and not name.startswith("_") and name not in _NOT_OPS
                and origin.startswith(_OP_MODULES) and not origin.startswith(_NOT_OP_MODULES)):
            yield name, f"{label}.{name}", fn


class OpRecorder(CellHooks):
    """Records every outermost operator call while active (`with OpRecorder(roots).active(): ...`).

    The cell stack: the pre-hook pushes a cell, the post-hook pops it. An op computes "in a cell
    kept in FP32" when its output is FP32 and the innermost running cell with a mixed-precision
    type has FP32's (MindSpore's `to_float(float32)`: keep-list paths and types, O2's black list).
    `gradients`: a tensor hook on each float output records the gradient that reaches it when
    the block runs a backward pass (PYNATIVE calls it once the gradient is complete, in
    backward order); the backward's own ops run in C++ and are not calls."""

    def __init__(self, roots: dict[str, nn.Cell], gradients: bool = False):
        super().__init__(roots, pre=True, with_roots=True)
        self.gradients = gradients
        self.arrived = 0
        self.calls: list[OpCall] = []
        self.stack: list[nn.Cell] = []
        self.counts: dict[tuple[str, str], int] = {}
        self.busy = False          # inside a recorded call (or the recording itself): not recorded

    def entered(self, cell) -> None:
        self.stack.append(cell)

    def finished(self, cell, inputs, output) -> None:
        if self.stack and self.stack[-1] is cell:
            self.stack.pop()

    def _kept_fp32(self) -> bool:
        for cell in reversed(self.stack):
            kind = getattr(cell, "mixed_precision_type", None)
            if kind is not None:
                return "FP32" in str(kind).upper()
        return False

    def _call(self, name: str, fn: Callable, args: tuple, kwargs: dict, primitive: bool = False):
        if self.busy:
            return fn(*args, **kwargs)
        self.busy = True
        try:
            out = fn(*args, **kwargs)
            self._record(name, args, kwargs, out, primitive)
        finally:
            self.busy = False
        return out

    def _record(self, name: str, args: tuple, kwargs: dict, out, primitive: bool) -> None:
        """A primitive's result is its first output: the others (BatchNorm's saved statistics and
        reserve space, LayerNorm's mean and rstd) are kept for its backward, some uninitialised."""
        outs = tensors(out)[:1] if primitive else tensors(out)
        if not outs:
            return
        cell = self.paths[id(self.stack[-1])] if self.stack else ""
        index = -1
        if name not in _CASTS:
            index = self.counts.get((cell, name), 0)
            self.counts[(cell, name)] = index + 1
        peak, bad, _ = peak_and_nonfinite(outs)
        _, bad_in, nan_in = peak_and_nonfinite([t for a in (*args, *kwargs.values()) for t in tensors(a)])
        file, line = source_line()
        fp32 = outs[0].dtype == ms.float32
        cast_in, cast_shape = 0.0, ()
        if outs[0].dtype == ms.float16:   # its FP32 inputs are cast down for it (PYNATIVE's AMP casts in C++)
            for t in (t for a in (*args, *kwargs.values()) for t in tensors(a) if t.dtype == ms.float32):
                if (p := peak_and_nonfinite([t])[0]) > cast_in:
                    cast_in, cast_shape = p, tuple(t.shape)
        self.calls.append(OpCall(name, cell, index, tuple(outs[0].shape), str(outs[0].dtype), peak, bad, bad_in,
                                 nan_in, fp32 and self._kept_fp32(), bool(self.stack), file, line, cast_in, cast_shape))
        if self.gradients and outs[0].dtype in (ms.float16, ms.float32):
            try:
                outs[0].register_hook(self._gradient_hook(self.calls[-1]))
            except RuntimeError:   # "requires grad is false": no gradient reaches it (a stop_gradient's input)
                pass

    def _gradient_hook(self, call: OpCall) -> Callable:
        def seen(grad):
            call.grad_order, self.arrived = self.arrived, self.arrived + 1
            call.grad_peak, call.grad_nonfinite, _ = peak_and_nonfinite([grad])
        return seen

    def _wrap_function(self, name: str, fn: Callable) -> Callable:
        def hooked(*args, **kwargs):
            return self._call(name, fn, args, kwargs)
        hooked.__wrapped__ = fn
        return hooked

    def _wrap_primitive_call(self, call: Callable) -> Callable:
        def hooked(prim, *args, **kwargs):
            return self._call(prim.name, call, (prim, *args), kwargs, primitive=True)
        hooked.__wrapped__ = call
        return hooked

    def _install(self, patches: _Patches) -> None:
        for cls in [Primitive, *_subclasses(Primitive)]:
            if "__call__" in vars(cls):
                patches.set(cls, "__call__", self._wrap_primitive_call(vars(cls)["__call__"]))
        for module, label in ((ops, "ops"), (ms_functional, "functional"), (mint, "mint"),
                              (mint.nn.functional, "mint.nn.functional")):
            for attr, name, fn in _op_functions(module, label):
                patches.set(module, attr, self._wrap_function(name, fn))
        for attr in dict.fromkeys((*_tensor_cpp_method.tensor_cpp_methods, *_TENSOR_OPERATORS)):
            method = getattr(ms.Tensor, attr, None)
            if callable(method):
                patches.set(ms.Tensor, attr, self._wrap_function(f"Tensor.{attr}", method))

    @contextlib.contextmanager
    def active(self) -> Iterator[OpRecorder]:
        """Hook every op entry point for the block; put everything back afterwards, also on error."""
        patches = _Patches()
        try:
            self._install(patches)
            yield self
        finally:
            patches.restore()
            self.close()


def record_ops(roots: dict[str, nn.Cell], run: Callable[[], object], gradients: bool = False) -> list[OpCall]:
    """The op calls `run()` makes (with the cells of `roots` named), in execution order; with
    `gradients`, the gradients at their outputs of the backward pass `run()` makes."""
    rec = OpRecorder(roots, gradients)
    with rec.active():
        run()
    return rec.calls


def first_bad_op(amp_calls: list[OpCall], fp32_calls: list[OpCall], cast_inputs: bool = False) -> OpHit | None:
    """The first AMP call whose inputs are clean while its output leaves float16's range (see the
    module's docstring), with the FP32 twin's value of the same call; None: no call does.

    `cast_inputs` (an inference-mode forward pass): a call computing in float16 is also the origin
    when one of its FP32 inputs exceeds 65504, inf once cast down for it (BatchNorm's moving
    variance, an FP32 parameter); the FP32 twin's value is that input's, uncast. Off in training
    passes, where BatchNorm takes its moving statistics as inputs its output does not use."""
    twin = {c.key: c for c in fp32_calls if not c.is_cast}
    for c in amp_calls:
        t = None if c.is_cast else twin.get(c.key)
        base_in, base_out = (t.nonfinite_in, t.nonfinite) if t is not None else (0, 0)
        if c.nan_in or c.nonfinite_in > base_in:
            continue
        if cast_inputs and c.cast_in_peak > FP16_MAX:
            return OpHit(c.op, c.cell, c.cast_in_shape, float("inf"), c.cast_in_peak, c.file, c.line, c.in_net,
                         cast_input=True)
        if c.nonfinite > base_out or (c.fp32_kept and c.nonfinite == 0 and c.peak > FP16_MAX):
            return OpHit(c.op, c.cell, c.shape, c.peak, t.peak if t is not None else float("nan"), c.file, c.line,
                         c.in_net)
    return None


def first_bad_gradient(amp_calls: list[OpCall], fp32_calls: list[OpCall], scale: float) -> OpHit | None:
    """The op whose output receives the backward pass's first non-finite gradient where the FP32
    twin's is finite (the gradients before it in backward order, its consumers', are finite: the
    overflow is in the backward of what consumed it), with the twin's gradient times AMP's loss
    `scale` (what float16 had to hold); None: no op's is."""
    twin = {c.key: c for c in fp32_calls if not c.is_cast}
    for c in sorted((c for c in amp_calls if c.grad_order >= 0), key=lambda c: c.grad_order):
        t = None if c.is_cast else twin.get(c.key)
        if c.grad_nonfinite > (t.grad_nonfinite if t is not None else 0):
            fp32 = t.grad_peak * scale if t is not None else float("nan")
            return OpHit(c.op, c.cell, c.shape, c.grad_peak, fp32, c.file, c.line, c.in_net, gradient=True)
    return None


def locate_op(task, fp32_task, roots, fp32_roots, net: str, inputs: tuple, backward: bool = False) -> OpHit | None:
    """Replay sub-step `net`'s forward pass and loss on `inputs` (each task's `optimised()` loss
    function, uncompiled) under the op hook, AMP then the FP32 twin (which holds the step's
    weights already); return the first op where float16 leaves its range. `backward`: the first
    order gradient of the scaled loss too (at the scaler's scale now: a dynamic scaler has
    already lowered it after the failing step), and the first op whose output's gradient does."""
    def loss(t):
        o = t.optimised()[net]
        fn = o.loss_fn(o.scaler)
        if backward:
            return lambda: ms.value_and_grad(fn, None, o.params, has_aux=True)(*inputs)
        return lambda: fn(*inputs)

    amp_calls = record_ops(roots, loss(task), backward)
    fp32_calls = record_ops(fp32_roots, loss(fp32_task), backward)
    if backward:
        scaler = task.optimised()[net].scaler
        return first_bad_gradient(amp_calls, fp32_calls, float(scaler.scale(ms.Tensor(1.0, ms.float32)).asnumpy()))
    return first_bad_op(amp_calls, fp32_calls)
