# ruff: noqa: E501 - the table holds the commands exactly as the docs write them
"""Every shell command in README.md and docs/*.md runs as written, or is checked as far as
this machine allows, or says why not (issue 31 item 8).

`DECISIONS` holds one decision per command found in a ```bash (sh, shell, console) block
(continuation lines joined, comments and `$ ` prompts dropped), so a command added to the
docs without a decision, or a decision left for a command that is gone, fails the fast tier:

- `run`: run here as written, from a scratch folder, with this venv's python (the launch
  tier); the value is the exit code it must end with;
- `check`: a training launch too long to run here (minutes, 8 ranks or a GPU): its overrides
  are composed as the front door composes them and checked at its world size
  (`--nproc_per_node` x `--nnodes`) as a submission is (`check_config`: the config alone,
  not this machine's devices);
- `dry`: a submission, rendered with `--dry-run` into a scratch run.root (submitting needs a
  cluster);
- `skip`: cannot run here; the reason says why.

The README's two CI commands are run by `.ci/run` in a fresh virtual environment.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```(?:bash|sh|shell|console)\n(.*?)^```", re.S | re.M)


def doc_commands(path: Path) -> list[str]:
    """The commands of `path`'s shell blocks, each on one line, without its comment."""
    found, pending = [], ""
    for block in BLOCK.findall(path.read_text()):
        for line in block.splitlines():
            pending = f"{pending} {line.strip()}".strip() if pending else line.strip()
            if pending.endswith("\\"):
                pending = pending[:-1].rstrip()
                continue
            command, pending = pending.removeprefix("$ "), ""
            command = re.sub(r"\s+#.*$", "", command).strip()
            if command and not command.startswith("#"):
                found.append(command)
    return found


def all_commands() -> dict[tuple[str, str], None]:
    return {(str(p.relative_to(ROOT)), c): None for p in DOCS for c in doc_commands(p)}


