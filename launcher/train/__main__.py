"""`torchrun -m launcher.train [overrides]` and `python -m launcher.train`."""

from launcher.train.front_door import main

main()
