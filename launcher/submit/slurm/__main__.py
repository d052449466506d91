"""`python -m launcher.submit.slurm --example > slurm/job.sbatch`: the checked-in example as
the renderer writes it today (a test keeps the two identical)."""

import sys

from launcher.submit.slurm.script import render_example

if sys.argv[1:] != ["--example"]:
    sys.exit("usage: python -m launcher.submit.slurm --example > slurm/job.sbatch")
sys.stdout.write(render_example())
