# Sourced by the GPU scripts: make the launcher importable on a GPU image that has torch and
# transformers but no internet, Hydra or OmegaConf (wheels carried in .whl/, see
# fetch_wheels.sh), running from the repository root without installing it.
if ! python3 -c "import hydra, omegaconf" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --target /tmp/launcher-site .whl/*.whl
    export PYTHONPATH=/tmp/launcher-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# Not installed there: conf/ ships as the package launcher.conf only through pip.
python3 -c "import launcher.conf" 2>/dev/null || ln -sfn ../conf launcher/conf
