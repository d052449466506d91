"""Training: the front door (`python -m launcher.train`, `front_door`), the job that builds a
run in order and chooses its ending (`job`), the one strategy-agnostic loop (`loop`) and the
parts it delegates to: a step's micro-batches and the size that fits (`micro_batch`), the
non-finite policy (`nonfinite`), the eval (`evaluate`); the checks that must pass before
anything starts (`preflight`) and how a front door ends on bad input (`bad_input`)."""
