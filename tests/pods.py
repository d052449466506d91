"""Run a rendered Indexed Job's pods on this machine the way Kubernetes would.

There is no kubelet here, so each "pod" is built from what Kubernetes gives a real one:

- its own network namespace (a veth on a bridge in a hub namespace, one address per pod),
  so that every pod listens on its own address and the same port, as pods do;
- a private mount, UTS and PID namespace (`unshare`): a tmpfs /dev/shm of the rendered
  emptyDir's sizeLimit, the hostname `<job>-<index>`, and an /etc/hosts such as the kubelet
  writes (the pod's own name) plus the headless Service's records (`<job>-<i>.<service>`,
  what cluster DNS would answer); killing the pod's first process kills all of it, like a
  container runtime tearing a pod down;
- SIGTERM to the container's process and SIGKILL after the grace period (`sigterm`,
  `wait_or_kill`),
  as the kubelet does on pod deletion or preemption;
- the pod's securityContext: the process runs as runAsUser/runAsGroup with fsGroup as its
  supplementary group and no_new_privs set (no capabilities, as a non-root UID has none);
  each disk emptyDir is a fresh folder of fsGroup (setgid, group-writable) mounted at its
  path, and a PersistentVolumeClaim (here: the host folder at its mountPath) gets
  `fsGroupChangePolicy: OnRootMismatch`: its files are given to fsGroup, group-writable,
  unless its root already belongs to it;
- the container's command and args exactly as rendered, with `$(VAR)` expanded the way
  Kubernetes does, and the environment the manifest gives (Secret references resolved
  from a dict standing in for the cluster's Secrets), plus what Kubernetes injects:
  JOB_COMPLETION_INDEX and HOSTNAME.

The image's own environment (PATH to this venv's python, HOME, the token cache) is given
by the caller. `python tests/pods.py enter ...` is the pod's first process: it mounts and
names, then execs the container's command.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "lk8s"  # network namespaces of this harness: lk8s<pid>-hub, lk8s<pid>-p<i>
SUBNET = "10.233.0"  # inside this harness's own namespaces only; never leaves them
CLUSTER_DOMAIN = "svc.cluster.local"
MOUNT = shutil.which("mount") or "/usr/bin/mount"
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38  # prctl(2) options

REPO = Path(__file__).resolve().parents[1]  # the launcher's source the pods import


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: `$$` is a literal `$`, an undefined `$(VAR)` stays."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2 : end]
                    out.append(env[name] if name in env else text[i : end + 1])
                    i = end + 1
                    continue
        out.append(text[i])
        i += 1
    return "".join(out)


def container_env(
    container: dict,
    injected: dict[str, str],
    secrets: dict[str, dict[str, str]],
    fields: dict[str, str] | None = None,
) -> dict[str, str]:
    """The variables a container sees from its manifest, in order, plus the injected ones;
    `fields`: the pod's fields a `fieldRef` may name (spec.nodeName)."""
    env = dict(injected)
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = expand(str(entry["value"]), env)
            continue
        if "fieldRef" in entry["valueFrom"]:
            env[entry["name"]] = (fields or {})[entry["valueFrom"]["fieldRef"]["fieldPath"]]
            continue
        ref = entry["valueFrom"]["secretKeyRef"]
        value = secrets.get(ref["name"], {}).get(ref["key"])
        if value is None:
            if ref.get("optional"):
                continue
            raise RuntimeError(
                f"pod would not start: Secret {ref['name']}/{ref['key']} for {entry['name']} "
                "is missing (CreateContainerConfigError)"
            )
        env[entry["name"]] = value
    return env


def parse_size(text: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "": 1}
    number, unit = re.fullmatch(r"(\d+)(Ki|Mi|Gi|)", str(text)).groups()
    return int(number) * units[unit]


