"""``halo-sched completion bash|zsh|fish`` (issue 41, item 5): scripts made from the parser, run
in their shells. bash: loaded with ``source <(...)`` and driven through COMP_WORDS as readline
would; zsh: its function driven with ``words``/``CURRENT`` and the completion builtins stood in
for (they exist only inside a completion widget); fish: ``complete -C`` on a command line. zsh and
fish run where they are installed (``make test`` and ``make test-fast`` install them), else their
tests skip saying so; with CI=true they fail instead (a fresh machine's run once skipped them)."""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

import pytest

from halo_sched import cli
from halo_sched.commands import completion
from helpers import in_ci

BASH_CASES = [
    # (the words before the cursor, the word being completed, what is offered)
    ([], "su", ["submit"]),
    (["submit"], "--ba", ["--backend"]),
    (["submit"], "", ["job.yaml", "notes.txt", "sub"]),  # FILE: the directory's entries
    (["submit"], "jo", ["job.yaml"]),
    (["submit", "--backend"], "", ["local", "nomad", "slurm"]),
    (["submit", "--backend", "slurm"], "jo", ["job.yaml"]),  # the option's value is no positional
    (["submit", "job.yaml"], "", []),  # one FILE only
    (["render", "job.yaml", "--format"], "", ["hcl", "json"]),
    (["validate", "job.yaml"], "no", ["notes.txt"]),  # FILE...: as many as given
    (["completion"], "", ["bash", "fish", "zsh"]),
    (["nodes"], "", ["clear"]),
    (["nodes", "clear"], "", []),  # HOST: nothing to offer
    (["cancel"], "--w", ["--wait"]),
    (["timeline", "ID", "--svg"], "no", ["notes.txt"]),
    (["--debug"], "vali", ["validate"]),
]


@pytest.fixture
def where(tmp_path):
    for name in ("job.yaml", "notes.txt"):
        (tmp_path / name).write_text("")
    (tmp_path / "sub").mkdir()
    return tmp_path


def generated(shell: str, cwd) -> str:
    r = subprocess.run([sys.executable, "-m", "halo_sched.cli", "completion", shell], capture_output=True,
                       text=True, timeout=60, cwd=cwd)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    return r.stdout


def _bash_quote(word: str) -> str:
    return "'" + word.replace("'", "'\\''") + "'"


def bash_offers(cases, cwd) -> list[list[str]]:
    """COMPREPLY for each case, the script loaded as a user would (source <(...))."""
    lines = [f'source <("{sys.executable}" -m halo_sched.cli completion bash) || exit 9']
    for before, word in cases:
        words = " ".join(_bash_quote(w) for w in ["halo-sched", *before, word])
        lines += [f"COMP_WORDS=({words}); COMP_CWORD={len(before) + 1}; COMPREPLY=()", "_halo_sched",
                  'printf "%s\\n" "${COMPREPLY[@]}" | sort; echo "=="']
    r = subprocess.run(["bash", "--norc", "-c", "\n".join(lines)], capture_output=True, text=True, timeout=60,
                       cwd=cwd, env=os.environ)
    assert r.returncode == 0, r.stderr
    blocks = r.stdout.split("==\n")[:-1]
    return [[x for x in b.splitlines() if x] for b in blocks]


def test_bash_loads_it_as_halo_scheds_completion(where):
    r = subprocess.run(["bash", "--norc", "-c",
                        f'source <("{sys.executable}" -m halo_sched.cli completion bash); complete -p halo-sched'],
                       capture_output=True, text=True, timeout=60, cwd=where, env=os.environ)
    assert r.returncode == 0 and r.stdout.strip() == "complete -F _halo_sched halo-sched", (r.stdout, r.stderr)


def test_bash_offers_commands_options_values_and_files(where):
    got = bash_offers([(b, w) for b, w, _ in BASH_CASES], where)
    for (before, word, want), offered in zip(BASH_CASES, got):
        assert offered == want, (before, word, offered)


def test_bash_offers_every_command_and_option_the_parser_has(where):
    """Nothing offered that does not parse, nothing that parses left out."""
    top, commands = completion.model(cli.build_parser())
    assert sorted(c.name for c in commands) == sorted(cli.COMMANDS)
    cases = [([], "")] + [([c.name], "-") for c in commands]
    got = bash_offers(cases, where)
    assert got[0] == sorted([c.name for c in commands] + [s for o in top for s in o.strings])
    for c, offered in zip(commands, got[1:]):
        parsed = cli.build_parser(only=c.name)._subparsers._group_actions[0].choices[c.name]._option_string_actions
        assert offered == sorted(parsed), c.name


