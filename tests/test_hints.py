"""Every option a message of edgevit names exists: a ``next:`` line, a hint
or an error's advice that names an option the command lacks sends the user
to a dead end (convert's own verdict told them to pass --calib-dir)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from edgevit.cli import main

PACKAGE = Path(__file__).resolve().parents[1] / "edgevit"
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9]")

# Flags of other programs that edgevit's texts quote, by the module that quotes them: they are no edgevit option.
OTHER_PROGRAMS = {
    "info.py": {"--all"},                          # python -m edgevit.info, the catalog's maintenance
    "litert/run_model.py": {"--stream"},           # the LiteRT child process's own command line
    "litert/delegates.py": {"--max"},              # benchmark_model --max_delegated_partitions
    "profile/benchmark_binary.py": {"--enable", "--graph", "--num", "--report", "--use"},  # benchmark_model
    "profile/benchmark_output.py": {"--enable"},
    "cli/profile.py": {"--enable", "--report"},
    "export/android_bundle.py": {"--gradle-version"},  # gradle wrapper
    "cli/__init__.py": {"--help"},
}
# Which commands print a module's texts (the others: any command may).
COMMANDS_OF = {"export/verdict.py": {"convert"}, "memory.py": {"convert", "finetune", "qat"},
               "train/": {"finetune", "qat"}, "cli/train.py": {"finetune", "qat", "eval"}, "data/folders.py":
               {"finetune", "qat", "eval"}, "export/android_bundle.py": {"bundle"}}


def _texts(path: Path):
    """The string constants of a module, an f-string as one text ({} for each value it formats)."""
    tree = ast.parse(path.read_text())
    parts = {id(value) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for value in node.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            yield "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in parts:
            yield node.value


@pytest.fixture(scope="module")
def helps() -> dict[str, str]:
    """Each command's --help text, by command name."""
    helps = {}
    for name, command in main.commands.items():
        assert not isinstance(command, click.Group), f"{name}: walk its subcommands too"
        result = CliRunner().invoke(main, [name, "--help"], terminal_width=10_000)
        assert result.exit_code == 0, result.output
        helps[name] = result.output
    return helps


def _named_options():
    """(module, the command a text names or None, option) of every option a text names; an option after
    ``edgevit COMMAND`` in a text (a command to copy) is that command's."""
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        for text in _texts(path):
            for quoted in re.finditer(r"\bedgevit ([a-z][a-z-]*)([^`\n]*)", text):  # up to the closing backquote
                for option in OPTION.findall(quoted.group(2)):
                    yield module, quoted.group(1), option
            for option in OPTION.findall(re.sub(r"\bedgevit [a-z][a-z-]*[^`\n]*", "", text)):
                yield module, None, option


@pytest.mark.parametrize("module, command, option", sorted(set(_named_options()), key=str))
def test_every_option_a_message_names_is_in_its_commands_help(module, command, option, helps):
    if option in OTHER_PROGRAMS.get(module, ()):
        return
    if command is not None and command in helps:
        commands = {command}
    else:
        commands = next((names for prefix, names in COMMANDS_OF.items() if module.startswith(prefix)), set(helps))
    having = [name for name in commands if re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", helps[name])]
    assert having, f"{module} names {option}, which `edgevit {' | '.join(sorted(commands))} --help` does not list"
