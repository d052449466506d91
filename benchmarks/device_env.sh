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
# Not installed there either: the launcher's own engines, backends, fault kinds and Kubernetes
# kinds are pyproject.toml's entry points, which an installation's metadata carries. Write that
# metadata (its entry points only) where Python finds it.
if ! python3 -c "import sys; from importlib.metadata import entry_points as e; \
        sys.exit(not e(group='launcher.engines'))" 2>/dev/null; then
    python3 - <<'PY'
import pathlib, tomllib
project = tomllib.loads(pathlib.Path("pyproject.toml").read_text())["project"]
info = pathlib.Path("/tmp/launcher-meta") / f"launcher-{project['version']}.dist-info"
info.mkdir(parents=True, exist_ok=True)
(info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: launcher\nVersion: {project['version']}\n")
groups = project["entry-points"].items()
(info / "entry_points.txt").write_text("".join(
    f"[{group}]\n" + "".join(f"{name} = {module}\n" for name, module in points.items()) + "\n"
    for group, points in groups
))
PY
    export PYTHONPATH=/tmp/launcher-meta:$PYTHONPATH
fi
