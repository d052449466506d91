"""One launch per run directory: a lock file that outlives neither its process nor its node.

Rank 0 of a launch holds `<run_dir>/.lock`, a small JSON file naming the holder (host, pid,
the process's start time, the launch's restart-stable key) whose modification time a
heartbeat thread refreshes. Creating it is atomic on local and network file systems
alike: the content is written to a private temporary file first, then hard-linked to the
lock's name, which fails if the name exists (link and rename are atomic on NFS; flock is
not reliable there). A lock is taken over, with one warning, when its holder is
 - a process of this host that no longer runs (its pid is gone, or reused by another);
 - on another host, this launch's own earlier attempt (the same launch key: torchrun's
   rendezvous id kept across `--max-restarts`, a Slurm job id kept across requeues, a
   JobSet's across its restarts) once its heartbeat has stopped for HANDOVER_S: while it
   beats, that attempt is still writing (its stop checkpoint, say) and this one waits for it
   to end, so that no two generations write the run directory at once;
 - on another host and silent: no heartbeat for `STALE_AFTER_S`;
 - unreadable (a person's edit, a truncated file).
Otherwise the launch stops with one line naming the holder.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from launcher.runtime import disk

log = logging.getLogger("launcher")

LOCK = ".lock"
HEARTBEAT_S = 5.0
STALE_AFTER_S = 120.0  # 24 missed heartbeats; hosts' clocks must agree to well within this
HANDOVER_S = 3 * HEARTBEAT_S  # an earlier attempt of this launch that beats no more has ended
WAIT_POLL_S = 1.0


class LockHeld(Exception):
    """Another live launch holds the run directory (or the lock cannot be written there);
    the message names it. `disk_full`: the lock could not be written for lack of space."""

    def __init__(self, message: str, disk_full: bool = False):
        super().__init__(message)
        self.disk_full = disk_full


def _process_start(pid: int) -> str | None:
    """The kernel's start time of `pid` (to tell a reused pid), where /proc has it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22: starttime


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by another user
    return True


@dataclass
class Holder:
    """Who holds (or wants) a lock."""

    host: str
    pid: int
    started: str | None  # the process's start time per the kernel, if known
    launch_key: str | None
    nonce: str
    since: float

    @classmethod
    def me(cls, launch_key: str | None) -> Holder:
        pid = os.getpid()
        return cls(
            socket.gethostname(),
            pid,
            _process_start(pid),
            launch_key,
            secrets.token_hex(8),
            time.time(),
        )

    def describe(self) -> str:
        key = f", launch {self.launch_key}" if self.launch_key else ""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"pid {self.pid} on {self.host}{key}, since {when}"


def _read(path: Path) -> Holder | None:
    try:
        data = json.loads(path.read_text())
        return Holder(**{k: data[k] for k in Holder.__dataclass_fields__})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def still_writing(holder: Holder | None, me: Holder, heartbeat_age_s: float) -> bool:
    """Whether `holder` is an earlier attempt of this launch on another host whose heartbeat
    still beats: a generation that has not ended, which this one waits for."""
    return (
        holder is not None
        and holder.host != me.host
        and bool(me.launch_key)
        and holder.launch_key == me.launch_key
        and heartbeat_age_s <= HANDOVER_S
    )


def stale_reason(
    holder: Holder | None,
    me: Holder,
    heartbeat_age_s: float,
    *,
    pid_alive=_pid_alive,
    process_start=_process_start,
) -> str | None:
    """Why a lock held by `holder` may be taken over by `me`, or None if it may not."""
    if holder is None:
        return "its content is unreadable"
    if holder.host == me.host:  # a live process is a live holder, whatever its launch
        if not pid_alive(holder.pid):
            return f"its holder ({holder.describe()}) is no longer running"
        if holder.started and process_start(holder.pid) not in (None, holder.started):
            return f"its holder ({holder.describe()}) is no longer running (pid reused)"
        return None
    if me.launch_key and holder.launch_key == me.launch_key:
        return (
            f"it was taken by an earlier attempt of this launch ({holder.describe()}), whose "
            f"heartbeat stopped {heartbeat_age_s:.0f} s ago"
        )
    if heartbeat_age_s > STALE_AFTER_S:
        return f"its holder ({holder.describe()}) has sent no heartbeat for {heartbeat_age_s:.0f} s"
    return None


