"""`python -m ampgan.train [overrides]`: one trainer for every model x data x AMP x scaler x hardware.

    python -m ampgan.train                                  # WGAN-GP on 8 Gaussians, FP32
    python -m ampgan.train amp=o2 scaler=dynamic            # the same under AMP O2
    python -m ampgan.train -m scaler=static,dynamic         # a sweep, one MLflow run per job

The run itself is `ampgan.training.entry.train`; this module is the thin `@hydra.main` entry that
returns its objective, so that sweepers can optimise it.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from ampgan import AmpganError, report_error
from ampgan.config.schema import CONF_DIR
from ampgan.training.entry import train


@hydra.main(config_path=str(CONF_DIR), config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float:
    from ampgan.training.loop import exit_code

    try:
        return train(cfg)
    except AmpganError as err:
        sys.exit(report_error(err))
    except KeyboardInterrupt as err:
        print(f"ampgan: interrupted ({err or 'Ctrl-C'}): the run ended KILLED after a checkpoint; "
              f"continue it with trainer.resume=<run id or run folder>", file=sys.stderr)
        sys.exit(exit_code(err))


if __name__ == "__main__":
    from ampgan.config.preflight import run_checked

    run_checked(main)
