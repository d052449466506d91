"""Run a module as `python -m` does, refusing `import torch`: `python tests/no_torch.py
MODULE ARGS...` exits 97 naming the first launcher modules on the import's path when
anything imports torch, else with the module's own exit code."""

from __future__ import annotations

import runpy
import sys
import traceback

REFUSED = 97


class RefuseTorch:
    """A meta path finder that stops the process at the first `import torch`."""

    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            chain = [
                f"{frame.filename}:{frame.lineno}"
                for frame in traceback.extract_stack()
                if "/launcher/" in frame.filename
            ]
            print(f"imported torch: {' <- '.join(reversed(chain[-5:]))}", file=sys.stderr)
            raise SystemExit(REFUSED)
        return None


if __name__ == "__main__":
    sys.meta_path.insert(0, RefuseTorch())
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
