"""The fork guard (launcher/runtime/fork_guard.py) against python/cpython#112275, measured:
children forked while a thread Python did not start keeps entering Python, with the guard
off and on, side by side in one run.

    python benchmarks/fork_guard.py [--seconds 60] [--load 6] [--start-timeout 2]

A small C library (compiled here with `cc`: it needs a compiler and Python's headers)
starts one native thread that enters and leaves Python in a loop, as gloo's worker threads
do for a future's callback or a tensor's last reference: each entry registers a new thread
state, under the interpreter's thread-list lock and without the GIL. The main thread forks
children that only write one byte; a child that has not written within `--start-timeout`
seconds is hung in `os.fork()` (killed, counted). `--load` busy processes keep the cores
oversubscribed, as a test machine running three launches on two cores is: the hang needs
the native thread descheduled while it holds the lock.

Each arm runs `--seconds` in a process of its own (the guard is registered per process).
Figures measured: docs/data.md#the-dataloader-knobs. On an interpreter that has the fix
(3.11.10+, 3.12+) the guard is not registered and both arms show what the interpreter does.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import select
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from launcher.runtime.fork_guard import guard_forks

CHURN_C = r"""
#include <Python.h>
#include <pthread.h>
static volatile int stop = 0;
static pthread_t thread;
static void *enter_python_forever(void *unused) {
    while (!stop) {
        PyGILState_STATE s = PyGILState_Ensure();
        PyGILState_Release(s);
    }
    return NULL;
}
int start_churn(void) { return pthread_create(&thread, NULL, enter_python_forever, NULL); }
"""


def build(folder: Path) -> Path:
    """The churn library, compiled into `folder`; one line and a non-zero exit without a
    compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        sys.exit("fork_guard.py needs a C compiler (cc or gcc on PATH) to build its churn thread")
    (folder / "churn.c").write_text(CHURN_C)
    lib = folder / "libchurn.so"
    include = sysconfig.get_paths()["include"]
    cmd = [cc, "-shared", "-fPIC", "-O2", f"-I{include}", str(folder / "churn.c"), "-o", str(lib)]
    proc = subprocess.run([*cmd, "-lpthread"], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"fork_guard.py: building the churn thread failed: {proc.stderr.strip()}")
    return lib


def arm(lib: str, guard: bool, seconds: float, start_timeout: float) -> dict:
    """Fork children for `seconds` while the churn thread runs: how many never started."""
    registered = guard_forks() if guard else False
    ctypes.PyDLL(lib).start_churn()
    forks = hung = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(w, b"x")
            os._exit(0)
        os.close(w)
        forks += 1
        if not select.select([r], [], [], start_timeout)[0]:
            hung += 1
            os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(r)
    return {"guard": "on" if guard else "off", "registered": registered, "forks": forks,
            "hung": hung}  # fmt: skip


def measure(lib: Path, guard: bool, args) -> dict:
    cmd = [sys.executable, __file__, "--arm", "on" if guard else "off", "--lib", str(lib)]
    cmd += ["--seconds", str(args.seconds), "--start-timeout", str(args.start_timeout)]
    load = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    finally:
        for p in load:
            p.kill()
            p.wait()
    # The arm ends with os._exit: the churn thread is still in Python, and a normal exit
    # would wait for it at finalisation.
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="per arm")
    parser.add_argument("--load", type=int, default=6, help="busy processes beside each arm")
    parser.add_argument("--start-timeout", type=float, default=2.0)
    parser.add_argument("--arm", choices=("off", "on"), help=argparse.SUPPRESS)
    parser.add_argument("--lib", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        result = arm(args.lib, args.arm == "on", args.seconds, args.start_timeout)
        print(json.dumps(result), flush=True)
        os._exit(0)
    with tempfile.TemporaryDirectory() as tmp:
        lib = build(Path(tmp))
        rows = [measure(lib, guard, args) for guard in (False, True)]
    version = sys.version.split()[0]
    print(f"Python {version}, {args.load} busy processes, {args.seconds:g} s per arm")
    print("\n| guard | registered | forks | hung | hung share |\n|---|---|---:|---:|---:|")
    for r in rows:
        share = r["hung"] / r["forks"] if r["forks"] else 0.0
        r["share"] = share
        print(f"| {r['guard']} | {r['registered']} | {r['forks']} | {r['hung']} | {share:.4%} |")
    off, on = rows
    if on["share"] > 0:
        print(f"\nhung share off / on: {off['share'] / on['share']:.0f}x")
    else:
        print(f"\nhung share off / on: {off['share']:.4%} / 0")


if __name__ == "__main__":
    main()
