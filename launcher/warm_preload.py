"""What an agent's fork server imports once for a warm start (launcher.warm_start): the
modules every rank imports before its first step, with Python's cyclic collector off while
they load (launcher/train/__main__.py says why), then frozen, so that each forked rank
neither walks nor copies them at its first collection (`gc.freeze` keeps them out of it).

The fork server only forks: it runs no torch operation and touches no device (a CUDA
context, or a thread pool started here, would not survive the fork), and ignores the stop
signals that its agent forwards to the ranks.
"""

# ruff: noqa: E402, F401  (imported for their side effect: loaded before the fork)
import gc
import signal

gc.disable()

# torch._dynamo: what each rank's job start loads (runtime.process.freeze_what_lasts);
# torch.distributed.run: what the agent's main module (launcher.torchrun) imports, which
# each forked rank re-runs as __mp_main__ (multiprocessing's rule): cheap once loaded here
import torch._dynamo
import torch.distributed.run

from launcher.runtime.process_tree import GROUP_SIGNALS
from launcher.train.front_door import compose_ahead

# The ranks' config, composed once here for all of them and every restart
# (front_door.compose_ahead), before the freeze below keeps it out of their collections.
compose_ahead()

# A scheduler or a terminal sends these to every process of a step or a group, this one
# included: its death would tell the agent that every rank had died (multiprocessing reads
# a rank's exit code from the server), and the agent would end while its ranks still wrote
# their stop checkpoint. It ends with its agent; each forked rank takes them back.
for sig in GROUP_SIGNALS:
    signal.signal(sig, signal.SIG_IGN)
gc.collect()
gc.freeze()
