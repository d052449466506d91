"""Sample text from a trained model: a run directory (its newest readable checkpoint), one
checkpoints/step_<n> folder, or an export (`python -m launcher.export`).

    python -m launcher.generate RUN_DIR|CHECKPOINT|EXPORT --prompt 'def ' \\
        [--max-tokens 64] [--temperature 0.8] [--top-k 40] [--samples 1] [--seed 0]

The text is encoded and decoded with the run's own tokenizer (the run directory's
tokenizer/, copied into an export), so ids mean what they meant in training, and printed as
it is drawn. `--max-tokens` is at most the model's context (model.n_positions): beyond it
the model would see none of the prompt. Bad input (a flag out of its range, no model there,
a damaged config.json, model.safetensors or tokenizer.json, no tokenizer saved): one line
naming the flag or the file and the fix, exit 2.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from launcher.checkpoint import protocol as checkpoint
from launcher.checkpoint.export import ExportError, model_of, run_tokenizer
from launcher.checkpoint.pretrained import folder_problem
from launcher.flags import FlagParser, number, whole
from launcher.resilience import exit_codes

DEFAULT_TOKENS = 64  # --max-tokens, or the model's context if it is shorter
EXPORT_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", "tokenizer.json")


def is_export(folder: Path) -> bool:
    """A transformers folder, as launcher.export writes it (config.json, weights, tokenizer),
    whole or damaged: any of its files and none of a run's or a checkpoint's."""
    run_like = (folder / "checkpoints").exists() or (folder / checkpoint.META).exists()
    return not run_like and any((folder / name).exists() for name in EXPORT_FILES)


def load(source: Path):
    """(model in eval mode, tokenizers.Tokenizer, where the weights came from); ExportError,
    worded as the one line the user sees, for anything that keeps them from loading."""
    if not source.is_dir():
        raise ExportError(f"{source}: no such folder; pass a run directory, a checkpoint "
                          "folder or an export (python -m launcher.export)")  # fmt: skip
    if is_export(source):
        model, origin, tokenizer = load_export(source), source, source
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
    return model.eval(), load_tokenizer(tokenizer / "tokenizer.json", model), origin


def load_export(folder: Path):
    """The export's GPT2LMHeadModel: its config.json and weights checked first (one line
    naming the damaged file), then loaded."""
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    problem = folder_problem(folder)
    if problem:
        where = "" if problem.startswith(str(folder)) else f"{folder}/"
        raise ExportError(f"{where}{problem}; export the run again (python -m launcher.export)")
    hf_logging.disable_progress_bar()
    try:
        return GPT2LMHeadModel.from_pretrained(folder)
    except Exception as exc:  # noqa: BLE001 - any damage transformers meets: one line
        raise ExportError(
            f"{folder}: not a loadable GPT-2 export ({_why(exc)}); export the run again "
            "(python -m launcher.export)"
        ) from None


def load_tokenizer(path: Path, model):
    """The run's tokenizer, which must fit the model's vocabulary."""
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises bare Exceptions
        raise ExportError(f"{path} is not a readable tokenizer ({_why(exc)})") from None
    if tokenizer.get_vocab_size() > model.config.vocab_size:
        raise ExportError(
            f"{path} has {tokenizer.get_vocab_size()} tokens, more than the model's "
            f"{model.config.vocab_size}: it is not the tokenizer this model trained with"
        )
    return tokenizer


def _why(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:160]


@torch.no_grad()
def sample(
    model, ids: list[int], *, max_tokens: int, temperature: float, top_k: int
) -> Iterator[int]:
    """`max_tokens` ids after `ids`, one at a time, each drawn from the softmax of the last
    logits at `temperature` (0: the most likely id), among the `top_k` likeliest (0: all)."""
    context = model.config.n_positions
    out = list(ids)
    for _ in range(max_tokens):
        x = torch.tensor([out[-context:]])
        logits = model(x).logits[0, -1].float()
        if temperature <= 0:
            out.append(int(logits.argmax()))
        else:
            logits = logits / temperature
            if 0 < top_k < logits.numel():
                cutoff = torch.topk(logits, top_k).values[-1]
                logits = logits.masked_fill(logits < cutoff, float("-inf"))
            out.append(int(torch.multinomial(torch.softmax(logits, -1), 1)))
        yield out[-1]


def stream(
    ids: Iterator[int], decode: Callable[[list[int]], str], write: Callable[[str], None]
) -> str:
    """Write the text of `ids` as they come: each time what decoding them all adds to what
    was written (a character split over two tokens waits for its second); the whole text."""
    new, shown = [], ""
    for token in ids:
        new.append(token)
        text = decode(new)
        if text.startswith(shown) and not text.endswith("\ufffd"):
            write(text[len(shown) :])
            shown = text
    text = decode(new)
    write(text[len(shown) :] if text.startswith(shown) else "")
    return text


def parser() -> FlagParser:
    p = FlagParser(prog="python -m launcher.generate", description=__doc__.splitlines()[0])
    p.add_argument("source", type=Path, help="a run directory, checkpoint or export")
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument(
        "--max-tokens",
        type=whole(1),
        help=f"tokens to add (default {DEFAULT_TOKENS}), at most the model's context "
        "(model.n_positions)",
    )
    p.add_argument("--temperature", type=number(0, " (0: greedy)"), default=0.8, help="0: greedy")
    p.add_argument(
        "--top-k", type=whole(0, why=" (0: every token)"), default=40, help="0: every token"
    )
    p.add_argument("--samples", type=whole(1), default=1)
    p.add_argument("--seed", type=whole(0, 2**63 - 1), default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        model, tokenizer, origin = load(args.source)
    except ExportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    context = model.config.n_positions
    if args.max_tokens is None:
        args.max_tokens = min(DEFAULT_TOKENS, context)
    if args.max_tokens > context:
        print(f"error: argument --max-tokens: {args.max_tokens}: more than the model's context "
              f"of {context} tokens (model.n_positions); give at most {context}",
              file=sys.stderr)  # fmt: skip
        return exit_codes.BAD_INPUT
    ids = tokenizer.encode(args.prompt, add_special_tokens=False).ids
    if not ids:
        print("error: --prompt encodes to no tokens; give some text", file=sys.stderr)
        return exit_codes.BAD_INPUT
    torch.manual_seed(args.seed)
    print(f"model: {origin}", file=sys.stderr)

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    for i in range(args.samples):
        if args.samples > 1:
            print(f"--- sample {i + 1}")
        write(args.prompt)
        drawn = sample(model, ids, max_tokens=args.max_tokens, temperature=args.temperature,
                       top_k=args.top_k)  # fmt: skip
        stream(drawn, tokenizer.decode, write)
        write("\n")
    return exit_codes.DONE


if __name__ == "__main__":
    sys.exit(main())
