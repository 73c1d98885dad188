"""A stand-in slurmrestd for the OpenAPI versions v0.0.40 to v0.0.45 (Slurm 23.11 to 26.05; the
local clusters serve 24.11's and 26.05's for real), on 127.0.0.1 only.

It is written from SchedMD/slurm's sources at the release tags named in ``RELEASES``, read for
their request fields and types and their answers' shapes (no code taken):

* ``src/plugins/data_parser/v0.0.4x/parsers.c``: ``PARSER_ARRAY(JOB_DESC_MSG)`` (the job
  fields and their parser types), ``PARSER_ARRAY(JOB_SUBMIT_REQ)``, ``PARSE_FUNC(...)`` of
  each type (what a value may be, and the error when it is not), the flag arrays
  (``WARN_FLAGS``, ``OPEN_MODE``, ``JOB_SHARED``, ``JOB_MAIL_FLAGS``, ``JOB_FLAGS``),
  ``PARSER_ARRAY(JOB_INFO)``, ``DUMP_FUNC(PROCESS_EXIT_CODE)``, ``DUMP_FUNC(UINT32_NO_VAL)``,
  ``PARSER_ARRAY(OPENAPI_JOB_SUBMIT_RESPONSE)``, ``PARSER_ARRAY(OPENAPI_JOB_INFO_DELETE_QUERY)``,
  ``PARSER_ARRAY(KILL_JOBS_RESP_JOB)``;
* ``src/plugins/data_parser/v0.0.4x/parsing.c``: an unknown field is ignored with a warning,
  a flag is a string or a list of strings;
* ``src/slurmrestd/plugins/openapi/slurmctld/jobs.c``: the paths, the submit checks, DELETE's
  defaults (SIGKILL, FULL_JOB) and answers (24.11 on: ``status`` per job);
* ``src/slurmrestd/openapi.c`` and ``operations.c``: ``/openapi/v3`` and the plain-text 404.

Each answer or check below names the file and tag it follows. What the stand-in does not
model (scheduling, most job fields, HetJobs) it leaves out rather than guess; a job runs only
when a test says so (``start``/``finish``).
"""
from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

# Answers recorded from real servers (tests/fixtures/slurmrestd/<release>/<version>/, written by
# its record.py; 24.11.5 built from Debian's source package): the stand-in serves those where a
# release/version was recorded, and tests/test_slurmrestd_stub_real.py checks the rest of what
# it says against them.
RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "slurmrestd"


def recorded(release: str, version: str, name: str) -> dict | None:
    """A real server's answer: this release's, else the newest recorded release's at this version."""
    for rel in [release] + sorted((p.name for p in RECORDED.iterdir() if p.is_dir()), reverse=True):
        path = RECORDED / rel / version / f"{name}.json"
        if path.is_file():
            return json.loads(path.read_text())
    return None


def recorded_paths(release: str) -> dict | None:
    path = RECORDED / release / "openapi_v3_paths.json"
    return json.loads(path.read_text()) if path.is_file() else None


# Release -> (the tag read, the versions it serves). src/plugins/data_parser/ (and, for v0.0.38,
# src/slurmrestd/plugins/openapi/v0.0.38) at each tag.
RELEASES = {
    "23.11": ("slurm-23-11-11-1", ("v0.0.38", "v0.0.39", "v0.0.40")),
    "24.05": ("slurm-24-05-8-1", ("v0.0.39", "v0.0.40", "v0.0.41")),
    "24.11": ("slurm-24-11-7-1", ("v0.0.40", "v0.0.41", "v0.0.42")),
    "25.05": ("slurm-25-05-8-1", ("v0.0.40", "v0.0.41", "v0.0.42", "v0.0.43")),
    "25.11": ("slurm-25-11-7-1", ("v0.0.41", "v0.0.42", "v0.0.43", "v0.0.44")),
    # The answers at v0.0.42-45 are 26.05.3's, recorded (tests/fixtures/slurmrestd/26.05).
    "26.05": ("slurm-26-05-3-1", ("v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45")),
}
MODELLED = ("v0.0.40", "v0.0.41", "v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45")

