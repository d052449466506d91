"""The NCCL environment variables the `nccl` config group may set, as a typed schema.

Each is a field of `NcclEnv` (null: leave NCCL's default), so `nccl.env.NCCL_ALGO=Ring`
works as an ordinary override, and a misspelt name is rejected while composing, with the
closest known names. NCCL reads these once, when its first communicator is created, so the
runtime exports them before the process group exists.
"""

from __future__ import annotations

from dataclasses import make_dataclass

KNOWN_NCCL_VARS = (
    "NCCL_ALGO",
    "NCCL_BUFFSIZE",
    "NCCL_CHECKS_DISABLE",
    "NCCL_COLLNET_ENABLE",
    "NCCL_CROSS_NIC",
    "NCCL_CUMEM_ENABLE",
    "NCCL_DEBUG",
    "NCCL_DEBUG_FILE",
    "NCCL_DEBUG_SUBSYS",
    "NCCL_IB_ADAPTIVE_ROUTING",
    "NCCL_IB_DISABLE",
    "NCCL_IB_GID_INDEX",
    "NCCL_IB_HCA",
    "NCCL_IB_QPS_PER_CONNECTION",
    "NCCL_IB_RETRY_CNT",
    "NCCL_IB_SL",
    "NCCL_IB_TC",
    "NCCL_IB_TIMEOUT",
    "NCCL_IGNORE_CPU_AFFINITY",
    "NCCL_LAUNCH_MODE",
    "NCCL_MAX_NCHANNELS",
    "NCCL_MIN_NCHANNELS",
    "NCCL_NET",
    "NCCL_NET_GDR_LEVEL",
    "NCCL_NET_GDR_READ",
    "NCCL_NET_PLUGIN",
    "NCCL_NSOCKS_PERTHREAD",
    "NCCL_NTHREADS",
    "NCCL_NVB_DISABLE",
    "NCCL_NVLS_ENABLE",
    "NCCL_P2P_DISABLE",
    "NCCL_P2P_LEVEL",
    "NCCL_P2P_NET_CHUNKSIZE",
    "NCCL_P2P_NVL_CHUNKSIZE",
    "NCCL_PROTO",
    "NCCL_PXN_DISABLE",
    "NCCL_SHM_DISABLE",
    "NCCL_SOCKET_FAMILY",
    "NCCL_SOCKET_IFNAME",
    "NCCL_SOCKET_NTHREADS",
    "NCCL_TOPO_DUMP_FILE",
    "NCCL_TOPO_FILE",
)

NcclEnv = make_dataclass(
    "NcclEnv",
    [(name, str | None, None) for name in KNOWN_NCCL_VARS],
    namespace={"__doc__": "NCCL_* variables to export; null leaves NCCL's own default."},
)
