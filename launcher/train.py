"""`torchrun -m launcher.train [overrides]`: compose, validate, run. Nothing else.

Hydra's own error output spans several lines; so before Hydra starts, the overrides are
composed and checked once here, and a problem becomes one line and exit code 2.
"""

from __future__ import annotations

import sys

import hydra
from hydra._internal.utils import get_args_parser
from omegaconf import DictConfig

from launcher.config import ConfigError, compose
from launcher.job import check_or_exit, fail_bad_input, run


@hydra.main(config_path="pkg://launcher.conf", config_name="train", version_base="1.3")
def _hydra_entry(cfg: DictConfig) -> None:
    code = run(cfg)
    if code:
        sys.exit(code)


def main() -> None:
    """Check the overrides, then hand over to Hydra (which also handles --help and -m)."""
    args = get_args_parser().parse_args(sys.argv[1:])
    if not (args.help or args.hydra_help or args.cfg or args.info or args.shell_completion):
        try:
            check = compose(args.overrides)
        except ConfigError as exc:
            fail_bad_input(exc)
        check_or_exit(check)
    _hydra_entry()


if __name__ == "__main__":
    main()
