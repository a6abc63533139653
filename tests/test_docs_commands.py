"""Every `edgevit` command in the README and the docs is one the CLI takes as
written, and each command block reads the files its earlier commands write.

The README's fine-tune block once ended with `edgevit eval
model_qat_int8.tflite`, a file no command had written (convert named it
after the architecture), and a later `convert` in the same folder silently
replaced another model's file. Running every block takes hours of training
and downloads, so this test replays them on paper: click parses each command
with the CLI's own options, and the names the commands would write are
computed with the CLI's own naming functions, then followed through the
document in order."""
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import click
import pytest

from edgevit.cli import main
from edgevit.cli.models import _named_after
from edgevit.cli.options import DEFAULT_PRECISION, PRECISION_FLAGS
from edgevit.export.pipeline import default_output_path
from edgevit.export.result import ExportFiles

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "android_demo" / "README.md",
             ROOT / "converters" / "README.md"]
SHELL_LANGUAGES = {"bash", "sh", "shell"}
# What a converted file's name ends in: <stem>_<precision>.tflite.
CONVERTED = re.compile(r"^(?P<stem>.+)_(?:fp32|fp16|dynamic|int8|int8_mixed|int16x8)\.tflite$")
MODEL_FILES = (".tflite", ".keras", ".h5")


def shell_blocks(text: str) -> list[str]:
    """The bodies of the fenced bash/sh blocks of a Markdown text, in order."""
    blocks, body, language = [], None, None
    for line in text.splitlines():
        if line.startswith("```"):
            if body is None:
                body, language = [], line[3:].strip()
            else:
                if language in SHELL_LANGUAGES:
                    blocks.append("\n".join(body))
                body = None
        elif body is not None:
            body.append(line)
    return blocks


def edgevit_commands(block: str) -> list[list[str]]:
    """The argument lists of the `edgevit` commands of a shell block (line
    continuations joined, comments dropped, `a && b` split)."""
    commands = []
    for line in re.sub(r"\\\n\s*", " ", block).splitlines():
        words = shlex.split(line, comments=True)
        while words:
            command, words = (words[:words.index("&&")], words[words.index("&&") + 1:]) if "&&" in words \
                else (words, [])
            if command[:1] == ["edgevit"]:
                commands.append(command[1:])
    return commands


def documented_commands() -> list[tuple[Path, list[list[str]]]]:
    return [(doc, [cmd for block in shell_blocks(doc.read_text()) for cmd in edgevit_commands(block)])
            for doc in DOCUMENTS]


def parse(args: list[str]) -> tuple[str, dict]:
    """The command's name and its parameters, as click parses them."""
    command = main.get_command(click.Context(main), args[0])
    assert command is not None, f"no command {args[0]!r}"
    return args[0], command.make_context(args[0], args[1:]).params


@dataclass
class Folder:
    """The working folder a document's commands run in, one after another."""
    written: set[str] = field(default_factory=set)
    stems: set[str | None] = field(default_factory=set)   # what the document's files could be converted from

    def run(self, name: str, params: dict) -> list[str]:
        """What the command would write; the problems it would meet."""
        problems = [self._read(path) for path in _inputs(name, params)]
        outputs = _outputs(name, params)
        refused = sorted(self.written.intersection(outputs))
        if refused and not params.get("overwrite"):
            problems.append(f"would be refused: {', '.join(refused)} already written above (no --overwrite)")
        self.written.update(outputs)
        self.stems.update(_convertible_stem(path) for path in [*outputs, *_inputs(name, params)])
        if name == "convert" and not params["model"].endswith(MODEL_FILES):
            self.stems.add(_named_after(params["model"], params["weights"], params["weights"] == "imagenet"))
        return [p for p in problems if p]

    def _read(self, path: str) -> str | None:
        converted = CONVERTED.match(Path(path).name)
        if path in self.written or converted is None or converted["stem"] not in self.stems:
            return None
        return f"reads {path}, which no command above writes (they write {sorted(self.written)})"


def _convertible_stem(path: str) -> str | None:
    """What a converted file of ``path`` is named after, where ``path`` is a model or weights file."""
    return Path(path).name.removesuffix(".h5").removesuffix(".keras").removesuffix(".weights") \
        if path.endswith((".keras", ".h5")) else None


