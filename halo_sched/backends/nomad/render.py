"""JobSpec -> Nomad job (pure): the API payload ``{"Job": {...}}`` is the one model; the HCL
(``halo_sched/templates/nomad/job.nomad.hcl.j2``) is rendered from that same dict.

Shape, for N nodes: group ``node-0`` (count 1: node rank 0; it asks for the rendezvous port and
registers a Nomad-native service) and, when N > 1, ONE group ``workers`` with count N-1, whose
allocation ``JOBID.workers[K]`` is node rank K+1. The env says ``HALO_NODE_RANK =
${NOMAD_ALLOC_INDEX}`` and ``HALO_NODE_RANK_OFFSET = 1``; the shared entry script adds them (HCL
and Nomad's ``${}`` cannot add) and checks the range. So the job is the same size for 2 nodes or
1,024: the entry script is embedded twice (once per group), never once per node. One group per
node made the job O(N) and the server state O(N^2), since every allocation carries the whole job
(hashicorp/nomad#27442, #6306).

Why the allocation index is a sound node rank here (hashicorp/nomad, ``scheduler/reconciler``):
each submission is a fresh job ID (:func:`submission_id`) registered once and never updated, so
there is one job version. Names come from ``AllocNameIndex`` (``allocs.go``): a bitmap of the
indexes the group's existing allocations hold; ``Next(n)`` hands out the free indexes in
0..count-1 first, so the first placement takes 0..count-1 and a later evaluation (a blocked one
unblocking) fills exactly the missing ones. A batch allocation that finished or failed still
counts as existing (``filters.go``: terminal allocations are "untainted"), so its index is never
reused for a new allocation. A lost-node replacement keeps the lost allocation's Name
(``reconcile_cluster.go``: "Add replacements for lost allocs", ``name: alloc.Name``), and with
``disconnect { lost_after = <the job's bound>, replace = false }`` (below, :func:`lost_after_ns`)
a running allocation on a node that went down is marked ``unknown`` and not replaced while the
job can run. Two live allocations of one version never share an index.
(``NOMAD_ALLOC_INDEX`` would be ambiguous across versions of an updated job: we never update.)

Every group: no restarts, no reschedules, and ``disconnect { lost_after, replace = false }``
(Nomad 1.8+; ``TaskGroup.Replace()`` in ``nomad/structs/structs.go`` defaults to true, and the
reconciler replaces lost allocations up to the count whatever the reschedule policy says;
``replace = false`` alone no longer stops it since Nomad 1.11.2: :func:`lost_after_ns` says why).
Docker tasks run ``entrypoint = ["/bin/bash"]`` with the script as ``args`` and no ``command``,
so an image's own ENTRYPOINT never runs (``_config_and_resources``). Nothing uses a
host namespace mode: since Nomad 2.0.4 the docker driver refuses them unless the client allows
them (``drivers/docker/driver.go`` ``validateNamespace``); shared memory comes from ``shm_size``.
Options that need client settings are listed by :func:`client_requirements`.

User text reaches the task only inside the entry-script template, whose Go-template delimiters
are chosen absent from it, and which Nomad does not ``${}``-interpolate; and in docker
``volumes``, escaped (``$${``, ``%%{``) because the client evaluates driver config as HCL
templates. Env and args carry only names Nomad itself defines.

Every value of the spec that reaches the job other than as quoted text (names in ids, paths,
labels and Go templates; numbers) is checked against a full-match pattern or as a number as the
payload is built, whatever the model holds (``model_copy`` does not validate); the HCL template's
filters check again.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Callable

from ...errors import SpecError
from ...launch import Launch, ServerRole, compile_launch, render_entry
from ...node.contract import NAMES
from ...servers import render_server
from ...models import JobSpec
from ...values import MAX_TIMEOUT_HOURS
from ...templating import check, checked_text, checked_int, render_template
from . import servers as nomad_servers

TASK = "torchrun"
PORT_LABEL = "rdzv"
ENTRY_PATH = "local/halo-entry.sh"
MASTER_FILE = nomad_servers.MASTER_FILE
NODES_META = "halo_sched_nodes"
#: Job meta naming the job's secrets Variable (its path; never a value): whoever sees the job
#: ended deletes that Variable (``NomadScheduler``), and only for jobs that carry this key.
SECRETS_META = "halo_sched_secrets"
#: Node rank 0: count 1, the rendezvous port and service.
LEADER_GROUP = "node-0"
#: Node ranks 1..N-1: count N-1, node rank = 1 + the allocation's name index.
WORKER_GROUP = "workers"
WORKER_RANK_OFFSET = 1

_ALLOC_INDEX_RE = re.compile(r"\[(\d+)\]$")


def alloc_index(alloc_name: str) -> int | None:
    """The name index of an allocation (``JOBID.GROUP[K]`` -> K), None for another name."""
    m = _ALLOC_INDEX_RE.search(alloc_name)
    return None if m is None else int(m.group(1))


def group_counts(nodes: int) -> dict[str, int]:
    """The task groups of an N-node job and their counts."""
    return {LEADER_GROUP: 1, **({WORKER_GROUP: nodes - 1} if nodes > 1 else {})}


def node_rank_of(task_group: str, alloc_name: str) -> int | None:
    """The node rank an allocation runs, from its TaskGroup and Name (``JOBID.workers[K]`` -> K+1);
    None for a group this module does not render."""
    index = alloc_index(alloc_name)
    if index is None:
        return None
    if task_group == LEADER_GROUP:
        return 0
    if task_group == WORKER_GROUP:
        return WORKER_RANK_OFFSET + index
    return None


def service_name(job_id: str) -> str:
    """The rendezvous service of one job: DNS-like (lower case, digits, '-'), at most 63
    characters, and distinct for distinct job ids (a hash keeps it so when the id is folded)."""
    base = "".join(c if c.isalnum() else "-" for c in job_id.lower()).strip("-") or "job"
    if base != job_id or len(base) > 58:
        digest = hashlib.sha256(job_id.encode()).hexdigest()[:8]
        base = f"{base[:49].rstrip('-')}-{digest}"
    return f"{base}-rdzv"


def delimiters(text: str) -> tuple[str, str]:
    """Go-template delimiters that never occur in ``text``, so the entry renders byte-exact."""
    salt = 0
    while True:
        h = hashlib.sha256(f"{salt}:{text}".encode()).hexdigest()[:8]
        left, right = f"[[halo-{h}", f"halo-{h}]]"
        if left not in text and right not in text:
            return left, right
        salt += 1


def variable_path(job_id: str) -> str:
    """The Nomad Variable holding a job's secrets. A task's workload identity may read
    ``nomad/jobs/<job>`` (and below) of its own namespace without any policy (acl/acl.go
    ``matchingVariablesCapabilitySet``: the implicit read/list for the claim's job)."""
    return f"nomad/jobs/{job_id}"


def secret_template(job_id: str, name: str) -> str:
    """``+VALUE`` when the job's Variable has the item ``name``, else empty: guarded per path
    (``nomadVarExists`` never blocks) and per key (a range over the items: ``.NAME`` on a missing
    key would render "<no value>"), consul-template ``template/nomad_funcs.go``."""
    path = variable_path(check(job_id, "job id", "name"))
    name = check(name, "variable name", "secret_env")
    return (f'{{{{ if nomadVarExists "{path}" }}}}{{{{ with nomadVar "{path}" }}}}'
            f'{{{{ range $k, $v := . }}}}{{{{ if eq $k "{name}" }}}}+{{{{ $v.Value }}}}{{{{ end }}}}{{{{ end }}}}'
            "{{ end }}{{ end }}")


def secret_wiring(job_id: str, names: list[str]) -> tuple[dict, list[dict]]:
    """(env, templates) of a task that gets the secrets ``names`` (secret_env of the job or of a
    server role): they come from the Nomad Variable submit writes; the entry script reads one
    file per name and fails naming a missing one. Never a bare nomadVar: on a missing path it
    blocks the allocation forever; a missing item renders "<no value>"."""
    if not names:
        return {}, []
    names = [check(name, "variable name", "secret_env") for name in names]
    return {NAMES.secrets_dir: "${NOMAD_SECRETS_DIR}"}, [
        {"EmbeddedTmpl": secret_template(job_id, name), "DestPath": f"secrets/halo-secret-{name}", "Perms": SECRET_PERMS,
         "ChangeMode": "noop"} for name in names]


SECRET_PERMS = "0400"


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


def master_template(job_id: str) -> str:
    """Rank 0's address on the first line and its port on the second, from node-0's service
    registration; blank until it registers. The registration carries the port the rendezvous
    label was given, static or dynamic (nomad v2.0.5 ``client/serviceregistration/address.go``
    GetAddress, host mode: the label's AllocatedPortMapping, HostIP and Value), and the template
    gives it as ``.Port`` (consul-template v0.42.1, Nomad 2.0.5's, ``dependency/nomad_service.go``).
    The file is written whole (``renderer/renderer.go`` AtomicWrite: a temporary file renamed into
    place), so a reader never sees the address without the port. Server tasks read the first line."""
    # Instance 0 explicitly: during a redeploy two registrations of the service can overlap.
    return (
        f'{{{{ with nomadService "{service_name(job_id)}" }}}}'
        # The final newline: a heredoc in the HCL would add one (the two forms stay one job).
        "{{ with index . 0 }}{{ .Address }}\n{{ .Port }}{{ end }}{{ end }}\n"
    )


def driver_config_literal(value: str) -> str:
    """``value`` as a docker driver config string the client leaves literal: the client decodes
    the whole config as HCL2 JSON (``hclutils.ParseHclInterface`` in the task runner), so
    ``${`` would interpolate and ``%{`` run a directive; ``$${`` and ``%%{`` are HCL's escapes."""
    return value.replace("${", "$${").replace("%{", "%%{")


@dataclass(frozen=True)
class ClientNeed:
    """One client setting a job needs, and how a node shows it (``GET /v1/nodes?resources=true``:
    each NodeListStub carries ``Drivers`` — per driver Detected, Healthy and the attributes its
    fingerprint set (structs.DriverInfo, nomad/structs/node.go:355; client/node_updater.go:248@v2.0.5)
    — and ``NodeResources.Devices``).

    ``check(node)`` is True/False for a node, or None where the API shows nothing about it
    ("unverifiable"); ``applies(node)`` picks the nodes that must have it (those that could run the
    task otherwise). ``default`` is True for what a default 2.0.x client already has."""

    option: str  # the job option that needs it
    setting: str  # the client's setting, as its configuration says it
    shown_by: str  # where a node shows it, or why nothing shows it
    check: Callable[[dict], bool] | None
    applies: Callable[[dict], bool]
    default: bool = False

    @property
    def line(self) -> str:
        return f"{self.option}: {self.setting}"


def _driver(node: dict, name: str) -> dict:
    return (node.get("Drivers") or {}).get(name) or {}


def _driver_ok(name: str) -> Callable[[dict], bool]:
    return lambda node: bool(_driver(node, name).get("Detected") and _driver(node, name).get("Healthy"))


def _docker_attr(name: str) -> Callable[[dict], str]:
    return lambda node: (_driver(node, "docker").get("Attributes") or {}).get(name, "")


def _has_nvidia_gpus(node: dict) -> bool:
    # The nvidia device plugin fingerprints each GPU model as a device group (Vendor "nvidia",
    # Type "gpu"); the job asks for "nvidia/gpu" (nomad/structs/devices.go, v2.0.5).
    devices = ((node.get("NodeResources") or {}).get("Devices")) or []
    return any(d.get("Vendor") == "nvidia" and d.get("Type") == "gpu" and d.get("Instances") for d in devices)


def _anywhere(node: dict) -> bool:
    return True


#: The namespace modes the docker driver refuses since 2.0.4 unless the client lists them in
#: ``allowed_modes`` (drivers/docker/driver.go:1365-1384 validateNamespace, config.go:325-326@v2.0.5).
_DOCKER_MODES = (("ipc_mode", "ipc"), ("pid_mode", "pid"), ("uts_mode", "uts"), ("userns_mode", "userns"))


def client_needs(job: dict) -> list[ClientNeed]:
    """Every client setting the job (the API payload's ``Job``) needs to start its tasks, read
    from what the job asks: drivers, docker host volumes, privileged mode and namespace modes,
    and for GPU docker tasks the nvidia device plugin and Docker's ``nvidia`` runtime. ``nomad job
    plan`` checks none of the docker plugin's settings; a task fails at start on a client without."""
    tasks = [t for g in job.get("TaskGroups") or [] for t in g.get("Tasks") or []]
    needs: list[ClientNeed] = []
    for driver in sorted({t.get("Driver") for t in tasks if t.get("Driver")}):
        if driver == "raw_exec":
            # raw_exec is off unless enabled (drivers/rawexec/driver.go:84-87@v2.0.5: enabled defaults to false).
            setting = 'plugin "raw_exec" { config { enabled = true } }'
        else:
            setting = f"the {driver} driver detected and healthy (on by default)"
        needs.append(ClientNeed(f"nomad.driver {driver}", setting, f"Drivers.{driver}.Detected/Healthy",
                                _driver_ok(driver), _anywhere, default=driver != "raw_exec"))
    docker = [t for t in tasks if t.get("Driver") == "docker"]
    on_docker = _driver_ok("docker")
    if any(any(str(v).split(":", 1)[0].startswith("/") for v in (t.get("Config") or {}).get("volumes") or [])
           for t in docker):
        # drivers/docker/driver.go: "volumes are not enabled; cannot mount host path" for any bind
        # source outside the allocation dir unless the plugin's volumes.enabled is true; the
        # fingerprint says so (drivers/docker/fingerprint.go:140-142@v2.0.5).
        needs.append(ClientNeed(
            "nomad.volumes", 'the docker plugin must allow host bind mounts: plugin "docker" { config { volumes { '
            'enabled = true } } }', "attribute driver.docker.volumes.enabled",
            lambda node: _docker_attr("driver.docker.volumes.enabled")(node) == "true", on_docker))
    if any((t.get("Config") or {}).get("privileged") for t in docker):
        needs.append(ClientNeed(
            "docker privileged", 'plugin "docker" { config { allow_privileged = true } }',
            "attribute driver.docker.privileged.enabled (fingerprint.go:132-134@v2.0.5)",
            lambda node: _docker_attr("driver.docker.privileged.enabled")(node) == "true", on_docker))
    for field, key in _DOCKER_MODES:
        modes = sorted({(t.get("Config") or {}).get(field) for t in docker} - {None, ""})
        if modes:
            needs.append(ClientNeed(
                f"docker {field}", f'plugin "docker" {{ config {{ allowed_modes {{ {key} = {json.dumps(modes)} }} }} }}',
                "no node attribute shows allowed_modes (drivers/docker/fingerprint.go@v2.0.5)",
                None, on_docker))
    if any(str(d.get("Name", "")).startswith("nvidia") for t in docker for d in (t.get("Resources") or {}).get("Devices") or []):
        # A GPU docker task: the device plugin sets NVIDIA_VISIBLE_DEVICES in the task's DeviceEnv,
        # and the driver then requires Docker's GPU runtime, named by the plugin's nvidia_runtime
        # ("nvidia" by default, drivers/docker/config.go:267-270), found in `docker info` at
        # fingerprint (fingerprint.go:172-183: d.gpuRuntime, attribute driver.docker.runtimes),
        # else the task fails at start: "requested docker runtime ... was not found"
        # (driver.go:1065-1068@v2.0.5); the runtime must also be in allow_runtimes (default
        # ["runc", "nvidia"], config.go:272-275; driver.go:1074-1076). The NVIDIA_VISIBLE_DEVICES
        # test: driver.go:80, 1065.
        needs.append(ClientNeed(
            "gpus_per_node (docker)", "the nvidia device plugin (nomad-device-nvidia) listing the GPUs",
            "NodeResources.Devices (Vendor nvidia, Type gpu)", _has_nvidia_gpus, on_docker))
        needs.append(ClientNeed(
            "gpus_per_node (docker)", "Docker's nvidia runtime (NVIDIA Container Toolkit), named as the plugin's "
            "nvidia_runtime (default nvidia)",
            "attribute driver.docker.runtimes",
            lambda node: "nvidia" in _docker_attr("driver.docker.runtimes")(node).split(","),
            lambda node: on_docker(node) and _has_nvidia_gpus(node)))
        needs.append(ClientNeed(
            "gpus_per_node (docker)", 'the runtime allowed: plugin "docker" { config { allow_runtimes } } '
            'includes "nvidia" (the default ["runc", "nvidia"] does)',
            "no node attribute shows allow_runtimes (drivers/docker/fingerprint.go@v2.0.5)",
            None, lambda node: on_docker(node) and _has_nvidia_gpus(node), default=True))
    return needs


def client_requirements(spec: JobSpec) -> list[str]:
    """Client settings this job needs beyond a default Nomad 2.0.x client, each a line naming the
    option that needs it and the setting (:func:`client_needs`); empty when a default client runs it."""
    return [n.line for n in client_needs(job_payload(spec)["Job"]) if not n.default]


def _task(launch: Launch, group: str, entry: str, delims: tuple[str, str]) -> dict:
    spec, job_id = launch.spec, launch.job_id
    nm = spec.nomad
    left, right = delims
    templates = [{
        "EmbeddedTmpl": entry,
        "DestPath": ENTRY_PATH,
        "Perms": "0755",
        "ChangeMode": "noop",
        "LeftDelim": left,
        "RightDelim": right,
    }]
    if group == LEADER_GROUP:
        # NOMAD_PORT_<label>: the port's To when set, else its Value, static or dynamic
        # (client/taskenv/env.go addGroupPort/addPorts, v2.0.5); host mode sets no To.
        env = {NAMES.node_rank: "0", NAMES.master_addr: "${NOMAD_IP_%s}" % PORT_LABEL,
               NAMES.master_port: "${NOMAD_PORT_%s}" % PORT_LABEL}
    else:
        env = {
            # The entry script adds the two: Nomad's ${} cannot.
            NAMES.node_rank: "${NOMAD_ALLOC_INDEX}",
            NAMES.node_rank_offset: str(WORKER_RANK_OFFSET),
            NAMES.master_addr_file: nomad_servers.MASTER_FILE_IN_TASK,
        }
        # noop: the file is rewritten when rank 0 registers; the entry script polls it.
        templates.append({"EmbeddedTmpl": master_template(job_id), "DestPath": MASTER_FILE, "ChangeMode": "noop"})

    if launch.restart_count:  # a retry of its run (halo_sched/runs.py): the ranks learn which attempt
        env[NAMES.restart_count] = str(launch.restart_count)
    secret_env, secret_templates = secret_wiring(job_id, list(launch.trainer.secret_names))
    env.update(secret_env)
    templates += secret_templates

    if launch.servers:
        # Each server role's addresses, read from its registrations (halo_sched/backends/nomad/servers.py).
        server_env, server_templates = nomad_servers.trainer_wiring(launch)
        env.update(server_env)
        templates += server_templates
    config, resources = _config_and_resources(spec, launch.trainer.image, launch.trainer.gpus, ["${NOMAD_TASK_DIR}/halo-entry.sh"])
    return {
        "Name": TASK,
        "Driver": nm.driver,
        "Config": config,
        "Env": env,
        "Templates": templates,
        "Resources": resources,
        "KillTimeout": 30_000_000_000,
    }


def _config_and_resources(spec: JobSpec, image: str | None, gpus: int, args: list[str]) -> tuple[dict, dict]:
    """The driver config and resources of a node-sized task (trainer node or server node)."""
    nm = spec.nomad
    if nm.driver == "docker":
        config: dict = {
            "image": image,
            # The shell as the container's entrypoint and the script as its command: the image's
            # own ENTRYPOINT never runs. The docker driver puts `command` and `args` into the
            # container's Cmd only (drivers/docker/driver.go:1477-1491, v2.0.5) and takes the
            # Entrypoint from the task config alone (:1053); Docker runs Entrypoint + Cmd, and an
            # image entrypoint that does not `exec "$@"` (vLLM's starts its server) would swallow
            # `command = "/bin/bash"`. No `command`: `args` alone become the Cmd (:1489-1491).
            "entrypoint": ["/bin/bash"],
            "args": args,
            # torchrun and NCCL need the host's interfaces; the rendezvous port is a host port.
            # (network_mode is not a namespace mode the driver restricts; ipc_mode = "host" is,
            # since 2.0.4: shared memory comes from shm_size instead.)
            "network_mode": "host",
            # The docker driver's ulimit is a list(map(string)); an HCL block is a list of one.
            "ulimit": [{"memlock": "-1", "stack": "67108864"}],
        }
        if nm.shm_bytes is not None:
            config["shm_size"] = checked_int(nm.shm_bytes, "nomad.shm_size")
        if nm.volumes:
            config["volumes"] = [driver_config_literal(checked_text(v, "nomad.volumes")) for v in nm.volumes]
        if spec.network.fabric == "efa":
            devices = ["/dev/infiniband"] + (["/dev/gdrdrv"] if spec.network.cross_node_expert_parallel else [])
            config["devices"] = [{"host_path": d, "container_path": d} for d in devices]
    else:
        config = {"command": "/bin/bash", "args": args}

    resources: dict = {"CPU": checked_int(nm.cpu, "nomad.cpu"), "MemoryMB": checked_int(nm.memory, "nomad.memory")}
    if checked_int(gpus, "gpus_per_node"):
        resources["Devices"] = [{"Name": "nvidia/gpu", "Count": gpus}]
    return config, resources


#: Added to the job's bound in :func:`lost_after_ns`: the allocation's max_run_duration timer
#: runs on the client from its CreateTime, the unknown allocation's expiry on the servers from
#: the time they marked it unknown (clocks of different machines), and the survivors' kill
#: takes up to kill_timeout (30 s). An hour covers skew and kill; it delays nothing a user waits
#: for (the survivors are gone by then; it only delays when an unwatched Nomad job turns dead).
LOST_AFTER_MARGIN_NS = 3600 * 10**9
#: The job's bound when it sets no max_run_duration: a week, the longest wait of any rank
#: (rendezvous.timeout_s, storage.store_timeout_hours and nccl_timeout_minutes are each at most
#: a week, spec.MAX_TIMEOUT_HOURS), so a survivor blocked on the lost rank has given up by then.
UNBOUNDED_JOB_LOST_AFTER_NS = MAX_TIMEOUT_HOURS * 3600 * 10**9


def lost_after_ns(spec: JobSpec) -> int:
    """``disconnect.lost_after`` of every group: the job's lifetime bound plus a margin.

    Why (hashicorp/nomad v2.0.5): ``replace = false`` alone no longer keeps a lost rank from
    being replaced. Since PR #27053 (v1.11.2, every 2.0.x) a node that misses its heartbeats is
    marked ``down`` unless one of its running allocations has a ``lost_after``
    (``nomad/heartbeat.go:158-173``, ``:208-221``: then ``disconnected``). On a down node the
    running allocation turns ``unknown`` with a follow-up evaluation at once; there, with
    ``lost_after`` 0, ``Expired()`` is already true (``nomad/structs/alloc.go:817-838``), which
    the reconciler checks before the replace=false rules (``scheduler/reconciler/filters.go:
    188-193``), so it counts as lost (``reconcile_cluster.go:439``) and is replaced under its
    name (``:868``). On a disconnected node it is "disconnecting" (``filters.go:232-237``): marked
    unknown, never rescheduled with replace = false (``filters.go:538-541``), and a follow-up
    evaluation waits until lost_after (``reconcile_cluster.go:1548-1580, 1639``); only then is
    it expired, lost and replaced. So lost_after at least the job's lifetime keeps the rank
    unreplaced while its world can still run; ``replace = false`` keeps older servers (before
    1.11.2, ``filters.go`` and ``reconcile_cluster.go:441-447`` at v1.11.1: expired or not, an
    unknown allocation with replace = false stays) from replacing it ever. Validate
    (``nomad/structs/group.go:66-98``) accepts it: lost_after >= 0 and no stop_on_client_after.

    The bound: ``nomad.max_run_duration`` when set (a rank lost after the world formed was
    created before it formed, and every member is stopped by its creation + max_run_duration);
    else :data:`UNBOUNDED_JOB_LOST_AFTER_NS`. Plus :data:`LOST_AFTER_MARGIN_NS`. A pending
    allocation on the node is still replaced at once (``filters.go:214-221``): it never joined
    a world."""
    bound = spec.nomad.max_run_duration_ns
    total = (UNBOUNDED_JOB_LOST_AFTER_NS if bound is None else checked_int(bound, "nomad.max_run_duration")) \
        + LOST_AFTER_MARGIN_NS
    # A Go time.Duration is an int64 of nanoseconds: the longest one stands for "never".
    return min(total, 2**63 - 1)


def _group(launch: Launch, name: str, count: int, entry: str, delims: tuple[str, str]) -> dict:
    spec, job_id = launch.spec, launch.job_id
    group: dict = {
        "Name": name,
        "Count": checked_int(count, "nodes"),
        # A fixed-size torchrun world never re-forms around a replaced rank: no restarts, no reschedules.
        "RestartPolicy": {"Attempts": 0, "Mode": "fail", "Interval": 86_400_000_000_000, "Delay": 15_000_000_000},
        "ReschedulePolicy": {"Attempts": 0, "Interval": 0, "Unlimited": False},
        # ... and no replacement of a rank whose node went down (the reschedule policy does not
        # cover lost allocations): its allocation turns "unknown" and the job's watcher ends it.
        # Both fields are needed: see lost_after_ns.
        "Disconnect": {"LostAfter": lost_after_ns(spec), "Replace": False},
        "Meta": ({"halo_node_rank": "0"} if name == LEADER_GROUP
                 else {"halo_node_rank_offset": str(WORKER_RANK_OFFSET)}),
        "Tasks": [_task(launch, name, entry, delims)],
    }
    if spec.nomad.max_run_duration_ns is not None:
        group["MaxRunDuration"] = checked_int(spec.nomad.max_run_duration_ns, "nomad.max_run_duration")
    if name == LEADER_GROUP:
        rdzv = launch.rendezvous.port
        # Rank 0 binds the weight-sync group ports too (servers[].group_port): reserved here.
        # Sorted by label: HCL keeps port blocks by label, so the two forms stay one job.
        reserved = sorted(
            ([{"Label": PORT_LABEL, "Value": rdzv}] if rdzv is not None else [])
            + [{"Label": f"group-{r.name}", "Value": r.group_port} for r in launch.servers if r.group_port is not None],
            key=lambda p: p["Label"])
        network: dict = {"Mode": "host"}
        if rdzv is None:
            # rendezvous.port unset: Nomad picks the port, one the node has free and none of this
            # group's reserved ports (nomad/structs/network.go AssignPorts: dynamic ports skip the
            # node's used ports, the ask's reserved ports and those already offered; v2.0.5),
            # from the client's dynamic range (20000-32000 by default). Two jobs' node-0 can then
            # share a client, which a static port forbids.
            network["DynamicPorts"] = [{"Label": PORT_LABEL}]
        if reserved:
            network["ReservedPorts"] = reserved
        group["Networks"] = [network]
        group["Services"] = [{"Name": service_name(job_id), "Provider": "nomad", "PortLabel": PORT_LABEL}]
    else:
        group["Networks"] = [{"Mode": "host"}]
    return group


def job_payload(spec: JobSpec, job_id: str | None = None) -> dict:
    """The API payload for ``PUT /v1/jobs`` (and ``/v1/job/<id>/plan``). ``job_id`` defaults to
    the job's name (what ``render`` shows); ``submit`` and ``plan`` pass a fresh :func:`submission_id`."""
    return payload(compile_launch(spec, job_id))


#: The node attribute a ledgered host is matched on: the client's name (``nomad node status``),
#: which is what failure reports and the ledger carry (an allocation's ``NodeName``).
NODE_NAME_TARGET = "${node.unique.name}"


def exclude_constraints(launch: Launch) -> list[dict]:
    """One ``${node.unique.name} != HOST`` constraint per host of the node ledger (the launch
    plan's ``exclude_hosts``). Nomad has no negated set operator (``nomad/structs/structs.go``
    v2.0.5: set_contains, set_contains_all, set_contains_any; ``scheduler/feasible/feasible.go``
    checks ``!=``/``not`` per value), hence one each."""
    return [{"LTarget": NODE_NAME_TARGET, "RTarget": check(h, "SLURM word", "exclude_hosts"), "Operand": "!="}
            for h in launch.exclude_hosts("nomad")]


def payload(launch: Launch) -> dict:
    """:func:`job_payload` of a launch plan."""
    spec, job_id = launch.spec, launch.job_id
    nm = spec.nomad
    if nm.driver == "docker" and not launch.trainer.image:
        raise SpecError([("image", "the Nomad docker driver needs an image; set image, or nomad.driver: exec or raw_exec")])
    if nm.driver != "docker" and launch.trainer.image:
        raise SpecError([("image", f"nomad.driver {nm.driver} runs on the host and would ignore the image; "
                                   "use nomad.driver: docker, or remove image")])
    if launch.secret_names and "." in launch.name:
        # The secrets' Variable path carries the job id, and Variable paths allow only
        # [a-zA-Z0-9-_~/] (nomad/structs/variables.go validVariablePath).
        raise SpecError([("name", "with secret_env on Nomad the name may not contain '.' (a Nomad Variable path "
                                  "carries the job id and allows only letters, digits, '-', '_' and '~')")])
    if spec.secret_names and nm.driver == "exec" and nm.user is None:
        raise SpecError([("nomad.user", "with secret_env and nomad.driver exec, give the uid:gid the task runs as: "
                                        "the exec driver runs it as nobody (Nomad drivers/exec/driver.go), and the "
                                        "secret files are readable by their owner only; nobody is usually 65534:65534")])
    entry = render_entry(launch)
    delims = delimiters(entry)
    # The name and the id end up in paths, service names and Go templates: the plan checked them.
    job: dict = {
        "ID": job_id,
        "Name": launch.name,
        "Type": "batch",
        "Datacenters": list(nm.datacenters),
        # One node per host: node-sized allocations must never share a client.
        "Constraints": [{"Operand": "distinct_hosts", "RTarget": "true"}] + exclude_constraints(launch),
        "Meta": {NODES_META: str(launch.trainer.nodes),
                 "halo_sched_world_size": str(launch.trainer.nodes * launch.trainer.nproc_per_node)},
        "TaskGroups": [_group(launch, name, count, entry, delims)
                       for name, count in group_counts(launch.trainer.nodes).items()],
    }
    if spec.secret_names:
        job["Meta"][SECRETS_META] = variable_path(job_id)
    if launch.servers:
        if nm.driver == "docker" and not all(r.image for r in launch.servers):
            raise SpecError([("servers", "the Nomad docker driver needs an image for every server role; set "
                                         "servers[].image or the job's image")])
        job["Meta"][nomad_servers.SERVERS_META] = nomad_servers.servers_meta(launch)
        policies = {k: v for k, v in job["TaskGroups"][0].items() if k in ("RestartPolicy", "ReschedulePolicy", "Disconnect")}
        job["TaskGroups"] += [_server_group(launch, r, policies) for r in launch.servers]
    secret_owner(spec, job)
    if nm.namespace:
        job["Namespace"] = nm.namespace
    if nm.region:
        job["Region"] = nm.region
    if nm.priority is not None:
        job["Priority"] = checked_int(nm.priority, "nomad.priority")
    return {"Job": job}


def _server_group(launch: Launch, role: ServerRole, policies: dict) -> dict:
    """The task group of one server role (halo_sched/backends/nomad/servers.py): the trainer's
    driver config and resources (same fabric devices, same host network), the trainer's
    ``policies`` (no restarts, reschedules or replacements)."""
    spec, job_id = launch.spec, launch.job_id
    entry = render_server(launch, role)
    left, right = delimiters(entry)
    config, resources = _config_and_resources(spec, role.image, role.gpus, ["${NOMAD_TASK_DIR}/halo-server.sh"])
    secret_env, secret_templates = secret_wiring(job_id, list(role.secret_names))
    task = {
        "Name": nomad_servers.TASK,
        "Driver": spec.nomad.driver,
        "Config": config,
        "Env": {
            NAMES.server_index: "${NOMAD_ALLOC_INDEX}",
            NAMES.server_addr: "${NOMAD_IP_%s}" % nomad_servers.PORT_LABEL,
            NAMES.trainer_master_file: nomad_servers.MASTER_FILE_IN_TASK,
            **secret_env,
        },
        "Templates": [
            {"EmbeddedTmpl": entry, "DestPath": nomad_servers.ENTRY_PATH, "Perms": "0755", "ChangeMode": "noop",
             "LeftDelim": left, "RightDelim": right},
            # noop: the server script polls it, and stops the server once it is blank again.
            {"EmbeddedTmpl": master_template(job_id), "DestPath": MASTER_FILE, "ChangeMode": "noop"},
            *secret_templates,
        ],
        "Resources": resources,
        "KillTimeout": 30_000_000_000,
    }
    group = {
        "Name": nomad_servers.group_name(role.name),
        "Count": role.nodes,
        **policies,
        "Meta": {"halo_server_role": role.name},
        "Networks": [{"Mode": "host", "ReservedPorts": [{"Label": nomad_servers.PORT_LABEL, "Value": role.port}]}],
        "Services": [{"Name": nomad_servers.service_name(job_id, role.name), "Provider": "nomad",
                      "PortLabel": nomad_servers.PORT_LABEL, "Tags": [launch.index_tag + "${NOMAD_ALLOC_INDEX}"]}],
        "Tasks": [task],
    }
    if spec.nomad.max_run_duration_ns is not None:
        group["MaxRunDuration"] = checked_int(spec.nomad.max_run_duration_ns, "nomad.max_run_duration")
    return group


def go_duration(ns: int) -> str:
    """Nanoseconds -> the shortest Go duration text ('2h', '1h30m', '45s')."""
    parts, rest = [], checked_int(ns, "a duration")
    for unit, size in (("h", 3600 * 10**9), ("m", 60 * 10**9), ("s", 10**9), ("ms", 10**6), ("us", 10**3), ("ns", 1)):
        if rest >= size:
            parts.append(f"{rest // size}{unit}")
            rest %= size
    return "".join(parts) or "0s"


def _not_nfc(spec: JobSpec) -> list[tuple[str, str]]:
    """User text the HCL cannot carry exactly: HCL normalizes every string to Unicode NFC."""
    import unicodedata

    def bad(text: str) -> bool:
        return not unicodedata.is_normalized("NFC", text)

    texts = [(f"env.{k}", v) for k, v in spec.env.items()] + [
        (f"trainer.args[{i}]", a) for i, a in enumerate(spec.trainer.args)] + [
        (f"setup[{i}]", line) for i, line in enumerate(spec.setup)] + [("trainer.script", spec.trainer.script or "")]
    for n, r in enumerate(spec.servers):  # a server's entry script rides in the HCL too
        texts += [(f"servers[{n}].command[{i}]", a) for i, a in enumerate(r.command)]
        texts += [(f"servers[{n}].env.{k}", v) for k, v in r.env.items()]
        texts += [(f"servers[{n}].setup[{i}]", line) for i, line in enumerate(r.setup)]
    return [(where, "not in Unicode NFC form, which HCL normalizes every string to, so the job file would "
                    "carry different text; submit sends it exactly (the API payload is not normalized), "
                    "or write it in NFC") for where, text in texts if bad(text)]


def render_hcl(spec: JobSpec, job_id: str | None = None) -> str:
    """The job as an HCL file, for reading or ``nomad job run``. Refuses text HCL would change."""
    problems = _not_nfc(spec)
    if problems:
        raise SpecError(problems)
    return render_template("nomad/job.nomad.hcl.j2", job=job_payload(spec, job_id)["Job"], go_duration=go_duration)
