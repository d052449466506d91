"""What one process of a run stands on: process groups, device and seeding (`process`), the
machine's facts (`envinfo`), the run directory, its history and its lock (`paths`, `disk`,
`run_history`, `lock`), and what outlives one job of a launch (`launch_state`)."""
