"""Export: a checkpoint of any engine written as a transformers folder that
`GPT2LMHeadModel.from_pretrained` reads (the `python -m launcher.export` front door's work).

The newest complete checkpoint whose weights load is used, as a resume would choose it; the
weights are read by the reader their format declares (launcher.config.registry), the native
module's converted (launcher.model.gpt2), transformers' copied.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import torch

from launcher.checkpoint import protocol as checkpoint
from launcher.config.registry import format_of, formats
from launcher.data.tokenizer import TOKENIZER_DIR
from launcher.model.gpt2 import config_of, hf_config, to_hf_state_dict
from launcher.paths import is_mount_point, same_access, writable_dir_problem
from launcher.runtime import disk
from launcher.runtime.lock import LockHeld, tool_lock


class ExportError(ValueError):
    """What is wrong with the input, worded as the one line the user sees."""


def read_state(folder: Path) -> dict[str, torch.Tensor]:
    """The whole model's state dict from a checkpoint of any engine, on the CPU, read by the
    reader its format declares (launcher.config.registry)."""
    fmt = format_of(folder)
    if fmt is None:
        markers = ", ".join(f.marker for f in formats().values())
        raise ExportError(
            f"{folder} holds none of the files a checkpoint starts with ({markers}); pass a run "
            "directory or a checkpoints/step_<n> folder the launcher wrote"
        )
    return fmt.module().weights(folder)


def newest_readable(source: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """The newest complete checkpoint of `source` whose weights load, and its state: an
    unreadable one (a garbage model.pt of the right size) is skipped with one warning,
    as a resume skips it."""
    found = checkpoint.candidates(source)
    if not found:
        raise ExportError(
            f"{source} holds no complete checkpoint; pass a run directory with checkpoints "
            "(trainer.checkpoint_interval > 0) or a complete checkpoints/step_<n> folder"
        )
    problems = []
    for folder in found:
        try:
            state = read_state(folder)
        except ExportError:
            raise
        except Exception as exc:  # noqa: BLE001 - any unreadable file: try the previous one
            why = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
            problems.append((folder, why))
            continue
        for skipped, why in problems:  # said once a readable one is found; else the error
            print(f"warning: checkpoint {skipped} is unreadable ({why}); falling back to the "
                  "previous one", file=sys.stderr)  # fmt: skip
        return folder, state
    problems = [f"{folder.name}: {why}" for folder, why in problems]
    raise ExportError(f"no checkpoint of {source} could be read ({' | '.join(problems)})")


def run_tokenizer(source: Path) -> Path | None:
    """The tokenizer folder the run of `source` (a run directory or one of its
    checkpoints/step_<n>) saved, or None (a run of token ids: memmap, synthetic)."""
    for run_dir in (source, source.parent.parent):
        if (run_dir / TOKENIZER_DIR / "tokenizer.json").is_file():
            return run_dir / TOKENIZER_DIR
    return None


def run_dir_of(source: Path) -> Path:
    """The run directory of `source`: itself, or the run a checkpoints/step_<n> is of."""
    source = Path(source).absolute()
    return source.parent.parent if source.parent.name == "checkpoints" else source


def export(source: Path, out: Path) -> Path:
    """Write the model of `source`'s checkpoint, and its run's tokenizer, into `out`;
    returns the checkpoint used.

    `out` is made beside itself and renamed into place, so its folder must be writable and
    `out` itself no mount point; the export holds `.<out>.export.lock` there meanwhile: a
    second export to the same OUT_DIR stops in one line rather than interleave with it."""
    out = Path(out).absolute()
    problem = writable_dir_problem(out.parent, f"OUT_DIR {out}", "choose an OUT_DIR on a "
                                   "writable file system")  # fmt: skip
    if problem:
        raise ExportError(problem)
    if out.is_dir() and is_mount_point(out):
        raise ExportError(
            f"{out} is a mount point, which an export (made beside it, then renamed) cannot "
            f"replace; choose a new folder inside it, e.g. {out / 'model'}"
        )
    not_empty_problem(out)  # the cheap refusal first
    folder, model, needed = model_of(source)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with tool_lock(out.parent, "export", "choose another OUT_DIR", f".{out.name}.export.lock"):
            not_empty_problem(out)  # again, now that no other export can write it
            write_whole(model, run_tokenizer(source), out, needed=needed, like=run_dir_of(source))
    except LockHeld as exc:
        if exc.disk_full:
            raise ExportError(disk.no_space_line("the export", out, needed)) from exc
        raise ExportError(str(exc)) from exc
    return folder


def not_empty_problem(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{out} exists and is not an empty folder; choose a new OUT_DIR")


def model_of(source: Path):
    """(the checkpoint used, its weights as a GPT2LMHeadModel, their bytes): read only."""
    folder, state = newest_readable(source)
    model_meta = (checkpoint.read_meta(folder) or {}).get("model") or {}
    if not model_meta.get("n_head"):
        raise ExportError(
            f"{folder / checkpoint.META} does not record model.n_head (written before the "
            "launcher recorded the model's shape); export from a newer checkpoint"
        )
    if model_meta.get("impl", "hf") == "native":
        state = to_hf_state_dict(state)
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar per load and save of a 1-file model is noise

    model = GPT2LMHeadModel(hf_config(config_of(state, int(model_meta["n_head"]))))
    loaded = model.load_state_dict(state, strict=False)  # older transformers: mask buffers
    buffers = (".attn.bias", ".attn.masked_bias")
    wrong = [k for k in loaded.missing_keys + loaded.unexpected_keys if not k.endswith(buffers)]
    if wrong:
        raise ExportError(
            f"{folder}: the weights do not fit a GPT-2 (first mismatch: {sorted(wrong)[0]}); "
            "export a checkpoint the launcher's GPT-2 wrote"
        )
    return folder, model, sum(t.numel() * t.element_size() for t in state.values())


def write_whole(model, tokenizer: Path | None, out: Path, *, needed: int, like: Path) -> None:
    """`model.save_pretrained` (and the tokenizer's files beside it) into a temporary
    sibling, as readable as the run directory `like` (safetensors writes its file for its
    owner alone), renamed to `out` when complete, so a full disk (or any failure) leaves no
    half an export; a full disk is one line."""
    tmp = out.with_name(f".tmp-{out.name}")
    shutil.rmtree(tmp, ignore_errors=True)  # a crashed export's leftover
    try:
        model.save_pretrained(tmp)
        if tokenizer is not None:
            for path in tokenizer.iterdir():
                shutil.copyfile(path, tmp / path.name)
        same_access(tmp, like)
        os.rename(tmp, out)  # replaces an empty `out` (POSIX rename)
    except OSError as exc:
        if disk.is_full(exc, out.parent):
            raise ExportError(disk.no_space_line("the export", out, needed)) from exc
        why = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
        raise ExportError(f"{out} could not be written ({why}); choose another OUT_DIR") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