# The names of PARSER_ARRAY(JOB_DESC_MSG) (parsers.c; "rlimits/cpu" and the like are the field
# "rlimits"). v0.0.40 as in slurm-23-11-11-1 and slurm-24-05-8-1 (identical), then the changes.
_V40 = frozenset("""
account account_gather_frequency admin_comment allocation_node_list allocation_node_port argv array
batch_features begin_time burst_buffer cluster_constraint clusters comment constraints container
container_id contiguous core_specification cores_per_socket cpu_binding cpu_binding_flags cpu_frequency
cpus_per_task cpus_per_tres crontab current_working_directory deadline delay_boot dependency distribution
distribution_plane_size end_time environment excluded_nodes exclusive extra flags group_id hetjob_group hold
immediate job_id kill_on_node_fail kill_warning_delay kill_warning_flags kill_warning_signal licenses
mail_type mail_user maximum_cpus maximum_nodes mcs_label memory_binding memory_binding_type memory_per_cpu
memory_per_node memory_per_tres minimum_boards_per_node minimum_cpus minimum_cpus_per_node minimum_nodes
minimum_sockets_per_board name network nice nodes ntasks_per_tres open_mode overcommit oversubscribe
partition power_flags prefer priority profile qos reboot requeue required_nodes required_switches
reservation reserve_ports rlimits script selinux_context shared site_factor sockets_per_node
spank_environment standard_error standard_input standard_output tasks tasks_per_board tasks_per_core
tasks_per_node tasks_per_socket temporary_disk_per_node thread_specification threads_per_core time_limit
time_minimum tres_bind tres_freq tres_per_job tres_per_node tres_per_socket tres_per_task user_id
wait_all_nodes wait_for_switch wckey x11 x11_magic_cookie x11_target_host x11_target_port
""".split())
# slurm-24-05-8-1 v0.0.41: no cores_per_socket; resv_mpi_ports, segment_size added.
_V41 = (_V40 - {"cores_per_socket"}) | {"resv_mpi_ports", "segment_size"}
# slurm-24-11-7-1 v0.0.42: exclusive and oversubscribe (deprecated since 23.11) and resv_mpi_ports
# gone; oom_kill_step added. slurm-25-05-8-1 v0.0.43: the same names.
_V42 = (_V41 - {"exclusive", "oversubscribe", "resv_mpi_ports"}) | {"oom_kill_step"}
# slurm-25-11-7-1 v0.0.44: step_id added.
_V44 = _V42 | {"step_id"}
# slurm-26-05-3-1 v0.0.45 (against v0.0.44 at the same tag): cores_per_socket back (UINT16, as in
# v0.0.40), container_type, memory_update_margin and memory_update_delay added; power_flags (an
# add_removed entry in v0.0.40-44) gone. Every other name, its parser type and each PARSE_FUNC
# the transport's fields go through (STRING, UINT16, UINT32_NO_VAL, BOOL16, JOB_DESC_MSG_ENV,
# JOB_DESC_MSG_NODES, SIGNAL, CSV_STRING, MEM_PER_NODE, ...) are the same as v0.0.44's, and so
# are JOB_SUBMIT_REQ (script, jobs, job), OPENAPI_JOB_SUBMIT_RESPONSE and KILL_JOBS_RESP_JOB.
_V45 = (_V44 - {"power_flags"}) | {"cores_per_socket", "container_type", "memory_update_margin",
                                   "memory_update_delay"}
JOB_FIELDS = {"v0.0.40": _V40, "v0.0.41": _V41, "v0.0.42": _V42, "v0.0.43": _V42, "v0.0.44": _V44,
              "v0.0.45": _V45}

# Flag arrays (parsers.c PARSER_FLAG_ARRAY(...), the same in v0.0.40-44 for these names;
# "topo" in JOB_SHARED from slurm-24-11-7-1).
FLAGS = {
    "WARN_FLAGS": {"BATCH_JOB", "ARRAY_TASK", "FULL_STEPS_ONLY", "FULL_JOB", "FEDERATION_REQUEUE", "HURRY",
                   "OUT_OF_MEMORY", "NO_SIBLING_JOBS", "RESERVATION_JOB", "VERBOSE", "WARNING_SENT"},
    "OPEN_MODE": {"APPEND", "TRUNCATE"},
    "JOB_SHARED": {"none", "oversubscribe", "user", "mcs"},
    "JOB_SHARED_42": {"none", "oversubscribe", "user", "mcs", "topo"},
    "JOB_EXCLUSIVE_FLAGS": {"true", "false", "user", "mcs"},
    "JOB_MAIL_FLAGS": {"BEGIN", "END", "FAIL", "REQUEUE", "TIME=100%", "TIME=90%", "TIME=80%", "TIME=50%",
                       "STAGE_OUT", "ARRAY_TASKS", "INVALID_DEPENDENCY"},
    "JOB_FLAGS": {"KILL_INVALID_DEPENDENCY", "NO_KILL_INVALID_DEPENDENCY", "SPREAD_JOB",
                  "PREFER_MINIMUM_NODE_COUNT", "GRES_BINDING_ENFORCED", "GRES_BINDING_DISABLED"},
    # v0.0.45 adds JOB_IMPLICIT_MAX_NODES (PARSER_FLAG_ARRAY(JOB_FLAGS), slurm-26-05-3-1).
    "JOB_FLAGS_45": {"KILL_INVALID_DEPENDENCY", "NO_KILL_INVALID_DEPENDENCY", "SPREAD_JOB",
                     "PREFER_MINIMUM_NODE_COUNT", "GRES_BINDING_ENFORCED", "GRES_BINDING_DISABLED",
                     "JOB_IMPLICIT_MAX_NODES"},
}

