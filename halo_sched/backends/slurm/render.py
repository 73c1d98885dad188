"""JobSpec -> sbatch script (pure). The script embeds the shared per-node entry unchanged."""
from __future__ import annotations

from ...launch import entry_script
from ...spec import JobSpec
from ...templating import heredoc_tag, render_template, sh_quote

DEFAULT_OUTPUT = "halo-%x-%j.out"


def sbatch_options(spec: JobSpec) -> list[str]:
    s = spec.slurm
    opts = []
    for flag, value in (("partition", s.partition), ("account", s.account), ("qos", s.qos), ("time", s.time),
                        ("constraint", s.constraint), ("cpus-per-task", s.cpus_per_task), ("mem", s.mem),
                        ("signal", s.signal)):
        if value is not None:
            opts.append(f"--{flag}={value}")
    if s.exclusive:
        opts.append("--exclusive")
    if s.requeue is not None:
        opts.append("--requeue" if s.requeue else "--no-requeue")
    opts.extend(s.extra_args)
    return opts


def srun_options(spec: JobSpec) -> list[str]:
    opts = []
    if spec.image and spec.slurm.container_runtime == "pyxis":
        # pyxis/enroot: every node's task runs inside the image.
        opts.append(f"--container-image={sh_quote(spec.image)}")
        if spec.slurm.container_mounts:
            opts.append(f"--container-mounts={sh_quote(','.join(spec.slurm.container_mounts))}")
    return opts


def render_sbatch(spec: JobSpec, output: str = DEFAULT_OUTPUT) -> str:
    entry = entry_script(spec).rstrip("\n")
    return render_template(
        "slurm/sbatch.sh.j2",
        spec=spec,
        sbatch_options=sbatch_options(spec),
        srun_options=srun_options(spec),
        output=output,
        entry=entry,
        tag=heredoc_tag(entry, "HALO_ENTRY_EOF"),
    )
