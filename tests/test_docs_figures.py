"""docs/performance.md's figures for rendered jobs come from bench/sizes.py: a stale one fails here.

Regenerate with ``python bench/sizes.py --write`` (with the golden files, when a render changed).
The render rates are measured, not derived: written with ``--rates``, never compared.
"""
from __future__ import annotations

import importlib.util

from helpers import REPO


def _sizes_module():
    spec = importlib.util.spec_from_file_location("bench_sizes", REPO / "bench" / "sizes.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_rendered_sizes_in_the_doc_are_what_the_tree_renders():
    sizes = _sizes_module()
    written = sizes.doc_block(sizes.SIZES)
    assert written is not None, "docs/performance.md lost its bench/sizes.py block"
    assert written == sizes.sizes_block(), \
        "docs/performance.md's rendered sizes are stale: run python bench/sizes.py --write"


def test_the_rates_block_was_written_by_the_script():
    sizes = _sizes_module()
    rates = sizes.doc_block(sizes.RATES)
    assert rates is not None and rates.startswith("Measured ") and "renders per CPU-second" in rates, \
        "docs/performance.md's render rates were not written by python bench/sizes.py --write --rates"


def test_the_goodput_table_in_the_doc_is_what_bench_goodput_prints():
    """bench/goodput.py is seeded: its default table is the doc's, figure for figure."""
    import sys

    spec = importlib.util.spec_from_file_location("bench_goodput", REPO / "bench" / "goodput.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    written = mod.doc_block()
    assert written is not None, "docs/performance.md lost its bench/goodput.py block"
    assert written == mod.table(mod.Params()), "docs/performance.md's goodput table is stale: python bench/goodput.py --write"
