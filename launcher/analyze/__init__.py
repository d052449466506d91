"""Reading the per-rank profiler traces a run wrote (never imports torch.distributed)."""
