"""Ending well: the exit codes schedulers read (`exit_codes`), stop signals turned into a
checkpointed stop (`preemption`), hang detection (`watchdog`), failures on purpose (`faults`),
stragglers named while the job runs (`stragglers`) and one decision made on rank 0 for every
rank (`decide`)."""
