"""`python -m launcher.submit {slurm,k8s}`: the training experiment as a cluster job.

`job.prepare` composes and validates the experiment for the cluster's world size (every
sweep point), fixes the run id and the shared run directory, and says how each node starts
torchrun. A renderer module per cluster (`slurm`, `k8s`) turns that into files, checks
them, and hands them to the cluster's own tool. Nothing is written or submitted before the
whole job has been checked.
"""
