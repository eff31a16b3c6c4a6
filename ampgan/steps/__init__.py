"""Step builders: the only code that knows MindSpore's autodiff and jit rules.

Each builder closes over nets, optimizer and scaler and returns a `Step`: a (jitted)
function whose single output tensor packs its status (losses, finite flag, whether the
update was applied, loss scale, global grad norm, clip flag, per-parameter gradient
health). The trainer fetches that one tensor per step and never sees a gradient.
"""

from ampgan.steps.common import Step, StepStatus

__all__ = ["Step", "StepStatus"]
