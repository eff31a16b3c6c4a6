"""Device target, execution mode, threads and seeds: set once per run, before anything is built."""

from __future__ import annotations

import logging
import random

import mindspore as ms
import numpy as np

from ampgan import AmpganError

log = logging.getLogger("ampgan")

# The devices ampgan's tests run on. GPU and Ascend are configured (conf/hardware/) but no test has
# run them: the machines ampgan is developed on have neither. A run on them says so.
TESTED = ("CPU",)

_MISSING = {
    "GPU": "MindSpore found no usable CUDA GPU (a GPU build of MindSpore, the CUDA driver and a device are needed)",
    "Ascend": "MindSpore found no Ascend NPU (the Ascend build of MindSpore and the CANN toolkit are needed)",
}


def check_device(device: str) -> None:
    """Raise a one-line AmpganError when this machine cannot run `device`."""
    if device != "CPU" and not ms.hal.is_available(device):
        raise AmpganError(f"hardware={device.lower()}: not available on this machine: {_MISSING[device]}")


# The CPU op thread count this process runs with, once ampgan has set it (MindSpore takes
# it once per process and has no getter).
_threads_in_process: int | None = None


def set_threads(threads: int) -> None:
    """Run MindSpore's CPU ops with `threads` threads (0: MindSpore's default).

    MindSpore accepts the value once per process. Asking again for the value already in force
    is fine (sweep workers run several jobs each); asking for another one raises AmpganError,
    since the job would run with the first value while its params record the second.
    """
    global _threads_in_process
    current = _threads_in_process
    if current is not None and threads != current:
        asked = f"hardware.threads={threads}" + (" (MindSpore's default)" if threads == 0 else "")
        raise AmpganError(f"{asked}, but this process already runs MindSpore's CPU ops with {current} threads "
                          "(set by an earlier job; MindSpore sets the count once per process): "
                          "run jobs with different hardware.threads in separate processes")
    if threads and current is None:
        try:
            ms.device_context.cpu.op_tuning.threads_num(threads)
        except RuntimeError as err:  # set outside ampgan in this process: its value is unknown
            raise AmpganError(f"hardware.threads={threads}: MindSpore's CPU thread count was already set in this "
                              f"process outside ampgan ({err}); leave hardware.threads=0 or use a fresh process") from None
        _threads_in_process = threads


def setup(cfg, seed: int) -> None:
    """Select the device, PYNATIVE mode (steps are compiled one by one with ms.jit), threads, seeds.

    Safe to call again in the same process (sweep workers run several jobs each), except with
    another non-default `threads` than an earlier job set (`set_threads` raises).
    """
    check_device(cfg.device)
    if cfg.device not in TESTED:
        log.warning(f"hardware={cfg.device.lower()}: configured, but no test of ampgan has run on {cfg.device} "
                    f"(its tests run on {', '.join(TESTED)} only); the run is tagged device_tested=false")
    if cfg.device == "CPU":
        set_threads(cfg.threads)
    if ms.get_context("device_target") != cfg.device:
        ms.set_device(cfg.device)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def device_in_use() -> str:
    """The device MindSpore actually runs on in this process (after `setup`)."""
    return str(ms.get_context("device_target"))
