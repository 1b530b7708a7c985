"""pretrain/ laid out in sub-packages (issue 20.1): the flat layout's module paths still import, as the very module
at the new path and with a DeprecationWarning; nothing in the project uses them any more; every sub-package's
docstring names each of its modules; the packages that replaced a module of their own name still give its names."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pretrain._moved import MOVED

ROOT = Path(__file__).resolve().parents[1]
SUBPACKAGES = ["common", "data", "run_folder", "tracking"]
# The old modules whose names are packages now: the package reads their names from the module that holds them.
REPLACED_BY_PACKAGE = {"pretrain.data": "pretrain.data.pipeline", "pretrain.tracking": "pretrain.tracking.metrics"}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_path_imports_the_module_at_its_new_path_with_a_warning(old, monkeypatch):
    new = MOVED[old]
    module = importlib.import_module(new)
    monkeypatch.delitem(sys.modules, old, raising=False)  # imported once already: import it afresh
    with pytest.warns(DeprecationWarning, match=re.escape(f"{old} moved to {new}")):
        aliased = importlib.import_module(old)
    assert aliased is module and sys.modules[old] is module
    assert module.__name__ == new and module.__spec__.name == new  # the alias did not rename the module
    monkeypatch.setattr(f"{old}._patched_by_test_layout", 1, raising=False)  # patching either name patches both
    assert module._patched_by_test_layout == 1
    monkeypatch.delitem(sys.modules, old)


def test_every_flat_module_that_moved_is_in_the_table():
    for old, new in {**MOVED, **REPLACED_BY_PACKAGE}.items():
        assert not (ROOT / (old.replace(".", "/") + ".py")).exists(), old
        assert (ROOT / (new.replace(".", "/") + ".py")).is_file(), new
    flat = {p.stem for p in (ROOT / "pretrain").glob("*.py")}
    assert not flat & {old.rpartition(".")[2] for old in MOVED}


def _old_path_patterns() -> list[re.Pattern]:
    patterns = []
    for old in [*MOVED, *REPLACED_BY_PACKAGE]:
        leaf = old.rpartition(".")[2]
        if old in REPLACED_BY_PACKAGE:  # the package is fine; the old module's names used through it are not
            mods = "|".join(p.stem for p in (ROOT / old.replace(".", "/")).glob("*.py") if p.stem != "__init__")
            patterns.append(re.compile(rf"(?<![\w.]){re.escape(old)}(?!\w)(?!\.(?:{mods})\b)(?! import (?:{mods})\b)"))
        else:
            patterns.append(re.compile(rf"(?<![\w.]){re.escape(old)}(?!\w)"))
        patterns.append(re.compile(rf"(?<!\w)pretrain/{leaf}\.py\b"))
        patterns.append(re.compile(rf'"pretrain" / "{leaf}\.py"'))
        patterns.append(re.compile(rf"^\s*from pretrain import [\w ,]*\b{leaf}\b", re.MULTILINE))
    return patterns


def test_no_project_file_imports_or_names_an_old_module_path():
    exempt = {ROOT / "pretrain" / "_moved.py", Path(__file__).resolve()}
    files = [p for d in ("pretrain", "finetune", "launch", "benchmarks", "tests", "docs", "configs")
             for p in (ROOT / d).rglob("*") if p.suffix in {".py", ".sh", ".md", ".yaml", ".toml"}]
    files += [ROOT / "README.md", ROOT / "BENCHMARKS.md", ROOT / "pyproject.toml"]
    patterns = _old_path_patterns()
    found = []
    for path in files:
        if path in exempt or not path.is_file():
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            found += [f"{path.relative_to(ROOT)}:{number}: {line.strip()}" for p in patterns if p.search(line)]
    assert not found, "old module paths (rewrite them with the layout script):\n" + "\n".join(found)


@pytest.mark.parametrize("package", SUBPACKAGES)
def test_a_subpackage_docstring_names_each_of_its_modules(package):
    folder = ROOT / "pretrain" / package
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text(encoding="utf-8"))) or ""
    modules = sorted(p.name for p in folder.glob("*.py") if p.name != "__init__.py")
    assert modules and [m for m in modules if not re.search(rf"(?<![\w/]){re.escape(m)}\b", doc)] == []


def test_the_packages_that_replaced_a_module_give_its_names_lazily():
    from pretrain.data import pipeline

    assert sorted(importlib.import_module("pretrain.data").__all__) == sorted(pipeline.__all__)
    code = (
        "import sys, pretrain.data.config\n"
        "from pretrain.data import config\n"  # a submodule through the package: not the pipeline
        "light = 'pretrain.data.pipeline' not in sys.modules and 'datasets' not in sys.modules\n"
        "from pretrain.data import build_pretraining_data, DataConfig\n"
        "from pretrain.tracking import log_metrics\n"
        "import pretrain.data.pipeline as p, pretrain.tracking.metrics as m\n"
        "print(light, build_pretraining_data is p.build_pretraining_data, DataConfig is config.DataConfig,"
        " log_metrics is m.log_metrics)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True"] * 4


def test_the_command_line_modules_and_the_packages_import_without_torch():
    """The command line is parsed before torch is imported: cli, roles, the data config and every sub-package's
    __init__ import nothing heavy (pretrain/__init__.py itself, which registers the model, is left out here)."""
    code = (
        "import sys, types\n"
        "pkg = types.ModuleType('pretrain'); pkg.__path__ = ['pretrain']; sys.modules['pretrain'] = pkg\n"
        "import pretrain.common.cli, pretrain.common.roles, pretrain.common.atomic, pretrain.data.config\n"
        "import pretrain.common, pretrain.data, pretrain.run_folder, pretrain.tracking\n"
        "print(sorted(m for m in ('torch', 'transformers', 'datasets', 'accelerate') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
