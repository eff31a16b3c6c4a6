"""AMP levels and FP32 keep-lists: what the kept cells really compute, stable parameter names, O1 training.

The probe net measures the precision each layer computes in, exactly: every probe layer adds
(1 + 2**-13) * c0 - c1 to its own output slot, with c0 = c1 = 1. In FP32 that is 2**-13;
in float16 the weight 1 + 2**-13 rounds to 1 and the slot stays 0. 2**-13 is a normal float16
number, so the result survives the casts to float16 that the levels put between cells.
"""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from ampgan import AmpganError
from ampgan.amp.policy import apply_amp, check_keep_paths, resolve_cell_types
from ampgan.config.schema import validate
from ampgan.models import Classifier, Critic, Generator
from tests.conftest import compose_cfg

EPS = 2.0**-13
WIDTH = 6  # two carriers (c0, c1) + one output slot per probe layer
SLOTS = {"body.0": 2, "body.2": 3, "conv": 4, "head": 5}


def probe_weight(slot: int) -> np.ndarray:
    w = np.eye(WIDTH, dtype=np.float32)
    w[slot, 0], w[slot, 1] = 1.0 + EPS, -1.0
    return w


def probe_dense(slot: int) -> nn.Dense:
    return nn.Dense(WIDTH, WIDTH, weight_init=ms.Tensor(probe_weight(slot)), has_bias=False)


class ProbeHead(nn.Cell):
    """A custom cell (kept by its path, `head`)."""

    def __init__(self):
        super().__init__()
        self.fc = probe_dense(SLOTS["head"])

    def construct(self, x):
        return self.fc(x)


class Probe(nn.Cell):
    """Dense, ReLU, Dense, a 1x1 Conv1d (another cell type), a custom head: one slot each."""

    def __init__(self):
        super().__init__()
        self.body = nn.SequentialCell([probe_dense(SLOTS["body.0"]), nn.ReLU(), probe_dense(SLOTS["body.2"])])
        self.conv = nn.Conv1d(WIDTH, WIDTH, 1, has_bias=False,
                              weight_init=ms.Tensor(probe_weight(SLOTS["conv"])[:, :, None]))
        self.head = ProbeHead()
        self.width = WIDTH  # O1's rewritten source does not see this module's globals

    def construct(self, x):
        h = self.body(x)
        h = self.conv(h.reshape((-1, self.width, 1))).reshape((-1, self.width))
        return self.head(h)


def fp32_layers(net: nn.Cell) -> dict[str, bool]:
    """Which probe layers computed in FP32, run compiled (as training steps are) and eagerly."""
    x = ms.Tensor(np.array([[1, 1, 0, 0, 0, 0]], np.float32))

    @ms.jit
    def compiled(x):
        return net(x)

    results = []
    for out in (compiled(x), net(x)):
        assert out.dtype == ms.float32   # every level hands FP32 outputs back
        slots = out.asnumpy()[0] / EPS
        assert set(np.round(slots[2:], 6)) <= {0.0, 1.0}, slots
        results.append({name: bool(slots[i] == 1.0) for name, i in SLOTS.items()})
    assert results[0] == results[1]
    return results[0]


def probe(root: str = "critic") -> Probe:
    net = Probe()
    net.update_parameters_name(f"{root}." if root else "")
    return net


ALL_FP16 = dict.fromkeys(SLOTS, False)
CASES = {
    # keep-list                          -> layers in FP32 (the rest run in float16)
    "nothing": ([], set()),
    "type Dense": (["Dense"], {"body.0", "body.2", "head"}),
    "type Conv1d": (["Conv1d"], {"conv"}),
    "paths": (["critic.body.2", "critic.head"], {"body.2", "head"}),
    "path into a custom cell": (["critic.head.fc", "critic.conv"], {"head", "conv"}),
    "type and path": (["Conv1d", "critic.body.0"], {"conv", "body.0"}),
    "nested paths": (["critic.body", "critic.body.0"], {"body.0", "body.2"}),
    "another net's path": (["gen.body.0"], set()),
}


@pytest.mark.parametrize("level", ["O1", "O2", "O3"])
@pytest.mark.parametrize("case", list(CASES))
def test_kept_cells_compute_in_fp32_and_the_rest_in_float16(level, case):
    keep, fp32 = CASES[case]
    net = probe()
    names = [p.name for p in net.get_parameters()]
    amp_net = apply_amp(net, level, keep, root="critic")
    assert fp32_layers(amp_net) == {name: name in fp32 for name in SLOTS}
    assert [p.name for p in amp_net.get_parameters()] == names


def test_the_probe_sees_fp32_without_amp_and_when_the_root_is_kept():
    assert all(fp32_layers(apply_amp(probe(), "O0", [], root="critic")).values())
    assert all(fp32_layers(apply_amp(probe(), "O2", ["critic"], root="critic")).values())