# The parser type of the fields modelled here (parsers.c PARSER_ARRAY(JOB_DESC_MSG), v0.0.40-45
# alike for these). A field in JOB_FIELDS but not here is accepted as it comes.
TYPES = {
    **dict.fromkeys(["account", "name", "partition", "qos", "reservation", "comment", "wckey", "licenses",
                     "dependency", "array", "prefer", "constraints", "cluster_constraint", "mail_user",
                     "container", "standard_output", "standard_error", "standard_input",
                     "current_working_directory", "tres_per_node", "tres_per_job", "tres_per_task",
                     "cpus_per_tres", "memory_per_tres", "tres_bind", "network", "script"], "STRING"),
    **dict.fromkeys(["tasks_per_node", "cpus_per_task", "threads_per_core", "sockets_per_node",
                     "cores_per_socket", "minimum_cpus_per_node", "core_specification",
                     "thread_specification"], "UINT16"),
    **dict.fromkeys(["tasks", "temporary_disk_per_node", "minimum_nodes", "maximum_nodes"], "UINT32"),
    **dict.fromkeys(["time_limit", "time_minimum"], "UINT32_NO_VAL"),
    "kill_warning_delay": "UINT16_NO_VAL",
    "memory_per_node": "MEM_PER_NODE", "memory_per_cpu": "MEM_PER_NODE",
    **dict.fromkeys(["requeue", "contiguous", "kill_on_node_fail"], "BOOL16"),
    "overcommit": "BOOL", "wait_all_nodes": "BOOL16", "hold": "HOLD", "nice": "NICE",
    "kill_warning_signal": "SIGNAL",
    "kill_warning_flags": "FLAGS:WARN_FLAGS", "open_mode": "FLAGS:OPEN_MODE", "mail_type": "FLAGS:JOB_MAIL_FLAGS",
    "flags": "FLAGS:JOB_FLAGS", "shared": "FLAGS:JOB_SHARED", "exclusive": "JOB_EXCLUSIVE",
    "nodes": "JOB_DESC_MSG_NODES", "environment": "JOB_DESC_MSG_ENV",
    "excluded_nodes": "CSV_STRING", "required_nodes": "CSV_STRING",
    "begin_time": "TIMESTAMP", "deadline": "TIMESTAMP",
}

# src/common/slurm_errno.c (slurm-25-11-7-1): the numbers and texts the answers carry.
E_INVALID_JOB_ID = (2017, "Invalid job id specified")
E_ALREADY_DONE = (2021, "Job/step already completing or completed")
E_REST_FAIL_PARSING = (9001, "Failure during parsing")
E_DATA_CONV_FAILED = (9202, "Unable to convert Data type")
E_DATA_FLAGS_INVALID = (9207, "Data parser unable to parse invalid flag")
E_DATA_EXPECTED_DICT = (9209, "Data parser expected a dictionary or object")
E_JOB_SCRIPT_MISSING = (2009, "Job script not specified")
E_ENVIRONMENT_MISSING = (2127, "Environment is missing in job")

_SIGNALS = {"HUP": 1, "INT": 2, "QUIT": 3, "KILL": 9, "USR1": 10, "USR2": 12, "TERM": 15, "CONT": 18,
            "STOP": 19, "TSTP": 20, "URG": 23, "XCPU": 24, "ALRM": 14}


class ParseError(Exception):
    def __init__(self, code: tuple[int, str], description: str, source: str):
        super().__init__(description)
        self.code, self.description, self.source = code, description, source


