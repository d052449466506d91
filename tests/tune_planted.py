"""`torchrun ... tests/tune_planted.py [overrides]`: launcher.tune with three planted
candidates ahead of those the evidence proposes in every round. The rest is the real tuner,
and each trial is the real job:

- `model.dropout=0.125` gets a model whose forward raises IndexError on every rank (as a
  knob torch cannot run with this model would): a crash inside the training loop;
- `data.source=memmap` reads the overrides' token file, whose ids exceed data.vocab_size:
  the job refuses it at data preparation (bad input, exit 2, one line);
- a micro-batch the config refuses (3 does not divide the global batch).
"""

from __future__ import annotations

from launcher.train import job
from launcher.tune import rounds
from launcher.tune.__main__ import main
from launcher.tune.candidates import Candidate

CRASHES = {"model.dropout": 0.125}
BAD_DATA = {"data.source": "memmap"}
REFUSED = {"trainer.micro_batch_size": 3}
proposed = rounds.propose
build_model = job.build_model


def planted(advice, cfg, world_size, gpu, measured=None):
    mine = [Candidate(c, "planted") for c in (CRASHES, BAD_DATA, REFUSED)]
    return [*mine, *proposed(advice, cfg, world_size, gpu, measured)]


def model_that_crashes_when_planted(model_cfg, *args, **kwargs):
    model = build_model(model_cfg, *args, **kwargs)
    if model_cfg.dropout == CRASHES["model.dropout"]:

        def forward(*_, **__):
            raise IndexError("index out of range in self (planted)")

        model.forward = forward
    return model


if __name__ == "__main__":
    rounds.propose = planted
    job.build_model = model_that_crashes_when_planted
    main()
