"""Targets: the callables that build a model, and the inputs it runs on.

A target is named `path/to/file.py:NAME` or `package.module:NAME`, and imported the way pytest's default
(prepend) import mode imports a test file: a file inside a package (a folder chain with `__init__.py`) under its
dotted name (`zoo.models`), with the package's root (the folder above the topmost `__init__.py`) first on
`sys.path`, so that relative imports work and the module exists once, under one name; any other file under a
private name, with its own folder first on `sys.path`, so that it can import its siblings. The project's
`pythonpath` folders (graphlint.project) follow, for module targets and for the absolute imports a file makes.

NAME is a factory returning `(model, args)`, or a class (any callable returning an `nn.Module`) together with
input specs (graphlint.inputs) or a model method `example_inputs()`, and keyword arguments for the call. A target
travels between processes, into the result cache and into reports as one text, its canonical spelling on the
command line: `models/net.py:Net --input 'float32[2,3,32,32]' --init depth=2`; so its identity includes its
inputs and arguments.

The package follows those concerns: `spec.py` the target's text, `importing.py` the import modes,
`builder.py` a class target's builder, `built.py` what a factory returns.
"""

from graphlint.target.built import Target, normalize_factory_result
from graphlint.target.importing import (LoadedTarget, add_target_folders, importable, load_factory, package_of,
                                        refused_before_import, search_path)
from graphlint.target.spec import TargetSpec, VARY, parse_init, parse_vary, script_name, target_text, target_vary

__all__ = [
    "LoadedTarget", "Target", "TargetSpec", "VARY", "add_target_folders", "importable", "load_factory",
    "normalize_factory_result", "package_of", "parse_init", "parse_vary", "refused_before_import", "script_name",
    "search_path",
    "target_text", "target_vary",
]
