"""`torchrun ... tests/tune_planted.py [overrides]`: launcher.tune with two planted
candidates ahead of those the evidence proposes in every round: `data.source=memmap`, which
crashes on every rank at its first step when the overrides' data.paths name a token file
whose ids exceed data.vocab_size (the embedding raises IndexError), and a micro-batch the
config refuses (3 does not divide the global batch). The rest is the real tuner.
"""

from __future__ import annotations

from launcher.tune import rounds
from launcher.tune.__main__ import main
from launcher.tune.candidates import Candidate

CRASHES = {"data.source": "memmap"}
REFUSED = {"trainer.micro_batch_size": 3}
proposed = rounds.propose


def planted(advice, cfg, world_size, gpu):
    mine = [Candidate(CRASHES, "planted"), Candidate(REFUSED, "planted")]
    return [*mine, *proposed(advice, cfg, world_size, gpu)]


if __name__ == "__main__":
    rounds.propose = planted
    main()
