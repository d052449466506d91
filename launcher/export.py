"""Export a trained model as a transformers folder: `GPT2LMHeadModel.from_pretrained` reads it.

    python -m launcher.export RUN_DIR_OR_CHECKPOINT OUT_DIR

RUN_DIR_OR_CHECKPOINT is a run directory (its newest complete checkpoint is exported) or
one `checkpoints/step_<n>` folder, written by DDP (model.pt), FSDP2 (DCP shards) or
DeepSpeed, with either model.impl: the native module's weights are converted (see
launcher.model.gpt2), transformers' are copied. Bad input: one line naming the file and the fix,
exit 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

from launcher.checkpoint.export import ExportError, export
from launcher.flags import FlagParser
from launcher.resilience import exit_codes


def main(argv: list[str] | None = None) -> int:
    parser = FlagParser(prog="python -m launcher.export", description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="a run directory or a checkpoint folder")
    parser.add_argument("out", type=Path, help="the folder to write (new or empty)")
    args = parser.parse_args(argv)
    try:
        folder = export(args.source, args.out)
    except ExportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    print(f"exported {folder} to {args.out} (AutoModelForCausalLM and AutoTokenizer read it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
