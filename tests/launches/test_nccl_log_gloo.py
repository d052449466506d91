"""A gloo run with NCCL_DEBUG set claims no NCCL transport in env.json: no claim without NCCL."""

from __future__ import annotations

import json

from launcher.runtime import nccl_capture

from launch import FAST, base_env, explain, free_port, python_train


def test_gloo_run_with_nccl_debug_claims_no_transport(tmp_path):
    """A real one-rank gloo process group with nccl=debug: NCCL never runs, so env.json
    says nothing about its transport and no NCCL log is set up."""
    env = base_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    env.pop("NCCL_DEBUG_FILE", None)
    proc = python_train(
        [
            *FAST,
            "trainer.max_steps=2",
            "trainer.checkpoint_interval=0",
            "trainer.eval_interval=0",
            "nccl=debug",
            f"run.root={tmp_path}",
            "run.id=gloo",
        ],
        env=env,
    )
    assert proc.returncode == 0, explain(proc)
    run_dir = tmp_path / "gloo"
    facts = json.loads((run_dir / "env.json").read_text())
    assert facts["backend"] == "gloo"
    assert "nccl_transport" not in facts
    assert facts["nccl_env"]["NCCL_DEBUG"] == "INFO" and "NCCL_DEBUG_FILE" not in facts["nccl_env"]
    assert not list((run_dir / "logs").glob("nccl*"))
    assert not (tmp_path / nccl_capture.STAGING_DIR).exists()
