"""JobSpec -> sbatch script (pure). The script embeds the shared per-node entry unchanged."""
from __future__ import annotations

from ...errors import SpecError
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


# srun passes the entry script as one argument; Linux caps one argument at 128 KiB (MAX_ARG_STRLEN).
MAX_ENTRY_BYTES = 128 * 1024 - 1


def render_sbatch(spec: JobSpec, output: str = DEFAULT_OUTPUT) -> str:
    entry = entry_script(spec).rstrip("\n")
    size = len(entry.encode())
    if size > MAX_ENTRY_BYTES:
        raise SpecError([("env", f"the node entry script is {size} bytes, over the {MAX_ENTRY_BYTES} that one "
                                 "argument to srun can carry; move large values (env, setup, args) into files")])
    return render_template(
        "slurm/sbatch.sh.j2",
        spec=spec,
        sbatch_options=sbatch_options(spec),
        srun_options=srun_options(spec),
        output=output,
        entry=entry,
        tag=heredoc_tag(entry, "HALO_ENTRY_EOF"),
    )
