"""Sample text from a trained model: a run directory (its newest readable checkpoint), one
checkpoints/step_<n> folder, or an export (`python -m launcher.export`).

    python -m launcher.generate RUN_DIR|CHECKPOINT|EXPORT --prompt 'def ' \\
        [--max-tokens 64] [--temperature 0.8] [--top-k 40] [--samples 1] [--seed 0]

The text is encoded and decoded with the run's own tokenizer (the run directory's
tokenizer/, copied into an export), so ids mean what they meant in training. Bad input
(no model there, no tokenizer saved): one line naming the path and the fix, exit 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from launcher.checkpoint.export import ExportError, model_of, run_tokenizer
from launcher.resilience import exit_codes


def is_export(folder: Path) -> bool:
    """A transformers folder (config.json and weights), as launcher.export writes it."""
    weights = ("model.safetensors", "pytorch_model.bin")
    return (folder / "config.json").is_file() and any((folder / w).is_file() for w in weights)


def load(source: Path):
    """(model in eval mode, tokenizers.Tokenizer, where the weights came from)."""
    from tokenizers import Tokenizer

    if not source.is_dir():
        raise ExportError(f"{source}: no such folder; pass a run directory, a checkpoint "
                          "folder or an export (python -m launcher.export)")  # fmt: skip
    if is_export(source):
        from transformers import GPT2LMHeadModel
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()

        model, origin, tokenizer = GPT2LMHeadModel.from_pretrained(source), source, source
        if not (tokenizer / "tokenizer.json").is_file():
            tokenizer = None
    else:
        origin, model, _ = model_of(source)
        tokenizer = run_tokenizer(source)
    if tokenizer is None:
        raise ExportError(
            f"{source}: no tokenizer.json saved with this model (a run of token ids, such as "
            "data=memmap or data=synthetic, or one written before runs saved tokenizer/); "
            "sampling needs the text tokenizer the run trained with"
        )
    return model.eval(), Tokenizer.from_file(str(tokenizer / "tokenizer.json")), origin


@torch.no_grad()
def sample(model, ids: list[int], *, max_tokens: int, temperature: float, top_k: int) -> list[int]:
    """`max_tokens` ids after `ids`, each drawn from the softmax of the last logits at
    `temperature` (0: the most likely id), among the `top_k` likeliest (0: all)."""
    context = model.config.n_positions
    out = list(ids)
    for _ in range(max_tokens):
        x = torch.tensor([out[-context:]])
        logits = model(x).logits[0, -1].float()
        if temperature <= 0:
            out.append(int(logits.argmax()))
            continue
        logits = logits / temperature
        if 0 < top_k < logits.numel():
            cutoff = torch.topk(logits, top_k).values[-1]
            logits = logits.masked_fill(logits < cutoff, float("-inf"))
        out.append(int(torch.multinomial(torch.softmax(logits, -1), 1)))
    return out[len(ids) :]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m launcher.generate", description=__doc__.splitlines()[0]
    )
    parser.add_argument("source", type=Path, help="a run directory, checkpoint or export")
    parser.add_argument("--prompt", required=True, help="the text to continue")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    parser.add_argument("--top-k", type=int, default=40, help="0: every token")
    parser.add_argument("--samples", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for flag, value in (("--max-tokens", args.max_tokens), ("--samples", args.samples)):
        if value < 1:
            print(f"error: {flag}={value}: give at least 1", file=sys.stderr)
            return exit_codes.BAD_INPUT
    try:
        model, tokenizer, origin = load(args.source)
    except ExportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    ids = tokenizer.encode(args.prompt, add_special_tokens=False).ids
    if not ids:
        print("error: --prompt encodes to no tokens; give some text", file=sys.stderr)
        return exit_codes.BAD_INPUT
    torch.manual_seed(args.seed)
    print(f"model: {origin}", file=sys.stderr)
    for i in range(args.samples):
        new = sample(model, ids, max_tokens=args.max_tokens, temperature=args.temperature,
                     top_k=args.top_k)  # fmt: skip
        if args.samples > 1:
            print(f"--- sample {i + 1}")
        print(args.prompt + tokenizer.decode(new))
    return exit_codes.DONE


if __name__ == "__main__":
    sys.exit(main())
