"""HashiCorp's HCL parser for the tests: ``@cdktf/hcl2json`` (the Go hashicorp/hcl library built to
WebAssembly) in one long-lived Node process, so that many documents (hypothesis examples) share
its start-up cost.

``parse(text)`` returns hcl2json's JSON: every block is a list of bodies (``{"job": {"ID": [body]}}``,
``{"group": {"node-0": [body]}}``, ``{"meta": [body]}``), and every string is the *template source*
of its value: escapes are kept (``$${``, ``%%{``) and an interpolation shows as ``${...}``.
``load(text)`` decodes those strings by HCL's template rules (``$${`` -> ``${``, ``%%{`` -> ``%{``)
and refuses any real interpolation or directive: halo-sched renders none, so one there means user
text changed the job's meaning.

Install: ``make hcl-parser`` (Node from Debian, then ``npm ci`` in tests/hclparse, version pinned by
package-lock.json).
"""
from __future__ import annotations

import atexit
import json
import re
import shutil
import subprocess
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
_lock = threading.Lock()
_proc: subprocess.Popen | None = None


class HclSyntaxError(ValueError):
    pass


def _start() -> subprocess.Popen:
    node = shutil.which("node") or shutil.which("nodejs")
    if node is None or not (HERE / "node_modules" / "@cdktf" / "hcl2json").is_dir():
        raise RuntimeError("the HCL parser is not installed: run `make hcl-parser` (Node.js + npm ci in tests/hclparse)")
    proc = subprocess.Popen([node, str(HERE / "parse.js")], cwd=HERE, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, encoding="utf-8", bufsize=1)
    atexit.register(_stop, proc)
    return proc


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.stdin.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()


def parse_many(texts: list[str], name: str = "job.nomad.hcl") -> list[dict | HclSyntaxError]:
    """Parse several documents in one round trip; a syntax error comes back as its exception."""
    global _proc
    with _lock:
        if _proc is None or _proc.poll() is not None:
            _proc = _start()
        for text in texts:
            _proc.stdin.write(json.dumps({"name": name, "text": text}) + "\n")
        _proc.stdin.flush()
        out: list[dict | HclSyntaxError] = []
        for _ in texts:
            line = _proc.stdout.readline()
            if not line:
                _proc = None
                raise RuntimeError("the HCL parser process died")
            answer = json.loads(line)
            out.append(answer["ok"] if "ok" in answer else HclSyntaxError(answer["error"]))
        return out


def parse(text: str) -> dict:
    (result,) = parse_many([text])
    if isinstance(result, Exception):
        raise result
    return result


def template_literal(source: str) -> str:
    """The value of HCL template source that holds only literal text (left to right, as
    hclsyntax scans it: ``$${`` and ``%%{`` are escapes, ``$$`` before anything else is text)."""
    out, i = [], 0
    while i < len(source):
        if source.startswith(("$${", "%%{"), i):
            out.append(source[i + 1:i + 3])
            i += 3
        elif source.startswith(("${", "%{"), i):
            raise ValueError(f"HCL interpolation or directive at {i}: {source[i:i + 30]!r}")
        else:
            out.append(source[i])
            i += 1
    return "".join(out)


_LOCAL = re.compile(r"\$\{local\.([A-Za-z_][A-Za-z0-9_]*)\}")


def decode(value, local: dict | None = None):
    """hcl2json output -> plain values, strings decoded by :func:`template_literal`; a string that
    is exactly one reference to a local (``${local.NAME}``, as hcl2json shows ``data = local.NAME``)
    is that local's value."""
    if isinstance(value, list):
        return [decode(v, local) for v in value]
    if isinstance(value, dict):
        return {k: decode(v, local) for k, v in value.items()}
    if isinstance(value, str):
        m = _LOCAL.fullmatch(value)
        if m and local is not None and m.group(1) in local:
            return local[m.group(1)]
        return template_literal(value)
    return value


def resolve(doc: dict) -> dict:
    """The document as Nomad reads it: its top-level ``locals`` blocks evaluated (each a literal
    string here) and each ``local.NAME`` replaced by its value. Nomad's jobspec2 does the same:
    ``locals`` attributes are evaluated into the ``local`` accessor of the context the job block
    is decoded with (jobspec2/types.config.go: parseLocalVariables, evaluateLocalVariables,
    EvalContext's localsAccessor); a name defined twice is an error there."""
    local: dict = {}
    for block in doc.get("locals", []):
        for name, value in block.items():
            assert name not in local, f"local {name} defined twice"
            local[name] = decode(value)
    return decode({k: v for k, v in doc.items() if k != "locals"}, local)


def load(text: str) -> dict:
    return resolve(parse(text))


def load_many(texts: list[str]) -> list[dict]:
    out = []
    for r in parse_many(texts):
        if isinstance(r, Exception):
            raise r
        out.append(resolve(r))
    return out
