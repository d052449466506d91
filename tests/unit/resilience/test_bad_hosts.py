"""The hosts a run keeps off its next attempts (launcher.resilience.bad_hosts,
docs/faults.md): one a line with its reason, each host once with its first reason, read back
as the renderers and the sbatch script read it; which failures are a device's. The kinds that
record a host are launched in tests/launches/test_burnin.py (burn-in), tests/scale/ (a hang's
culprit among 16 ranks) and tests/launches/test_faults.py (a device error)."""

from __future__ import annotations

import pytest

from launcher.resilience import bad_hosts


def test_hosts_accumulate_once_each_with_their_first_reason(tmp_path):
    assert bad_hosts.read(tmp_path) == [] and bad_hosts.reasons(tmp_path) == {}
    bad_hosts.record(tmp_path, {"n3": "burn-in: rank 5: matmul 9 ms"})
    bad_hosts.record(tmp_path, {"n1": "hang: rank 2 wrote no stacks\n(could not run)", "n3": "x"})
    assert (tmp_path / bad_hosts.FILE).read_text() == (
        "n3 burn-in: rank 5: matmul 9 ms\nn1 hang: rank 2 wrote no stacks (could not run)\n"
    )
    assert bad_hosts.read(tmp_path) == ["n3", "n1"]
    assert bad_hosts.reasons(tmp_path)["n1"] == "hang: rank 2 wrote no stacks (could not run)"


def test_a_file_of_hosts_alone_reads_as_before(tmp_path):
    (tmp_path / bad_hosts.FILE).write_text("n2\n\n  n7  \n")
    assert bad_hosts.reasons(tmp_path) == {"n2": "", "n7": ""}


@pytest.mark.parametrize(
    ("message", "device"),
    [
        ("CUDA error: uncorrectable ECC error encountered", True),
        ("NCCL error in: ...: unhandled cuda error (run with NCCL_DEBUG=INFO for details)", True),
        ("CUDA error: unspecified launch failure", True),
        ("GPU 0000:3b:00.0 has fallen off the bus", True),
        ("CUBLAS_STATUS_EXECUTION_FAILED when calling cublasGemmEx", True),
        ("CUDA out of memory. Tried to allocate 2.00 GiB", False),  # the job's size, not the host
        ("CUDA error: device-side assert triggered", False),  # the program's own error
        ("Connection closed by peer [10.0.0.3]:4312", False),  # a peer's loss, not this device
    ],
)
def test_device_errors_are_told_from_the_programs_own(message, device):
    assert bad_hosts.is_device_error(RuntimeError(message)) == device
    try:
        try:
            raise RuntimeError(message)
        except RuntimeError as inner:
            raise ValueError("step failed") from inner
    except ValueError as outer:
        assert bad_hosts.is_device_error(outer) == device  # found through the cause too