# (file, command): (decision, the exit code for `run`, else why)
DECISIONS: dict[tuple[str, str], tuple[str, str]] = {
    (
        "docs/benchmarks.md",
        "python benchmarks/memory_tier.py [--pairs 8] [--steps 60] [--interval 10] [--out FILE] [overrides...]",
    ): ("skip", "a usage line (options in brackets); tests/launches/test_benchmarks.py runs it"),
    (
        "docs/benchmarks.md",
        "python benchmarks/peer_copy.py [--nodes 4] [--per-node 4] [--pairs 2] [--steps 160] [--interval 10] [--skip 20] [--out FILE] [overrides...]",
    ): ("skip", "a usage line (options in brackets); tests/launches/test_benchmarks.py runs it"),
    (
        "docs/benchmarks.md",
        "python benchmarks/goodput.py [--minutes 15] [--every 180] [--nodes 4] [--per-node 4] [--out FILE] [overrides...]",
    ): ("skip", "a usage line; 16 ranks for 15 minutes under faults: a benchmark, never a test"),
    (
        "docs/benchmarks.md",
        "python benchmarks/host_memory.py [--build gpt2-tiny,gpt2,gpt2-medium,gpt2-large] [--pretrained gpt2] [--runs all] [--impl native]",
    ): ("skip", "a usage line (options in brackets): builds and runs that take minutes"),
    (
        "docs/burnin.md",
        "python -m launcher.submit slurm cluster.nodes=1 cluster.procs_per_node=2 burnin.action=refuse burnin.tolerance=3 fault.kind=slow_device fault.rank=0 fault.seconds=0.2",
    ): ("dry", "rendered with --dry-run (applying needs a cluster)"),
    (
        "docs/burnin.md",
        "python -m launcher.submit slurm cluster.nodes=4 burnin.action=refuse",
    ): ("dry", "rendered with --dry-run (applying needs a cluster)"),
    (
        "docs/burnin.md",
        "python -m launcher.torchrun --standalone --nproc_per_node=2 -m launcher.train burnin.enabled=true",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    (
        "docs/checkpoints.md",
        "torchrun --standalone --nproc_per_node=8 --max-restarts=3 -m launcher.train trainer.global_batch_size=64 trainer.memory_checkpoint_interval=5",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    (
        "docs/rehearse.md",
        "python -m launcher.rehearse",
    ): ("skip", "a rehearsal is minutes of launches; tests/launches/test_rehearse.py runs it"),
    (
        "docs/rehearse.md",
        "python -m launcher.rehearse rehearse.only=[stop,hung_rank]",
    ): ("skip", "a rehearsal is minutes of launches; tests/launches/test_rehearse.py runs it"),
    (
        "docs/rehearse.md",
        "python -m launcher.rehearse rehearse.skip=[world_size]",
    ): ("skip", "a rehearsal is minutes of launches; tests/launches/test_rehearse.py runs it"),
    (
        "docs/rehearse.md",
        "python -m launcher.rehearse strategy=fsdp2 data.num_workers=4 run.id=exp7 cluster=slurm",
    ): ("skip", "a rehearsal is minutes of launches; tests/launches/test_rehearse.py runs it"),
    (
        "docs/rehearse.md",
        "torchrun --standalone --nproc_per_node=8 -m launcher.rehearse model=gpt2",
    ): ("skip", "a rehearsal is minutes of launches; tests/launches/test_rehearse.py runs it"),
    (
        "README.md",
        "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 -e . && torchrun --standalone --nproc_per_node=2 -m launcher.train",
    ): ("skip", "installs packages (.ci/run runs the README's install line in a fresh venv)"),
    (
        "README.md",
        ". .venv/bin/activate && pip install -e '.[test]' && python -m pytest -n 3 -m \"not serial\" && python -m pytest -m serial",
    ): ("skip", "the test suite itself (.ci/run and the lead run it)"),
    (
        "README.md",
        "torchrun --standalone --nproc_per_node=8 -m launcher.train trainer.global_batch_size=64 +exp=profile",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    ("README.md", "python -m launcher.analyze runs/<id>"): (
        "skip",
        "a template: placeholders to fill in",
    ),
    (
        "README.md",
        "torchrun --standalone --nproc_per_node=8 -m launcher.train trainer.global_batch_size=64 +exp=bucket_sweep",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    ("README.md", "torchrun --standalone --nproc_per_node=8 -m launcher.commbench"): (
        "skip",
        "8 ranks, one per GPU (commbench at 2 CPU ranks: tests/test_comm.py)",
    ),
    ("README.md", "torchrun --standalone --nproc_per_node=8 -m launcher.tune [overrides]"): (
        "skip",
        "a template: placeholders to fill in",
    ),
    (
        "docs/benchmarks.md",
        "python benchmarks/overhead.py [--pairs 8] [--steps 60] [--out FILE] [overrides...]",
    ): ("skip", "a template: placeholders to fill in"),
    (
        "docs/benchmarks.md",
        "python benchmarks/fork_guard.py [--seconds 60] [--load 6] [--start-timeout 2]",
    ): ("skip", "a template: placeholders to fill in"),
    ("docs/data.md", "python benchmarks/fork_guard.py --seconds 60 --load 6"): (
        "skip",
        "two minutes with six busy processes; test_benchmarks.py runs it for 2 s unloaded",
    ),
    (
        "docs/benchmarks.md",
        "python benchmarks/startup.py [--pairs 4] [--warmup 1] [--nproc 2] [--judge wall|cpu] "
        "[--out FILE] [overrides...]",
    ): ("skip", "a template: placeholders to fill in"),
    (
        "docs/benchmarks.md",
        "python benchmarks/warm_start.py [--pairs 3] [--nproc 8] [--steps 30] [--fault-step 15] "
        "[--out FILE] [overrides...]",
    ): ("skip", "a template: placeholders to fill in"),
    (
        "docs/benchmarks.md",
        "torchrun --standalone --nproc_per_node=2 benchmarks/comm_timing_cost.py [--steps 60] [overrides...]",
    ): ("skip", "a template: placeholders to fill in"),
    (
        "docs/benchmarks.md",
        "python benchmarks/profiler_cost.py [--rounds 2] [--steps 24] [overrides...]",
    ): ("skip", "a template: placeholders to fill in"),
    (
        "docs/checkpoints.md",
        "torchrun --standalone --nproc_per_node=2 -m launcher.train run.id=long trainer.lr_decay_steps=2000 trainer.max_steps=1000",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    (
        "docs/checkpoints.md",
        "torchrun --standalone --nproc_per_node=2 -m launcher.train run.id=long trainer.lr_decay_steps=2000 trainer.max_steps=2000",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    (
        "docs/checkpoints.md",
        "torchrun --standalone --nproc_per_node=8 --max-restarts=3 -m launcher.train ...",
    ): ("skip", "a template: placeholders to fill in"),
    (
        "docs/communication.md",
        "torchrun --standalone --nproc_per_node=8 -m launcher.commbench [--min-bytes 1K] [--max-bytes 256M] [--factor 4] [--dtypes fp32,bf16] [--warmup 5] [--iters 20] [--out commbench.json]",
    ): ("skip", "a template: placeholders to fill in"),
    (
        "docs/communication.md",
        "torchrun --nnodes=2 ... -m launcher.train nccl=ethernet nccl.env.NCCL_SOCKET_NTHREADS=8",
    ): ("skip", "a template: placeholders to fill in"),
    ("docs/communication.md", "for preset in default nvlink; do"): (
        "skip",
        "a shell loop; its body is checked for each preset",
    ),
    (
        "docs/communication.md",
        "torchrun --standalone --nproc_per_node=8 -m launcher.train trainer.global_batch_size=64 nccl=$preset run.root=runs/nccl_cmp run.id=$preset",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    ("docs/communication.md", "done"): ("skip", "a shell loop's end"),
    (
        "docs/communication.md",
        "torchrun --standalone --nproc_per_node=8 -m launcher.train trainer.global_batch_size=64 nccl.env.NCCL_ALGO=Tree run.root=runs/nccl_cmp run.id=tree",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    (
        "docs/communication.md",
        "python -m launcher.config.sweep runs/nccl_cmp/default runs/nccl_cmp/nvlink runs/nccl_cmp/tree --out runs/nccl_cmp",
    ): ("skip", "reads the runs the loop above makes (8 ranks, minutes each)"),
    (
        "docs/data.md",
        "python -m launcher.train data=text_files 'data.paths=[/data/books/**/*.txt]' data.max_bytes=null",
    ): ("skip", "needs the user's corpus under /data"),
    (
        "docs/data.md",
        "python -m launcher.train data=memmap 'data.paths=[/data/owt/train.bin]' 'data.val_paths=[/data/owt/val.bin]'",
    ): ("skip", "needs the user's corpus under /data"),
    (
        "docs/data.md",
        "python -m launcher.train data=synthetic data.vocab_size=50257 model=gpt2 trainer.seq_len=1024",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    (
        "docs/deepspeed.md",
        "torchrun --standalone --nproc_per_node=8 -m launcher.train trainer.global_batch_size=64 strategy=deepspeed strategy.zero_stage=2",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    (
        "docs/deepspeed.md",
        "torchrun --standalone --nproc_per_node=8 -m launcher.train trainer.global_batch_size=64 strategy=zero3 strategy.offload_optimizer=cpu strategy.offload_param=cpu",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    (
        "docs/deepspeed.md",
        "torchrun --standalone --nproc_per_node=8 -m launcher.train trainer.global_batch_size=64 +exp=zero_sweep",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    ("docs/deepspeed.md", "pip install -e '.[deepspeed]'"): (
        "skip",
        "installs packages (.ci/run runs the README's install line in a fresh venv)",
    ),
    (
        "docs/faults.md",
        "python -m launcher.torchrun --standalone --nproc_per_node=8 -m launcher.train [overrides]",
    ): ("skip", "a template: placeholders to fill in"),
    ("docs/faults.md", "echo $?"): ("skip", "prints the exit code of the command before it"),
    ("docs/faults.md", "python -m launcher.analyze runs/<id>"): (
        "skip",
        "a template: placeholders to fill in",
    ),
    (
        "docs/faults.md",
        "python -m torch.distributed.flight_recorder.fr_trace -v runs/<id>/logs/fr",
    ): ("skip", "a template: placeholders to fill in"),
    (
        "docs/faults.md",
        "python -m launcher.submit k8s cluster.nodes=2 trainer.global_batch_size=64 trainer.max_steps=1000 fault.kind=stall fault.rank=1 fault.step=500 fault.seconds=3600",
    ): ("dry", "rendered with --dry-run (applying needs a cluster)"),
    (
        "docs/faults.md",
        "python -m launcher.torchrun --standalone --nproc_per_node=2 -m launcher.train fault.kind=exit fault.rank=1 fault.step=20 fault.exit_code=2",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    (
        "docs/faults.md",
        "python -m launcher.torchrun --standalone --nproc_per_node=2 -m launcher.train trainer.max_steps=20 trainer.checkpoint_interval=10 fault.kind=slow_phase 'fault.phases=[checkpoint]' fault.seconds=70",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    (
        "docs/faults.md",
        "python -m launcher.torchrun --standalone --nproc_per_node=2 -m launcher.train trainer.max_steps=20 trainer.on_nonfinite=skip fault.kind=nonfinite fault.rank=1 fault.step=5",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    (
        "docs/faults.md",
        "python -m launcher.torchrun --standalone --nproc_per_node=2 -m launcher.train trainer.max_steps=30 trainer.checkpoint_interval=10 trainer.on_nonfinite=rewind fault.kind=nonfinite fault.rank=1 fault.step=15",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    (
        "docs/faults.md",
        "python -m launcher.torchrun --standalone --nproc_per_node=2 -m launcher.train trainer.max_steps=20 trainer.on_nonfinite=skip trainer.max_bad_steps=0 fault.kind=nonfinite fault.rank=1 fault.step=5",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    (
        "docs/faults.md",
        "python -m launcher.torchrun --standalone --nproc_per_node=2 -m launcher.train trainer.max_steps=20 trainer.micro_batch_size=auto fault.kind=oom fault.rank=1 fault.micro_batch=2",
    ): (
        "check",
        "composed and validated at its world size (the same launches, shrunk, run in tests/launches/test_oom.py)",
    ),
    (
        "docs/faults.md",
        "python -m launcher.torchrun --standalone --nproc_per_node=2 -m launcher.train trainer.max_steps=20 trainer.on_oom=retry fault.kind=oom fault.rank=1 fault.step=5 fault.micro_batch=2",
    ): (
        "check",
        "composed and validated at its world size (the same launches, shrunk, run in tests/launches/test_oom.py)",
    ),
    (
        "docs/faults.md",
        "python -m launcher.torchrun --standalone --nproc_per_node=2 -m launcher.train trainer.max_steps=20 trainer.on_oom=retry fault.kind=oom fault.micro_batch=0",
    ): (
        "check",
        "composed and validated at its world size (the same launches, shrunk, run in tests/launches/test_oom.py)",
    ),
    (
        "docs/kubernetes.md",
        "python -m launcher.submit k8s cluster.nodes=2 cluster.gpus_per_node=8 trainer.global_batch_size=64 +exp=bucket_sweep run.root=/runs",
    ): ("dry", "rendered with --dry-run (applying needs a cluster)"),
    (
        "docs/kubernetes.md",
        "kubectl create secret generic wandb --from-literal=api-key=$WANDB_API_KEY",
    ): ("skip", "needs a Kubernetes cluster and a W&B key"),
    (
        "docs/kubernetes.md",
        'kubectl create secret generic launcher-secrets --from-literal=HF_TOKEN="$HF_TOKEN"',
    ): ("skip", "needs a Kubernetes cluster and a Hugging Face token"),
    (
        "docs/logging.md",
        "torchrun --standalone --nproc_per_node=2 -m launcher.train logger=tensorboard",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    (
        "docs/logging.md",
        "torchrun --standalone --nproc_per_node=2 -m launcher.train 'logger=[wandb,tensorboard]' logger.mode=offline",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    ("docs/logging.md", "tensorboard --logdir runs/<run_id>"): (
        "skip",
        "a template: placeholders to fill in",
    ),
    ("docs/logging.md", "pip install -e '.[wandb]'"): (
        "skip",
        "installs packages (.ci/run runs the README's install line in a fresh venv)",
    ),
    ("docs/logging.md", "export WANDB_API_KEY=..."): (
        "skip",
        "a template: placeholders to fill in",
    ),
    (
        "docs/logging.md",
        "torchrun --standalone --nproc_per_node=2 -m launcher.train logger=wandb",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    (
        "docs/logging.md",
        "torchrun --standalone --nproc_per_node=2 -m launcher.train logger=wandb logger.mode=offline",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    ("docs/logging.md", "wandb leet inspect --summary runs/<run_id>/wandb/offline-run-*/"): (
        "skip",
        "a template: placeholders to fill in",
    ),
    ("docs/logging.md", "wandb leet inspect --summary --json runs/<run_id>/wandb/offline-run-*/"): (
        "skip",
        "a template: placeholders to fill in",
    ),
    (
        "docs/logging.md",
        'wandb leet inspect --json runs/<run_id>/wandb/offline-run-*/ | grep \'"type":"history"\'',
    ): ("skip", "a template: placeholders to fill in"),
    ("docs/logging.md", "wandb leet runs/<run_id>/wandb"): (
        "skip",
        "a template: placeholders to fill in",
    ),
    ("docs/logging.md", "wandb sync runs/<run_id>/wandb/offline-run-*"): (
        "skip",
        "a template: placeholders to fill in",
    ),
    ("docs/logging.md", "pip install -e '.[tensorboard]'"): (
        "skip",
        "installs packages (.ci/run runs the README's install line in a fresh venv)",
    ),
    ("docs/logging.md", "pip install tensorboard"): (
        "skip",
        "installs packages (.ci/run runs the README's install line in a fresh venv)",
    ),
    ("docs/logging.md", "tensorboard --logdir runs"): (
        "skip",
        "the TensorBoard viewer, a server that runs until stopped",
    ),
    ("docs/logging.md", "tensorboard --logdir runs/<sweep_id>"): (
        "skip",
        "a template: placeholders to fill in",
    ),
    (
        "docs/performance.md",
        "torchrun --standalone --nproc_per_node=1 -m launcher.train +exp=throughput",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    (
        "docs/performance.md",
        "torchrun --standalone --nproc_per_node=8 -m launcher.train +exp=throughput",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    (
        "docs/performance.md",
        "python -m launcher.train +exp=throughput data=memmap 'data.paths=[/data/owt/train.bin]'",
    ): ("skip", "needs the user's corpus under /data"),
    (
        "docs/performance.md",
        "python benchmarks/ladder.py [--steps N] [--max-micro-batch N] [--out runs/ladder.json] [overrides...]",
    ): ("skip", "a template: placeholders to fill in"),
    ("docs/performance.md", "bash benchmarks/fetch_wheels.sh"): (
        "skip",
        "downloads wheels for the GPU check (network)",
    ),
    ("docs/performance.md", 'bash benchmarks/gpu_check.sh "$OUT"'): (
        "skip",
        "runs on a GPU machine",
    ),
    (
        "docs/performance.md",
        "python benchmarks/model_cost.py [--iters 30] [--steps 20] [--rounds 2] [--threads 1] [--out FILE] [overrides...]",
    ): ("skip", "a template: placeholders to fill in"),
    (
        "docs/performance.md",
        "torchrun --standalone --nproc_per_node=1 -m launcher.train +exp=throughput model.attention=cudnn",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    (
        "docs/performance.md",
        "torchrun --standalone --nproc_per_node=1 -m launcher.train -m +exp=throughput model.attention=auto,flash,cudnn,efficient",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    (
        "docs/performance.md",
        "MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=2147483647 python -m launcher.train",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    (
        "docs/profiling.md",
        "torchrun --standalone --nproc_per_node=2 -m launcher.train profiler=steps",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    (
        "docs/profiling.md",
        "torchrun ... -m launcher.train profiler=full profiler.ranks=[0,3] profiler.skip_first=50",
    ): ("skip", "a template: placeholders to fill in"),
    (
        "docs/profiling.md",
        "torchrun --standalone --nproc_per_node=2 -m launcher.train +exp=profile",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    ("docs/profiling.md", "python -m launcher.analyze runs/<id>"): (
        "skip",
        "a template: placeholders to fill in",
    ),
    ("docs/profiling.md", "python -m launcher.analyze runs/<sweep_id>"): (
        "skip",
        "a template: placeholders to fill in",
    ),
    (
        "docs/profiling.md",
        "torchrun --standalone --nproc_per_node=2 -m launcher.train +exp=profile strategy.bucket_cap_mb=0.05 run.id=slow",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    ("docs/profiling.md", "python -m launcher.analyze runs/slow"): (
        "skip",
        "reads the profiled run the line above makes (minutes); tests/test_profiler.py analyses a profiled run",
    ),
    (
        "docs/profiling.md",
        "torchrun --standalone --nproc_per_node=2 -m launcher.train -m +exp=profile strategy.bucket_cap_mb=0.05,1,5,25 run.id=w",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    ("docs/profiling.md", "python -m launcher.analyze runs/w"): (
        "skip",
        "reads the profiled sweep the line above makes (minutes); tests/test_profiler.py",
    ),
    ("docs/quickstart.md", "python3 -m venv .venv && . .venv/bin/activate"): (
        "skip",
        "installs packages (.ci/run runs the README's install line in a fresh venv)",
    ),
    ("docs/quickstart.md", "pip install torch==2.13.0 -e ."): (
        "skip",
        "installs packages (.ci/run runs the README's install line in a fresh venv)",
    ),
    ("docs/quickstart.md", "torchrun --standalone --nproc_per_node=2 -m launcher.train"): (
        "check",
        "composed and validated at its world size (a run takes minutes or a GPU)",
    ),
    ("docs/quickstart.md", "python -m launcher.train trainer.max_steps=50"): (
        "check",
        "composed and validated at its world size (a run takes minutes or a GPU)",
    ),
    (
        "docs/quickstart.md",
        "torchrun --standalone --nproc_per_node=2 -m launcher.train model=gpt2 trainer.seq_len=1024 trainer.precision=bf16 trainer.compile=default trainer.global_batch_size=64 trainer.micro_batch_size=8 data.num_workers=4",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    ("docs/quickstart.md", "python -m launcher.runs"): (
        "skip",
        "lists runs/ of a finished run; tests/launches/test_person_sees.py lists the reference runs",
    ),
    ("docs/quickstart.md", "python -m launcher.runs compare runs/latest runs/<other_id>"): (
        "skip",
        "a template: placeholders to fill in (tests/launches/test_person_sees.py compares two runs)",
    ),
    (
        "docs/quickstart.md",
        "python -m launcher.generate runs/latest --prompt 'def ' --max-tokens 64 --temperature 0.8 --top-k 40",
    ): (
        "skip",
        "needs a finished run; tests/launches/test_person_sees.py samples the reference run",
    ),
    (
        "docs/quickstart.md",
        "python -m launcher.export runs/latest gpt2-out && python -m launcher.generate gpt2-out --prompt 'import '",
    ): ("skip", "needs a finished run; tests/launches/test_person_sees.py exports and samples it"),
    ("docs/quickstart.md", "python -m launcher.train --help"): ("run", "0"),
    ("docs/quickstart.md", "python -m launcher.train --cfg job"): ("run", "0"),
    ("docs/quickstart.md", "python -m launcher.doctor"): ("run", "0"),
    (
        "docs/plan.md",
        "python -m launcher.plan model=gpt2-xl trainer.seq_len=1024 cluster.nodes=8 cluster.gpus_per_node=8 trainer.global_batch_size=512",
    ): ("run", "0"),
    (
        "docs/plan.md",
        "python -m launcher.plan model=gpt2-xl trainer.seq_len=1024 cluster.nodes=8 cluster.gpus_per_node=8 trainer.global_batch_size=512 strategy=fsdp2 trainer.precision=bf16 cluster.gpu_type=H200 cluster.gpu_hour_cost=2.5",
    ): ("run", "0"),
    (
        "docs/plan.md",
        "python -m launcher.plan --from runs/<probes> cluster.procs_per_node=2 trainer.micro_batch_size=8",
    ): (
        "skip",
        "runs/<probes> stands for runs of yours; tests/launches/test_plan.py plans from the strategy sweep",
    ),
    (
        "docs/plan.md",
        "torchrun --standalone --nproc_per_node=8 -m launcher.train +exp=strategy_sweep trainer.seq_len=256,1024 trainer.global_batch_size=64 trainer.max_steps=30 trainer.checkpoint_interval=30 run.id=probes",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    (
        "docs/quickstart.md",
        "torchrun --standalone --nproc_per_node=2 -m launcher.train +exp=python_sample",
    ): (
        "check",
        "minutes of training; its compute is pinned to the measured run (tests/unit/config/test_experiments.py)",
    ),
    (
        "docs/quickstart.md",
        "python -m launcher.generate runs/latest --prompt 'class ' --max-tokens 200 --seed 1 --temperature 0.7",
    ): ("skip", "needs the recipe's finished run (minutes); its sample is a real run's output"),
    (
        "docs/cluster.md",
        "python -m launcher.submit slurm --dry-run cluster.nodes=2 trainer.global_batch_size=64",
    ): ("dry", "rendered with --dry-run (applying needs a cluster)"),
    (
        "docs/cluster.md",
        "python -m launcher.submit k8s --dry-run cluster.nodes=2 trainer.global_batch_size=64",
    ): ("dry", "rendered with --dry-run (applying needs a cluster)"),
    (
        "docs/train.md",
        "torchrun --standalone --nproc_per_node=2 -m launcher.train +exp=python_sample model.n_layer=6 trainer.max_steps=1000",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    (
        "docs/slurm.md",
        "python -m launcher.submit slurm cluster.nodes=2 cluster.gpus_per_node=8 cluster.slurm.partition=gpu cluster.time_limit=04:00:00 trainer.global_batch_size=64 run.root=/shared/$USER/runs",
    ): ("dry", "rendered with --dry-run (applying needs a cluster)"),
    ("docs/slurm.md", 'grep -m1 "launcher: job" /shared/runs/*/submit/slurm-48213.out'): (
        "skip",
        "reads a Slurm job's output file",
    ),
    (
        "docs/slurm.md",
        "python -m launcher.submit slurm <the same overrides> run.id=20261130-141502-9f3c0a1e",
    ): ("skip", "a template: placeholders to fill in"),
    (
        "docs/strategies.md",
        "torchrun --standalone --nproc_per_node=8 -m launcher.train trainer.global_batch_size=64 strategy=fsdp2",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    (
        "docs/strategies.md",
        "torchrun --standalone --nproc_per_node=8 -m launcher.train trainer.global_batch_size=64 strategy=fsdp2 trainer.precision=bf16 strategy.reduce_dtype=fp32",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    (
        "docs/strategies.md",
        "torchrun --standalone --nproc_per_node=8 -m launcher.train trainer.global_batch_size=64 strategy=fsdp2 trainer.async_checkpoint=true",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    (
        "docs/strategies.md",
        "torchrun --standalone --nproc_per_node=8 -m launcher.train trainer.global_batch_size=64 +exp=strategy_sweep",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    (
        "docs/strategies.md",
        "torchrun --nnodes=1:4 --nproc_per_node=8 --rdzv-backend=c10d --rdzv-endpoint=node0:29500 --rdzv-id=job42 --max-restarts=3 -m launcher.train trainer.global_batch_size=128 strategy=fsdp2 run.id=job42",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    (
        "docs/sweeps.md",
        "torchrun --standalone --nproc_per_node=8 -m launcher.train trainer.global_batch_size=64 +exp=bucket_sweep",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    (
        "docs/sweeps.md",
        "torchrun --standalone --nproc_per_node=8 -m launcher.train trainer.global_batch_size=64 +exp=comm_hook_sweep",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    (
        "docs/sweeps.md",
        "torchrun ... -m launcher.train -m strategy.bucket_cap_mb=5,25,100 trainer.max_steps=50",
    ): ("skip", "a template: placeholders to fill in"),
    ("docs/sweeps.md", "for preset in default nvlink; do"): (
        "skip",
        "a shell loop; its body is checked for each preset",
    ),
    (
        "docs/sweeps.md",
        "torchrun --standalone --nproc_per_node=8 -m launcher.train trainer.global_batch_size=64 nccl=$preset run.root=runs/nccl_cmp run.id=$preset",
    ): ("check", "composed and validated at its world size (a run takes minutes or a GPU)"),
    ("docs/sweeps.md", "done"): ("skip", "a shell loop's end"),
    (
        "docs/sweeps.md",
        'python -m launcher.config.sweep runs/nccl_cmp/default runs/nccl_cmp/nvlink --out runs/nccl_cmp --title "NCCL presets"',
    ): ("skip", "reads the runs the loop above makes (8 ranks, minutes each)"),
    ("docs/testing.md", ". .venv/bin/activate"): (
        "skip",
        "activates the virtual environment (the tests run in it)",
    ),
    ("docs/testing.md", 'python -m pytest -n 3 -m "not serial" && python -m pytest -m serial'): (
        "skip",
        "the test suite itself (.ci/run and the lead run it)",
    ),
    ("docs/testing.md", "python -m pytest -m unit -n 2"): (
        "skip",
        "the test suite itself (.ci/run and the lead run it)",
    ),
    ("docs/testing.md", "python -m pytest -m launch -n 3"): (
        "skip",
        "the test suite itself (.ci/run and the lead run it)",
    ),
    ("docs/testing.md", "python -m pytest -m cluster"): (
        "skip",
        "the test suite itself (.ci/run and the lead run it)",
    ),
    ("docs/testing.md", "python -m pytest -m scale"): (
        "skip",
        "the test suite itself (.ci/run and the lead run it)",
    ),
    ("docs/scale.md", "python -m pytest -m scale"): (
        "skip",
        "the test suite itself: the README's serial part runs the scale tier",
    ),
    ("docs/scale.md", "python benchmarks/scale.py --out scale.json"): (
        "skip",
        "launches 2 to 16 ranks three times each (minutes); its figures are in docs/scale.md",
    ),
    ("docs/testing.md", "python -m pytest tests/launches/test_fsdp2.py"): (
        "skip",
        "the test suite itself (.ci/run and the lead run it)",
    ),
    (
        "docs/testing.md",
        'python -m pytest -n 3 -m "not serial" --junitxml=run.xml && python -m pytest -m serial',
    ): ("skip", "the test suite itself (.ci/run and the lead run it)"),
    ("docs/testing.md", "python tests/durations.py run.xml --top 20"): (
        "skip",
        "reads the JUnit XML of a whole-suite run",
    ),
    (
        "docs/tuning.md",
        "torchrun --standalone --nproc_per_node=8 -m launcher.tune [the overrides of your experiment] [tune.*]",
    ): ("skip", "a template: placeholders to fill in"),
    ("docs/tuning.md", "python -m launcher.submit slurm --tune cluster.nodes=2 [overrides]"): (
        "skip",
        "a template: placeholders to fill in",
    ),
    ("docs/tuning.md", "python -m launcher.submit k8s --tune cluster.nodes=2 [overrides]"): (
        "skip",
        "a template: placeholders to fill in",
    ),
    (
        "docs/tuning.md",
        "torchrun --standalone --nproc_per_node=2 -m launcher.tune trainer.global_batch_size=16 trainer.micro_batch_size=1 trainer.seq_len=64 data.num_workers=0 data.persistent_workers=false data.max_bytes=400000 data.bpe_vocab_size=512 fault.kind=slow_data fault.seconds=0.06 tune.trial_steps=8 tune.repeats=2 tune.confirm_steps=20 tune.min_gain=0.2 tune.max_rounds=3 run.id=walkthrough",
    ): (
        "skip",
        "a tuning session of several minutes (tests/test_tune.py tunes the same kind of job)",
    ),
    (
        "docs/tuning.md",
        "torchrun --standalone --nproc_per_node=2 -m launcher.train 'hydra.searchpath=[file://runs/walkthrough]' +tune=tuned",
    ): ("skip", "needs the walkthrough's tuned.yaml (the tuning session above makes it)"),
    (
        "docs/tuning.md",
        "mkdir -p myconf/exp && cp runs/walkthrough/tune/tuned.yaml myconf/exp/tuned.yaml",
    ): ("skip", "copies the walkthrough's tuned.yaml (the tuning session above makes it)"),
    (
        "docs/tuning.md",
        "torchrun --standalone --nproc_per_node=2 -m launcher.train --config-dir myconf +exp=tuned",
    ): ("skip", "needs the walkthrough's tuned.yaml (the tuning session above makes it)"),
}
# A shell loop's body: checked once for each value of its variable.
LOOP_VALUES = {"$preset": ("default", "nvlink")}


def launch_of(command: str) -> tuple[list[int], list[str], bool]:
    """(world sizes, overrides, multirun) of a `torchrun ... -m launcher.train ...` or
    `python -m launcher.train ...` command (environment assignments before it ignored); an
    elastic `--nnodes=MIN:MAX` gives both ends."""
    argv = [a for a in shlex.split(command) if not re.fullmatch(r"[A-Z_]+=.*", a)]
    at = next(i for i in range(len(argv) - 1) if argv[i : i + 2] == ["-m", "launcher.train"])
    flags, overrides = argv[:at], argv[at + 2 :]
    nproc, nodes = 1, ["1"]
    for flag in flags:
        if flag.startswith(("--nproc_per_node=", "--nproc-per-node=")):
            nproc = int(flag.split("=")[1])
        if flag.startswith("--nnodes="):
            nodes = flag.split("=")[1].split(":")
    multirun = any(o in ("-m", "--multirun") for o in overrides)
    worlds = sorted({nproc * int(n) for n in nodes})
    return worlds, [o for o in overrides if o not in ("-m", "--multirun")], multirun


def checked_commands() -> list[str]:
    commands = []
    for (_, command), (kind, _) in DECISIONS.items():
        if kind != "check":
            continue
        values = next((v for k, v in LOOP_VALUES.items() if k in command), None)
        if values is None:
            commands.append(command)
        else:
            var = next(k for k in LOOP_VALUES if k in command)
            commands += [command.replace(var, value) for value in values]
    return commands