def _int_like(v) -> int | None:
    """data_convert_type(..., DATA_TYPE_INT_64) (src/common/data.c): ints, and strings that are
    whole numbers."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str) and re.fullmatch(r"-?\d+", v.strip()):
        return int(v)
    return None


def _no_val(v, path: str) -> dict:
    """PARSE_FUNC(UINT64_NO_VAL) (parsers.c, slurm-23-11-11-1 .. slurm-25-11-7-1): null, a float,
    an integer (or a string that converts to one), or ``{set, infinite, number}``; anything else
    is "Expected dictionary but got string"."""
    if v is None:
        return {"set": False, "infinite": False, "number": 0}
    if isinstance(v, float):
        return {"set": True, "infinite": False, "number": int(v)}
    n = _int_like(v)
    if n is not None:
        return {"set": True, "infinite": False, "number": n}
    if not isinstance(v, dict):
        kind = "string" if isinstance(v, str) else type(v).__name__
        raise ParseError(E_DATA_EXPECTED_DICT, f"Expected dictionary but got {kind}", path)
    out = {"set": bool(v.get("set", False)), "infinite": bool(v.get("infinite", False)), "number": 0}
    if "number" in v:
        if _int_like(v["number"]) is None:
            raise ParseError(E_DATA_CONV_FAILED, "Expected integer number for \"number\" field", path)
        out["number"] = _int_like(v["number"])
    elif out["set"] and not out["infinite"]:
        raise ParseError(E_DATA_CONV_FAILED, "Expected \"number\" field when \"set\"=True but field not present", path)
    return out


def _flags(v, allowed: set[str], path: str) -> list[str]:
    """parsing.c _parse_flag (slurm-23-11-11-1, slurm-25-11-7-1): one flag as a string, or a list
    of them, matched without regard to case; an unknown one is "Unknown flag"."""
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list):
        raise ParseError(E_DATA_FLAGS_INVALID, f"Expected a List but found a {type(v).__name__}", path)
    out = []
    for item in items:
        match = next((a for a in allowed if isinstance(item, str) and a.lower() == item.lower()), None)
        if match is None:
            raise ParseError(E_DATA_FLAGS_INVALID, f"Unknown flag \"{item}\"", path)
        out.append(match)
    return out


def _str_to_mbytes(text: str) -> int | None:
    """src/common/proc_args.c str_to_mbytes: a number with K, M (default), G or T."""
    m = re.fullmatch(r"(\d+)([KkMmGgTt]?)", text.strip())
    if not m:
        return None
    n, unit = int(m.group(1)), (m.group(2) or "M").upper()
    return {"K": (n + 1023) // 1024, "M": n, "G": n << 10, "T": n << 20}[unit]


def parse_field(version: str, key: str, value, path: str):
    """One job field as that version's PARSE_FUNC takes it; the stored (normalized) value."""
    kind = TYPES.get(key)
    if kind is None:
        return value
    if kind == "STRING":
        # PARSE_FUNC(STRING): null, or anything that converts to a string (not a list or dict).
        if value is None or isinstance(value, (str, int, float, bool)):
            return None if value is None else (value if isinstance(value, str) else json.dumps(value))
        raise ParseError(E_DATA_CONV_FAILED, E_DATA_CONV_FAILED[1], path)
    if kind in ("UINT16", "UINT32"):
        # PARSE_FUNC(UINT16/UINT32): null (0) or an integer.
        n = 0 if value is None else _int_like(value)
        if n is None:
            raise ParseError(E_DATA_CONV_FAILED, E_DATA_CONV_FAILED[1], path)
        return n
    if kind in ("UINT32_NO_VAL", "UINT16_NO_VAL"):
        return _no_val(value, path)
    if kind == "MEM_PER_NODE":
        # PARSE_FUNC(MEM_PER_NODE): a string with units (str_to_mbytes), else UINT64_NO_VAL.
        if isinstance(value, str) and _int_like(value) is None:
            mb = _str_to_mbytes(value)
            if mb is None:
                raise ParseError(E_DATA_CONV_FAILED, f"Invalid formatted memory size: {value}", path)
            return {"set": True, "infinite": False, "number": mb}
        return _no_val(value, path)
    if kind in ("BOOL16", "BOOL"):
        # PARSE_FUNC(BOOL16): data_convert_type(..., DATA_TYPE_BOOL): booleans, and the words
        # src/common/data.c takes as one.
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no"):
            return value.lower() in ("true", "yes")
        raise ParseError(E_DATA_CONV_FAILED, E_DATA_CONV_FAILED[1], path)
    if kind == "HOLD":
        if value is None:
            return False
        return parse_field(version, "requeue", value, path)
    if kind == "NICE":
        n = _int_like(value)
        if n is None or abs(n) > 2147483645:
            raise ParseError(E_DATA_CONV_FAILED, "Nice value not within +/- 2147483645", path)
        return n
    if kind == "SIGNAL":
        # PARSE_FUNC(SIGNAL): a number, or a name for sig_name2num (with or without "SIG").
        n = _int_like(value)
        if n is not None:
            return n
        name = str(value).upper()
        name = name[3:] if name.startswith("SIG") else name
        if name not in _SIGNALS:
            raise ParseError(E_DATA_CONV_FAILED, f"Unknown signal {value}", path)
        return _SIGNALS[name]
    if kind.startswith("FLAGS:"):
        table = kind.split(":", 1)[1]
        if table == "JOB_SHARED" and int(version.rsplit(".", 1)[1]) >= 42:
            table = "JOB_SHARED_42"
        if table == "JOB_FLAGS" and int(version.rsplit(".", 1)[1]) >= 45:
            table = "JOB_FLAGS_45"
        return _flags(value, FLAGS[table], path)
    if kind == "JOB_EXCLUSIVE":
        # PARSE_FUNC(JOB_EXCLUSIVE): null, a boolean, or JOB_EXCLUSIVE_FLAGS.
        if value is None or isinstance(value, bool):
            return value
        return _flags(value, FLAGS["JOB_EXCLUSIVE_FLAGS"], path)
    if kind == "JOB_DESC_MSG_NODES":
        # PARSE_FUNC(JOB_DESC_MSG_NODES): [min, max], [max], or text for verify_node_count.
        if isinstance(value, list):
            if not 1 <= len(value) <= 2 or any(_int_like(x) is None for x in value):
                raise ParseError(E_DATA_CONV_FAILED, "Node count in format of a list must have a cardinality of 2 or 1", path)
            return [_int_like(x) for x in value]
        if isinstance(value, (dict, bool)) or value is None:
            raise ParseError(E_DATA_CONV_FAILED, f"Expected string instead of {type(value).__name__} for node counts", path)
        if not re.fullmatch(r"\d+(-\d+)?(:\d+)?", str(value)):
            raise ParseError(E_DATA_CONV_FAILED, f"Unknown format: {value}", path)
        return str(value)
    if kind == "JOB_DESC_MSG_ENV":
        # PARSE_FUNC(JOB_DESC_MSG_ENV) -> STRING_ARRAY: a list of strings (or a dict).
        if isinstance(value, list) and all(isinstance(x, str) for x in value):
            return list(value)
        if isinstance(value, dict):
            return [f"{k}={v}" for k, v in value.items()]
        raise ParseError(E_DATA_CONV_FAILED, "expected a list of strings", path)
    if kind == "CSV_STRING":
        if isinstance(value, str):
            return value
        if isinstance(value, list) and all(isinstance(x, str) for x in value):
            return ",".join(value)
        raise ParseError(E_DATA_CONV_FAILED, E_DATA_CONV_FAILED[1], path)
    if kind == "TIMESTAMP":
        # _parse_timestamp: an integer, or text for parse_time() (not modelled: any non-empty text).
        if _int_like(value) is not None or (isinstance(value, str) and value.strip()):
            return value
        raise ParseError(E_DATA_CONV_FAILED, f"Parsing of {value} for timestamp failed", path)
    raise AssertionError(kind)


