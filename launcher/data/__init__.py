"""The data pipeline: text or token files in, fixed-length (x, y) windows out, in step order.

`prepare_data` builds (once per node) and opens the token cache; `build_train_loader` and
`build_eval_batches` turn its windows into per-rank batches; `launcher.data.shm` sizes the
shared memory the loader's workers need.
"""

from launcher.data.loader import build_eval_batches, build_train_loader
from launcher.data.prepare import TokenData, prepare_data
from launcher.data.shm import check_shm, shm_need_bytes
from launcher.data.windows import TokenWindows

__all__ = [
    "TokenData",
    "TokenWindows",
    "build_eval_batches",
    "build_train_loader",
    "check_shm",
    "prepare_data",
    "shm_need_bytes",
]
