"""GPT-2: the project's own module (`gpt2`) or transformers' (`build` chooses, and counts the
FLOPs MFU divides by)."""