def _meta(release: str, version: str, user: str) -> dict:
    """OPENAPI_META (parsers.c v0.0.40-45, slurm-23-11-11-1 .. slurm-26-05-3-1): plugin, client,
    command, slurm."""
    tag = RELEASES[release][0]
    major, minor, micro = tag.split("-")[1:4]
    return {
        "plugin": {"type": "openapi/slurmctld", "name": "Slurm OpenAPI slurmctld",
                   "data_parser": f"data_parser/{version}", "accounting_storage": ""},
        "client": {"source": "[127.0.0.1]", "user": user, "group": user},
        "command": [],
        "slurm": {"version": {"major": major, "minor": minor, "micro": micro},
                  "release": f"{major}.{minor}.{micro}", "cluster": "halo"},
    }


def _no_val_dump(n: int | None, infinite: bool = False) -> dict:
    """DUMP_FUNC(UINT32_NO_VAL) (parsers.c, slurm-23-11-11-1 .. slurm-25-11-7-1; not complex
    mode): ``{set, infinite, number}``."""
    if infinite:
        return {"set": False, "infinite": True, "number": 0}
    if n is None:
        return {"set": False, "infinite": False, "number": 0}
    return {"set": True, "infinite": False, "number": n}


def _exit_dump(rc: int | None, sig: int | None) -> dict:
    """DUMP_FUNC(PROCESS_EXIT_CODE) -> PROCESS_EXIT_CODE_VERBOSE (parsers.c slurm-23-11-11-1 ..
    slurm-25-11-7-1): status, return_code, signal {id, name}."""
    if rc is None and sig is None:
        return {"status": ["PENDING"], "return_code": _no_val_dump(None),
                "signal": {"id": _no_val_dump(None), "name": ""}}
    if sig:
        name = next((k for k, v in _SIGNALS.items() if v == sig), str(sig))
        return {"status": ["SIGNALED"], "return_code": _no_val_dump(None),
                "signal": {"id": _no_val_dump(sig), "name": name}}
    return {"status": ["SUCCESS" if rc == 0 else "ERROR"], "return_code": _no_val_dump(rc),
            "signal": {"id": _no_val_dump(None), "name": ""}}


