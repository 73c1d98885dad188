"""``halo-sched completion bash|zsh|fish``: a shell completion script, made from the command
line's own parser (``halo_sched.cli.build_parser``, handed over in ``args``), so that it offers exactly the commands and
options that parse, each option's values where the parser knows them (``--format``'s choices,
the backends for ``--backend``, files for ``FILE``), and the help texts (zsh, fish).

    source <(halo-sched completion bash)        # ~/.bashrc
    source <(halo-sched completion zsh)         # ~/.zshrc, after compinit
    halo-sched completion fish | source         # ~/.config/fish/config.fish

Nothing here is written by hand per command: a command or option added to the parser is in the
next script (tests/test_completion.py runs each script in its shell)."""
from __future__ import annotations

import argparse
import re
import sys
from typing import NamedTuple

#: What a word of a completion script may be (names, options, choices): nothing a shell reads
#: as more than a word. The parser's are; one that is not is refused rather than quoted.
_WORD = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.]*$|^--?[A-Za-z0-9][-A-Za-z0-9_]*$")
FILES = "files"  # a value (or positional) that is a path


class Option(NamedTuple):
    strings: tuple[str, ...]
    takes_value: bool
    values: tuple[str, ...] | str | None  # choices, FILES, or None (free text)
    help: str


class Command(NamedTuple):
    name: str
    help: str
    options: tuple[Option, ...]
    #: Each positional in order: its choices, FILES or None; the last one repeats when it takes many.
    positionals: tuple[tuple[str, ...] | str | None, ...]
    repeats: bool


def _word(text: str) -> str:
    if not _WORD.match(text):
        raise ValueError(f"{text!r} is not a plain word; a completion script cannot carry it")
    return text


def _values(action: argparse.Action) -> tuple[str, ...] | str | None:
    if action.choices:
        return tuple(_word(str(c)) for c in action.choices)
    if action.dest == "backend":
        from ..backends import names

        return tuple(_word(n) for n in names())
    if action.metavar == "FILE" or action.dest in ("file", "files"):
        return FILES
    return None


def _help(action_or_text) -> str:
    text = action_or_text if isinstance(action_or_text, str) else (action_or_text.help or "")
    if text == argparse.SUPPRESS:
        return ""
    text = " ".join(text.split())
    return text if len(text) <= 100 else text[:97] + "..."


def _options(parser: argparse.ArgumentParser) -> tuple[Option, ...]:
    out = []
    for a in parser._actions:
        if not a.option_strings or a.help == argparse.SUPPRESS:
            continue
        out.append(Option(tuple(_word(s) for s in a.option_strings), a.nargs != 0,
                          _values(a) if a.nargs != 0 else None, _help(a)))
    return tuple(out)


