"""Bad input, in-process through the train front door: one clear line naming the key or file
and the fix, exit code 2, nothing started; every numeric key's range; the refusal tables."""

from __future__ import annotations

import copy
import functools
import math
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import ListConfig, OmegaConf

from launcher.config import (
    ConfigError,
    TrainConfig,
    compose,
    friendly_overrides,
    validate,
)
from launcher.config.ranges import Range, numeric_keys
from launcher.config.registry import schemas
from launcher.config.schema import all_ranges
from launcher.config.sweep import main as sweep_main
from launcher.preflight import init_from_problem, logger_problems
from launcher.runtime.disk import shm_available_bytes
from launcher.strategy.deepspeed import cpu_has_fp16
from launcher.train.front_door import main

from paths import REPO

RANGES = all_ranges()


def run_main(monkeypatch, capsys, args: list[str]) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["launcher.train", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    return exit_info.value.code, capsys.readouterr().err


CASES = [
    (["trainer.max_stpes=3"], "trainer.max_stpes: unknown key (did you mean trainer.max_steps"),
    (["+trainer.foo=1"], "trainer.foo: unknown key"),
    (["trainer.max_steps=abc"], "trainer.max_steps:"),
    (["model=gpt3"], "model=gpt3: no such option; choose one of: gpt2, gpt2-large"),
    (["trainer.precision=fp64"], "trainer.precision=fp64: not one of fp32, bf16, fp16"),
    (
        ["model.attention=xformers"],
        "model.attention=xformers: not one of auto, flash, efficient, cudnn, math",
    ),
    (
        ["model.attention=cudnn", "trainer.device=cpu"],
        "model.attention=cudnn needs a CUDA GPU (on the CPU SDPA has flash and math)",
    ),
    (["trainer.compile=fast"], "trainer.compile=fast: not one of off, default"),
    (
        ["trainer.global_batch_size=10", "trainer.micro_batch_size=4"],
        "trainer.global_batch_size=10 is not divisible by trainer.micro_batch_size=4",
    ),
    (["trainer.seq_len=2048"], "trainer.seq_len=2048 exceeds model.n_positions=1024"),
    (
        ["data=text_files", "data.paths=[/nonexistent/*.txt]"],
        "data.paths: no file matches '/nonexistent/*.txt'",
    ),
    (
        ["data=memmap", "data.paths=[/nonexistent/train.bin]"],
        "data.paths: /nonexistent/train.bin does not exist",
    ),
    (["strategy.bucket_cap_mb=-1"], "strategy.bucket_cap_mb=-1.0: must be greater than 0"),
    (
        ["data.num_workers=0", "data.persistent_workers=true"],
        "data.persistent_workers=true needs data.num_workers>0",
    ),
    (
        ["strategy.comm_hook=powersgd2"],
        "strategy.comm_hook=powersgd2: not one of none, fp16, bf16, powersgd",
    ),
    (["strategy.powersgd_rank=0"], "strategy.powersgd_rank=0: must be at least 1"),
    (["strategy.powersgd_warmup_steps=-1"], "strategy.powersgd_warmup_steps=-1: must be 0 or more"),
    (
        ["strategy.powersgd_min_compression_rate=0.5"],
        "strategy.powersgd_min_compression_rate=0.5: must be at least 1",
    ),
    (
        ["strategy.comm_hook=powersgd", "trainer.precision=fp16"],
        "strategy.comm_hook=powersgd does not work with trainer.precision=fp16",
    ),
    (
        ["nccl.env.NCCL_ALOG=Ring"],
        "nccl.env.NCCL_ALOG: unknown key (did you mean nccl.env.NCCL_ALGO",
    ),
    (
        ["nccl=nvlnk"],
        "nccl=nvlnk: no such option; choose one of: debug, default, ethernet, infiniband, nvlink",
    ),
    (["strategy=ddp_schema"], "strategy=ddp_schema: a schema the options are checked against"),
    # issue 14's named cases: legal to the schema, not to the trainer
    (["model.n_head=0"], "model.n_head=0: must be at least 1"),
    (["trainer.lr=nan"], "trainer.lr=nan: must be a finite number greater than 0"),
    (["data.shard_tokens=0"], "data.shard_tokens=0: must be at least 65536"),
    (
        ["strategy=deepspeed", "strategy.comm_hook=bf16"],
        "strategy.comm_hook: unknown key for strategy=deepspeed: it is a key of strategy=ddp",
    ),
    (
        ["strategy=ddp", "strategy.offload_optimizer=cpu"],
        "strategy.offload_optimizer: unknown key for strategy=ddp: it is a key of "
        "strategy=deepspeed",
    ),
    (
        ["strategy=zero2", "+strategy.bucket_cap_mb=5"],
        "strategy.bucket_cap_mb: unknown key for strategy=deepspeed",
    ),
    (["trainer.on_nonfinite=ignore"], "trainer.on_nonfinite=ignore: not one of stop, skip, rewind"),
    (
        ["strategy=deepspeed", "trainer.on_nonfinite=skip"],
        "trainer.on_nonfinite=skip is not supported with strategy=deepspeed",
    ),
    (["trainer.on_oom=halve"], "trainer.on_oom=halve: not one of stop, retry"),
    (
        ["trainer.micro_batch_size=big"],
        "trainer.micro_batch_size=big: give a whole number of at least 1, or auto",
    ),
    (["trainer.micro_batch_size=0"], "trainer.micro_batch_size=0: must be at least 1"),
    (
        ["trainer.micro_batch_size=auto", "trainer.global_batch_size=null"],
        "trainer.micro_batch_size=auto needs trainer.global_batch_size",
    ),
    (
        ["strategy=fsdp2", "trainer.on_oom=retry"],
        "trainer.on_oom=retry is not supported with strategy=fsdp2 (its engine cannot abandon",
    ),
    (
        ["strategy=zero1", "trainer.micro_batch_size=auto"],
        "trainer.micro_batch_size=auto is not supported with strategy=deepspeed",
    ),
    (
        ["strategy.static_graph=true", "trainer.on_oom=retry"],
        "strategy.static_graph=true cannot change its micro-batch in-process",
    ),
    (
        ["strategy.name=deepspeed"],
        "strategy.name=deepspeed does not match the strategy option (strategy=ddp)",
    ),
    (
        ["profiler=steps", "trainer.max_steps=12"],
        "profiler: profiler.skip_first=10 then 1 cycle(s) of wait=0 + warmup=2 + active=3 "
        "steps need 15 steps but trainer.max_steps=12, so nothing would be recorded",
    ),
    (
        ["profiler=steps", "trainer.max_steps=13"],
        "trainer.max_steps=13, so only steps 13-13 would be recorded",
    ),
    (
        ["data=text_files", "data.paths=/nonexistent/*.txt"],  # a single glob is a list of one
        "data.paths: no file matches '/nonexistent/*.txt'",
    ),
    (["data=text_files"], "data.paths is empty; give text file globs"),
    (
        ["data=memmap", "data.paths=[a.bin]", "data.vocab_size=null"],
        "data.vocab_size is not set; memmap data needs",
    ),
    (["model.init_from=/nonexistent/gpt2"], "model.init_from=/nonexistent/gpt2: no such folder"),
    (
        ["data.tokenizer=/nonexistent/gpt2.tiktoken"],
        "data.tokenizer=/nonexistent/gpt2.tiktoken: not an existing .tiktoken file",
    ),
    (
        ["run.root=/proc/runs"],
        "run.root=/proc/runs: it would be made in /proc, which is not a writable directory",
    ),
]


@pytest.mark.parametrize(("args", "expected"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_override_is_one_line(monkeypatch, capsys, args, expected):
    code, err = run_main(monkeypatch, capsys, args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and expected in lines[0], lines[0]


@pytest.mark.skipif(
    torch.cuda.is_available() or cpu_has_fp16(),
    reason="needs a CPU without fp16 (DeepSpeed refuses fp16 there); this one has it",
)
def test_deepspeed_fp16_on_this_cpu_is_refused(monkeypatch, capsys):
    code, err = run_main(monkeypatch, capsys, ["strategy=zero1", "trainer.precision=fp16"])
    assert code == 2
    assert err.startswith("error: trainer.precision=fp16 with strategy=deepspeed needs a GPU")
    assert len(err.strip().splitlines()) == 1


def test_config_dir_is_read_by_the_check_too(monkeypatch, capsys, tmp_path):
    """`--config-dir DIR +exp=mine` reaches the experiments in DIR/exp/ (a tuned.yaml copied
    there, say): the check before Hydra starts composes with it, so a mistake inside the
    file is the usual one line, and a missing directory is named."""
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "mine.yaml").write_text("# @package _global_\ntrainer:\n  max_stpes: 3\n")
    code, err = run_main(monkeypatch, capsys, ["--config-dir", str(tmp_path), "+exp=mine"])
    assert code == 2
    assert err.startswith("error: trainer.max_stpes: unknown key (did you mean trainer.max_steps")
    code, err = run_main(monkeypatch, capsys, ["--config-dir", str(tmp_path / "no"), "+exp=mine"])
    assert (code, err.strip()) == (2, f"error: --config-dir {tmp_path / 'no'}: no such directory")


def test_resume_path_without_checkpoint(monkeypatch, capsys, tmp_path):
    code, err = run_main(monkeypatch, capsys, [f"resume={tmp_path}"])
    assert code == 2
    assert err.strip() == (
        f"error: resume={tmp_path}: no complete checkpoint there; give a run directory, "
        "its checkpoints/ folder or a step_<n> folder, or use resume=auto"
    )


def test_shm_too_small_names_both_numbers_and_fixes(monkeypatch, capsys):
    size, _ = shm_available_bytes()
    # A prefetch depth whose need exceeds the whole of /dev/shm: refused whatever other
    # processes free meanwhile (measured against the free space, it raced them).
    batch_bytes = 2 * 4 * 128 * 8
    prefetch = size // (2 * batch_bytes * 2) + 1
    code, err = run_main(
        monkeypatch, capsys, ["data.num_workers=2", f"data.prefetch_factor={prefetch}"]
    )
    assert code == 2
    line = err.strip()
    assert len(line.splitlines()) == 1
    for fix in ("--shm-size", "--ipc=host", "medium: Memory", "data.num_workers"):
        assert fix in line, line


def schema_numeric_keys() -> set[str]:
    keys = set(numeric_keys(OmegaConf.structured(TrainConfig)))
    for engine in schemas().values():
        keys |= set(numeric_keys(OmegaConf.structured(engine), "strategy."))
    return keys - {k for k in keys if k.startswith("strategy.") and k.count(".") > 1}


def test_every_numeric_key_has_a_range():
    """A numeric key added to the schema without an entry in RANGES fails here."""
    assert schema_numeric_keys() == set(RANGES)


def outside(allowed: Range, is_float: bool) -> list:
    """Values just outside the range, and NaN and infinity for a float key."""
    step = 1.0 if is_float else 1
    values = []
    if allowed.low is not None:
        values.append(allowed.low if allowed.low_open else allowed.low - step)
    if allowed.high is not None:
        values.append(allowed.high if allowed.high_open else allowed.high + step)
    if is_float:
        values += [math.nan, math.inf]
    return values


@functools.cache
def default_config(engine: str):
    return compose([f"strategy={engine}"])


def composed_for(key: str):
    """A copy of the default config, with the engine that has `key` if it is a strategy key."""
    leaf = key.removeprefix("strategy.")
    engine = next((n for n, s in schemas().items() if leaf in s.__dataclass_fields__), "ddp")
    return copy.deepcopy(default_config(engine))


BAD_VALUES = [
    (key, value)
    for key, allowed in RANGES.items()
    for value in outside(
        allowed, isinstance(allowed.low if allowed.low is not None else allowed.high, float)
    )
]


@pytest.mark.parametrize(("key", "value"), BAD_VALUES, ids=[f"{k}={v}" for k, v in BAD_VALUES])
def test_a_value_outside_its_range_is_refused(key, value):
    cfg = composed_for(key)
    node = OmegaConf.select(cfg, key, throw_on_missing=False)
    OmegaConf.update(cfg, key, [value] if isinstance(node, ListConfig) else value)
    with pytest.raises(ConfigError) as refused:
        validate(cfg, 1)
    line = str(refused.value)
    assert line.startswith(f"{key}=") and ": must be " in line, line
    assert RANGES[key].rule() in line


def test_range_rules_read_as_documented():
    """docs/configuration.md lists every range in the words the error line uses."""
    doc = (REPO / "docs" / "configuration.md").read_text()
    for key, allowed in RANGES.items():
        assert f"| `{key}` | {allowed.rule()} |" in doc, key


def test_num_workers_zero_alone_turns_persistent_workers_off():
    cfg = compose(["data.num_workers=0"])
    validate(cfg, 1)
    assert cfg.data.persistent_workers is False
    cfg = compose([])
    validate(cfg, 1)
    assert cfg.data.persistent_workers is True


def test_a_single_value_for_a_list_key_is_a_list_of_one():
    assert friendly_overrides(["data.paths=/data/*.txt", "+logger.tags=a", "data.paths=a,b"]) == [
        "data.paths=[/data/*.txt]",
        "+logger.tags=[a]",
        "data.paths=a,b",  # a sweep: left to Hydra
    ]
    assert compose(friendly_overrides(["profiler.ranks=0"])).profiler.ranks == [0]


def test_a_string_for_a_list_key_shows_the_list_syntax():
    with pytest.raises(ConfigError) as refused:
        compose(["data.paths=/data/*.txt"])
    assert str(refused.value) == (
        "data.paths: a list is expected; write data.paths='[/data/*.txt]' (quoted, so the "
        "shell keeps the brackets), or [a,b] for several"
    )


def test_a_profiler_schedule_that_fits_is_accepted():
    validate(compose(["+exp=profile"]), 2)  # steps 11-13 of 16


@pytest.mark.skipif(torch.cuda.is_available(), reason="refusing CUDA needs a machine without it")
def test_cuda_without_a_gpu_is_refused(monkeypatch, capsys):
    code, err = run_main(monkeypatch, capsys, ["trainer.device=cuda"])
    assert code == 2
    assert err.startswith("error: trainer.device=cuda but no CUDA device is visible")
    assert len(err.strip().splitlines()) == 1


def test_run_root_under_a_file_is_refused(monkeypatch, capsys, tmp_path):
    (tmp_path / "file").write_text("")
    code, err = run_main(monkeypatch, capsys, [f"run.root={tmp_path}/file/runs"])
    assert code == 2
    assert err.strip() == (
        f"error: run.root={tmp_path}/file/runs: it would be made in {tmp_path}/file, which is "
        "not a writable directory; choose a run.root you can write to"
    )


def test_init_from_folder_without_weights_is_refused(tmp_path):
    assert init_from_problem(str(tmp_path)) == (
        f"model.init_from={tmp_path}: {tmp_path} holds no config.json; give a folder written "
        "by save_pretrained (python -m launcher.export RUN_DIR OUT_DIR writes one)"
    )


def test_wandb_without_the_package_is_refused(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # how Python marks a module unimportable
    logger = compose(["logger=wandb", "logger.mode=offline"]).logger
    assert logger_problems(logger) == [
        "logger.mode=offline needs the wandb package, which is not installed: "
        "pip install 'launcher[wandb]', or logger=none"
    ]


def test_wandb_online_needs_a_key(monkeypatch, tmp_path):
    netrc_file = tmp_path / "netrc"
    netrc_file.write_text("machine example.com login user password x\n")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_BASE_URL", raising=False)
    monkeypatch.setenv("NETRC", str(netrc_file))
    logger = compose(["logger=wandb"]).logger
    (problem,) = logger_problems(logger)
    assert problem.startswith("logger.mode=online needs a W&B API key: set WANDB_API_KEY")
    assert logger_problems(compose(["logger=wandb", "logger.mode=offline"]).logger) == []
    netrc_file.write_text("machine api.wandb.ai login user password " + "k" * 40 + "\n")
    assert logger_problems(logger) == []  # `wandb login` wrote the key
    netrc_file.write_text("")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert logger_problems(logger) == []


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def finished_run(folder: Path, summary_text: str, config_text: str = "trainer: {}\n") -> Path:
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(summary_text)
    (folder / "config.yaml").write_text(config_text)
    return folder


@pytest.mark.parametrize(
    ("summary_text", "config_text", "expected"),
    [
        ('{"status": "compl', "trainer: {}\n", "summary.json: not readable JSON ("),
        ('{"status": "completed"}', "trainer: [\n", "config.yaml: not a readable config ("),
        ("[]", "trainer: {}\n", "summary.json or config.yaml does not hold a mapping"),
    ],
)
def test_sweep_refuses_a_damaged_run_directory(
    tmp_path, capsys, summary_text, config_text, expected
):
    run = finished_run(tmp_path / "a", summary_text, config_text)
    assert sweep_main([str(run), "--out", str(tmp_path / "out")]) == 2
    assert expected in one_error_line(capsys)


def test_sweep_refuses_an_unwritable_out_folder(tmp_path, capsys):
    run = finished_run(tmp_path / "a", '{"status": "completed"}')
    (tmp_path / "file").write_text("")
    assert sweep_main([str(run), "--out", f"{tmp_path}/file/out"]) == 2
    assert one_error_line(capsys) == (
        f"error: --out {tmp_path}/file/out: it would be made in {tmp_path}/file, which is not "
        "a writable directory; choose a folder you can write"
    )
