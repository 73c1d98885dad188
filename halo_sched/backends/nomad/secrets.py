"""The job's secrets (``secret_env``) in the Nomad job: the templates that read them from the
job's Nomad Variable (``variable_path``) into files of the task's secrets directory, and who may
read those files."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ...node.contract import NAMES
from ...templating import check, checked_int
from ...node_runtime import ITEM
from .names import carries_runtime, variable_path

if TYPE_CHECKING:  # pragma: no cover
    from ...models import JobSpec

#: The secret files' mode: their owner reads them (secret_owner says who that is).
SECRET_PERMS = "0400"


def secret_template(job_id: str, name: str) -> str:
    """``+VALUE`` when the job's Variable has the item ``name``, else empty: guarded per path
    (``nomadVarExists`` never blocks) and per key (a range over the items: ``.NAME`` on a missing
    key renders empty, as does an item whose value is empty; the ``+`` tells the two apart),
    consul-template ``template/nomad_funcs.go``. Empty, not "<no value>": Nomad renders with
    ``missingkey=zero`` (consul-template v0.42.1 ``template/template.go:275-279``, unless the
    template sets ``error_on_missing_key``), and the zero of a ``NomadVarItems`` entry is a
    ``NomadVarItem`` that prints as its empty Value (``dependency/nomad_var_structs.go:67, 135``)."""
    path = variable_path(check(job_id, "job id", "name"))
    return item_template(path, check(name, "variable name", "secret_env"), mark="+")


def item_template(path: str, item: str, mark: str = "") -> str:
    """The Variable's item ``item`` at ``path`` after ``mark``, or empty (guarded as
    :func:`secret_template` says)."""
    return (f'{{{{ if nomadVarExists "{path}" }}}}{{{{ with nomadVar "{path}" }}}}'
            f'{{{{ range $k, $v := . }}}}{{{{ if eq $k "{item}" }}}}{mark}{{{{ $v.Value }}}}{{{{ end }}}}{{{{ end }}}}'
            "{{ end }}{{ end }}")


def runtime_wiring(job_id: str) -> tuple[dict, list[dict]]:
    """(env, templates) of a task that reads the node runtime (halo_sched/node_runtime.py) from the
    job's Variable: one item for the whole job, however many groups read it; the file is empty
    when the Variable or the item is missing (guarded as :func:`secret_template`), and the entry
    script then fails unless the node has halo-sched at the job's version."""
    if not carries_runtime(job_id):
        return {}, []
    path = variable_path(check(job_id, "job id", "name"))
    return {NAMES.node_runtime_file: "${NOMAD_TASK_DIR}/halo-node.b64"}, [{
        "EmbeddedTmpl": item_template(path, ITEM), "DestPath": "local/halo-node.b64", "ChangeMode": "noop"}]


def secret_wiring(job_id: str, names: list[str]) -> tuple[dict, list[dict]]:
    """(env, templates) of a task that gets the secrets ``names`` (secret_env of the job or of a
    server role): they come from the Nomad Variable submit writes; the entry script reads one
    file per name and fails naming a missing one. Never a bare nomadVar: on a missing path it
    blocks the allocation forever; a missing item renders empty, like an empty value."""
    if not names:
        return {}, []
    names = [check(name, "variable name", "secret_env") for name in names]
    return {NAMES.secrets_dir: "${NOMAD_SECRETS_DIR}"}, [
        {"EmbeddedTmpl": secret_template(job_id, name), "DestPath": f"secrets/halo-secret-{name}", "Perms": SECRET_PERMS,
         "ChangeMode": "noop"} for name in names]


def secret_owner(spec: JobSpec, job: dict) -> None:
    """Who can read the secret files, set on ``job``'s tasks in place.

    The choice: ``uid``/``gid`` on the secret templates, from ``nomad.user``, and never a wider
    mode. Nomad renders a template as the client agent's user and changes its owner only when the
    template sets ``uid``/``gid`` (client/allocrunner/taskrunner/template/template.go:821-826@v2.0.5),
    so ``perms = "0400"`` alone leaves the file readable by root only. A mode open to others is
    not made safe by the task directory: the client's alloc dir is 0711
    (client/client.go:742@v2.0.5), each allocation's dir 0755 (client/allocdir/alloc_dir.go:357),
    the task dir and its secrets/ tmpfs 0777 (client/allocdir/task_dir.go:131, 326@v2.0.5, with
    fs_unix.go:36-37 forcing the 0777 bits), so any user of the client host who learns the
    allocation id (from the API, or ``ps``) could read a 0444 file. So the file stays 0400 and
    goes to the task's own user:

    - docker: the task runs as ``nomad.user`` too (the task's ``user``, which the docker driver
      makes the container's user, drivers/docker/driver.go:1055@v2.0.5), whatever the image's
      USER; without it the image's USER runs and must be root to read a file owned by root.
    - exec: the driver runs the task as ``nobody`` unless the task names a host user
      (drivers/exec/driver.go:472-473@v2.0.5); a name, which halo-sched cannot know the ids of,
      so the job must say nobody's ids (``nomad.user``), and a job with secrets and no
      ``nomad.user`` is refused (its task could never read them).
    - raw_exec: the task runs as the agent's user (root), which reads the file either way;
      ``nomad.user`` still gives it that owner.
    """
    owner = spec.nomad.owner
    if owner is None:
        return
    uid, gid = checked_int(owner[0], "nomad.user"), checked_int(owner[1], "nomad.user")
    for group in job["TaskGroups"]:
        for task in group["Tasks"]:
            if spec.nomad.driver == "docker":
                task["User"] = f"{uid}:{gid}"
            for tpl in task.get("Templates") or []:
                if tpl["DestPath"].startswith("secrets/halo-secret-"):
                    tpl["Uid"], tpl["Gid"] = uid, gid

