"""What torch's file formats add around the tensors a checkpoint holds, for the engines'
declarations of their checkpoint bytes (launcher.strategy.<engine>, read by the plan).

Measured with torch 2.13 (`torch.save` into a buffer, less the tensors' bytes): a tensor in a
dict that one `torch.save` writes costs its zip entry and its record in the pickle, about
260 bytes; a tensor written by a `torch.save` of its own, as torch Distributed Checkpoint
writes each item, a whole zip archive, about 1,550 bytes; DCP's `.metadata` holds about 95
bytes for every key of the state dict and 185 for every chunk a rank stores (fitted to
FSDP2's checkpoints of gpt2-tiny at 1 and 4 ranks: 38,086 and 85,241 bytes). Beside a
model of millions of parameters these are fractions of a percent; for the tiny models of
tests and laptops they are most of FSDP2's difference from the state (a 0.2M-parameter
model's DCP checkpoint is 12% framing)."""

from __future__ import annotations

ENTRY_BYTES = 260  # a tensor in a dict written by one torch.save
RECORD_BYTES = 1550  # a tensor written by a torch.save of its own (a DCP item)
DCP_KEY_BYTES = 95  # a state dict key's entry in DCP's .metadata
DCP_CHUNK_BYTES = 185  # a stored chunk's entry in DCP's .metadata
