"""Checkpoints: the atomic protocol every engine writes through (`protocol`), and the resume
decision (`resume`): which checkpoint a launch may start from, or why it must not start."""
