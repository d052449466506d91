"""`torchrun -m launcher.train [overrides]` and `python -m launcher.train`.

The cyclic garbage collector is off from here until the job starts
(`launcher.runtime.process.freeze_what_lasts`, which turns it back on): the imports make
some 300,000 objects and next to no garbage, and the collections they would set off walk
the growing heap again and again, about 0.7 CPU-s of a rank's 3.6 s of imports on a 2-core
machine (benchmarks/startup.py measures a rank's start-up).
"""

import gc

gc.disable()

from launcher.train.front_door import main  # noqa: E402

main()
