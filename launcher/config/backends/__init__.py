"""The clusters a job can be submitted to (`cluster=<name>`, `python -m launcher.submit
<name>`), and everything the rest of the launcher may know about one: each backend declares
it as a `Backend`, and nothing outside its own modules compares a backend's name.

Every backend, the built-in `slurm` and `k8s` too, is two entry points of the same name: in
the `launcher.backends` group a module whose `BACKEND` is a `Backend` (what the schema, each
rank and the plan read), in the `launcher.renderers` group its renderer module (what only
`python -m launcher.submit` and launcher.rehearse load). The built-in ones are declared in
the launcher's pyproject.toml and their sections are always in the schema, under
`cluster.<name>`; another package adds one in its own, with no edit to the launcher (its
section exists when it is chosen): docs/architecture.md, "Adding a cluster backend". This
module reads the groups and names no module, so that it stays in the config layer that the
schema, the runtime and submit all read.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, make_dataclass

from launcher.config import plugins

ENTRY_POINTS = "launcher.backends"
RENDERERS = "launcher.renderers"


def _no_key(_environ: Mapping[str, str]) -> str | None:
    return None


@dataclass(frozen=True)
class Backend:
    """One cluster backend: its config section, how it gets a secret to the job, which of
    its keys become shell text, and how a running job finds its id. Its renderer is the
    `launcher.renderers` entry point of its name (`renderer()`)."""

    name: str
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

    def renderer(self):
        """The module with `render(job) -> {file name: text}` (checked; raises ConfigError)
        and `submit(job, paths) -> str` (hands the files to the cluster's tool, returns what
        identifies the job there); it may have `notes(job) -> [line]` (what must exist
        first, how to remove the job) and `rehearse(seen, group, key, write)`
        (launcher.rehearse's cluster case: what a stop's checkpoint and the restarts need
        of the section)."""
        found = [ep for ep in plugins.declared(RENDERERS) if ep.name == self.name]
        if not found:
            raise RuntimeError(
                f"backend {self.name} has no renderer: declare a {RENDERERS} entry point "
                f"named {self.name}"
            )
        return found[0].load()


@functools.cache
def builtin() -> dict[str, Backend]:
    """The launcher's own backends, by name (the schema's sections: loaded while it is built,
    before another package's module could import the launcher's config)."""
    own = [ep for ep in plugins.declared(ENTRY_POINTS) if plugins.is_own(ep)]
    return plugins.by_name([(ep, ep.load().BACKEND) for ep in own], "backend")


@functools.cache
def backends() -> dict[str, Backend]:
    """Every backend this installation has, by name: the built-in ones, then other
    packages'. A name declared twice is an error of the installation, said at once."""
    return plugins.by_name(plugins.loaded(ENTRY_POINTS, "BACKEND"), "backend")


def added() -> list[Backend]:
    """The backends other packages added."""
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
