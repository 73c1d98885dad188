"""The names the backends and the nodes share are defined once (halo_sched/node/contract.py) and
passed into the templates: no template spells an environment variable of the contract or the
warning carrier itself, so renaming one changes every script at once."""
from __future__ import annotations

import re

from halo_sched.node.contract import NAMES, WARNING_CARRIER
from halo_sched.templating import TEMPLATES

# Every name of the contract (and each role variable's prefix), and the carrier alone or as SIG...
_NAMES = [v for k, v in vars(type(NAMES)).items() if not k.startswith("_") and isinstance(v, str)]
_LITERAL = re.compile(r"(?<![A-Za-z0-9_])(%s)(?![A-Za-z0-9_])|(?<![A-Za-z0-9_])(SIG)?%s(?![A-Za-z0-9_])" % (
    "|".join(re.escape(n) for n in sorted(_NAMES, key=len, reverse=True) if not n.endswith("_")),
    re.escape(WARNING_CARRIER)))
_PREFIX = re.compile(re.escape(NAMES.role_prefix) + r"<?[A-Za-z]+>?_(URLS|ADDRS|ADDRS_FILE|GROUP_PORT)\b")


def test_no_template_spells_a_contract_name():
    templates = sorted(TEMPLATES.rglob("*.j2"))
    assert len(templates) >= 9
    found = []
    for path in templates:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for m in list(_LITERAL.finditer(line)) + list(_PREFIX.finditer(line)):
                found.append(f"{path.relative_to(TEMPLATES)}:{n}: {m.group(0)}")
    assert not found, "names of halo_sched/node/contract.py written in a template (pass them in):\n" + "\n".join(found)


def test_the_pattern_finds_what_it_looks_for():
    """The check itself: each kind of literal it must find is found."""
    for text in ("export HALO_NODE_RANK=1", "trap halo_warning URG", "as SIGURG, to", "$HALO_MASTER_ADDR_FILE",
                 "HALO_SERVER_<NAME>_ADDRS", "HALO_SERVER_POLICY_URLS"):
        assert _LITERAL.search(text) or _PREFIX.search(text), text
    for text in ("HALO_ENTRY=$(cat", "HALO_SERVER_ENTRY_0", "SURGE", "URGENT", "{{ names.node_rank | var }}"):
        assert not (_LITERAL.search(text) or _PREFIX.search(text)), text
