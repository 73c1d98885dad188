"""Extract the HCL <-> API field list of Nomad's ``api`` package from its Go source, as data.

Every struct of ``api/*.go`` (tests excluded) with at least one ``hcl:"..."`` struct tag: for
each field its Go name (the API JSON key: the api package has no json tags), the HCL name and
kind from the tag (``optional``, ``block``, ``label``; jobspec2 decodes with these tags through
gohcl), and its Go type. Output: ``nomad_api_fields.json`` beside this file, with the tag and
commit it came from. Usage::

    python tests/hclparse/extract_api_fields.py /path/to/nomad.git v2.0.5

(a bare or ordinary git directory of hashicorp/nomad). jobspec.py reads only the JSON.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

_STRUCT = re.compile(r"^type (\w+) struct \{\n(.*?)^\}", re.M | re.S)
_FIELD = re.compile(r"^\s+(\w+)\s+([^`\n]+?)\s+`([^`]*)`", re.M)
_HCL_TAG = re.compile(r'hcl:"([^"]*)"')


def _git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True, text=True).stdout


def extract(repo: str, tag: str) -> dict:
    commit = _git(repo, "rev-parse", f"{tag}^{{commit}}").strip()
    files = sorted(p for p in _git(repo, "ls-tree", "--name-only", tag, "api/").split()
                   if p.endswith(".go") and not p.endswith("_test.go"))
    structs: dict[str, list[dict]] = {}
    for path in files:
        text = _git(repo, "show", f"{tag}:{path}")
        for m in _STRUCT.finditer(text):
            fields = []
            for f in _FIELD.finditer(m.group(2)):
                tag_m = _HCL_TAG.search(f.group(3))
                if not tag_m:
                    continue
                name, _, kind = tag_m.group(1).partition(",")
                fields.append({"field": f.group(1), "hcl": name, "kind": kind or "attr", "type": f.group(2).strip()})
            if fields:
                structs[m.group(1)] = fields
    return {"source": {"repository": "hashicorp/nomad", "tag": tag, "commit": commit, "files": files,
                       "extracted_by": "tests/hclparse/extract_api_fields.py"},
            "structs": dict(sorted(structs.items()))}


if __name__ == "__main__":
    repo, tag = sys.argv[1], sys.argv[2]
    out = Path(__file__).resolve().parent / "nomad_api_fields.json"
    out.write_text(json.dumps(extract(repo, tag), indent=1) + "\n")
    print(f"wrote {out}")
