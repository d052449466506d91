"""`python -m launcher.rehearse`: the user's experiment, shrunk to seconds, driven through
every fault path the launcher handles (stop, killed rank, hang, world-size change, slow
rank, bad input, the cluster job's own checks), each case in its own run directory under
`<run dir>/rehearse/`, with a verdict table (docs/rehearse.md)."""