@dataclass
class Pod:
    index: int
    hostname: str
    netns: str
    ip: str
    hosts_file: Path
    proc: subprocess.Popen | None = None
    log: Path | None = None
    starts: int = 0

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def first_process(self) -> int:
        """The container's process: `ip netns exec` becomes `unshare`, whose forked child is
        PID 1 of the pod's PID namespace and execs the container's command."""
        pid = self.proc.pid
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        return int(children[0])

    def sigterm(self) -> None:
        """What the kubelet does first when the pod is deleted or preempted: SIGTERM to the
        container's process. Then `wait_or_kill(terminationGracePeriodSeconds)`."""
        os.kill(self.first_process(), signal.SIGTERM)

    def wait_or_kill(self, grace_s: float) -> int:
        """The pod's exit code, or -9 if it outlived the grace period and was killed."""
        try:
            return self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return -signal.SIGKILL

    def kill(self) -> None:
        """SIGKILL the pod's first process; its PID namespace dies with it."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


@dataclass
class IndexedJobPods:
    """The pods of one rendered Indexed Job (+ its headless Service) on this machine."""

    job: dict
    service: dict
    image_env: dict[str, str]  # what the image itself provides: PATH, HOME, ...
    workdir: Path  # the image's WORKDIR, used when the container gives no workingDir
    state_dir: Path  # hosts files and logs
    secrets: dict[str, dict[str, str]] = field(default_factory=dict)
    # Files of the image its non-root user must reach (the interpreter): here they may lie
    # in a folder only root may enter (/root/.pyenv), which the pod then gets opened.
    expose: list[Path] = field(default_factory=list)
    # The image's own files (this venv, the launcher's source it imports). An emptyDir the
    # pod mounts over a folder holding them (the restricted pod's /tmp, where a CI clone may
    # lie) would hide them, which no real image's would be: they are mounted back on top.
    image_files: list[Path] = field(default_factory=lambda: [Path(sys.prefix), REPO])
    pods: list[Pod] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.job["metadata"]["name"]

    @property
    def pod_spec(self) -> dict:
        return self.job["spec"]["template"]["spec"]

    def __enter__(self) -> IndexedJobPods:
        remove_stale_namespaces()
        tag = f"{PREFIX}{os.getpid()}"
        hub = f"{tag}-hub"
        _ip("netns", "add", hub)
        _ip("-n", hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", hub, "link", "set", "br0", "up")
        namespace = self.job["metadata"].get("namespace", "default")
        subdomain = self.pod_spec["subdomain"]
        completions = self.job["spec"]["completions"]
        for i in range(completions):
            ns, ip = f"{tag}-p{i}", f"{SUBNET}.{10 + i}"
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"h{i}",
                "netns", hub)  # fmt: skip
            _ip("-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", hub, "link", "set", f"h{i}", "master", "br0")
            _ip("-n", hub, "link", "set", f"h{i}", "up")
            hostname = f"{self.name}-{i}"
            self.pods.append(Pod(i, hostname, ns, ip, self.state_dir / f"hosts.{i}"))
        self._hub = hub
        fqdn = {
            p.index: f"{p.hostname}.{subdomain}.{namespace}.{CLUSTER_DOMAIN}" for p in self.pods
        }
        dns = [f"{p.ip}\t{fqdn[p.index]}\t{p.hostname}.{subdomain}" for p in self.pods]
        for pod in self.pods:
            kubelet = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
            kubelet.append(f"{pod.ip}\t{fqdn[pod.index]}\t{pod.hostname}")
            lines = ["# Kubernetes-managed hosts file.", *kubelet, "# cluster DNS", *dns]
            pod.hosts_file.write_text("\n".join(lines) + "\n")
        return self

    def __exit__(self, *exc) -> None:
        for pod in self.pods:
            pod.kill()
        for pod in self.pods:
            _ip("netns", "del", pod.netns, check=False)
        _ip("netns", "del", self._hub, check=False)

    def _volumes(self, container: dict, folder: Path) -> list[str]:
        """`--bind SRC:DST` for each disk emptyDir (a fresh folder under `folder`), after
        giving each volume to the pod's fsGroup as the kubelet does."""
        ctx = self.pod_spec.get("securityContext") or {}
        group = ctx.get("fsGroup")
        volumes = {v["name"]: v for v in self.pod_spec["volumes"]}
        binds = []
        for mount in container["volumeMounts"]:
            volume = volumes[mount["name"]]
            if "persistentVolumeClaim" in volume and group is not None:
                _give_to_group(Path(mount["mountPath"]), group)
            empty = volume.get("emptyDir")
            if empty is None or empty.get("medium") == "Memory":
                continue
            source = folder / mount["name"]
            source.mkdir(parents=True)
            if group is not None:
                os.chown(source, 0, group)
                source.chmod(0o2775)
            binds.append(f"--bind={source}:{mount['mountPath']}")
        return binds

    def start(self, index: int) -> Pod:
        """Create pod `index` (again): a fresh /dev/shm and emptyDirs, the rendered command
        and env, as the securityContext's user."""
        pod = self.pods[index]
        container = self.pod_spec["containers"][0]
        injected = {**self.image_env, "HOSTNAME": pod.hostname}
        injected["JOB_COMPLETION_INDEX"] = str(index)
        # Each pod on a node of its own, named as a kubelet would report spec.nodeName.
        env = container_env(container, injected, self.secrets, {"spec.nodeName": f"node{index}"})
        argv = [expand(a, env) for a in container.get("command", []) + container.get("args", [])]
        shm = next(
            v["emptyDir"]["sizeLimit"]
            for v in self.pod_spec["volumes"]
            for m in container["volumeMounts"]
            if m["mountPath"] == "/dev/shm" and m["name"] == v["name"]
        )
        cwd = container.get("workingDir") or str(self.workdir)
        ctx = self.pod_spec.get("securityContext") or {}
        user = [f"--{k}={ctx[f]}" for k, f in (("uid", "runAsUser"), ("gid", "runAsGroup"),
                ("fs-group", "fsGroup")) if f in ctx]  # fmt: skip
        volumes = self._volumes(container, self.state_dir / f"pod{index}.{pod.starts}.volumes")
        enter = [
            shutil.which("ip"), "netns", "exec", pod.netns,
            shutil.which("unshare"), "--mount", "--uts", "--pid", "--fork", "--kill-child",
            "--mount-proc", "--propagation", "private",
            sys.executable, str(Path(__file__).resolve()), "enter",
            f"--shm-bytes={parse_size(shm)}", f"--hosts={pod.hosts_file}",
            f"--hostname={pod.hostname}", f"--cwd={cwd}", *user, *volumes,
            *(f"--expose={p}" for p in self.expose),
            *(f"--keep={p}" for p in self.image_files), "--", *argv,
        ]  # fmt: skip
        pod.log = self.state_dir / f"pod{index}.{pod.starts}.log"
        pod.starts += 1
        out = open(pod.log, "w")  # noqa: SIM115 - held by the child
        pod.proc = subprocess.Popen(enter, env=env, stdout=out, stderr=subprocess.STDOUT)
        out.close()
        return pod

    def logs(self) -> str:
        parts = []
        for log in sorted(self.state_dir.glob("pod*.log")):
            parts.append(f"--- {log.name}\n{log.read_text()[-5000:]}")
        return "\n".join(parts)


