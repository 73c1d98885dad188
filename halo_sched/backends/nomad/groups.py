"""The task groups of a Nomad job, from the launch plan: the trainer's (one group, count N, see
render.py for the shape) and one per server role, each with its task: driver config and
resources, environment, the entry script and the templates it reads (rank 0's address, the
secrets, the servers' addresses), and the policies that keep a rank from being restarted,
rescheduled or replaced (``lost_after_ns``)."""
from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from ...launch import Launch, ServerRole
from ...node_runtime import SERVER_ITEM, server_shell
from ...node.contract import INDEX_TAG, NAMES
from ...servers import render_server
from ...templating import check, checked_int, checked_text
from ...values import MAX_TIMEOUT_HOURS
from . import servers as nomad_servers
from .names import (
    ENTRY_PATH, KEEPER_GROUP, KEEPER_TASK, MASTER_FILE, PORT_LABEL, RESULT_IN_TASK, TASK, TRAINER_GROUP,
    carries_runtime, keeper_variable_path, service_name, variable_path,
)
from .progress import LOG_DIR_IN_TASK
from .secrets import item_template, runtime_wiring, secret_wiring

if TYPE_CHECKING:  # pragma: no cover
    from ...models import JobSpec


def delimiters(text: str) -> tuple[str, str]:
    """Go-template delimiters that never occur in ``text``, so the entry renders byte-exact."""
    salt = 0
    while True:
        h = hashlib.sha256(f"{salt}:{text}".encode()).hexdigest()[:8]
        left, right = f"[[halo-{h}", f"halo-{h}]]"
        if left not in text and right not in text:
            return left, right
        salt += 1


def rdzv_service_key(launch: Launch, job_id: str) -> str:
    """What the trainer's rendezvous service is named after (servers.attempt_key): the new
    version's nodes never read a registration an earlier attempt's rank 0 left."""
    return nomad_servers.attempt_key(job_id, launch.restart_count)


def master_template(job_id: str) -> str:
    """Rank 0's address on the first line and its port on the second, from the service
    registration of the trainer's allocation index 0; blank until it registers. Every trainer
    allocation registers the service tagged ``halo-index-${NOMAD_ALLOC_INDEX}``: Nomad
    interpolates a group service's tags with the allocation's environment before it registers
    them, whatever the provider (nomad v2.0.5 ``client/allocrunner/group_service_hook.go``
    preRunLocked -> ``client/taskenv/services.go`` InterpolateService, ``service.Tags =
    taskEnv.ParseAndReplace``). ``nomadService "TAG.NAME"`` keeps the registrations carrying TAG
    (consul-template v0.42.1, Nomad 2.0.5's: ``dependency/nomad_service.go``
    NomadServiceQueryRe = tagRe + serviceNameRe + regionRe, and Fetch's tag filter); the name has
    no '.' (:func:`service_name`), so the tag is all before the last one. The registration
    carries the port the rendezvous label was given, static or dynamic (nomad v2.0.5
    ``client/serviceregistration/address.go`` GetAddress, host mode: the label's
    AllocatedPortMapping, HostIP and Value), and the template gives it as ``.Port``. The file is
    written whole (``renderer/renderer.go`` AtomicWrite: a temporary file renamed into place), so
    a reader never sees the address without the port. Server tasks read the first line."""
    # Instance 0 explicitly: during a redeploy two registrations of index 0 can overlap.
    return (
        f'{{{{ with nomadService "{INDEX_TAG}0.{service_name(job_id)}" }}}}'
        # The final newline: a heredoc in the HCL would add one (the two forms stay one job).
        "{{ with index . 0 }}{{ .Address }}\n{{ .Port }}{{ end }}{{ end }}\n"
    )


def driver_config_literal(value: str) -> str:
    """``value`` as a docker driver config string the client leaves literal: the client decodes
    the whole config as HCL2 JSON (``hclutils.ParseHclInterface`` in the task runner), so
    ``${`` would interpolate and ``%{`` run a directive; ``$${`` and ``%%{`` are HCL's escapes."""
    return value.replace("${", "$${").replace("%{", "%%{")


