"""NCCL transport from NCCL's INFO log: the parser on real-format logs, the log file's way
into the run directory, and env.json's `nccl_transport`."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch

from launcher.observe import nccl_log
from launcher.observe.nccl_log import parse_nccl_log, split_by_process
from launcher.observe.nccl_transport import transport_recorders
from launcher.runtime import nccl_capture
from launcher.runtime.launch_state import LaunchState
from launcher.runtime.process import Runtime

from nccl_fixtures import FIXTURES, fixture


def test_single_node_nvlink_pair_uses_p2p_over_cumem():
    s = parse_nccl_log(fixture("single_node_p2p.rank0.log"))
    assert s["version"] == "2.21.5+cuda12.4"
    assert s["transports"] == {"P2P/CUMEM/read": 24}
    assert s["kinds"] == ["P2P"]
    assert (s["nodes"], s["nranks"], s["communicators"]) == (1, 2, 1)
    assert s["network"] == "Socket" and s["gdr"] is None  # initialised, but no NET channel
    assert s["nvls"] is False and s["nvls_available"] is False and s["mnnvl"] is False


def test_two_nodes_on_infiniband_with_gpudirect_rdma():
    by_proc = split_by_process(fixture("two_nodes_ib.node0.stdout.log"))
    assert list(by_proc) == ["dgx-h100-a:90511", "dgx-h100-a:90512"]
    rank0 = parse_nccl_log(by_proc["dgx-h100-a:90511"])
    assert rank0["version"] == "2.19.3+cuda12.3"
    assert rank0["transports"] == {
        "NET/IB/0/GDRDMA": 1,
        "NET/IB/1/GDRDMA": 1,
        "P2P/CUMEM/read": 2,
    }
    assert rank0["kinds"] == ["NET", "P2P"]
    assert rank0["network"] == "IB" and rank0["gdr"] is True
    assert (rank0["nodes"], rank0["nranks"]) == (2, 4)
    rank1 = parse_nccl_log(by_proc["dgx-h100-a:90512"])
    assert rank1["version"] is None  # NCCL prints its version on rank 0 only
    assert rank1["kinds"] == ["NET", "P2P"]


def test_ethernet_node_without_peer_access_uses_shm_and_sockets():
    whole = parse_nccl_log(fixture("ethernet_shm.node0.stdout.log"))  # both ranks at once
    assert whole["version"] == "2.18.1+cuda12.1"
    assert whole["transports"] == {"NET/Socket/0": 2, "SHM/direct/direct": 2}
    assert whole["kinds"] == ["NET", "SHM"]
    assert whole["network"] == "Socket" and whole["gdr"] is False
    assert whole["communicators"] == 2  # one per process in this stdout


def test_hgx_node_sets_up_nvls_next_to_p2p():
    s = parse_nccl_log(fixture("hgx_nvls.rank3.log"))
    assert s["nvls"] is True and s["nvls_available"] is True
    assert s["kinds"] == ["NVLS", "P2P"]
    assert s["transports"] == {"P2P/CUMEM/read": 16}
    assert s["network"] == "IBext_v8"  # HPC-X's RDMA plugin: still InfiniBand verbs
    assert (s["nodes"], s["nranks"], s["communicators"]) == (1, 8, 1)


P = "h:1:2 [0] NCCL INFO "


@pytest.mark.parametrize(
    ("line", "transport"),
    [
        # NCCL < 2.7 said Ring and printed bus ids
        ("[4] NCCL INFO Ring 00 : 12[41000] -> 11[2d000] via P2P/IPC", "P2P/IPC"),
        (P + "Channel 06 : 7[e7000] -> 6[e1000] via P2P/direct pointer/read", None),
        (P + "Channel 02/0 : 0[0] -> 9[1] [send] via NET/IB/1(1)/GDRDMA", None),  # PXN
        (P + "Channel 00/0 : 2[2] -> 3[3] via P2P/MNNVL/read", None),
        (P + "Channel 01/1 : 0[0] -> 4[0] [send] via NET/AWS Libfabric/0/GDRDMA", None),
        (P + "CollNet 00/1 : 0 [send] via COLLNET/SHARP/0/GDRDMA", None),
        # timestamps (NCCL_DEBUG_TIMESTAMP_LEVELS) and torchrun's --tee prefixes
        ("[2025-02-01 10:00:00] " + P + "Channel 03 : 1[1] -> 0[0] via SHM/CE/direct", None),
        ("[default1]:" + P + "Channel 03/0 : 1[1] -> 0[0] via P2P/IPC/read", None),
    ],
)
def test_channel_line_variants(line, transport):
    expected = transport or line.split(" via ", 1)[1]
    assert parse_nccl_log(line)["transports"] == {expected: 1}


def test_kinds_network_and_flags_from_single_lines():
    s = parse_nccl_log(
        "h:1:2 [0] NCCL INFO CollNet 00/0 : 0 [receive] via COLLNET/SHARP/0/GDRDMA\n"
        "h:1:2 [0] NCCL INFO rank 0 Connected CollNet\n"
        "h:1:2 [0] NCCL WARN NET/IB : Got async event : port error\n"
    )
    assert s["kinds"] == ["CollNet"] and s["collnet"] is True
    assert s["network"] == "SHARP" and s["gdr"] is True  # from the transport, no "Using" line
    empty = parse_nccl_log("nothing from NCCL here\n")
    assert empty["transports"] == {} and empty["kinds"] == [] and empty["version"] is None


def test_merge_reports_what_any_rank_used():
    by_proc = split_by_process(fixture("two_nodes_ib.node0.stdout.log"))
    entries = [
        {"rank": r, "log": f"logs/{r}.log", **parse_nccl_log(text)}
        for r, text in enumerate(by_proc.values())
    ]
    entries.append({"rank": 2, "log": None})  # a rank whose NCCL wrote no log
    job = nccl_log.merge(entries)
    assert job["ranks_with_log"] == 2
    assert job["version"] == "2.19.3+cuda12.3"
    assert job["kinds"] == ["NET", "P2P"] and job["network"] == "IB" and job["gdr"] is True
    assert job["nodes"] == 2 and job["nvls"] is False


def test_command_line_summarises_each_process(capsys):
    assert nccl_log.main([str(FIXTURES / "two_nodes_ib.node0.stdout.log")]) == 0
    out = capsys.readouterr().out
    assert "[dgx-h100-a:90511]: NCCL 2.19.3+cuda12.3, 2 node(s), network IB, GPUDirect RDMA" in out
    assert "NET/IB/0/GDRDMA" in out and "P2P/CUMEM/read" in out
    assert nccl_log.main(["--json", str(FIXTURES / "hgx_nvls.rank3.log")]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary[str(FIXTURES / "hgx_nvls.rank3.log")]["nvls"] is True


def test_command_line_rejects_a_file_without_nccl_lines(tmp_path, capsys):
    (tmp_path / "train.log").write_text("step 1 loss 4.2\n")
    assert nccl_log.main([str(tmp_path / "train.log")]) == 2
    assert "no NCCL INFO lines" in capsys.readouterr().err


def test_nothing_is_staged_without_nccl_or_without_info(nccl_env, tmp_path):
    nccl_env.setenv("NCCL_DEBUG", "INFO")
    assert nccl_capture.stage_debug_file(str(tmp_path), "gloo", 0) is None
    nccl_env.setenv("NCCL_DEBUG", "WARN")  # warnings stay on the console
    assert nccl_capture.stage_debug_file(str(tmp_path), "nccl", 0) is None
    assert "NCCL_DEBUG_FILE" not in os.environ
    assert nccl_capture.adopt_debug_file(None, tmp_path / "run") is None
    assert not (tmp_path / nccl_capture.STAGING_DIR).exists()


def test_staged_log_moves_into_the_run_directory(nccl_env, tmp_path):
    nccl_env.setenv("NCCL_DEBUG", "INFO")
    capture = nccl_capture.stage_debug_file(str(tmp_path), "nccl", 3)
    staged = Path(os.environ["NCCL_DEBUG_FILE"])
    assert staged.parent == tmp_path / nccl_capture.STAGING_DIR
    assert staged.name == f"nccl.rank3.{socket.gethostname().split('.')[0]}.{os.getpid()}.log"
    staged.write_text(fixture("single_node_p2p.rank0.log"))  # as NCCL does during init
    (tmp_path / "run" / "logs").mkdir(parents=True)
    final = nccl_capture.adopt_debug_file(capture, tmp_path / "run")
    assert final == (tmp_path / "run" / "logs" / staged.name).absolute()
    assert final.exists() and not staged.parent.exists()
    assert os.environ["NCCL_DEBUG_FILE"] == str(final) and capture.path == final
    assert parse_nccl_log(nccl_capture.read_own_log(capture))["transports"] == {
        "P2P/CUMEM/read": 24
    }


def test_log_not_opened_yet_is_pointed_at_the_run_directory(nccl_env, tmp_path):
    nccl_env.setenv("NCCL_DEBUG", "INFO")
    capture = nccl_capture.stage_debug_file(str(tmp_path), "nccl", 0)
    (tmp_path / "run" / "logs").mkdir(parents=True)
    final = nccl_capture.adopt_debug_file(capture, tmp_path / "run")
    assert os.environ["NCCL_DEBUG_FILE"] == str(final) and not final.exists()
    assert nccl_capture.read_own_log(capture) is None  # no log, so nothing to claim


def test_users_debug_file_is_kept_and_a_second_job_reads_only_its_own_lines(nccl_env, tmp_path):
    nccl_env.setenv("NCCL_DEBUG", "INFO")
    nccl_env.setenv("NCCL_DEBUG_FILE", str(tmp_path / "nccl.%h.%p.log"))
    host = socket.gethostname().split(".")[0]
    path = tmp_path / f"nccl.{host}.{os.getpid()}.log"
    path.write_text("stale lines of an earlier process\n")  # NCCL truncates when it opens
    first = nccl_capture.stage_debug_file(str(tmp_path), "nccl", 0)
    assert os.environ["NCCL_DEBUG_FILE"] == str(tmp_path / "nccl.%h.%p.log")
    path.write_text(fixture("single_node_p2p.rank0.log"))
    assert nccl_capture.adopt_debug_file(first, tmp_path / "run") == path
    assert parse_nccl_log(nccl_capture.read_own_log(first))["transports"] == {"P2P/CUMEM/read": 24}
    # the next job of a sweep in this process: NCCL appends to the file it already has open
    second = nccl_capture.stage_debug_file(str(tmp_path), "nccl", 0, earlier=first)
    with open(path, "a") as f:
        f.write(fixture("hgx_nvls.rank3.log"))
    assert parse_nccl_log(nccl_capture.read_own_log(second))["kinds"] == ["NVLS", "P2P"]


def test_recorder_adds_nccl_transport_to_env_json(nccl_env, tmp_path):
    nccl_env.setenv("NCCL_DEBUG", "INFO")
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "env.json").write_text(json.dumps({"run_id": "run", "world_size": 1}))
    launch = LaunchState(nccl_capture=nccl_capture.stage_debug_file(str(tmp_path), "nccl", 0))
    Path(os.environ["NCCL_DEBUG_FILE"]).write_text(fixture("single_node_p2p.rank0.log"))
    final = nccl_capture.adopt_debug_file(launch.nccl_capture, run_dir)
    rt = Runtime(0, 0, 1, torch.device("cpu"), "nccl", run_id="run", run_dir=run_dir)
    rt.launch = launch
    (recorder,) = transport_recorders(rt)
    recorder.log({"step": 1})
    recorder.log({"step": 2})  # once only
    env = json.loads((run_dir / "env.json").read_text())
    assert env["run_id"] == "run"  # the rest of env.json is kept
    (entry,) = env["nccl_transport"]["ranks"]
    assert entry["log"] == str(final.relative_to(run_dir.absolute()))
    assert entry["transports"] == {"P2P/CUMEM/read": 24} and entry["rank"] == 0
    assert env["nccl_transport"]["job"]["kinds"] == ["P2P"]


def test_no_recorder_for_gloo(nccl_env, tmp_path):
    nccl_env.setenv("NCCL_DEBUG", "INFO")
    launch = LaunchState(nccl_capture=nccl_capture.stage_debug_file(str(tmp_path), "gloo", 0))
    rt = Runtime(0, 0, 2, torch.device("cpu"), "gloo", run_dir=tmp_path, launch=launch)
    assert transport_recorders(rt) == []
