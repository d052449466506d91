"""What one process of a run stands on: process groups, device and seeding (`process`), the
machine's facts (`envinfo`), the run directory, its history and its lock (`disk`,
`run_history`, `lock`), NCCL's log staged into it (`nccl_capture`), timing an all-reduce
(`allreduce`), and what outlives one job of a launch (`launch_state`). Folders and atomic
writes are the foundation module launcher.paths."""