def model(parser: argparse.ArgumentParser) -> tuple[tuple[Option, ...], tuple[Command, ...]]:
    """The top-level options and each command of ``parser`` (the whole one: ``build_parser()``)."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: _help(c.help or "") for c in sub._choices_actions}
    commands = []
    for name, p in sub.choices.items():
        positionals = [a for a in p._actions if not a.option_strings]
        commands.append(Command(_word(name), helps.get(name, ""), _options(p),
                                tuple(_values(a) for a in positionals),
                                bool(positionals) and positionals[-1].nargs in ("+", "*")))
    return _options(parser), tuple(commands)


# ---- bash ---------------------------------------------------------------------------------------


def _bash_values(values, indent: str) -> str:
    if values == FILES:
        return f"{indent}compopt -o filenames 2> /dev/null; COMPREPLY=($(compgen -f -- \"$cur\")); return ;;"
    if values:
        return f"{indent}COMPREPLY=($(compgen -W \"{' '.join(values)}\" -- \"$cur\")); return ;;"
    return f"{indent}return ;;"


def bash(top: tuple[Option, ...], commands: tuple[Command, ...]) -> str:
    lines = ["# halo-sched completion for bash, made by `halo-sched completion bash` from its own parser.",
             "# Load it with: source <(halo-sched completion bash)",
             "_halo_sched() {",
             '    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} cmd= i at=0 n=0',
             "    COMPREPLY=()",
             "    for ((i = 1; i < COMP_CWORD; i++)); do",
             '        case ${COMP_WORDS[i]} in -*) ;; *) cmd=${COMP_WORDS[i]}; at=$i; break ;; esac',
             "    done",
             '    if [[ -z $cmd ]]; then',
             f'        COMPREPLY=($(compgen -W "{" ".join(c.name for c in commands)} '
             f'{" ".join(s for o in top for s in o.strings)}" -- "$cur"))',
             "        return",
             "    fi",
             "    case $cmd in"]
    for c in commands:
        valued = [o for o in c.options if o.takes_value]
        lines.append(f"        {c.name})")
        if valued:
            lines.append("            case $prev in")
            for o in valued:
                lines.append(f"                {'|'.join(o.strings)})")
                lines.append(_bash_values(o.values, "                    "))
            lines.append("            esac")
        lines.append('            if [[ $cur == -* ]]; then')
        lines.append(f'                COMPREPLY=($(compgen -W "{" ".join(s for o in c.options for s in o.strings)}" '
                     '-- "$cur")); return')
        lines.append("            fi")
        if c.positionals:
            # Which positional the word is: the words after the command, options and their values aside.
            taking = " ".join(s for o in valued for s in o.strings)
            lines.append("            for ((i = at + 1; i < COMP_CWORD; i++)); do")
            if taking:
                lines.append('                case " ' + taking + ' " in *" ${COMP_WORDS[i]} "*) ((i++)); continue ;; esac')
            lines.append('                [[ ${COMP_WORDS[i]} == -* ]] || ((n++))')
            lines.append("            done")
            last = len(c.positionals) - 1
            lines.append(f"            (( n > {last} )) && n={last if c.repeats else len(c.positionals)}")
            lines.append("            case $n in")
            for k, values in enumerate(c.positionals):
                lines.append(f"                {k})")
                lines.append(_bash_values(values, "                    "))
            lines.append("            esac")
        lines.append("            ;;")
    lines += ["    esac", "}", "complete -F _halo_sched halo-sched", ""]
    return "\n".join(lines)


# ---- zsh ----------------------------------------------------------------------------------------


def _zq(text: str) -> str:
    """``text`` in zsh single quotes."""
    return "'" + text.replace("'", "'\\''") + "'"


def _zsh_values(values, indent: str) -> str:
    if values == FILES:
        return f"{indent}_files; return ;;"
    if values:
        return f"{indent}compadd -- {' '.join(values)}; return ;;"
    return f"{indent}return ;;"


def _zsh_described(name: str, entries: list[tuple[str, str]], what: str, indent: str) -> list[str]:
    items = " ".join(_zq(f"{w}:{h}" if h else w) for w, h in entries)
    return [f"{indent}local -a {name}; {name}=({items})", f"{indent}_describe -t {name} {what} {name}"]


def zsh(top: tuple[Option, ...], commands: tuple[Command, ...]) -> str:
    lines = ["#compdef halo-sched",
             "# halo-sched completion for zsh, made by `halo-sched completion zsh` from its own parser.",
             "# Load it with: source <(halo-sched completion zsh)   (after compinit), or put it in $fpath as _halo_sched",
             "_halo_sched() {",
             "    local cmd= i at=0 n=0",
             "    for ((i = 2; i < CURRENT; i++)); do",
             '        [[ $words[i] == -* ]] || { cmd=$words[i]; at=$i; break }',
             "    done",
             '    if [[ -z $cmd ]]; then',
             '        if [[ $PREFIX == -* ]]; then']
    lines += _zsh_described("opts", [(s, o.help) for o in top for s in o.strings], "option", "            ")
    lines += ["        else"]
    lines += _zsh_described("cmds", [(c.name, c.help) for c in commands], "command", "            ")
    lines += ["        fi", "        return", "    fi", "    case $cmd in"]
    for c in commands:
        valued = [o for o in c.options if o.takes_value]
        lines.append(f"        {c.name})")
        if valued:
            lines.append("            case $words[CURRENT-1] in")
            for o in valued:
                lines.append(f"                {'|'.join(o.strings)})")
                lines.append(_zsh_values(o.values, "                    "))
            lines.append("            esac")
        lines.append('            if [[ $PREFIX == -* ]]; then')
        lines += _zsh_described("opts", [(s, o.help) for o in c.options for s in o.strings], "option",
                                "                ")
        lines.append("                return")
        lines.append("            fi")
        if c.positionals:
            taking = " ".join(s for o in valued for s in o.strings)
            lines.append("            for ((i = at + 1; i < CURRENT; i++)); do")
            if taking:
                lines.append(f'                if [[ " {taking} " == *" $words[i] "* ]]; then ((i++)); continue; fi')
            lines.append("                [[ $words[i] == -* ]] || ((n++))")
            lines.append("            done")
            last = len(c.positionals) - 1
            lines.append(f"            (( n > {last} )) && n={last if c.repeats else len(c.positionals)}")
            lines.append("            case $n in")
            for k, values in enumerate(c.positionals):
                lines.append(f"                {k})")
                lines.append(_zsh_values(values, "                    "))
            lines.append("            esac")
        lines.append("            ;;")
    lines += ["    esac", "}",
              "if [[ ${zsh_eval_context[-1]} == loadautofunc ]]; then",
              '    _halo_sched "$@"',
              "else",
              "    compdef _halo_sched halo-sched",
              "fi", ""]
    return "\n".join(lines)


# ---- fish ---------------------------------------------------------------------------------------


def _fq(text: str) -> str:
    """``text`` in fish single quotes."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _fish_option(o: Option, when: str) -> str:
    parts = ["complete -c halo-sched", f"-n {_fq(when)}"]
    for s in o.strings:
        parts.append(f"-l {s[2:]}" if s.startswith("--") else f"-s {s[1:]}")
    if o.takes_value:
        if o.values == FILES:
            parts.append("-r -F")
        else:
            parts.append("-x")
            if o.values:
                parts.append(f"-a {_fq(' '.join(o.values))}")
    if o.help:
        parts.append(f"-d {_fq(o.help)}")
    return " ".join(parts)


