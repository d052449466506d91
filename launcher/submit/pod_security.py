"""Pod Security Standards' `restricted` profile (baseline included), as rules on a pod spec.

A namespace labelled `pod-security.kubernetes.io/enforce: restricted` rejects a pod that
breaks any of these; there is no API server here to ask, so the rules of the published
standard (kubernetes.io/docs/concepts/security/pod-security-standards, Kubernetes 1.25+)
are checked on the rendered pod. `violations` names each broken rule by its field.
"""

from __future__ import annotations

# Baseline: capabilities a container may add; restricted allows only NET_BIND_SERVICE.
BASELINE_CAPS = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
RESTRICTED_CAPS = frozenset({"NET_BIND_SERVICE"})
RESTRICTED_VOLUMES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
SECCOMP_OK = ("RuntimeDefault", "Localhost")


def violations(spec: dict) -> list[str]:
    """Every rule of `restricted` the pod spec breaks, one line each (field: rule)."""
    out = [
        f"spec.{key}: must not be true"
        for key in ("hostNetwork", "hostPID", "hostIPC")
        if spec.get(key)
    ]
    pod_ctx = spec.get("securityContext") or {}
    for s in pod_ctx.get("sysctls") or []:
        if s.get("name") not in SAFE_SYSCTLS:
            out.append(f"spec.securityContext.sysctls: {s.get('name')} is not a safe sysctl")
    for i, vol in enumerate(spec.get("volumes") or []):
        kind = next((k for k in vol if k != "name"), None)
        if kind not in RESTRICTED_VOLUMES:
            out.append(f"spec.volumes[{i}]: {kind} volumes are not allowed")
    containers = [("containers", c) for c in spec.get("containers") or []]
    containers += [("initContainers", c) for c in spec.get("initContainers") or []]
    for field, c in containers:
        out += _container(f"spec.{field}[{c.get('name')}]", c, pod_ctx)
    return out


def _container(where: str, c: dict, pod_ctx: dict) -> list[str]:
    ctx = c.get("securityContext") or {}
    out = []
    if ctx.get("privileged"):
        out.append(f"{where}.securityContext.privileged: must not be true")
    if ctx.get("allowPrivilegeEscalation") is not False:
        out.append(f"{where}.securityContext.allowPrivilegeEscalation: must be false")
    if ctx.get("procMount", "Default") != "Default":
        out.append(f"{where}.securityContext.procMount: must be Default")
    caps = ctx.get("capabilities") or {}
    if "ALL" not in (caps.get("drop") or []):
        out.append(f"{where}.securityContext.capabilities.drop: must include ALL")
    for cap in caps.get("add") or []:
        if cap not in RESTRICTED_CAPS:
            level = "restricted" if cap in BASELINE_CAPS else "baseline or restricted"
            out.append(f"{where}.securityContext.capabilities.add: {cap} breaks {level}")
    non_root = ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot"))
    if non_root is not True:
        out.append(f"{where}: runAsNonRoot must be true (pod or container securityContext)")
    if ctx.get("runAsUser", pod_ctx.get("runAsUser")) == 0:
        out.append(f"{where}: runAsUser must not be 0")
    seccomp = (ctx.get("seccompProfile") or pod_ctx.get("seccompProfile") or {}).get("type")
    if seccomp not in SECCOMP_OK:
        out.append(f"{where}: seccompProfile.type must be RuntimeDefault or Localhost")
    for p in c.get("ports") or []:
        if p.get("hostPort"):
            out.append(f"{where}.ports: hostPort {p['hostPort']} is not allowed")
    return out
