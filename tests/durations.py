"""The costliest tests and files of a run, from its JUnit XML (docs/testing.md):

    python -m pytest --junitxml=run.xml ...
    python tests/durations.py run.xml [--top 20]

Two figures each: wall seconds (setup included: a module's launch is paid by its first
test) and CPU seconds (the `cpu_s` property tests/cpu_accounting.py records: the test's pytest
process and every process it started). On 2 cores the parallel part is CPU-bound, so its
wall time is about the CPU total over two: the CPU column says what a test costs the suite,
the wall column how long it keeps a worker (a test that waits on a timeout costs wall, not
CPU). Tables are ordered by CPU seconds.
"""

from __future__ import annotations

import argparse
import collections
import xml.etree.ElementTree as ET
from typing import NamedTuple


class Case(NamedTuple):
    file: str
    name: str
    wall_s: float
    cpu_s: float


def read(path: str) -> list[Case]:
    """Every test case of the report (CPU seconds 0 where the run recorded none)."""
    cases = []
    for case in ET.parse(path).iter("testcase"):
        module = case.get("classname", "").rpartition(".")[2] or case.get("classname", "")
        cpu = [p.get("value") for p in case.iter("property") if p.get("name") == "cpu_s"]
        cpu_s = float(cpu[0]) if cpu else 0.0
        cases.append(Case(f"{module}.py", case.get("name", ""), float(case.get("time", 0)), cpu_s))
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit_xml")
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    cases = read(args.junit_xml)
    files: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for case in cases:
        files[case.file][0] += case.wall_s
        files[case.file][1] += case.cpu_s
    wall, cpu = (sum(c[i] for c in files.values()) for i in (0, 1))
    print(f"{len(cases)} tests, {wall:.0f} s of test time, {cpu:.0f} CPU seconds")
    print("\n| file | wall s | CPU s |\n|---|---:|---:|")
    for file, (wall_s, cpu_s) in sorted(files.items(), key=lambda f: -f[1][1])[: args.top]:
        print(f"| {file} | {wall_s:.0f} | {cpu_s:.0f} |")
    print("\n| test | wall s | CPU s |\n|---|---:|---:|")
    for case in sorted(cases, key=lambda c: -c.cpu_s)[: args.top]:
        print(f"| {case.file}::{case.name} | {case.wall_s:.0f} | {case.cpu_s:.0f} |")


if __name__ == "__main__":
    main()
