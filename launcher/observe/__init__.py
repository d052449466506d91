"""How a run measures itself and where the figures go: step and communication timing without
per-step host syncs (`clock`, `intervals`, `comm_stats`), the cross-rank aggregation
(`metrics`), profiling and memory snapshots, NCCL's transport (`nccl_log` parses the log
launcher.runtime.nccl_capture stages; `nccl_transport`), GPU peaks for MFU, the sinks:
metrics.jsonl and the console, W&B, TensorBoard, what goes to them (`recorder`: each
interval's record, the summary) and the run directory's files on rank 0 (`run_files`)."""
