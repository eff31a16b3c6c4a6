"""hardware.setup: the thread count is applied per process, a conflicting one refused."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import mindspore as ms
    from ampgan import AmpganError
    from ampgan.training import hardware
    from ampgan.config.schema import HardwareConfig

    def setup(threads):
        try:
            hardware.setup(HardwareConfig(device="CPU", threads=threads), seed=0)
            return "ok"
        except AmpganError as err:
            return "error: " + str(err)

    print(setup(0))                     # MindSpore's default: nothing set yet
    print(setup(2))                     # applied
    try:
        ms.device_context.cpu.op_tuning.threads_num(3)
        print("not applied")
    except RuntimeError:
        print("applied")                # MindSpore holds a value now: ours
    print(setup(2))                     # the same value again (the next job of a sweep)
    print(setup(1))                     # another value: refused
    print(setup(0))                     # back to the default: refused too
""")


def test_two_setups_in_one_process_apply_or_refuse_the_thread_count(tmp_path):
    env = {**os.environ, "GLOG_v": "3"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[:4] == ["ok", "ok", "applied", "ok"]
    for line, asked in zip(lines[4:], ("hardware.threads=1", "hardware.threads=0")):
        assert line.startswith(f"error: {asked}") and "already runs MindSpore's CPU ops with 2 threads" in line
        assert "\n" not in line
    assert len(lines) == 6