def _task(launch: Launch, entry: str, delims: tuple[str, str]) -> dict:
    spec, job_id = launch.spec, launch.job_id
    nm = spec.nomad
    left, right = delims
    templates = [
        {"EmbeddedTmpl": entry, "DestPath": ENTRY_PATH, "Perms": "0755", "ChangeMode": "noop",
         "LeftDelim": left, "RightDelim": right},
        # Every node, rank 0 too, reads rank 0's address from index 0's registration. noop: the
        # file is rewritten when rank 0 registers; the entry script polls it.
        {"EmbeddedTmpl": master_template(rdzv_service_key(launch, job_id)), "DestPath": MASTER_FILE, "ChangeMode": "noop"},
    ]
    env = {NAMES.node_rank: "${NOMAD_ALLOC_INDEX}", NAMES.master_addr_file: nomad_servers.MASTER_FILE_IN_TASK}

    # The entry script keeps its logs and the ranks' progress files inside the task directory,
    # where the client serves them (fs/ls, fs/cat) to `status` and `timeline` (progress.py); the
    # allocation's directory goes with the allocation. A user's own HALO_LOG_DIR (env) wins.
    env[NAMES.log_dir] = LOG_DIR_IN_TASK
    # Rank 0's result, where the client serves it to `status` and Run.result() (fs/cat) too.
    env[NAMES.result_file] = RESULT_IN_TASK
    if launch.restart_count:  # a retry of its run (halo_sched/runs.py): the ranks learn which attempt
        env[NAMES.restart_count] = str(launch.restart_count)
    secret_env, secret_templates = secret_wiring(job_id, list(launch.trainer.secret_names))
    env.update(secret_env)
    templates += secret_templates
    runtime_env, runtime_templates = runtime_wiring(job_id)
    env.update(runtime_env)
    templates += runtime_templates

    if spec.nomad.spare_nodes:
        world_env, world_templates = world_wiring(launch)
        env.update(world_env)
        templates += world_templates
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


#: Where a trainer task of a job with hot spares reads the run's world and every slot's address.
WORLD_PATH = "local/halo-world"
SLOTS_PATH = "local/halo-slots"


def world_variable_path(job_id: str) -> str:
    """The Variable the run's keeper writes each world into (node/nomad_keeper.py): the trainer
    group's path, which its tasks' workload identities read without any policy (acl/acl.go
    ``matchingVariablesCapabilitySet``: ``nomad/jobs/<job>/<group>``, v2.0.5)."""
    return f"nomad/jobs/{check(job_id, 'job id', 'name')}/{TRAINER_GROUP}"


def world_wiring(launch: Launch) -> tuple[dict, list[dict]]:
    """(env, templates) of a trainer task with hot spares (``nomad.spare_nodes``; node/entry.sh
    ``halo_world``): the run's world as ``KEY VALUE`` lines (empty until the keeper wrote one:
    generation 0, slots 0..N-1 as node ranks, is the job's own; ``nomadVarExists`` guards the
    read, which never blocks), and every slot's registration of the attempt's rendezvous service as
    ``halo-index-K ADDR PORT`` lines: rank 0 of a world is the slot the world names. Both noop: the
    entry script polls them."""
    path = world_variable_path(launch.job_id)
    world = (f'{{{{ if nomadVarExists "{path}" }}}}{{{{ with nomadVar "{path}" }}}}'
             "{{ range $k, $v := . }}{{ $k }} {{ $v.Value }}\n{{ end }}{{ end }}{{ end }}\n")
    slots = (f'{{{{ range nomadService "{service_name(rdzv_service_key(launch, launch.job_id))}" }}}}'
             "{{ range .Tags }}{{ . }} {{ end }}{{ .Address }} {{ .Port }}\n{{ end }}\n")
    env = {NAMES.world_file: "${NOMAD_TASK_DIR}/" + WORLD_PATH.split("/", 1)[1],
           NAMES.slots_file: "${NOMAD_TASK_DIR}/" + SLOTS_PATH.split("/", 1)[1]}
    return env, [{"EmbeddedTmpl": world, "DestPath": WORLD_PATH, "ChangeMode": "noop"},
                 {"EmbeddedTmpl": slots, "DestPath": SLOTS_PATH, "ChangeMode": "noop"}]


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


