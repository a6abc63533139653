"""What ``pip install .`` installs: the package ``edgevit`` alone, with the
checkpoint importers of the repository's ``converters/`` folder inside it
as ``edgevit.converters``, and every source module of both."""
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = {"edgevit": "edgevit", "converters": "edgevit/converters"}  # repository folder -> installed path


def _modules(folder: str, installed: str) -> set[str]:
    return {f"{installed}/{p.relative_to(ROOT / folder).as_posix()}" for p in (ROOT / folder).rglob("*.py")
            if "__pycache__" not in p.parts}


def test_wheel_installs_edgevit_alone_with_the_converters_inside(tmp_path):
    # Built from a copy: setuptools writes build/ next to pyproject.toml, which would race with
    # other builds in the working tree and could ship stale files from an earlier build.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for folder in SOURCES:
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                          "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("edgevit-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())

    top_level = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top_level == {"edgevit"}
    assert "edgevit/converters/api.py" in names
    assert "edgevit/data/imagenet_classes.txt" in names
    assert "edgevit/data/models.json" in names  # the registry reads it
    expected = set().union(*(_modules(folder, installed) for folder, installed in SOURCES.items()))
    missing = sorted(expected - names)
    assert not missing, f"add their packages to [tool.setuptools] packages in pyproject.toml: {missing}"
