"""Cell paths have one home (ampgan.amp.cell_paths): the headroom's leaf cells and diagnose's hooks
name every cell alike, AMP's wrappers transparent."""

from __future__ import annotations

from mindspore import nn

from ampgan.amp.activations import leaf_cells
from ampgan.amp.cell_paths import cell_paths, is_wrapper
from ampgan.amp.policy import apply_amp


class Block(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(8, 8)
        self.norm = nn.LayerNorm((8,))

    def construct(self, x):
        return self.norm(self.fc(x))


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.body = nn.SequentialCell([Block(), nn.ReLU(), Block()])
        self.head = nn.Dense(8, 3)

    def construct(self, x):
        return self.head(self.body(x))


def test_headroom_and_locate_give_every_leaf_the_same_path_through_amp_wrappers():
    plain = {path for path, _, _ in leaf_cells(Net(), "critic")}
    for level, keep in (("O0", []), ("O2", []), ("O2", ["head", "body.0.fc"]), ("O3", ["body.2"])):
        net = apply_amp(Net(), level, keep, root="critic")
        leaves = leaf_cells(net, "critic")
        paths = cell_paths({"critic": net})
        assert {path for path, _, _ in leaves} == plain, (level, keep)   # the wrappers add no path
        assert all(paths[id(cell)] == path for path, cell, _ in leaves), (level, keep)
    kept = apply_amp(Net(), "O2", ["head"], root="critic")
    assert any(is_wrapper(cell) for _, cell in kept.cells_and_names())
    assert "critic.head" in set(cell_paths({"critic": kept}).values())
