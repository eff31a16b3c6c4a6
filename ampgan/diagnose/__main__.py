"""`python -m ampgan.diagnose [train's overrides] [diagnose.KEY=VALUE]`: see ampgan.diagnose.command."""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from ampgan import AmpganError, report_error
from ampgan.config.schema import CONF_DIR


@hydra.main(config_path=str(CONF_DIR), config_name="diagnose_main", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    from ampgan.diagnose.command import diagnose

    try:
        result = diagnose(cfg, Path(HydraConfig.get().runtime.output_dir))
    except AmpganError as err:
        sys.exit(report_error(err))
    sys.exit(result.exit_code)


if __name__ == "__main__":
    from ampgan.diagnose.command import check_node
    from ampgan.config.preflight import run_checked

    run_checked(main, config_name="diagnose_main", extra=check_node)
