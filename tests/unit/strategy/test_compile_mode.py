"""trainer.compile as torch.compile's mode: CUDA graphs are passed only where they exist."""

import pytest
import torch

from launcher.strategy.base import compile_mode

CUDA, CPU = torch.device("cuda", 0), torch.device("cpu")


@pytest.mark.parametrize(
    ("setting", "on_cuda", "elsewhere"),
    [
        ("default", None, None),  # torch's own default
        ("reduce-overhead", "reduce-overhead", None),  # elsewhere: default's cached graphs
        ("max-autotune", "max-autotune", "max-autotune-no-cudagraphs"),
    ],
)
def test_a_mode_keeps_its_cuda_graphs_only_on_a_cuda_device(setting, on_cuda, elsewhere):
    assert compile_mode(setting, CUDA) == on_cuda
    assert compile_mode(setting, CPU) == elsewhere


def test_the_mode_elsewhere_is_the_mode_less_its_cuda_graphs():
    """What torch itself skips off CUDA: the options differ by triton.cudagraphs alone."""
    from torch._inductor import list_mode_options

    for setting in ("reduce-overhead", "max-autotune"):
        with_graphs = list_mode_options(setting)
        without = list_mode_options(compile_mode(setting, CPU) or "default")
        assert with_graphs == {**without, "triton.cudagraphs": True}, setting
