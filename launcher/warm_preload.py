"""What an agent's fork server imports once for a warm start (launcher.warm_start): the
modules every rank imports before its first step, with Python's cyclic collector off while
they load (launcher/train/__main__.py says why), then frozen, so that each forked rank
neither walks nor copies them at its first collection (`gc.freeze` keeps them out of it).

The fork server only forks: it runs no torch operation and touches no device (a CUDA
context, or a thread pool started here, would not survive the fork), and ignores the stop
signals that its agent forwards to the ranks (`warm_start.shield_server`).
"""

# ruff: noqa: E402, F401  (imported for their side effect: loaded before the fork)
import gc

gc.disable()

# torch._dynamo: what each rank's job start loads (runtime.process.freeze_what_lasts);
# torch.distributed.run: what the agent's main module (launcher.torchrun) imports, which
# each forked rank re-runs as __mp_main__ (multiprocessing's rule): cheap once loaded here
import torch._dynamo
import torch.distributed.run

import launcher.train.front_door
from launcher import warm_start

warm_start.shield_server()
gc.collect()
gc.freeze()
