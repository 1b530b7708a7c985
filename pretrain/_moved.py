"""The module paths of the flat layout, kept working: ``import pretrain.layout`` (or ``from pretrain.layout import
...``) gives the module ``pretrain.run_folder.layout`` itself, the same object, so monkeypatching either name
patches both, with a DeprecationWarning that names the new path. ``pretrain/__init__.py`` installs the finder.

The two old modules whose names are packages now (``pretrain.data``, ``pretrain.tracking``) are not in the table:
their packages read the old module's names from the module that holds them (``reexport``), lazily.

Standard library only, like every module that ``pretrain/__init__.py`` imports before torch.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import pkgutil
import sys
import warnings
from collections.abc import Callable, Iterable

# old module -> where it is now (issue 20: pretrain/ laid out in sub-packages)
MOVED = {
    "pretrain.atomic": "pretrain.common.atomic",
    "pretrain.cli": "pretrain.common.cli",
    "pretrain.device": "pretrain.common.device",
    "pretrain.hardware": "pretrain.common.hardware",
    "pretrain.reporting": "pretrain.common.reporting",
    "pretrain.roles": "pretrain.common.roles",
    "pretrain.cache": "pretrain.data.cache",
    "pretrain.collator": "pretrain.data.collator",
    "pretrain.corpus": "pretrain.data.corpus",
    "pretrain.data_config": "pretrain.data.config",
    "pretrain.instance_cache": "pretrain.data.instance_cache",
    "pretrain.instances": "pretrain.data.instances",
    "pretrain.loaders": "pretrain.data.loaders",
    "pretrain.tokenizer": "pretrain.data.tokenizer",
    "pretrain.vocabulary": "pretrain.data.vocabulary",
    "pretrain.checkpointing": "pretrain.run_folder.checkpointing",
    "pretrain.identity": "pretrain.run_folder.identity",
    "pretrain.layout": "pretrain.run_folder.layout",
    "pretrain.manifest": "pretrain.run_folder.manifest",
    "pretrain.status": "pretrain.run_folder.status",
    "pretrain.wandb_logging": "pretrain.tracking.wandb_logging",
}


class _Alias(importlib.abc.Loader):
    """Loads an old name as the module at its new path: the same module object, not a copy."""

    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec):
        warnings.warn(f"{spec.name} moved to {self.new}; import it from there", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(self.new)
        self.spec = module.__spec__  # the import system sets __spec__ to the old name's; exec_module puts it back
        return module

    def exec_module(self, module) -> None:
        module.__spec__ = self.spec


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(MOVED[fullname]))


def install() -> None:
    """Puts the finder first on sys.meta_path, once."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())


def reexport(package: str, module: str, names: Iterable[str] | None = None) -> tuple[Callable, Callable]:
    """A package's ``__getattr__`` and ``__dir__`` (PEP 562) that read ``names`` (every public name when None) from
    ``module``, imported on first use: the package that replaced a module of its own name keeps that module's names
    without importing it (or what it imports) when only one of its light modules is wanted."""
    wanted = None if names is None else frozenset(names)

    def submodules() -> set[str]:
        return {info.name for info in pkgutil.iter_modules(sys.modules[package].__path__)}

    def __getattr__(name: str):
        forwarded = name in wanted if wanted is not None else not name.startswith("_")
        if forwarded and name not in submodules():  # a submodule not yet imported: the import system imports it
            return getattr(importlib.import_module(module), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        public = wanted if wanted is not None else {n for n in dir(importlib.import_module(module)) if n[0] != "_"}
        return sorted(set(vars(sys.modules[package])) | submodules() | public)

    return __getattr__, __dir__


install()