def test_classifier_paths_have_no_root():
    net = probe(root="")
    assert fp32_layers(apply_amp(net, "O1", ["head"])) == {**ALL_FP16, "head": True}


# ---------------------------------------------------------------- parameter names
def task_nets(kind: str) -> dict[str, nn.Cell]:
    ms.set_seed(0)
    if kind == "gan2d":
        nets = {"gen": Generator(4, (2,), 16, 2), "critic": Critic((2,), 16, 2)}
    elif kind == "gan_images":
        nets = {"gen": Generator(8, (1, 8, 8), 8, 2), "critic": Critic((1, 8, 8), 8, 2)}
    else:
        nets = {"": Classifier((1, 8, 8), 10, width=8)}
    for root, net in nets.items():
        if root:
            net.update_parameters_name(f"{root}.")
    return nets


@pytest.mark.parametrize("level", ["O1", "O2", "O3"])
@pytest.mark.parametrize("kind,keep", [("gan2d", []), ("gan2d", ["critic.score.0", "gen.body.2"]),
                                       ("gan_images", ["Conv2d"]), ("classifier", []),
                                       ("classifier", ["head", "backbone.body.0", "BatchNorm2d"])])
def test_parameter_names_survive_apply_amp(level, kind, keep):
    nets = task_nets(kind)
    check_keep_paths(nets, keep)
    before = {root: [(p, p.name) for p in net.get_parameters()] for root, net in nets.items()}
    amp_nets = {root: apply_amp(net, level, keep, root=root) for root, net in nets.items()}
    all_names = []
    for root, amp_net in amp_nets.items():
        params = amp_net.get_parameters()
        assert [(p, p.name) for p in params] == before[root]  # the very Parameters, their names
        all_names += [p.name for p in params]
        if root:
            assert all(name.startswith(f"{root}.") for name in all_names[-len(before[root]):])
    assert len(set(all_names)) == len(all_names)  # generator and critic can share one graph


# ---------------------------------------------------------------- O1 training
@pytest.mark.parametrize("overrides", [("amp=o1",),   # the other two in `make test-full` (CI's time)
                                       pytest.param(("amp=o1", "amp.fp32_gradient_penalty=true"), marks=pytest.mark.slow),
                                       pytest.param(("amp=o1", "model=classifier", "data=digits",
                                                     "amp.keep_fp32=[head,backbone.body.0,BatchNorm2d]"),
                                                    marks=pytest.mark.slow)])
def test_o1_smoke_train_runs(tmp_path, overrides):
    from ampgan.training.entry import train

    objective = train(compose_cfg(*overrides, "trainer=smoke", "tracking=none"), run_dir=tmp_path / "run")
    assert math.isfinite(objective)


# ---------------------------------------------------------------- keep-list errors
def one_line_error(fn, *args, **kwargs) -> str:
    with pytest.raises(AmpganError) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message and message.startswith("amp.keep_fp32: ")
    return message


def test_a_path_that_names_no_cell_fails_with_the_closest_path():
    nets = task_nets("gan2d")
    assert "did you mean 'critic.score.2'" in one_line_error(check_keep_paths, nets, ["critic.scor.2"])
    assert "did you mean 'critic.score.0'" in one_line_error(check_keep_paths, nets, ["score.0"])
    assert "did you mean 'gen.body.0'" in one_line_error(check_keep_paths, nets, ["Dense", "gen.bdy.0"])
    check_keep_paths(nets, ["critic", "gen.body.4", "critic.features.0", "Conv2d"])  # all fine
    classifier = task_nets("classifier")
    assert "did you mean 'head.fc'" in one_line_error(check_keep_paths, classifier, ["head.fx"])
    # apply_amp refuses a path under its own root as well (the classifier's root is "")
    assert "did you mean 'head.fc'" in one_line_error(apply_amp, classifier[""], "O2", ["head.fx"])


def test_type_names_and_path_syntax_are_checked_without_nets():
    assert resolve_cell_types(["Dense", "critic.score.0", "head", "BatchNorm2d"]) == [nn.Dense, nn.BatchNorm2d]
    assert "did you mean 'Dense'" in one_line_error(resolve_cell_types, ["Dens"])
    assert "NotACell" in one_line_error(resolve_cell_types, ["NotACell"])
    for bad in ("critic..score", "score-0", "critic.score.", " head"):
        assert repr(bad)[1:-1] in one_line_error(resolve_cell_types, [bad])


def test_config_accepts_paths_and_names_and_refuses_a_wrong_type():
    s = validate(compose_cfg("amp=o2", "amp.keep_fp32=[critic.score.0,Dense]"))
    assert s.amp.keep_fp32 == ["critic.score.0", "Dense"]
    with pytest.raises(AmpganError, match="did you mean 'Dense'"):
        validate(compose_cfg("amp=o2", "amp.keep_fp32=[Dens]"))
