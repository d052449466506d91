"""The slowest tests and files of a run, from its JUnit XML (docs/testing.md):

    python -m pytest --junitxml=run.xml ...
    python tests/durations.py run.xml [--top 20]

Per-file totals are the sum of the file's test times (setup included: a module's launch is
paid by its first test), so they add up to the serial cost whatever -n was.
"""

from __future__ import annotations

import argparse
import collections
import xml.etree.ElementTree as ET


def read(path: str) -> list[tuple[str, str, float]]:
    """(file, test, seconds) for every test case of the report."""
    cases = []
    for case in ET.parse(path).iter("testcase"):
        module = case.get("classname", "").rpartition(".")[2] or case.get("classname", "")
        cases.append((f"{module}.py", case.get("name", ""), float(case.get("time", 0))))
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit_xml")
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    cases = read(args.junit_xml)
    files = collections.Counter()
    for file, _, seconds in cases:
        files[file] += seconds
    print(f"{len(cases)} tests, {sum(files.values()):.0f} s of test time")
    print("\n| file | s |\n|---|---:|")
    for file, seconds in files.most_common(args.top):
        print(f"| {file} | {seconds:.0f} |")
    print("\n| test | s |\n|---|---:|")
    for file, name, seconds in sorted(cases, key=lambda c: -c[2])[: args.top]:
        print(f"| {file}::{name} | {seconds:.0f} |")


if __name__ == "__main__":
    main()
