#!/usr/bin/env bash
# Fill .whl/ with the pure-Python wheels the GPU check needs on an image that has torch and
# transformers but no internet, Hydra or OmegaConf. Run here, where PyPI is reachable; the
# versions are the ones installed in this environment, i.e. the ones the tests ran with.
set -euo pipefail
cd "$(dirname "$0")/.."
version() { python3 -c "import importlib.metadata as m; print(m.version('$1'))"; }
mkdir -p .whl
python3 -m pip wheel -q --no-deps -w .whl \
    "hydra-core==$(version hydra-core)" \
    "omegaconf==$(version omegaconf)" \
    "antlr4-python3-runtime==$(version antlr4-python3-runtime)"
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
ls .whl
