"""DeepSpeed checkpoints at another world size or ZeRO stage, through DeepSpeed's universal
checkpoint.

DeepSpeed's ZeRO shards are laid out for the world size and stage that wrote them. Its
universal checkpoint (`deepspeed.checkpoint.ds_to_universal`) rewrites them as one folder
per parameter (the fp32 weights and each Adam moment, whole), which an engine of any world
size and ZeRO stage loads with `checkpoint.load_universal`. The launcher runs the conversion
itself, on rank 0 while the others wait, into `checkpoints/universal/step_<n>/`, under the
same atomic protocol as the checkpoints: written as `.tmp-step_<n>`, sealed with a
`meta.json` that lists every file, then renamed. The original checkpoint is only read; a
conversion cut short leaves a temporary folder that the next conversion replaces, and no
resume ever picks a converted folder that is not sealed. See docs/checkpoints.md.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import shutil
import sys
from pathlib import Path

import torch

from launcher.checkpoint import protocol as checkpoint
from launcher.config import ConfigError
from launcher.paths import atomic_write
from launcher.strategy.deepspeed.ds_import import import_deepspeed

log = logging.getLogger("launcher")


def converted_folder(step_dir: Path) -> Path:
    """Where the universal conversion of `step_dir` lives (beside it, never inside it)."""
    return step_dir.parent / checkpoint.UNIVERSAL / step_dir.name


def needs_conversion(saved: dict, now: dict) -> bool:
    """Whether a DeepSpeed checkpoint with meta `saved` loads into launch `now` (both
    resume.identity dicts) only through the universal checkpoint: another engine (DDP,
    FSDP2), the ZeRO stage changed, or the world size under ZeRO 1-3 (ZeRO-0 holds the
    whole state on every rank)."""
    ss, ns = saved.get("strategy") or {}, now["strategy"]
    if ss.get("name") != "deepspeed":
        return False
    if ns["name"] != "deepspeed":
        return True
    old_stage = ss.get("zero_stage", ns["zero_stage"])
    world_changed = saved.get("world_size", now["world_size"]) != now["world_size"]
    return old_stage != ns["zero_stage"] or (world_changed and old_stage > 0)


def prepare(candidates: list[str], now: dict) -> list[str]:
    """The checkpoints a launch may try, newest first, with the universal conversion of
    the newest done where it needs one (rank 0): a DeepSpeed checkpoint at another world
    size or stage, or resumed by DDP or FSDP2. An older one that would need its own
    conversion is left out as a fallback: one conversion per launch."""
    kept = []
    for i, folder in enumerate(candidates):
        saved = checkpoint.read_meta(Path(folder)) or {}
        if not needs_conversion(saved, now):
            kept.append(folder)
        elif i == 0:
            _convert_or_refuse(Path(folder), saved, now)
            kept.append(folder)
        else:
            log.warning("skipping checkpoint %s as a fallback: it would need its own universal "
                        "conversion", folder)  # fmt: skip
    return kept


def _convert_or_refuse(folder: Path, saved: dict, now: dict) -> None:
    old = f"{saved.get('world_size')} rank(s), ZeRO-{saved['strategy'].get('zero_stage')}"
    engine = now["strategy"]["name"]
    stage = f"ZeRO-{now['strategy']['zero_stage']}" if engine == "deepspeed" else engine
    new = f"{now['world_size']} rank(s), {stage}"
    log.warning("%s was written by %s, this launch is %s: converting it with DeepSpeed's "
                "universal checkpoint", folder, old, new)  # fmt: skip
    try:
        convert(folder)
    except Exception as exc:  # noqa: BLE001 - said in the one line, with the way out
        raise ConfigError(
            f"{folder} (written by {old}) needs DeepSpeed's universal conversion to resume "
            f"with {new}, which failed: {' '.join(str(exc).split())[:300]}; to resume it, run "
            f"with strategy=deepspeed, {saved.get('world_size')} ranks and strategy.zero_stage="
            f"{saved['strategy'].get('zero_stage')}"
        ) from exc


def convert(step_dir: Path) -> Path:
    """The universal checkpoint of `step_dir`, converted now unless a sealed one exists
    (rank 0 only: it runs under the run directory's lock, before any engine exists)."""
    final = converted_folder(step_dir)
    if checkpoint.is_complete(final):
        log.info("using %s, converted earlier from %s", final, step_dir.name)
        return final
    import_deepspeed()
    from deepspeed.checkpoint import ds_to_universal

    tmp = final.with_name(f"{checkpoint.TMP_PREFIX}{final.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(final, ignore_errors=True)  # unsealed: a conversion cut short before
    tmp.mkdir(parents=True)
    argv = ["ds_to_universal", "--input_folder", str(step_dir), "--output_folder", str(tmp),
            "--num_extract_workers", "1", "--num_merge_workers", "1",
            "--inject_missing_state"]  # fmt: skip
    chatter = io.StringIO()  # its progress prints and bars: kept for the error message
    saved_argv = sys.argv
    try:
        sys.argv = argv
        with contextlib.redirect_stdout(chatter), contextlib.redirect_stderr(chatter):
            ds_to_universal.main(ds_to_universal.parse_arguments())
    except Exception as exc:
        tail = " ".join(chatter.getvalue().split()[-30:])
        raise RuntimeError(f"{type(exc).__name__}: {exc} ({tail})") from exc
    finally:
        sys.argv = saved_argv
        # DeepSpeed also names the folder in a `latest_universal` file beside it; the
        # launcher resolves the folder itself, and the name would be the temporary one.
        (tmp.parent / "latest_universal").unlink(missing_ok=True)
    files = {
        str(p.relative_to(tmp)): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()
    }
    source = {"source": step_dir.name, "step": checkpoint.step_of(step_dir), "files": files}
    atomic_write(tmp / checkpoint.META, json.dumps(source, indent=1))
    tmp.rename(final)
    log.info("converted %s to DeepSpeed's universal checkpoint %s", step_dir.name, final)
    return final


def torch_state(folder: Path, model: torch.nn.Module, optimizer) -> tuple[dict, dict]:
    """DeepSpeed checkpoint `folder` as DDP holds it, from its universal conversion: the
    model's state dict and the AdamW state dict (keyed by position in `optimizer`, as
    launcher.strategy.ddp.build_optimizer orders the parameters). The conversion holds,
    per parameter name, the fp32 weights, both Adam moments and the step, whole: what
    DDP's and FSDP2's AdamW need, so they continue the DeepSpeed run's optimizer."""
    zero = converted_folder(folder) / "zero"

    shapes = {n: p.shape for n, p in model.named_parameters()}  # whole, even when sharded

    def read(name: str, what: str) -> torch.Tensor:
        value = torch.load(zero / name / f"{what}.pt", map_location="cpu", weights_only=True)
        value = value["param"] if isinstance(value, dict) else value
        if what == "step":
            return value
        # ZeRO-3's conversion keeps parameters flat (and may pad them): the model's shape.
        return value.flatten()[: shapes[name].numel()].view(shapes[name])

    names = {id(p): n for n, p in model.named_parameters()}  # a tied weight: its first name
    model_sd = model.state_dict()
    for name, param in model.named_parameters(remove_duplicate=False):
        model_sd[name] = read(names[id(param)], "fp32")
    ordered = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
    # ZeRO-1/2 conversions hold each parameter's step; ZeRO-3's one step for all, in the
    # global optimizer state (where DeepSpeed's ZeRO-3 loader reads it too).
    glob_sd = torch.load(zero / "optimizer_state.pt", map_location="cpu", weights_only=False)
    shared_step = glob_sd.get("optimizer_state_dict", {}).get("state", {}).get(0, {}).get("step")

    def step(name: str) -> torch.Tensor:
        if (zero / name / "step.pt").is_file():
            return read(name, "step")
        # A tensor of its own per parameter: AdamW increments each step in place.
        return torch.tensor(float(shared_step), dtype=torch.float32)

    state = {
        i: {"step": step(n), "exp_avg": read(n, "exp_avg"), "exp_avg_sq": read(n, "exp_avg_sq")}
        for i, n in enumerate(ordered)
    }
    return model_sd, {"state": state, "param_groups": optimizer.state_dict()["param_groups"]}


def load_into(folder: Path, model: torch.nn.Module, optimizer, load_whole) -> None:
    """The format reader's entry (launcher.config.registry.Format): the whole state from
    the universal conversion (made by `prepare` on rank 0), into another engine."""
    load_whole(*torch_state(folder, model, optimizer))


def weights(folder: Path) -> dict[str, torch.Tensor]:
    """The whole model in fp32, the ZeRO shards merged (DeepSpeed's zero_to_fp32)."""
    import_deepspeed()
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    state = get_fp32_state_dict_from_zero_checkpoint(str(folder.parent), tag=folder.name)
    return {k: v.float() for k, v in state.items()}
