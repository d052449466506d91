"""Which transport NCCL chose, read from NCCL's own INFO log, and recorded in env.json.

With `NCCL_DEBUG=INFO` (the `nccl=debug` preset) NCCL logs, per process, its version, the
network it uses and one line per channel connection saying how it reaches the peer:

    host:1234:1290 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
    host:1234:1290 [0] NCCL INFO Channel 02/0 : 2[0] -> 0[0] [receive] via NET/IB/0/GDRDMA

How the launcher gets each rank's log (launcher.runtime.nccl_capture: the run directory is
only known once the process group exists, and PyTorch creates the NCCL communicator inside
`init_process_group` when it is given a device, which opens NCCL's log file):

1. `stage_debug_file`, before the process group: unless the user chose `NCCL_DEBUG_FILE`,
   point it at `<run.root>/.nccl-logs/nccl.rank<r>.<host>.<pid>.log` (same file system as
   the run directory);
2. `adopt_debug_file`, once the run directory exists: rename that file into
   `<run_dir>/logs/` (NCCL's open file follows the rename) and point the variable there;
3. `launcher.observe.nccl_transport.TransportRecorder`, a sink on every rank: at the first logged
   interval (communicators connect lazily, at their first collective, so only after a
   training step is the log complete) each rank parses its own log (`read_own_log`), and
   rank 0 gathers the summaries into env.json's `nccl_transport`.

What a process has staged is a `Capture`, kept by the caller (the launch state): NCCL
opens its log once per process, so a later job of a sweep must know the earlier one's.

`parse_nccl_log` is pure and also reads a user's captured stdout:
`python -m launcher.observe.nccl_log FILE...` prints the summary of each process found.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from collections import defaultdict
from pathlib import Path

log = logging.getLogger("launcher")


# `host:pid:tid [dev] NCCL INFO <message>`; anything before it (timestamps, torchrun's
# `[default0]:` prefixes) is ignored.
_LINE = re.compile(r"(?:(?P<host>[^\s:]+):(?P<pid>\d+):\d+ \[\d+\] )?NCCL INFO (?P<msg>.*)$")
_VERSION = re.compile(r"NCCL version (\S+)")
_NETWORK = re.compile(r"Using network (.+?)\s*$")
# `comm 0x.. rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0` (2.19+) and the
# `ncclCommInitRank comm 0x.. rank 0 nranks 8 cudaDev 0 ...` lines of every version.
_COMM = re.compile(r"comm (0x[0-9a-fA-F]+) rank \d+ n[Rr]anks (\d+)(?: nNodes (\d+))?")
_MNNVL = re.compile(r"localRank \d+ MNNVL (\d+)")
# `Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read`, `Channel 00 : 7[ca000] -> 6[c7000] via
# SHM/direct/direct` (busId in older versions, no /connIndex for SHM), `... [send] via
# NET/IB/0/GDRDMA`, and NCCL < 2.7's `Ring 00 : ...`.
_CHANNEL = re.compile(
    r"(?:Channel|Ring) (?P<channel>\d+)(?:/\d+)? : \d+\[[^\]]*\] -> \d+\[[^\]]*\]"
    r"(?: \[(?:send|receive)\])? via (?P<transport>.+?)\s*$"
)
# `CollNet 00/0 : 0 [send] via COLLNET/SHARP/0/GDRDMA` (`Coll 00 : ...` before 2.12)
_COLLNET = re.compile(
    r"Coll(?:Net)? (?P<channel>\d+)(?:/\d+)? : \d+ \[(?:send|receive)\] via (?P<transport>.+?)\s*$"
)
_NVLS_SUPPORT = re.compile(r"NVLS multicast support is (not )?available")
# NVLS buffers set up (`NVLS comm 0x.. headRank ..`) or NVLS trees connected across nodes.
_NVLS_USED = re.compile(r"NVLS comm 0x[0-9a-fA-F]+ headRank|Connected NVLS")
_COLLNET_USED = re.compile(r"Connected [Cc]oll[Nn]et")

KIND_NAMES = {"P2P": "P2P", "SHM": "SHM", "NET": "NET", "COLLNET": "CollNet"}


def parse_nccl_log(text: str) -> dict:
    """Summarise the transports NCCL's INFO lines in `text` report.

    Returns `version` (e.g. "2.21.5+cuda12.4"), `network` (the net plugin NCCL uses between
    nodes: "IB", "Socket", "IBext_v8", "AWS Libfabric", ...), `transports` (for each
    transport as NCCL names it, e.g. "P2P/CUMEM/read" or "NET/IB/0/GDRDMA", the number of
    channels with at least one connection over it), `kinds` (P2P, SHM, NET, CollNet, NVLS),
    `gdr` (whether network connections use GPUDirect RDMA; None without any), `nvls` (NVLink
    SHARP buffers were set up), `nvls_available`, `collnet`, `nodes`, `nranks`, `mnnvl` and
    `communicators` (how many communicators the text describes). Values the text does not
    show are None. Lines of several processes are summarised together; see
    `split_by_process`.
    """
    version = network = nvls_available = nodes = nranks = mnnvl = None
    nvls = collnet = False
    channels: dict[str, set[int]] = defaultdict(set)
    comms: set[str] = set()
    for line in text.splitlines():
        found = _LINE.search(line)
        if not found:
            continue
        msg = found["msg"]
        if m := _CHANNEL.match(msg) or _COLLNET.match(msg):
            channels[m["transport"]].add(int(m["channel"]))
        elif m := _VERSION.match(msg):
            version = m[1]
        elif m := _NETWORK.match(msg):
            network = m[1]
        elif m := _COMM.search(msg):
            comms.add(m[1])
            nranks = max(nranks or 0, int(m[2]))
            if m[3] is not None:
                nodes = max(nodes or 0, int(m[3]))
            if mm := _MNNVL.search(msg):
                mnnvl = bool(int(mm[1])) or bool(mnnvl)
        elif m := _NVLS_SUPPORT.match(msg):
            nvls_available = m[1] is None or bool(nvls_available)
        elif _NVLS_USED.match(msg):
            nvls = True
        elif _COLLNET_USED.search(msg):
            collnet = True
    transports = {name: len(chans) for name, chans in sorted(channels.items())}
    kinds = {KIND_NAMES.get(name.split("/")[0].upper(), name.split("/")[0]) for name in transports}
    if nvls:
        kinds.add("NVLS")
    if collnet:
        kinds.add("CollNet")
    networked = [t for t in transports if t.upper().startswith(("NET/", "COLLNET/"))]
    if network is None and networked:
        network = networked[0].split("/")[1]
    return {
        "version": version,
        "network": network,
        "transports": transports,
        "kinds": sorted(kinds),
        "gdr": any("/GDRDMA" in t for t in networked) if networked else None,
        "nvls": nvls,
        "nvls_available": nvls_available,
        "collnet": collnet,
        "nodes": nodes,
        "nranks": nranks,
        "mnnvl": mnnvl,
        "communicators": len(comms),
    }


def split_by_process(text: str) -> dict[str, str]:
    """NCCL lines grouped by their `host:pid` prefix (a torchrun stdout mixes every rank's)."""
    groups: dict[str, list[str]] = defaultdict(list)
    for line in text.splitlines():
        found = _LINE.search(line)
        if found:
            key = f"{found['host']}:{found['pid']}" if found["host"] else "?"
            groups[key].append(line)
    return {key: "\n".join(lines) for key, lines in groups.items()}


def merge(entries: list[dict]) -> dict:
    """One job-wide view of per-rank summaries: what any rank used, and every version seen."""
    found = [e for e in entries if e.get("log")]
    versions = sorted({e["version"] for e in found if e.get("version")})
    networks = sorted({e["network"] for e in found if e.get("network")})
    gdr = [e["gdr"] for e in found if e.get("gdr") is not None]
    return {
        "ranks_with_log": len(found),
        "version": versions[0] if len(versions) == 1 else (versions or None),
        "kinds": sorted({k for e in found for k in e["kinds"]}),
        "network": networks[0] if len(networks) == 1 else (networks or None),
        "gdr": all(gdr) if gdr else None,
        "nvls": any(e["nvls"] for e in found),
        "collnet": any(e["collnet"] for e in found),
        "nodes": max((e["nodes"] for e in found if e.get("nodes")), default=None),
    }


# -- python -m launcher.observe.nccl_log FILE... --------------------------------------------------


def describe(name: str, summary: dict) -> str:
    """A few lines for a person: version, nodes, network, then each transport."""
    version = summary["version"] or "(version: only rank 0 logs it)"
    head = [f"NCCL {version}"]
    if summary["nodes"]:
        head.append(f"{summary['nodes']} node(s)")
    if summary["network"]:
        gdr = {True: ", GPUDirect RDMA", False: ", no GPUDirect RDMA"}.get(summary["gdr"], "")
        unused = "" if summary["gdr"] is not None else " (no connection uses it)"
        head.append(f"network {summary['network']}{gdr}{unused}")
    lines = [f"{name}: " + ", ".join(head)]
    lines += [f"  {t:<28} {n} channel(s)" for t, n in summary["transports"].items()]
    if summary["nvls"]:
        lines.append("  NVLS (NVLink SHARP) set up")
    if summary["collnet"]:
        lines.append("  CollNet connected")
    if not summary["transports"] and not summary["nvls"]:
        lines.append("  no channel connections in this log (one rank, or no collective yet)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m launcher.observe.nccl_log",
        description="Summarise the transports in NCCL_DEBUG=INFO logs (NCCL_DEBUG_FILE "
        "files or captured stdout), one summary per process found.",
    )
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = parser.parse_args(argv)
    out = {}
    for file in args.files:
        if not file.is_file():
            print(f"error: {file}: no such file", file=sys.stderr)
            return 2
        processes = split_by_process(file.read_text(errors="replace"))
        if not processes:
            print(f"error: {file}: no NCCL INFO lines (NCCL_DEBUG=INFO?)", file=sys.stderr)
            return 2
        for proc, text in processes.items():
            name = str(file) if len(processes) == 1 else f"{file} [{proc}]"
            out[name] = parse_nccl_log(text)
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print("\n".join(describe(name, summary) for name, summary in out.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