def test_the_scripts_follow_the_parser_not_a_list_written_by_hand():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    p = sub.add_parser("frobnicate", help="a command added to the parser")
    p.add_argument("--level", choices=("low", "high"))
    p.add_argument("FILE", metavar="FILE")
    for shell in ("bash", "zsh", "fish"):
        text = completion.script(shell, parser)
        assert "frobnicate" in text and "--level" in text or "-l level" in text, shell
        assert "low high" in text, shell
    # A word a shell would read as more than a word is refused, never written.
    p.add_argument("--odd", choices=("a;rm -rf ~",))
    with pytest.raises(ValueError, match="not a plain word"):
        completion.script("bash", parser)


def test_an_unknown_shell_is_exit_2(where):
    r = subprocess.run([sys.executable, "-m", "halo_sched.cli", "completion", "tcsh"], capture_output=True, text=True,
                       timeout=60, cwd=where)
    assert r.returncode == 2 and "invalid choice: 'tcsh'" in r.stderr and "Traceback" not in r.stderr


# ---- zsh ----------------------------------------------------------------------------------------

ZSH_STUBS = r"""
compadd() { [[ $1 == -- ]] && shift; print -l -- "$@"; }
_describe() { local w; for w in ${(P)4}; do [[ ${w%%:*} == ${PREFIX}* ]] && print -- ${w%%:*}; done; }
_files() { print -- '<files>'; }
compdef() { print -- "compdef $*"; }
"""


def need_shell(name: str) -> None:
    """Skip the test without shell ``name``; with CI=true, fail it: CI runs every shell's test."""
    if shutil.which(name):
        return
    why = f"{name} is not installed (make completion-shells, or apt-get install {name})"
    if in_ci():
        pytest.fail(why + ": CI=true runs this test")
    pytest.skip(why)


def test_zsh_runs_it(where):
    need_shell("zsh")
    (where / "c.zsh").write_text(generated("zsh", where))
    assert subprocess.run(["zsh", "-n", "c.zsh"], cwd=where, timeout=60).returncode == 0
    cases = [(["su"], "su"), (["submit", "--backend", ""], ""), (["cancel", "--w"], "--w"),
             (["submit", "--backend", "slurm", ""], ""), (["completion", ""], ""), (["nodes", "clear", ""], "")]
    lines = [ZSH_STUBS, "source ./c.zsh"]
    for words, prefix in cases:
        lines += ["words=(halo-sched " + " ".join(f"'{w}'" for w in words) + f"); CURRENT={len(words) + 1}; "
                  f"PREFIX='{prefix}'", "_halo_sched; print -r -- '=='"]
    r = subprocess.run(["zsh", "-f", "-c", "\n".join(lines)], capture_output=True, text=True, timeout=60, cwd=where)
    assert r.returncode == 0, r.stderr
    head, *blocks = r.stdout.split("compdef _halo_sched halo-sched\n", 1)[1].split("==\n")
    assert [b.split() for b in [head] + blocks][:len(cases)] == [
        ["submit"], ["local", "nomad", "slurm"], ["--wait"], ["<files>"], ["bash", "zsh", "fish"], []]


# ---- fish ---------------------------------------------------------------------------------------


def test_fish_runs_it(where):
    need_shell("fish")
    (where / "c.fish").write_text(generated("fish", where))
    assert subprocess.run(["fish", "-n", "c.fish"], cwd=where, timeout=60).returncode == 0
    cases = ["halo-sched sub", "halo-sched submit --backend ", "halo-sched completion ", "halo-sched submit jo",
             "halo-sched cancel --w", "halo-sched render job.yaml --format "]
    script = "source c.fish; " + "; ".join(f"complete -C{c!r}; echo ==" for c in cases)
    r = subprocess.run(["fish", "--no-config", "-c", script], capture_output=True, text=True, timeout=60, cwd=where,
                       env={**os.environ, "HOME": str(where)})
    assert r.returncode == 0, r.stderr
    got = [[line.split("\t")[0] for line in b.splitlines()] for b in r.stdout.split("==\n")[:-1]]
    assert got == [["submit"], ["local", "nomad", "slurm"], ["bash", "fish", "zsh"], ["job.yaml"], ["--wait"],
                   ["hcl", "json"]], r.stdout
    assert "submit\tsubmit a job; prints its id on the last line of stdout" in r.stdout  # the help, as description
