"""JobSpec -> Nomad job (pure): the API payload ``{"Job": {...}}`` is the one model; the HCL
(``halo_sched/templates/nomad/job.nomad.hcl.j2``) is rendered from that same dict.

Shape, for N nodes: ONE group ``trainer`` with count N, whose allocation ``JOBID.trainer[K]`` is
node rank K: the env says ``HALO_NODE_RANK = ${NOMAD_ALLOC_INDEX}`` and the entry script checks
the range. Every allocation asks for the rendezvous port and registers a Nomad-native service
tagged ``halo-index-${NOMAD_ALLOC_INDEX}``; every node, rank 0 too, reads rank 0's address and
port from index 0's registration (groups.py :func:`master_template`). So the job is the same
size for 2 nodes or 1,024: the entry script is embedded once, never once per node. One group per
node made the job O(N) and the server state O(N^2), since every allocation carries the whole job
(hashicorp/nomad#27442, #6306).

Why the allocation index is a sound node rank here (hashicorp/nomad, ``scheduler/reconciler``):
each submission is a fresh job ID (:func:`submission_id`), registered again only as the next
attempt of its run (a new version: NomadScheduler.submit_attempt). Names come from ``AllocNameIndex`` (``allocs.go``): a bitmap of the
indexes the group's existing allocations hold; ``Next(n)`` hands out the free indexes in
0..count-1 first, so the first placement takes 0..count-1 and a later evaluation (a blocked one
unblocking) fills exactly the missing ones. A batch allocation that finished or failed still
counts as existing (``filters.go``: terminal allocations are "untainted"), so its index is never
reused for a new allocation. A lost-node replacement keeps the lost allocation's Name
(``reconcile_cluster.go``: "Add replacements for lost allocs", ``name: alloc.Name``), and with
``disconnect { lost_after = <the job's bound>, replace = false }`` (groups.py, :func:`lost_after_ns`)
a running allocation on a node that went down is marked ``unknown`` and not replaced while the
job can run. Two live allocations of one version never share an index, so the one live
registration tagged ``halo-index-0`` under the attempt's service name (groups.py rdzv_service_key)
is rank 0's. A new version (a retry
attempt) is registered once the old version's allocations are terminal or being stopped: a batch
job's terminal allocations of an older version are set aside before the reconciler computes
anything (``filters.go`` filterOldTerminalAllocs, v2.0.5), and the name index is built from what
is left (``reconcile_cluster.go``: ``newAllocNameIndex(..., untainted.union(migrate,
rescheduleNow, lost))``), so the new version's allocations take 0..count-1 afresh; the entry
script reads its version's own index.

Every group: no restarts, no reschedules, and ``disconnect { lost_after, replace = false }``
(Nomad 1.8+; ``TaskGroup.Replace()`` in ``nomad/structs/structs.go`` defaults to true, and the
reconciler replaces lost allocations up to the count whatever the reschedule policy says;
``replace = false`` alone no longer stops it since Nomad 1.11.2: :func:`lost_after_ns` says why).
Docker tasks run ``entrypoint = ["/bin/bash"]`` with the script as ``args`` and no ``command``,
so an image's own ENTRYPOINT never runs (groups.py). Nothing uses a
host namespace mode: since Nomad 2.0.4 the docker driver refuses them unless the client allows
them (``drivers/docker/driver.go`` ``validateNamespace``); shared memory comes from ``shm_size``.
Options that need client settings are listed by :func:`client_requirements`.

Where each part is built: the group and task dicts in groups.py, the names other modules read
back (groups, meta keys, node ranks) in names.py, the secrets' templates in secrets.py, the client
settings a job needs in client_settings.py; this module assembles the job and writes it as API
JSON or HCL.

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

from typing import TYPE_CHECKING

from ...errors import SpecError
from ...node.nomad_names import NOMAD_KEEPER_META, NOMAD_SPARES_META
from ...launch import Launch, compile_launch, render_entry
from ...templating import check, checked_int, render_template
from . import servers as nomad_servers
from .client_settings import ClientNeed, client_needs
from .groups import (
    LOST_AFTER_MARGIN_NS, UNBOUNDED_JOB_LOST_AFTER_NS, delimiters, driver_config_literal, has_keeper, keeper_group,
    lost_after_ns, master_template, server_group, trainer_group,
)
from .names import (
    ENTRY_PATH, KEEPER_GROUP, KEEPER_TASK, MASTER_FILE, NODES_META, PORT_LABEL, SECRETS_META, TASK, TRAINER_GROUP,
    alloc_index, carries_runtime, keeper_variable_path, node_rank_of, service_name, variable_path,
)
from .secrets import SECRET_PERMS, secret_owner, secret_template, secret_wiring

if TYPE_CHECKING:  # pragma: no cover
    from ...models import JobSpec

#: Job meta of a job carrying its run's keeper, and of one with hot spares (their number).
KEEPER_META = NOMAD_KEEPER_META
SPARES_META = NOMAD_SPARES_META

# The names other modules and tests import from here, wherever they are defined.
__all__ = [
    "ClientNeed", "ENTRY_PATH", "KEEPER_GROUP", "KEEPER_META", "KEEPER_TASK", "LOST_AFTER_MARGIN_NS", "SPARES_META", "MASTER_FILE", "NODES_META", "NODE_NAME_TARGET",
    "PORT_LABEL", "SECRETS_META", "SECRET_PERMS", "TASK", "TRAINER_GROUP", "UNBOUNDED_JOB_LOST_AFTER_NS",
    "alloc_index", "client_needs", "client_requirements", "delimiters", "has_keeper", "keeper_variable_items",
    "keeper_variable_path",
    "driver_config_literal", "exclude_constraints", "go_duration", "job_payload", "lost_after_ns",
    "master_template", "node_rank_of", "payload", "render_hcl", "secret_owner", "secret_template",
    "secret_wiring", "service_name", "variable_items", "variable_path",
]


def variable_items(spec: JobSpec, job_id: str) -> dict[str, str]:
    """What the job's Variable holds, written before the job is registered: the secrets'
    values, and the node runtime (one copy for the whole job, halo_sched/node_runtime.py) where
    the Variable can carry it, with the servers' shell for a job with servers. Empty: no Variable."""
    from ...node_runtime import ITEM, SERVER_ITEM, runtime, server_shell

    items = dict(spec.secret_values())  # a missing one is a SpecError before any request
    secrets = _variable_size(items)
    if carries_runtime(job_id):
        items[ITEM] = runtime(batch=False).base64
        if spec.servers:  # the servers' shell: pure bash, read by their tasks as text (groups.py)
            items[SERVER_ITEM] = server_shell()
    size = _variable_size(items)
    if size > VARIABLE_MAX:  # sizes only: never a value
        rest = "the node runtime and the servers' shell" if spec.servers else "the node runtime"
        raise SpecError([("secret_env", f"the job's Nomad Variable would hold {size:,} bytes: the secrets {secrets:,}, "
                                        f"{rest} {size - secrets:,}; Nomad keeps at most {VARIABLE_MAX:,} "
                                        "(maxVariableSize); pass fewer or smaller secrets")])
    return items