def trainer_group(launch: Launch, entry: str, delims: tuple[str, str]) -> dict:
    """The trainer's one group: count N, node rank = ``NOMAD_ALLOC_INDEX`` (render.py says why)."""
    spec, job_id = launch.spec, launch.job_id
    group: dict = {
        "Name": TRAINER_GROUP,
        # With hot spares, nomad.spare_nodes allocations more: slots N.. idle until the keeper
        # gives one a rank (node/entry.sh halo_world).
        "Count": checked_int(launch.trainer.nodes, "nodes") + checked_int(spec.nomad.spare_nodes, "nomad.spare_nodes"),
        # A fixed-size torchrun world never re-forms around a replaced rank: no restarts, no reschedules.
        # Attempts alone: Nomad fills the rest from a batch job's defaults (api/tasks.go
        # TaskGroup.Canonicalize, ReschedulePolicy.Canonicalize @v2.0.5: mode "fail", unlimited
        # false), which with no attempts change nothing.
        "RestartPolicy": {"Attempts": 0},
        "ReschedulePolicy": {"Attempts": 0},
        # ... and no replacement of a rank whose node went down (the reschedule policy does not
        # cover lost allocations): its allocation turns "unknown" and the job's watcher ends it.
        # Both fields are needed: see lost_after_ns.
        "Disconnect": {"LostAfter": lost_after_ns(spec), "Replace": False},
        "Tasks": [_task(launch, entry, delims)],
    }
    if spec.nomad.max_run_duration_ns is not None:
        group["MaxRunDuration"] = checked_int(spec.nomad.max_run_duration_ns, "nomad.max_run_duration")
    rdzv = launch.rendezvous.port
    # Every allocation reserves what rank 0 binds (one group has one network ask; distinct_hosts
    # puts each on its own client): the rendezvous port and the weight-sync group ports
    # (servers[].group_port). Sorted by label: HCL keeps port blocks by label, so the two forms
    # stay one job.
    reserved = sorted(
        ([{"Label": PORT_LABEL, "Value": rdzv}] if rdzv is not None else [])
        + [{"Label": f"group-{r.name}", "Value": r.group_port} for r in launch.servers if r.group_port is not None],
        key=lambda p: p["Label"])
    network: dict = {"Mode": "host"}
    if rdzv is None:
        # rendezvous.port unset: Nomad picks the port, one the node has free and none of this
        # group's reserved ports (nomad/structs/network.go AssignPorts: dynamic ports skip the
        # node's used ports, the ask's reserved ports and those already offered; v2.0.5),
        # from the client's dynamic range (20000-32000 by default). Two jobs' nodes can then
        # share a client, which a static port forbids.
        network["DynamicPorts"] = [{"Label": PORT_LABEL}]
    if reserved:
        network["ReservedPorts"] = reserved
    group["Networks"] = [network]
    # Tagged with the allocation index (master_template): every node finds index 0's.
    group["Services"] = [{"Name": service_name(rdzv_service_key(launch, job_id)), "Provider": "nomad",
                          "PortLabel": PORT_LABEL, "Tags": [launch.index_tag + "${NOMAD_ALLOC_INDEX}"]}]
    return group


#: Where a server task's template writes the servers' shell (HALO_SERVER_SHELL_FILE).
SERVER_SHELL_PATH = "local/halo-server-shell.sh"


