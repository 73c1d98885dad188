"""The typed sbatch request: what one submission asks of SLURM, built once from the launch plan
(render.py ``batch_request``), as TorchX's ``SlurmBatchRequest`` is the value its script is
materialized from.

Every transport builds what it sends from it, and nothing else: the script's ``#SBATCH`` header
(:meth:`SbatchRequest.directives`), sbatch's command line (:meth:`SbatchRequest.arguments`,
transport/cli.py), slurmrestd's job description for each API version (transport/rest.py) and
pyslurm's ``JobSubmitDescription`` attributes (transport/pyslurm.py). The script's text is sent
as the program to run; no transport reads an option back out of it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable

from ...sbatch_options import Setting, parse_setting


@dataclass(frozen=True)
class SbatchRequest:
    """One submission: its sbatch options (each once, typed: :mod:`halo_sched.sbatch_options`),
    in the order the script's header shows them, and the batch script."""

    options: tuple[Setting, ...] = ()
    #: The rendered batch script, its header the :meth:`directives` of ``options``.
    script: str = ""
    #: secret_env names: they go into the job's environment whatever --export says
    #: (transport/base.py ``job_environment``).
    secret_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        names = [s.option for s in self.options]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"sbatch request: {', '.join('--' + n for n in twice)} given twice")

    def __repr__(self) -> str:  # the script is long: its size only
        return f"SbatchRequest({' '.join(self.arguments())}, script={len(self.script)} chars)"

    def get(self, option: str, default: Any = None) -> Any:
        """The typed value of ``option`` (None for a flag that is set), else ``default``."""
        for s in self.options:
            if s.option == option:
                return s.value
        return default

    def has(self, option: str) -> bool:
        return any(s.option == option for s in self.options)

    def directives(self) -> list[Setting]:
        """The settings the script's ``#SBATCH`` lines show (not those for the command line only)."""
        return [s for s in self.options if not s.command_line_only]

    def arguments(self) -> list[str]:
        """Every option as sbatch's arguments, ``--name[=value]``."""
        return [s.text() for s in self.options]

    def with_options(self, *settings: Setting | str) -> "SbatchRequest":
        """This request with ``settings`` (Settings, or ``--name[=value]`` parsed as
        ``slurm.extra_args`` are) added, each replacing the option's earlier value."""
        new = [s if isinstance(s, Setting) else parse_setting(s) for s in settings]
        names = {s.option for s in new}
        return replace(self, options=tuple(s for s in self.options if s.option not in names) + tuple(new))

    def with_script(self, script: str) -> "SbatchRequest":
        return replace(self, script=script)