def _give_to_group(root: Path, group: int) -> None:
    """fsGroupChangePolicy OnRootMismatch: unless the volume's root already belongs to the
    group, every file is given to it, group-readable and -writable, folders setgid."""
    if root.stat().st_gid == group:
        return
    for path in [root, *root.rglob("*")]:
        os.chown(path, -1, group, follow_symlinks=False)
        if not path.is_symlink():
            extra = 0o2070 if path.is_dir() else 0o060
            path.chmod(path.stat().st_mode | extra)


def _ip(*args: str, check: bool = True) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


def remove_stale_namespaces() -> None:
    """Delete namespaces left by an earlier run of this harness whose process is gone."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in listing.splitlines():
        name = line.split()[0] if line.strip() else ""
        match = re.fullmatch(rf"{PREFIX}(\d+)-(hub|p\d+)", name)
        if match and not _alive(int(match.group(1))):
            _ip("netns", "del", name, check=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def can_run_pods() -> str | None:
    """None when this machine can make the namespaces, else why not."""
    if os.geteuid() != 0:
        return "network and mount namespaces need root"
    probe = f"{PREFIX}{os.getpid()}-probe"
    try:
        _ip("netns", "add", probe)
    except (OSError, RuntimeError) as exc:
        return f"cannot create a network namespace: {exc}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


def _expose(path: Path) -> None:
    """Make `path` reachable for any user in this mount namespace: the first folder on
    the way that others may not enter (/root) is covered by a tmpfs anyone may enter,
    holding only the one entry on the way (/root/.pyenv), bound from where it was."""
    for parent in path.parents:
        if parent.parent == parent or parent.stat().st_mode & stat.S_IXOTH:
            continue
        child = path.relative_to(parent).parts[0]
        stage = Path(tempfile.mkdtemp(prefix="pods-expose-"))
        subprocess.run([MOUNT, "--bind", str(parent / child), str(stage)], check=True)
        subprocess.run([MOUNT, "-t", "tmpfs", "-o", "mode=755", "tmpfs", str(parent)], check=True)
        (parent / child).mkdir()
        subprocess.run([MOUNT, "--move", str(stage), str(parent / child)], check=True)
        stage.rmdir()
        return


def _stage(path: Path) -> tuple[Path, Path]:
    """`path` bound to a folder outside every pod volume, to be moved back once the volumes
    are mounted: (path, that folder)."""
    stage = Path(tempfile.mkdtemp(prefix="pods-keep-", dir="/var/tmp"))
    subprocess.run([MOUNT, "--bind", str(path), str(stage)], check=True)
    return path, stage


def _become(uid: int, gid: int, fs_group: int | None) -> None:
    """The container's user: its group, fsGroup as a supplementary group, no way back to
    more privileges (allowPrivilegeEscalation: false is no_new_privs)."""
    os.setgroups([fs_group] if fs_group is not None else [])
    os.setgid(gid)
    os.setuid(uid)
    libc = ctypes.CDLL(None, use_errno=True)
    # unshare --kill-child's parent-death signal is cleared by the change of user: set it
    # again, so that killing the pod (its unshare) still kills everything in it.
    for option, value in ((PR_SET_PDEATHSIG, signal.SIGKILL), (PR_SET_NO_NEW_PRIVS, 1)):
        if libc.prctl(option, int(value), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"prctl({option})")


def _enter(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shm-bytes", type=int, required=True)
    parser.add_argument("--hosts", required=True)
    parser.add_argument("--hostname", required=True)
    parser.add_argument("--cwd", required=True)
    parser.add_argument("--uid", type=int)
    parser.add_argument("--gid", type=int)
    parser.add_argument("--fs-group", type=int)
    parser.add_argument("--bind", action="append", default=[])
    parser.add_argument("--expose", action="append", default=[])
    parser.add_argument("--keep", action="append", default=[])
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    mounts = [
        [MOUNT, "-t", "tmpfs", "-o", f"size={args.shm_bytes},mode=1777", "tmpfs", "/dev/shm"],
        [MOUNT, "--bind", args.hosts, "/etc/hosts"],
    ]
    for bind in args.bind:
        source, target = bind.split(":", 1)
        os.makedirs(target, exist_ok=True)  # a mount point (an image would have it)
        mounts.append([MOUNT, "--bind", source, target])
    covered = [Path(b.split(":", 1)[1]) for b in args.bind]
    kept = [_stage(Path(p)) for p in args.keep if any(Path(p).is_relative_to(c) for c in covered)]
    for cmd in mounts:
        subprocess.run(cmd, check=True)
    for path, stage in kept:
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run([MOUNT, "--move", str(stage), str(path)], check=True)
        stage.rmdir()
    for path in args.expose:
        _expose(Path(path))
    socket.sethostname(args.hostname)
    if args.uid is not None:
        _become(args.uid, args.gid if args.gid is not None else args.uid, args.fs_group)
    os.chdir(args.cwd)
    with contextlib.suppress(KeyError):
        os.environ["PWD"] = args.cwd
    os.execvpe(command[0], command, os.environ)


if __name__ == "__main__":
    if sys.argv[1:2] == ["enter"]:
        _enter(sys.argv[2:])
    else:
        sys.exit("usage: pods.py enter --shm-bytes N --hosts FILE --hostname H --cwd D -- CMD")
