"""What a front door's refusal must be, read the same way for every front door called in
process: exit code 2 (returned, or raised by its flag parser or its bad-input ending),
nothing on stdout, one `error:` line on stderr and no traceback. And whether another user
can read a path (a private run directory's files)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

NOBODY = 65534


def exit_code(call: Callable[[], int | None]) -> int | None:
    """`call()`'s exit code, whether it returns it or ends with SystemExit."""
    try:
        return call()
    except SystemExit as exc:
        return exc.code


def refusal(capsys, call: Callable[[], int | None]) -> str:
    """The one error line of `call()`, a front door given bad input; asserts the rest."""
    code = exit_code(call)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and "Traceback" not in err, (code, out, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def readable_by_nobody(path: Path) -> bool:
    """Whether the unprivileged user `nobody` can read `path` (a child drops to it; the
    caller is root, for whom every mode reads)."""
    read, write = os.pipe()
    if os.fork() == 0:
        os.close(read)
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            Path(path).read_bytes()
            os.write(write, b"1")
        except OSError:
            os.write(write, b"0")
        os._exit(0)
    os.close(write)
    os.wait()
    return os.read(read, 1) == b"1"
