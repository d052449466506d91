"""Checkpoints: the atomic protocol every engine writes through (`protocol`), the resume
decision (`resume`): which checkpoint a launch may start from, or why it must not start, a
run's checkpoints from that decision to the last save (`manager`), the memory tier (`memory`),
`export`: a checkpoint of any engine as a transformers folder, and whether such a
`save_pretrained` folder (`model.init_from`) loads (`pretrained`)."""
