"""hcl2json's reading of a rendered Nomad job -> the API job, by jobspec2's field mapping, for
the subset halo-sched renders. Any block or attribute outside that subset raises: the test then
says so instead of comparing less than the file holds."""
from __future__ import annotations

import re
from fractions import Fraction

# Go's time.ParseDuration, written here from its documentation rather than taken from halo-sched
# (whose payload this reading is compared with): a sequence of decimal numbers, each with an
# optional fraction and a unit, ns us µs ms s m h; "0" alone is zero.
_GO_UNITS = {"ns": 1, "us": 10**3, "µs": 10**3, "μs": 10**3, "ms": 10**6, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9}
_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_go_duration(text: str) -> int:
    if text == "0":
        return 0
    sign, body = (-1, text[1:]) if text.startswith("-") else (1, text.removeprefix("+"))
    parts = _GO_PART.findall(body)
    if not body or "".join(n + u for n, u in parts) != body:
        raise ValueError(f"not a Go duration: {text!r}")
    return sign * int(sum(Fraction(n) * _GO_UNITS[u] for n, u in parts))


def _one(blocks: list, what: str) -> dict:
    assert isinstance(blocks, list) and len(blocks) == 1, f"{what}: expected one block, got {blocks!r}"
    return blocks[0]


def _take(body: dict, known: set[str], what: str) -> dict:
    unknown = set(body) - known
    assert not unknown, f"{what}: unexpected {sorted(unknown)}"
    return body


def _ns(text: str) -> int:
    return parse_go_duration(text)


def _task(name: str, body: dict) -> dict:
    _take(body, {"driver", "kill_timeout", "config", "env", "template", "resources"}, f"task {name}")
    res = _take(_one(body["resources"], "resources"), {"cpu", "memory", "device"}, "resources")
    resources: dict = {"CPU": res["cpu"], "MemoryMB": res["memory"]}
    if "device" in res:
        resources["Devices"] = [{"Name": dev, **{"Count": _one(b, dev)["count"]}} for dev, b in res["device"].items()]
    templates = []
    for t in body.get("template", []):
        _take(t, {"destination", "change_mode", "perms", "left_delimiter", "right_delimiter", "data"}, "template")
        tpl = {"EmbeddedTmpl": t["data"], "DestPath": t["destination"]}
        if "perms" in t:
            tpl["Perms"] = t["perms"]
        tpl["ChangeMode"] = t["change_mode"]
        if "left_delimiter" in t:
            tpl["LeftDelim"], tpl["RightDelim"] = t["left_delimiter"], t["right_delimiter"]
        templates.append(tpl)
    return {
        "Name": name, "Driver": body["driver"], "Config": _one(body["config"], "config"),
        "Env": _one(body["env"], "env"), "Templates": templates, "Resources": resources,
        "KillTimeout": _ns(body["kill_timeout"]),
    }


def _group(name: str, body: dict) -> dict:
    _take(body, {"count", "max_run_duration", "restart", "reschedule", "disconnect", "meta", "network", "service", "task"},
          f"group {name}")
    restart = _take(_one(body["restart"], "restart"), {"attempts", "mode", "interval", "delay"}, "restart")
    resched = _take(_one(body["reschedule"], "reschedule"), {"attempts", "unlimited"}, "reschedule")
    g: dict = {
        "Name": name, "Count": body["count"],
        "RestartPolicy": {"Attempts": restart["attempts"], "Mode": restart["mode"],
                          "Interval": _ns(restart["interval"]), "Delay": _ns(restart["delay"])},
        "ReschedulePolicy": {"Attempts": resched["attempts"], "Interval": 0, "Unlimited": resched["unlimited"]},
    }
    if "disconnect" in body:
        d = _take(_one(body["disconnect"], "disconnect"), {"lost_after", "replace"}, "disconnect")
        g["Disconnect"] = {**({"LostAfter": _ns(d["lost_after"])} if "lost_after" in d else {}), "Replace": d["replace"]}
    g["Meta"] = _one(body["meta"], "meta")
    g["Tasks"] = [_task(t, _one(b, t)) for t, b in body["task"].items()]
    if "max_run_duration" in body:
        g["MaxRunDuration"] = _ns(body["max_run_duration"])
    networks = []
    for net in body.get("network", []):
        _take(net, {"mode", "port"}, "network")
        n: dict = {"Mode": net["mode"]}
        if "port" in net:
            # jobspec2: a port block with `static` is reserved, one without is dynamic.
            ports = {label: _take(_one(p, label), {"static"}, f"port {label}") for label, p in net["port"].items()}
            dynamic = [{"Label": label} for label, p in ports.items() if "static" not in p]
            reserved = [{"Label": label, "Value": p["static"]} for label, p in ports.items() if "static" in p]
            if dynamic:
                n["DynamicPorts"] = dynamic
            if reserved:
                n["ReservedPorts"] = reserved
        networks.append(n)
    g["Networks"] = networks
    if "service" in body:
        g["Services"] = [{"Name": s["name"], "Provider": s["provider"], "PortLabel": s["port"],
                          **({"Tags": s["tags"]} if "tags" in s else {})} for s in body["service"]]
    return g


def api_job(doc: dict) -> dict:
    """The decoded hcl2json document of one ``job`` -> the API job (``{"Job": <this>}``)."""
    ((job_id, blocks),) = doc["job"].items()
    body = _take(_one(blocks, "job"), {"type", "datacenters", "namespace", "region", "priority", "constraint", "meta", "group"}, "job")
    job: dict = {
        "ID": job_id, "Type": body["type"], "Datacenters": body["datacenters"],
        "Constraints": [{"Operand": c["operator"], "RTarget": c["value"]} for c in body.get("constraint", [])],
        "Meta": _one(body["meta"], "meta"),
        "TaskGroups": [_group(name, _one(b, name)) for name, b in body["group"].items()],
    }
    for hcl_key, api_key in (("namespace", "Namespace"), ("region", "Region"), ("priority", "Priority")):
        if hcl_key in body:
            job[api_key] = body[hcl_key]
    return job


def comparable(job: dict) -> dict:
    """An API job as the HCL can express it: Name is the ID's (the HCL has no separate name)
    and group order is by name (hcl2json returns labelled blocks as a map)."""
    out = {k: v for k, v in job.items() if k != "Name"}
    out["TaskGroups"] = sorted(job["TaskGroups"], key=lambda g: g["Name"])
    return out
