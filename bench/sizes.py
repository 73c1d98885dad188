"""The figures docs/performance.md gives for rendered jobs, produced here and only here.

    python bench/sizes.py            # print the two blocks
    python bench/sizes.py --write    # rewrite the sizes block in docs/performance.md
    python bench/sizes.py --write --rates   # ... and the render rates block (measured: slow, noisy)

Sizes (lines and bytes of every example's rendered artifact, the carried node runtime apart, and
the Nomad job at 2, 256 and 1,024 nodes) are a function of the tree: tests/test_docs_figures.py
fails when the doc's block is not what this script writes now. Render rates (renders/s in
process, per CPU-second, by backend and node count) depend on the machine: written with ``--rates``,
with the date, CPU count and load average they were measured under, never checked.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
DOC = REPO / "docs" / "performance.md"
SIZES = ("<!-- bench/sizes.py: sizes -->", "<!-- /bench/sizes.py: sizes -->")
RATES = ("<!-- bench/sizes.py: rates -->", "<!-- /bench/sizes.py: rates -->")
#: Every example on the backends it is written for (tests/golden/ holds the same renderings).
EXAMPLES = {"ddp-cpu": ("slurm", "local"), "sweep": ("slurm",), "ddp-gpu": ("slurm",), "nomad-gpu": ("slurm", "nomad", "nomad json"),
            "rl-servers": ("slurm", "nomad", "nomad json", "local")}


def _artifacts():
    """(example, backend, text) of every example on its backends (as `halo-sched render` in the
    checkout's top: a job file's relative script is given to the nodes from there)."""
    import contextlib

    import halo_sched

    for name, backends in EXAMPLES.items():
        spec = halo_sched.load(REPO / "examples" / f"{name}.yaml")
        for b in backends:
            with contextlib.chdir(REPO):
                if b == "nomad json":
                    out = name, "nomad (API JSON)", halo_sched.render(spec, "nomad", format="json")
                else:
                    out = name, "nomad (HCL)" if b == "nomad" else b, halo_sched.render(spec, b)
            yield out


def _split(text: str) -> tuple[str, str]:
    """(the artifact, the carried node runtime after it: empty when none)."""
    from halo_sched.node_runtime import runtime

    lines = runtime().base64_lines()
    at = text.find(lines)
    if at < 0:
        return text, ""
    head = text[:at].rsplit("\n", 2)[0] + "\n"  # the zip's comment line goes with it
    return head, text[len(head):]


def sizes_block() -> str:
    import halo_sched
    from halo_sched.backends.nomad.render import job_payload, render_hcl
    from halo_sched.node_runtime import runtime

    rt = runtime()
    out = ["| example | backend | lines | bytes | carried node runtime |", "|---|---|---|---|---|"]
    for name, backend, text in _artifacts():
        head, carried = _split(text)
        extra = f"+{carried.count(chr(10))} lines, {len(carried.encode()):,} B" if carried else "-"
        out.append(f"| {name} | {backend} | {head.count(chr(10)):,} | {len(head.encode()):,} | {extra} |")
    spec = halo_sched.load(REPO / "examples" / "nomad-gpu.yaml")
    row = []
    for n in (2, 16, 256, 1024):
        s = spec.model_copy(update={"nodes": n})
        api = json.dumps(job_payload(s), indent=2, ensure_ascii=False) + "\n"
        row.append(f"{n:,} nodes: API payload {len(api.encode()):,} B, HCL {len(render_hcl(s).encode()):,} B")
    out += ["", "Nomad job of examples/nomad-gpu.yaml by node count: " + "; ".join(row) + ".",
            f"The node runtime (halo_sched/node/, version {rt.version}): a {len(rt.zip_bytes):,} B zip (members stored), "
            f"{len(rt.base64):,} B of base64 (one zlib stream); on Nomad one item of the job's Variable (at most 64 KiB), "
            f"without what only a SLURM batch shell runs: {len(runtime(batch=False).base64):,} B of base64."]
    return "\n".join(out)


def rates_block() -> str:
    import halo_sched

    # CPU time of this process, not wall time: on a shared machine other work moves wall time by
    # a factor of several, the process's own CPU time by a few percent.
    def per_call(fn, seconds: float = 0.3) -> float:
        fn()
        k, t0 = 0, time.process_time()
        while time.process_time() - t0 < seconds:
            fn()
            k += 1
        return (time.process_time() - t0) / k

    lines = [f"Measured {time.strftime('%Y-%m-%d')} on {os.cpu_count()} CPUs, load average "
             f"{os.getloadavg()[0]:.1f}, Python {sys.version.split()[0]} (renders per CPU-second, in process):", ""]
    for backend, f in {"slurm": "ddp-gpu.yaml", "nomad": "nomad-gpu.yaml", "local": "ddp-cpu.yaml"}.items():
        spec = halo_sched.load(REPO / "examples" / f)
        rates = []
        for nodes in (2, 256, 1024):
            s = spec.model_copy(update={"nodes": nodes})
            rates.append(f"{nodes:,} nodes {1 / per_call(lambda: halo_sched.render(s, backend)):,.0f}/s")
        lines.append(f"- {backend} ({f}): " + ", ".join(rates))
    return "\n".join(lines)


def replace_block(text: str, marks: tuple[str, str], body: str) -> str:
    pattern = re.compile(re.escape(marks[0]) + r"\n.*?\n" + re.escape(marks[1]), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{DOC}: no block between {marks[0]} and {marks[1]}")
    return pattern.sub(lambda _: f"{marks[0]}\n{body}\n{marks[1]}", text)


def doc_block(marks: tuple[str, str]) -> str | None:
    m = re.search(re.escape(marks[0]) + r"\n(.*?)\n" + re.escape(marks[1]), DOC.read_text(), re.S)
    return m.group(1) if m else None


def main(argv: list[str]) -> int:
    sizes = sizes_block()
    rates = rates_block() if "--rates" in argv or "--write" not in argv else None
    if "--write" in argv:
        text = replace_block(DOC.read_text(), SIZES, sizes)
        if rates is not None:
            text = replace_block(text, RATES, rates)
        DOC.write_text(text)
        print(f"wrote {DOC.relative_to(REPO)}")
        return 0
    print(sizes, rates, sep="\n\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
