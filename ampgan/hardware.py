"""Device target, execution mode, threads and seeds: set once per run, before anything is built."""

from __future__ import annotations

import random

import mindspore as ms
import numpy as np

from ampgan import AmpganError

_MISSING = {
    "GPU": "MindSpore found no usable CUDA GPU (a GPU build of MindSpore, the CUDA driver and a device are needed)",
    "Ascend": "MindSpore found no Ascend NPU (the Ascend build of MindSpore and the CANN toolkit are needed)",
}


def check_device(device: str) -> None:
    """Raise a one-line AmpganError when this machine cannot run `device`."""
    if device != "CPU" and not ms.hal.is_available(device):
        raise AmpganError(f"hardware={device.lower()}: not available on this machine: {_MISSING[device]}")


def setup(cfg, seed: int) -> None:
    """Select the device, PYNATIVE mode (steps are compiled one by one with ms.jit), threads, seeds.

    Safe to call again in the same process (sweep workers run several jobs each).
    """
    check_device(cfg.device)
    if ms.get_context("device_target") != cfg.device:
        ms.set_device(cfg.device)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    if cfg.threads and cfg.device == "CPU":
        try:
            ms.device_context.cpu.op_tuning.threads_num(cfg.threads)
        except RuntimeError:  # already fixed in this process by an earlier job
            pass
    ms.set_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
