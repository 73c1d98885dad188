"""JobSpec -> sbatch script (pure). The script embeds the shared per-node entry unchanged."""
from __future__ import annotations

from ...errors import SpecError
from ...launch import entry_script
from ...servers import addrs_var, server_script
from ...spec import JobSpec
from ...templating import heredoc_tag, render_template, sh_quote

DEFAULT_OUTPUT = "halo-%x-%j.out"


def sbatch_options(spec: JobSpec) -> list[str]:
    s = spec.slurm
    opts = []
    for flag, value in (("partition", s.partition), ("account", s.account), ("qos", s.qos), ("time", s.time),
                        ("constraint", s.constraint), ("cpus-per-task", s.cpus_per_task), ("mem", s.mem)):
        if value is not None:
            opts.append(f"--{flag}={value}")
    if s.signal is not None:
        # B: the batch shell alone gets the warning and forwards it to the steps itself (it must
        # know it was warned to requeue the job; see the template).
        flags, name, secs = s.warning
        flags = "".join(sorted(set(flags) | {"B"}))
        opts.append(f"--signal={flags}:{name}" + (f"@{secs}" if secs is not None else ""))
    if s.exclusive:
        opts.append("--exclusive")
    if s.requeue is not None:
        opts.append("--requeue" if s.requeue else "--no-requeue")
    opts.extend(s.extra_args)
    return opts


def container(spec: JobSpec, image: str | None = None) -> dict | None:
    """pyxis settings the template needs, or None when the job runs on the host."""
    if not ((image or spec.image) and spec.slurm.container_runtime == "pyxis"):
        return None
    mounts = spec.slurm.container_mounts
    return {
        "workdir": spec.slurm.container_workdir,
        "mounts": ",".join(mounts),
        # Where each mount lands in the image (SRC:DST[:FLAGS]); "/" covers everything.
        "mount_dsts": [m.split(":")[1].rstrip("/") for m in mounts],
    }


def srun_options(spec: JobSpec, gpus: int | None = None, image: str | None = None) -> list[str]:
    """srun options beyond the one-task-per-node shape (shell text; the template sets the
    $halo_* variables they name). ``gpus``/``image``: a server role's, instead of the trainer's."""
    opts = []
    gpus = spec.gpus_per_node if gpus is None else gpus
    image = image or spec.image
    if gpus:
        opts.append(f"--gpus-per-node={gpus}")
    c = container(spec, image)
    if c:
        # pyxis/enroot: every node's task runs inside the image, in the submit directory (or
        # slurm.container_workdir), so a relative trainer.script resolves as it did on submit.
        opts.append(f"--container-image={sh_quote(image)}")
        if c["mounts"] or not c["workdir"]:
            opts.append('--container-mounts="$halo_container_mounts"')
        opts.append('--container-workdir="$halo_container_workdir"')
    return opts


# srun passes the entry script as one argument; Linux caps one argument at 128 KiB (MAX_ARG_STRLEN).
MAX_ENTRY_BYTES = 128 * 1024 - 1


def render_sbatch(spec: JobSpec, output: str = DEFAULT_OUTPUT) -> str:
    entry = entry_script(spec).rstrip("\n")
    size = len(entry.encode())
    if size > MAX_ENTRY_BYTES:
        raise SpecError([("env", f"the node entry script is {size} bytes, over the {MAX_ENTRY_BYTES} that one "
                                 "argument to srun can carry; move large values (env, setup, args) into files")])
    servers = []
    offset = spec.nodes
    for r in spec.servers:
        text = server_script(spec, r).rstrip("\n")
        servers.append({"name": r.name, "nodes": r.nodes, "offset": offset, "addrs_var": addrs_var(r.name),
                        "srun_options": srun_options(spec, gpus=r.gpus_per_node, image=r.image),
                        "entry": text, "tag": heredoc_tag(text, "HALO_SERVER_EOF")})
        offset += r.nodes
    return render_template(
        "slurm/sbatch.sh.j2",
        servers=servers,
        all_nodes=spec.all_nodes,
        max_gpus=max([spec.gpus_per_node] + [r.gpus_per_node for r in spec.servers]),
        spec=spec,
        sbatch_options=sbatch_options(spec),
        srun_options=srun_options(spec),
        # The mounts and working directory are shared by every role that runs in an image.
        container=container(spec) or next((container(spec, r.image) for r in spec.servers if r.image), None),
        warning=spec.slurm.warning[1],
        output=output,
        entry=entry,
        tag=heredoc_tag(entry, "HALO_ENTRY_EOF"),
    )