class Job:
    def __init__(self, job_id: int, desc: dict, script: str, user: str):
        self.id = job_id
        self.desc = desc
        self.script = script
        self.user = user
        self.state = ["PENDING"]
        self.rc: int | None = None
        self.sig: int | None = None
        self.nodes = ""
        self.signals: list[tuple[int, list[str]]] = []  # every DELETE: (signal, flags)

    def _expand(self, path: str | None) -> str:
        text = path or "slurm-%j.out"
        text = text.replace("%j", str(self.id)).replace("%x", self.desc.get("name") or "")
        if not text.startswith("/"):
            text = f"{self.desc.get('current_working_directory', '')}/{text}"
        return text

    def info(self, version: str, cluster: str) -> dict:
        """One entry of OPENAPI_JOB_INFO_RESP jobs[] (parsers.c PARSER_ARRAY(JOB_INFO) at
        slurm-23-11-11-1 .. slurm-26-05-3-1, the fields the transport reads, alike in v0.0.45; job_state is the
        JOB_STATE flag list, base state first). v0.0.40-42 dump standard_output expanded (JOB_INFO_STDOUT:
        slurm_get_job_stdout); v0.0.43+ dump it as given and add stdout_expanded
        (slurm-25-05-8-1, slurm-25-11-7-1)."""
        n_nodes = self.desc.get("nodes")
        count = int(str(n_nodes[-1] if isinstance(n_nodes, list) else n_nodes or "1").split("-")[0].split(":")[0])
        out = {
            "job_id": self.id,
            "name": self.desc.get("name") or "",
            "job_state": list(self.state),
            "exit_code": _exit_dump(self.rc, self.sig),
            "node_count": _no_val_dump(count),
            "nodes": self.nodes,
            "batch_host": self.nodes.split(",")[0] if self.nodes else "",
            "cluster": cluster,
            "array_job_id": _no_val_dump(0),
            "array_task_id": _no_val_dump(None),
            "array_task_string": "",
            "het_job_id": _no_val_dump(0),
            "het_job_offset": _no_val_dump(None),
            "restart_cnt": 0,
            "requeue": bool(self.desc.get("requeue", False)),
            "state_reason": "None" if self.state != ["PENDING"] else "Priority",
            "user_name": self.user,
            "current_working_directory": self.desc.get("current_working_directory", ""),
            "time_limit": self.desc.get("time_limit") or _no_val_dump(None, infinite=True),
        }
        raw_out = self.desc.get("standard_output")
        if int(version.rsplit(".", 1)[1]) >= 43:
            out["standard_output"] = raw_out or ""
            out["stdout_expanded"] = self._expand(raw_out)
        else:
            out["standard_output"] = self._expand(raw_out)
        return out