def server_shell_wiring(job_id: str) -> tuple[dict, list[dict]]:
    """(env, templates) of a server task: the servers' shell (halo_sched/node/server.sh), once per
    job, as the item SERVER_ITEM of the job's Variable, which a task's workload identity may read
    without any policy (``nomad/jobs/<job>``: acl/acl.go ``matchingVariablesCapabilitySet``,
    v2.0.5); the server entry fails naming it when the file is empty. A job whose id cannot have
    a Variable (:func:`carries_runtime`) holds the text itself in the template (its delimiters
    absent from it): a server node has no python to fall back on."""
    env = {NAMES.server_shell_file: "${NOMAD_TASK_DIR}/" + SERVER_SHELL_PATH.split("/", 1)[1]}
    if carries_runtime(job_id):
        path = variable_path(check(job_id, "job id", "name"))
        return env, [{"EmbeddedTmpl": item_template(path, SERVER_ITEM), "DestPath": SERVER_SHELL_PATH, "ChangeMode": "noop"}]
    text = server_shell()
    left, right = delimiters(text)
    return env, [{"EmbeddedTmpl": text, "DestPath": SERVER_SHELL_PATH, "ChangeMode": "noop",
                  "LeftDelim": left, "RightDelim": right}]


def server_group(launch: Launch, role: ServerRole, policies: dict) -> dict:
    """The task group of one server role (halo_sched/backends/nomad/servers.py): the trainer's
    driver config and resources (same fabric devices, same host network), the trainer's
    ``policies`` (no restarts, reschedules or replacements)."""
    spec, job_id = launch.spec, launch.job_id
    entry = render_server(launch, role)
    left, right = delimiters(entry)
    config, resources = _config_and_resources(spec, role.image, role.gpus, ["${NOMAD_TASK_DIR}/halo-server.sh"])
    secret_env, secret_templates = secret_wiring(job_id, list(role.secret_names))
    shell_env, shell_templates = server_shell_wiring(job_id)
    task = {
        "Name": nomad_servers.TASK,
        "Driver": spec.nomad.driver,
        "Config": config,
        "Env": {
            NAMES.server_index: "${NOMAD_ALLOC_INDEX}",
            NAMES.server_addr: "${NOMAD_IP_%s}" % nomad_servers.PORT_LABEL,
            NAMES.trainer_master_file: nomad_servers.MASTER_FILE_IN_TASK,
            **shell_env,
            **secret_env,
        },
        "Templates": [
            {"EmbeddedTmpl": entry, "DestPath": nomad_servers.ENTRY_PATH, "Perms": "0755", "ChangeMode": "noop",
             "LeftDelim": left, "RightDelim": right},
            *shell_templates,
            # noop: the server script polls it, and stops the server once it is blank again.
            {"EmbeddedTmpl": master_template(rdzv_service_key(launch, job_id)), "DestPath": MASTER_FILE, "ChangeMode": "noop"},
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
        # The attempt's own name: an earlier attempt's registration may outlive its stop.
        "Services": [{"Name": nomad_servers.service_name(rdzv_service_key(launch, job_id), role.name),
                      "Provider": "nomad",
                      "PortLabel": nomad_servers.PORT_LABEL, "Tags": [launch.index_tag + "${NOMAD_ALLOC_INDEX}"]}],
        "Tasks": [task],
    }
    if spec.nomad.max_run_duration_ns is not None:
        group["MaxRunDuration"] = checked_int(spec.nomad.max_run_duration_ns, "nomad.max_run_duration")
    return group



#: Where the keeper's task writes its script and its copy of the node runtime.
KEEPER_PATH = "local/halo-keeper.sh"
KEEPER_RUNTIME_PATH = "local/halo-keeper.b64"
#: The keeper's share of a node: it reads the API and a few log tails.
KEEPER_CPU_MHZ = 200
KEEPER_MEMORY_MB = 256
#: Nomad's smallest reschedule delay (nomad/structs/structs.go ReschedulePolicyMinDelay, v2.0.5).
KEEPER_RESCHEDULE_DELAY_NS = 5 * 10**9


def has_keeper(spec: JobSpec) -> bool:
    """Whether the job carries its run's keeper (node/nomad_keeper.py): with ``retry:`` or
    ``nomad.spare_nodes``, unless ``nomad.keeper: false``."""
    return bool(spec.nomad.keeper and (spec.retry is not None or spec.nomad.spare_nodes))


def keeper_group(launch: Launch) -> dict:
    """The run's keeper: one allocation of a group of its own, whose task runs
    ``python -m halo_sched.node.nomad_keeper`` (docs/recovery.md) with the task's workload identity
    in its environment (``identity { env = true }``: ``NOMAD_TOKEN``, client/taskenv/env.go and
    client/allocrunner/taskrunner/task_runner_getters.go setNomadToken, v2.0.5), which the Task API
    socket (client/allocrunner/taskrunner/api_hook.go) takes as its token.

    Its policies are the trainer's opposite: restarted when it exits badly, rescheduled without
    limit (``reschedule { unlimited = true }``; Attempts 0 is sent, since a batch group's default 1
    with unlimited is refused, nomad/structs/structs.go ReschedulePolicy.Validate, v2.0.5), and no
    ``disconnect`` block: an allocation lost with its node is replaced at once under the same name
    (``TaskGroup.Replace()`` true; scheduler/reconciler/filters.go, lost on a down node), so the keeper
    comes back on another client and reads where the run is (it keeps no state of its own). The
    job-level ``distinct_hosts`` keeps it off the trainer's nodes: losing a trainer's node never
    loses the keeper. No ports, no services, no GPUs; the trainer's driver and image."""
    from ...node_runtime import keeper_runtime
    from ...templating import render_template

    spec, job_id = launch.spec, launch.job_id
    nm = spec.nomad
    script = render_template("nomad/keeper.sh.j2", names=launch.names, runtime=keeper_runtime())
    left, right = delimiters(script)
    args = ["${NOMAD_TASK_DIR}/" + KEEPER_PATH.split("/", 1)[1]]
    if nm.driver == "docker":
        config: dict = {"image": launch.trainer.image, "entrypoint": ["/bin/bash"], "args": args, "network_mode": "host"}
    else:
        config = {"command": "/bin/bash", "args": args}
    retry = spec.retry
    env = {
        NAMES.keeper_attempts: str(checked_int(retry.attempts if retry else 0, "retry.attempts")),
        NAMES.keeper_retry_on: ",".join(check(w, "SLURM word", "retry.on") for w in (retry.on if retry else [])),
        NAMES.keeper_nodes: str(checked_int(launch.trainer.nodes, "nodes")),
        NAMES.keeper_spares: str(checked_int(nm.spare_nodes, "nomad.spare_nodes")),
    }
    templates = [{"EmbeddedTmpl": script, "DestPath": KEEPER_PATH, "Perms": "0755", "ChangeMode": "noop",
                  "LeftDelim": left, "RightDelim": right}]
    if carries_runtime(job_id):
        from ...node_runtime import KEEPER_ITEM

        env[NAMES.node_runtime_file] = "${NOMAD_TASK_DIR}/" + KEEPER_RUNTIME_PATH.split("/", 1)[1]
        templates.append({"EmbeddedTmpl": item_template(keeper_variable_path(check(job_id, "job id", "name")), KEEPER_ITEM),
                          "DestPath": KEEPER_RUNTIME_PATH, "ChangeMode": "noop"})
    task = {
        "Name": KEEPER_TASK,
        "Driver": nm.driver,
        "Config": config,
        "Env": env,
        "Identity": {"Env": True},
        "Templates": templates,
        "Resources": {"CPU": KEEPER_CPU_MHZ, "MemoryMB": KEEPER_MEMORY_MB},
        "KillTimeout": 5_000_000_000,
    }
    return {
        "Name": KEEPER_GROUP,
        "Count": 1,
        "RestartPolicy": {"Attempts": 3, "Interval": 600 * 10**9, "Delay": 5 * 10**9, "Mode": "fail"},
        "ReschedulePolicy": {"Attempts": 0, "Unlimited": True, "Delay": KEEPER_RESCHEDULE_DELAY_NS,
                             "DelayFunction": "constant"},
        "Tasks": [task],
    }
