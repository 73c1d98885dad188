"""hcl2json's reading of a rendered Nomad job -> the API job, the way jobspec2 decodes it: by the
struct tags of Nomad's ``api`` package (nomad_api_fields.json, extracted from the Go source by
extract_api_fields.py, which names the tag), then jobspec2's normalizeJob. Written against
Nomad's structs, not against halo-sched's renderer: a block or attribute api's structs do not
have raises, and whatever the file says reaches the comparison."""
from __future__ import annotations

import json
import re
from fractions import Fraction
from pathlib import Path

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


# Nomad's api package, as data: every struct's fields with their HCL name, kind and Go type, from
# the struct tags jobspec2 decodes with (gohcl), extracted from the Go source by
# extract_api_fields.py; the file names the tag and commit.
_API = json.loads((Path(__file__).resolve().parent / "nomad_api_fields.json").read_text())
SOURCE: dict = _API["source"]
STRUCTS: dict[str, list[dict]] = _API["structs"]


def _label_field(struct: str) -> str | None:
    return next((f["field"] for f in STRUCTS.get(struct, []) if f["kind"] == "label"), None)


def _decode(struct: str, body: dict, label: str | None = None) -> dict:
    """One HCL body -> the api struct ``struct`` as JSON (Go field names), by its tags."""
    if struct not in STRUCTS:
        raise AssertionError(f"api.{struct} has no HCL fields at {SOURCE['tag']}")
    by_hcl = {f["hcl"]: f for f in STRUCTS[struct] if f["kind"] != "label"}
    out: dict = {}
    if label is not None:
        out[_label_field(struct)] = label
    for key, value in body.items():
        f = by_hcl.get(key)
        assert f is not None, f"{struct}: no field with HCL name {key!r} in api.{struct} at {SOURCE['tag']}"
        out[f["field"]] = _value(f, value, f"{struct}.{f['field']}")
    return out


def _value(f: dict, value, where: str):
    gotype = f["type"]
    if f["kind"] != "block":
        # gohcl decodes a duration attribute from its Go duration text (jobspec2's decoder hook).
        return parse_go_duration(value) if gotype.lstrip("*") == "time.Duration" else value
    if gotype.startswith("map[string]"):
        inner = gotype[len("map[string]"):]
        assert inner in ("string", "any", "interface{}"), f"{where}: labelled map blocks ({gotype}) are not mapped"
        return _one(value, where)  # meta, env, config: the body as it is
    elem = gotype.lstrip("[]*")
    if gotype.startswith("[]"):
        if _label_field(elem) is not None:  # labelled blocks: hcl2json gives {label: [body, ...]}
            return [_decode(elem, body, label) for label, bodies in value.items() for body in bodies]
        return [_decode(elem, body) for body in value]
    return _decode(elem, _one(value, where))


def _normalize_network_ports(networks: list[dict]) -> None:
    """jobspec2/parse_job.go normalizeNetworkPorts (v2.0.5): every ``port`` block decodes into
    DynamicPorts; those with a static value move to ReservedPorts. Keys left empty are dropped
    (Go's nil slices; the payload omits them)."""
    for n in networks or []:
        ports = n.pop("DynamicPorts", None) or []
        dynamic = [p for p in ports if not p.get("Value")]
        reserved = [p for p in ports if p.get("Value")]
        if dynamic:
            n["DynamicPorts"] = dynamic
        if reserved:
            n["ReservedPorts"] = reserved


def api_job(doc: dict) -> dict:
    """The decoded hcl2json document of one ``job`` -> the API job (``{"Job": <this>}``): the
    body decoded by api.Job's struct tags, then jobspec2/parse_job.go normalizeJob (v2.0.5): ID
    and Name default to the block's label; network ports normalized. The defaults normalizeJob
    and the servers' Canonicalize add to templates and the like are not added: they reach an
    API payload the same way, so comparing what was written is comparing the jobs."""
    ((label, blocks),) = doc["job"].items()
    job = _decode("Job", _one(blocks, "job"))
    job.setdefault("ID", label)
    job.setdefault("Name", label)
    for g in job.get("TaskGroups", []):
        _normalize_network_ports(g.get("Networks"))
        for t in g.get("Tasks", []):
            _normalize_network_ports((t.get("Resources") or {}).get("Networks"))
            _normalize_identity(t)
    return job


def _normalize_identity(task: dict) -> None:
    """jobspec2/parse_job.go normalizeJob (v2.0.5, "move the default identity to Task.Identity"):
    the first ``identity`` block without a name (or named "default") becomes ``Identity`` and
    leaves ``Identities``, whose empty remainder is dropped here (the JSON form never has it)."""
    ids = task.get("Identities")
    if not ids:
        return
    i = next((k for k, w in enumerate(ids) if w.get("Name", "") in ("", "default")), None)
    if i is not None:
        task["Identity"] = ids.pop(i)
    if not ids:
        del task["Identities"]


def comparable(job: dict) -> dict:
    """An API job as the HCL can express it: Name is the ID's (the HCL has no separate name)
    and group order is by name (hcl2json returns labelled blocks as a map)."""
    out = {k: v for k, v in job.items() if k != "Name"}
    out["TaskGroups"] = sorted(job["TaskGroups"], key=lambda g: g["Name"])
    return out