def _precision(params: dict) -> str:
    chosen = [flag for flag, _ in PRECISION_FLAGS if params["precision_" + flag.replace("-", "_")]]
    return (chosen[0] if chosen else DEFAULT_PRECISION).replace("-", "_")


def _inputs(name: str, params: dict) -> list[str]:
    candidates = [params.get("model"), params.get("model_file"), params.get("weights"), *(params.get("models") or ())]
    if name == "import-weights":
        candidates = []
    return [c for c in candidates if isinstance(c, str) and c.endswith(MODEL_FILES)]


def _outputs(name: str, params: dict) -> list[str]:
    if name == "convert":
        model = params["model"]
        output = params["output"] or default_output_path(
            _named_after(model, params["weights"], params["weights"] == "imagenet"), _precision(params))
        return [str(p) for p in ExportFiles.beside(Path(output)).all()]
    if name in ("finetune", "qat"):
        written = [params["output"]]
        if params.get("export_int8"):
            beside = Path(params["output"]).with_name(default_output_path(Path(params["output"]).stem, "int8").name)
            written += [str(p) for p in ExportFiles.beside(beside).all()]
        return written
    if name == "import-weights":
        return [params["output"] or f"{params['model_name']}.weights.h5"]
    return [p for p in (params.get("csv_path"), params.get("plot_path")) if p]


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_documented_command_runs_as_written(doc):
    commands = dict(documented_commands())[doc]
    folder, problems = Folder(), []
    for args in commands:
        try:
            name, params = parse(args)
        except click.UsageError as err:
            problems.append(f"edgevit {shlex.join(args)}: {err.format_message()}")
            continue
        problems += [f"edgevit {shlex.join(args)}: {p}" for p in folder.run(name, params)]
    assert not problems, "\n".join(problems)


def test_the_readme_walks_the_whole_path_from_weights_to_the_phone():
    names = [args[0] for args in dict(documented_commands())[ROOT / "README.md"]]
    assert {"convert", "finetune", "qat", "eval", "check", "bench", "bundle", "list"} <= set(names)
    assert names.index("finetune") < names.index("qat") < names.index("eval")


def test_the_replay_catches_a_file_no_command_wrote_and_a_silent_overwrite():
    """The two mistakes of the old README, replayed: the check can fail."""
    folder, problems = Folder(), []
    for args in (["qat", "model.keras", "--data", "DIR", "-o", "model_qat.keras"],
                 ["convert", "--int8", "model_qat.keras", "-o", "mobilevit_v3_xxs_int8.tflite"],
                 ["eval", "model_qat_int8.tflite", "--data", "DIR"],
                 ["convert", "--int8", "model.keras", "-o", "mobilevit_v3_xxs_int8.tflite"]):
        problems += folder.run(*parse(args))
    assert len(problems) == 2
    assert problems[0].startswith("reads model_qat_int8.tflite")
    assert problems[1].startswith("would be refused: mobilevit_v3_xxs_int8")


def test_every_option_the_readme_names_is_in_the_commands_help():
    """`--help` and the README use the same names: each option of a README command is one its help lists."""
    for args in dict(documented_commands())[ROOT / "README.md"]:
        command = main.get_command(click.Context(main), args[0])
        help_text = command.get_help(click.Context(command, info_name=args[0]))
        for word in args[1:]:
            if word.startswith("--"):
                assert word.split("=")[0] in help_text, (args, word)


def _anchors(doc: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings."""
    headings = re.findall(r"^#+ (.+)$", doc.read_text(), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_link_between_the_documents_leads_somewhere(doc):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (doc.parent / path).resolve() if path else doc
        if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in _anchors(linked)):
            broken.append(target)
    assert not broken, broken


def test_the_qat_defaults_the_readme_states_are_the_commands_defaults():
    epochs, lr = re.search(r"edgevit qat .*# quantization-aware: (\d+) epochs at lr ([\d.e-]+)",
                           (ROOT / "README.md").read_text()).groups()
    defaults = {p.name: p.default for p in main.get_command(click.Context(main), "qat").params}
    assert (defaults["epochs"], defaults["lr"]) == (int(epochs), float(lr))