class RunLock:
    """The run directory's lock, held by rank 0 for the whole launch."""

    def __init__(
        self,
        run_dir: Path,
        launch_key: str | None,
        name: str = LOCK,
        user: str = "launch",
        fix: str = "use another run.id",
    ):
        self.path = Path(run_dir) / name
        self.me = Holder.me(launch_key)
        # Who holds a lock of this name ("launch", or a tool: "launcher.rehearse") and the
        # way around it, for the one line that refuses a second one.
        self.user, self.fix = user, fix
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def acquire(self) -> None:
        """Take the lock, or raise LockHeld naming the live holder; wait while an earlier
        attempt of this launch on another host still holds it (`still_writing`)."""
        races, waiting = 0, False
        while races < 3:  # a takeover race lost to a third launch: look again
            if self._create():
                self._start_heartbeat()
                return
            holder = _read(self.path)
            if self.path.is_dir():
                raise LockHeld(f"{self.path} is a folder; remove it (it is not the launcher's)")
            try:
                age = time.time() - self.path.stat().st_mtime
            except FileNotFoundError:
                continue  # released meanwhile
            if still_writing(holder, self.me, age):
                if not waiting:
                    log.warning("%s: waiting for the earlier attempt of this launch (%s) to end "
                                "before this one writes there", self.path.parent,
                                holder.describe())  # fmt: skip
                waiting = True
                time.sleep(WAIT_POLL_S)
                continue
            races += 1
            reason = stale_reason(holder, self.me, age)
            if reason is None:
                raise LockHeld(
                    f"{self.path.parent} is in use by another {self.user} "
                    f"({holder.describe()}); wait for it to end, or {self.fix}"
                )
            if self._take_over(holder):
                log.warning("took over the lock of %s: %s", self.path.parent, reason)
                self._start_heartbeat()
                return
        raise LockHeld(f"{self.path.parent}: could not take its lock ({self.path}); try again")

    def _create(self) -> bool:
        """Atomically create the lock with our content; False if it exists."""
        tmp = self.path.with_name(f"{self.path.name}.{self.me.host}.{self.me.pid}.{self.me.nonce}")
        try:
            tmp.write_text(json.dumps(self.me.__dict__))
        except OSError:
            tmp.unlink(missing_ok=True)  # a full disk: no stray file, the caller says why
            raise
        try:
            os.link(tmp, self.path)
            return True
        except FileExistsError:
            return False
        except OSError:  # a file system without hard links: exclusive create instead
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "w") as f:
                f.write(tmp.read_text())
            return True
        finally:
            tmp.unlink(missing_ok=True)

    def _take_over(self, seen: Holder | None) -> bool:
        """Move the stale lock aside (one of several racing launches wins the rename),
        check that what moved is what was judged stale, and create ours."""
        aside = self.path.with_name(f"{self.path.name}.stale.{self.me.nonce}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return False
        moved = _read(aside)
        if (moved.nonce if moved else None) != (seen.nonce if seen else None):
            # A live lock created since we looked: put it back unless someone else has one.
            with contextlib.suppress(OSError):
                os.link(aside, self.path)
            aside.unlink(missing_ok=True)
            return False
        aside.unlink(missing_ok=True)
        return self._create()

    def _start_heartbeat(self) -> None:
        def beat():
            while not self._stop.wait(HEARTBEAT_S):
                with contextlib.suppress(OSError):
                    os.utime(self.path)

        self._beat = threading.Thread(target=beat, name="run-dir-lock", daemon=True)
        self._beat.start()

    def release(self) -> None:
        """Remove the lock if it is still ours."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=1)
        holder = _read(self.path)
        if holder is not None and holder.nonce == self.me.nonce:
            self.path.unlink(missing_ok=True)


@contextlib.contextmanager
def tool_lock(folder: Path, tool: str, fix: str = "use another run.id", name: str | None = None):
    """Hold `folder/.<tool>.lock` while a tool (`launcher.<tool>`) writes there: a second
    invocation of the same tool on the same folder stops with one line (LockHeld) instead
    of deleting or overwriting the first one's output. The same lock as a launch's (atomic
    on NFS, taken over from a dead holder with one warning); the folder must exist. `name`:
    another file name (an export's lock sits beside its OUT_DIR, named after it)."""
    held = RunLock(folder, None, name=name or f".{tool}.lock", user=f"launcher.{tool}", fix=fix)
    try:
        held.acquire()
    except OSError as exc:  # a full disk, a folder that went read-only: still one line
        full = disk.is_full(exc, folder)
        why = "no space left on device" if full else (exc.strerror or type(exc).__name__)
        raise LockHeld(f"{held.path} cannot be written ({why}); {fix}", full) from exc
    try:
        yield held
    finally:
        held.release()