def keeper_variable_items(spec: JobSpec, job_id: str) -> dict[str, str]:
    """What the keeper's Variable (:func:`keeper_variable_path`) holds: the keeper's copy of the node
    runtime (halo_sched/node_runtime.py ``keeper_runtime``). Empty: the job has no keeper, or an
    id no Variable can carry (its keeper then needs halo-sched at the job's version on its node)."""
    from ...node_runtime import KEEPER_ITEM, keeper_runtime

    if not has_keeper(spec) or not carries_runtime(job_id):
        return {}
    return {KEEPER_ITEM: keeper_runtime().base64}


#: The most a Nomad Variable holds, counted as :func:`_variable_size` counts: nomad/structs/variables.go
#: ``maxVariableSize`` and ``VariableItems.Size`` (hashicorp/nomad aa026cc), a write over it is refused.
VARIABLE_MAX = 65536


def _variable_size(items: dict[str, str]) -> int:
    """Bytes of every item's key and value, as Nomad's ``VariableItems.Size`` adds them (Go's len)."""
    return sum(len(k.encode()) + len(v.encode()) for k, v in items.items())


def job_payload(spec: JobSpec, job_id: str | None = None) -> dict:
    """The API payload for ``PUT /v1/jobs`` (and ``/v1/job/<id>/plan``). ``job_id`` defaults to
    the job's name (what ``render`` shows); ``submit`` and ``plan`` pass a fresh :func:`submission_id`.
    The job keeps off the node ledger's hosts."""
    from ... import ledger

    return payload(compile_launch(spec, job_id, ledgered=ledger.exclusions()))


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
        "TaskGroups": [trainer_group(launch, entry, delims)],
    }
    if spec.secret_names or carries_runtime(job_id):  # the job has a Variable (deleted once it ended)
        job["Meta"][SECRETS_META] = variable_path(job_id)
    if has_keeper(spec):
        # The run's keeper (node/nomad_keeper.py): the waiting processes follow it, none submits.
        job["Meta"][KEEPER_META] = "1"
        if nm.spare_nodes:
            job["Meta"][SPARES_META] = str(checked_int(nm.spare_nodes, "nomad.spare_nodes"))
        job["TaskGroups"].append(keeper_group(launch))
    if launch.servers:
        if nm.driver == "docker" and not all(r.image for r in launch.servers):
            raise SpecError([("servers", "the Nomad docker driver needs an image for every server role; set "
                                         "servers[].image or the job's image")])
        job["Meta"][nomad_servers.SERVERS_META] = nomad_servers.servers_meta(launch)
        policies = {k: v for k, v in job["TaskGroups"][0].items() if k in ("RestartPolicy", "ReschedulePolicy", "Disconnect")}
        job["TaskGroups"] += [server_group(launch, r, policies) for r in launch.servers]
    secret_owner(spec, job)
    if nm.namespace:
        job["Namespace"] = nm.namespace
    if nm.region:
        job["Region"] = nm.region
    if nm.priority is not None:
        job["Priority"] = checked_int(nm.priority, "nomad.priority")
    return {"Job": job}


def client_requirements(spec: JobSpec) -> list[str]:
    """Client settings this job needs beyond a default Nomad 2.0.x client, each a line naming the
    option that needs it and the setting (:func:`client_needs`); empty when a default client runs it."""
    return [n.line for n in client_needs(job_payload(spec)["Job"]) if not n.default]


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
    job = job_payload(spec, job_id)["Job"]
    return render_template("nomad/job.nomad.hcl.j2", job=job, go_duration=go_duration)

