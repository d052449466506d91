"""The clusters a job can be submitted to (`cluster=<name>`, `python -m launcher.submit
<name>`), and everything the rest of the launcher may know about one: each backend declares
it as a `Backend`, and nothing outside its own modules compares a backend's name.

The built-in backends are `slurm` and `k8s` (their sections are always in the schema, under
`cluster.<name>`); another package adds one through the `launcher.backends` entry-point group
(the entry point names a module whose `BACKEND` is a `Backend`; its section exists when it
is chosen), with no edit to the launcher: docs/architecture.md, "Adding a cluster backend".
A backend's renderer is named by module, not imported here, so that this module stays in
the config layer that the schema, the runtime and submit all read.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, make_dataclass
from importlib.metadata import entry_points

BUILTIN = ("launcher.config.backends.slurm", "launcher.config.backends.k8s")
ENTRY_POINTS = "launcher.backends"


def _no_key(_environ: Mapping[str, str]) -> str | None:
    return None


@dataclass(frozen=True)
class Backend:
    """One cluster backend: its config section, its renderer, how it gets a secret to the
    job, which of its keys become shell text, and how a running job finds its id."""

    name: str
    # A module with `render(job) -> {file name: text}` (checked; raises ConfigError) and
    # `submit(job, paths) -> str` (hands the files to the cluster's tool, returns what
    # identifies the job there); it may have `notes(job) -> [line]` (what must exist first,
    # how to remove the job) and `rehearse(seen, group, key, write)` (launcher.rehearse's
    # cluster case: what a stop's checkpoint and the restarts need of the section).
    renderer: str
    summary: str  # what it renders, for --help: "an sbatch script"
    tool: str  # what submit hands the files to, for --help: "sbatch"
    docs: str  # the page that explains its keys
    secret_way: str  # how this cluster gets a secret to the job (a refusal's fix): cluster.secrets
    schema: type | None = None  # its section, cluster.<name>; None: none
    shell_text: tuple[str, ...] = ()  # the section's keys whose values become shell text
    # the section's keys every user of the cluster can read (the job list, `kubectl get`):
    # a long run of hex digits there is refused, not only warned about
    public_text: tuple[str, ...] = ()
    # A running rank's environment -> the id its scheduler gave the job (every rank of the
    # job shares it, a requeue keeps it): the key a run directory is found again by; None:
    # not a job of this backend
    job_key: Callable[[Mapping[str, str]], str | None] = _no_key
    # The section's key holding the seconds a stop has from the scheduler's signal to its
    # kill (a step, the stop checkpoint and stop_margin_s must fit: launcher.plan.stop)
    stop_window: str | None = None
    stop_margin_s: int = 0  # of that window, what the scheduler's launcher needs to end

    def module(self):
        return importlib.import_module(self.renderer)


def _declared(modules) -> dict[str, Backend]:
    """The BACKEND of each module, by name; a name declared twice is refused."""
    declared = [importlib.import_module(module).BACKEND for module in modules]
    names = [b.name for b in declared]
    twice = [name for name in names if names.count(name) > 1]
    if twice:
        raise RuntimeError(f"backend {twice[0]} is declared twice (by {', '.join(modules)})")
    return {b.name: b for b in declared}


def builtin() -> dict[str, Backend]:
    """The launcher's own backends, by name."""
    return _declared(BUILTIN)


@functools.cache
def backends() -> dict[str, Backend]:
    """Every backend this installation has, by name: the built-in ones, then the entry
    points'. A name declared twice is an error of the installation, said at once."""
    return _declared([*BUILTIN, *(ep.value for ep in entry_points(group=ENTRY_POINTS))])


def added() -> list[Backend]:
    """The backends other packages added (entry points)."""
    own = builtin()
    return [b for name, b in backends().items() if name not in own]


def backend(name: str) -> Backend:
    """The backend `name`; a KeyError names the ones there are."""
    try:
        return backends()[name]
    except KeyError:
        raise KeyError(f"cluster={name}: not one of {', '.join(backends())}") from None


def shell_text_keys() -> tuple[str, ...]:
    """Every backend's keys whose values become shell text, as cluster.<name>.<key>."""
    return tuple(f"cluster.{b.name}.{key}" for b in backends().values() for key in b.shell_text)


def public_text_keys() -> tuple[str, ...]:
    """Every backend's keys that every user of its cluster reads, as cluster.<name>.<key>."""
    return tuple(f"cluster.{b.name}.{key}" for b in backends().values() for key in b.public_text)


def job_key(environ: Mapping[str, str]) -> str | None:
    """The scheduler's id of the job this process runs in, if a backend's scheduler
    started it."""
    return next((k for b in backends().values() if (k := b.job_key(environ))), None)


def with_sections(base: type, found: list[Backend], **defaults) -> type:
    """A cluster schema: `base` with a section `<name>` for each backend in `found` that has
    one, and other defaults for its keys (`name=...`), named and documented as `base`."""
    fields = [(key, type(value), field(default=value)) for key, value in defaults.items()]
    fields += [(b.name, b.schema, field(default_factory=b.schema)) for b in found if b.schema]
    schema = make_dataclass("ClusterConfig", fields, bases=(base,))
    schema.__module__, schema.__doc__ = base.__module__, base.__doc__
    return schema