def fish(top: tuple[Option, ...], commands: tuple[Command, ...]) -> str:
    lines = ["# halo-sched completion for fish, made by `halo-sched completion fish` from its own parser.",
             "# Load it with: halo-sched completion fish | source",
             "complete -c halo-sched -e",
             "complete -c halo-sched -f"]
    for o in top:
        lines.append(_fish_option(o, "__fish_use_subcommand"))
    for c in commands:
        lines.append(f"complete -c halo-sched -n __fish_use_subcommand -a {c.name}"
                     + (f" -d {_fq(c.help)}" if c.help else ""))
    for c in commands:
        when = f"__fish_seen_subcommand_from {c.name}"
        for o in c.options:
            lines.append(_fish_option(o, when))
        for values in dict.fromkeys(v for v in c.positionals if v):
            lines.append(f"complete -c halo-sched -n {_fq(when)} "
                         + ("-F" if values == FILES else f"-a {_fq(' '.join(values))}"))
    return "\n".join(lines) + "\n"


WRITERS = {"bash": bash, "zsh": zsh, "fish": fish}


def script(shell: str, parser: argparse.ArgumentParser) -> str:
    """The completion script for ``shell`` of ``parser`` (the whole command line's)."""
    return WRITERS[shell](*model(parser))


def cmd_completion(args, scheduler) -> int:
    # args.whole_parser: halo_sched.cli.build_parser (this run parsed one command only).
    sys.stdout.write(script(args.shell, args.whole_parser()))
    return 0
