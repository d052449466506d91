"""Ending well: the exit codes schedulers read (`exit_codes`), stop signals turned into a
checkpointed stop (`preemption`), hang detection (`watchdog`), failures on purpose (`faults`)
and stragglers named while the job runs (`stragglers`)."""