class Slurmrestd:
    """``with Slurmrestd("24.11") as rest: RestTransport(url=rest.url, token="t")``."""

    def __init__(self, release: str, token: str = "t", cluster: str = "halo"):
        self.release = release
        self.tag, self.versions = RELEASES[release]
        self.token = token
        self.cluster = cluster
        self.jobs: dict[int, Job] = {}
        self.requests: list[tuple[str, str, object]] = []  # (method, path, body)
        self.next_id = 100
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code: int, doc, plain: bool = False):
                body = (doc if plain else json.dumps(doc)).encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain" if plain else "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _handle(self, method: str):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                with stub.lock:
                    stub.requests.append((method, self.path, body))
                    code, doc, plain = stub.answer(method, self.path, body, self.headers)
                self._send(code, doc, plain)

            def do_GET(self):
                self._handle("GET")

            def do_POST(self):
                self._handle("POST")

            def do_DELETE(self):
                self._handle("DELETE")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- what a test does to a job --------------------------------------------------------------

    def start(self, job_id: int, nodes: str = "node[1-2]") -> None:
        with self.lock:
            job = self.jobs[int(job_id)]
            job.state, job.nodes = ["RUNNING"], nodes

    def finish(self, job_id: int, rc: int = 0, sig: int | None = None, state: str | None = None) -> None:
        with self.lock:
            job = self.jobs[int(job_id)]
            job.rc, job.sig = (0, sig) if sig else (rc, None)
            job.state = [state or ("CANCELLED" if sig else "COMPLETED" if rc == 0 else "FAILED")]

    # -- the API ----------------------------------------------------------------------------------

    def answer(self, method: str, path: str, body, headers) -> tuple[int, object, bool]:
        url = urlsplit(path)
        if url.path == "/openapi/v3":
            # src/slurmrestd/openapi.c: the specification of every loaded plugin; each data_parser
            # version expands the slurmctld plugin's "/slurm/{data_parser}/..." paths.
            real = recorded_paths(self.release)
            if real is not None:  # what the real server of this release listed
                paths = {p: {m.lower(): {} for m in methods} for p, methods in real["paths"].items()}
                return 200, {"openapi": "3.0.3", "info": real["info"], "paths": paths}, False
            paths = {}
            for v in self.versions:
                for op in ("job/submit", "jobs/", "job/{job_id}", "jobs/state/", "ping/", "diag/", "partitions/",
                           "nodes/"):
                    paths[f"/slurm/{v}/{op}"] = {}
            return 200, {"openapi": "3.0.3", "info": {"title": "Slurm REST API", "version": self.tag},
                         "paths": paths}, False
        m = re.fullmatch(r"/slurm/(v0\.0\.\d+)/(.*)", url.path)
        if not m or m.group(1) not in self.versions or m.group(1) not in MODELLED:
            # src/slurmrestd/operations.c: an unbound path is a plain-text 404.
            return 404, "Unable find requested URL. Please view /openapi/v3 for API reference.", True
        version, rest = m.groups()
        user = headers.get("X-SLURM-USER-NAME") or ""
        if headers.get("X-SLURM-USER-TOKEN") != self.token:
            return 401, "Authentication failure", True
        doc = {"meta": _meta(self.release, version, user), "errors": [], "warnings": []}

        def fail(code: int, err: tuple[int, str], description: str, source: str) -> tuple[int, dict, bool]:
            doc["errors"].append({"description": description, "error_number": err[0], "error": err[1],
                                  "source": source})
            return code, doc, False

        if rest == "job/submit" and method == "POST":
            return self._submit(version, body, user, doc, fail)
        if rest in ("jobs/", "jobs") and method == "GET":
            # slurmctld/jobs.c _op_handler_jobs -> OPENAPI_JOB_INFO_RESP (jobs, last_backfill,
            # last_update) at every tag read.
            doc.update(jobs=[j.info(version, self.cluster) for j in self.jobs.values()],
                       last_backfill=_no_val_dump(int(time.time())), last_update=_no_val_dump(int(time.time())))
            return 200, doc, False
        jm = re.fullmatch(r"job/(\d+)", rest)
        if jm and method == "GET":
            job = self.jobs.get(int(jm.group(1)))
            if job is None:
                # _handle_job_get: "Unable to query JobId=%s" with slurm_load_job's error, at HTTP
                # 404 (24.11.5, every version: tests/fixtures/slurmrestd/24.11/*/job_unknown_get.json).
                doc.update(jobs=[], last_backfill=_no_val_dump(0), last_update=_no_val_dump(0))
                return fail(404, E_INVALID_JOB_ID, f"Unable to query JobId={jm.group(1)}", "_handle_job_get")
            doc.update(jobs=[job.info(version, self.cluster)], last_backfill=_no_val_dump(0),
                       last_update=_no_val_dump(0))
            return 200, doc, False
        if rest in ("partitions/", "partitions", "nodes/", "nodes") and method == "GET":
            # The real server's answer for this cluster's 3 nodes of partition debug (recorded;
            # no scheduling is modelled here, so there is nothing to change in them).
            real = recorded(self.release, version, rest.rstrip("/"))
            if real is None:
                return 404, "Requested REST method is not defined at URL. Please view /openapi/v3 for API reference.", True
            key = rest.rstrip("/")
            doc[key] = real["body"][key]
            for extra in ("last_update", "last_backfill"):
                if extra in real["body"]:
                    doc[extra] = real["body"][extra]
            return 200, doc, False
        if jm and method == "DELETE":
            return self._delete(version, int(jm.group(1)), url.query, doc, fail)
        return 404, "Requested REST method is not defined at URL. Please view /openapi/v3 for API reference.", True

    def _submit(self, version: str, body, user: str, doc: dict, fail):
        """slurmctld/jobs.c _job_post (slurm-23-11-11-1 .. slurm-25-11-7-1) on JOB_SUBMIT_REQ."""
        minor = int(version.rsplit(".", 1)[1])
        if not isinstance(body, dict):
            return fail(400, E_REST_FAIL_PARSING, "unexpected empty query for job", "_job_post")
        for key in body:
            if key not in ("script", "jobs", "job"):
                # parsing.c: "Ignoring unknown field".
                doc["warnings"].append({"description": f"Ignoring unknown field \"{key}\" of type "
                                                       f"{type(body[key]).__name__} in JOB_SUBMIT_REQ",
                                        "source": "#/"})
        # A top-level "script" draws no warning at any release modelled: JOB_SUBMIT_REQ has it as
        # add_parse_deprec(..., SLURM_24_05_PROTOCOL_VERSION) at v0.0.41/42 of slurm-24-05-8-1 and
        # slurm-24-11-7-1, where parsing.c warns only for deprecated <= SLURM_MIN_PROTOCOL_VERSION
        # (23.02's there), and as a plain add_parse again from slurm-25-05-8-1 (v0.0.41-43) to
        # slurm-26-05-3-1 (v0.0.42-45). 26.05.3 took one at v0.0.44 and v0.0.45 with no warning.
        job_in = body.get("job")
        if body.get("jobs") is not None:
            return fail(500, E_REST_FAIL_PARSING, "HetJobs are not modelled by this stand-in", "#/jobs")
        if not isinstance(job_in, dict):
            return fail(400, E_REST_FAIL_PARSING,
                        "Specifing either \"job\" or \"jobs\" fields are required to submit job", "_job_post")
        desc = {}
        try:
            for key, value in job_in.items():
                if key not in JOB_FIELDS[version]:
                    doc["warnings"].append({"description": f"Ignoring unknown field \"{key}\" of type "
                                                           f"{type(value).__name__} in JOB_DESC_MSG",
                                            "source": f"#/job/{key}"})
                    continue
                desc[key] = parse_field(version, key, value, f"#/job/{key}")
            script = parse_field(version, "script", body.get("script"), "#/script")
        except ParseError as e:
            # parse_error() in parsers.c adds the error; DATA_PARSE fails and _job_post returns.
            return fail(500, e.code, e.description, e.source)
        script = script or desc.get("script")
        if not script:
            # _job_post: 'Populated "script" field is required for job submission'.
            return fail(400, E_JOB_SCRIPT_MISSING, "Populated \"script\" field is required for job submission",
                        "_job_post")
        if not desc.get("environment"):
            # slurmctld refuses a batch job without an environment (job_mgr.c _validate_job_desc).
            return fail(500, E_ENVIRONMENT_MISSING, "Batch job submission failed", "slurm_submit_batch_job()")
        job_id = self.next_id
        self.next_id += 1
        self.jobs[job_id] = Job(job_id, desc, script, user)
        # OPENAPI_JOB_SUBMIT_RESPONSE: job_id, step_id, job_submit_user_msg; v0.0.40-41 also the
        # deprecated "result" (JOB_SUBMIT_RESPONSE_MSG), gone from v0.0.42 (parsers.c at
        # slurm-24-11-5-1; 24.11.5's answers: tests/fixtures/slurmrestd/24.11/*/job_submit_held.json).
        doc.update(job_id=job_id, step_id="batch", job_submit_user_msg="")
        if minor <= 41:
            doc["result"] = {"job_id": job_id, "step_id": "batch", "error_code": 0, "error": "No error",
                             "job_submit_user_msg": ""}
        return 200, doc, False

    def _delete(self, version: str, job_id: int, query: str, doc: dict, fail):
        """DELETE /slurm/V/job/ID?signal=&flags= (OPENAPI_JOB_INFO_DELETE_QUERY: signal SIGNAL,
        flags WARN_FLAGS). No signal: SIGKILL; no flags: FULL_JOB (slurmctld/jobs.c
        _handle_job_delete slurm-23-11-11-1, _parse_job_delete slurm-24-11-7-1)."""
        q = {k: v[-1] for k, v in parse_qs(query).items()}
        try:
            sig = parse_field(version, "kill_warning_signal", q["signal"], "#/signal") if "signal" in q else 9
            flags = _flags(q["flags"], FLAGS["WARN_FLAGS"], "#/flags") if "flags" in q else ["FULL_JOB"]
        except ParseError as e:
            return fail(500, e.code, e.description, e.source)
        job = self.jobs.get(job_id)
        per_job = (0, "No error")
        if job is None:
            per_job = E_INVALID_JOB_ID
        elif job.state[0] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            per_job = E_ALREADY_DONE
        else:
            job.signals.append((sig, flags))
            if sig == 9:
                job.state, job.rc, job.sig = ["CANCELLED"], 0, 9
        if self.release in ("23.11", "24.05"):
            # slurm_kill_job(): an ended job is a warning, an unknown one an error.
            if per_job == E_ALREADY_DONE:
                doc["warnings"].append({"description": "Job was already sent signal", "source": "_handle_job_delete"})
            elif per_job[0]:
                return fail(500, per_job, f"unable to send signal to JobId={job_id}", "slurm_kill_job2()")
            return 200, doc, False
        minor = int(version.rsplit(".", 1)[1])
        if minor < 42:
            # 24.11.5 at v0.0.40/41: HTTP 200, no errors and no "status", whether the job was
            # signalled, had ended or never existed (tests/fixtures/slurmrestd/24.11/v0.0.4[01]/).
            return 200, doc, False
        # v0.0.42 on: each job's outcome is in "status" (KILL_JOBS_RESP_JOB: error {string, code,
        # message}, step_id, job_id, federation), and only failures are listed: a job signalled
        # answers "status": [] (24.11.5: tests/fixtures/slurmrestd/24.11/v0.0.42/job_held_delete.json).
        # An unknown id has no job id ({set: false}) and its own id as step_id.
        doc["status"] = [] if not per_job[0] else [
            {"error": {"string": per_job[1], "code": per_job[0], "message": per_job[1]},
             "step_id": str(job_id), "federation": {"sibling": ""},
             "job_id": _no_val_dump(job_id) if per_job != E_INVALID_JOB_ID else {"infinite": False, "number": 0,
                                                                                  "set": False}}]
        return 200, doc, False
