"""Targets in real project layouts: a package with relative and absolute imports under src/, a folder that
pytest's `pythonpath` names, a file named like its package, and a plain script folder. Every target form (a
factory, a file's class, a module's function or class) imports, and gives the findings the factory gives."""

from __future__ import annotations

import importlib
import json
import shutil
import sys
from pathlib import Path

import pytest

from conftest import line_of, run_graphlint, write

from graphlint.cache import ResultCache
from graphlint.config import read_config
from graphlint.project import Project
from graphlint.target import TargetSpec, importable, load_factory, package_of, search_path

INPUT = "float32[2,8,16]"


def _project(root: Path) -> Path:
    """A held-out project: src/tinyvision (relative and absolute imports, a subpackage), lib/ on pytest's
    pythonpath, xformer/xformer.py named like its package, scripts/ without __init__.py."""
    write(root, "pyproject.toml", """
        [project]
        name = "tinyvision"
        version = "0"

        [tool.pytest.ini_options]
        pythonpath = ["lib"]
    """)
    write(root, "lib/blocks.py", """
        from torch import nn


        class MLP(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.up = nn.Linear(dim, 2 * dim)
                self.down = nn.Linear(2 * dim, dim)

            def forward(self, x):
                return self.down(self.up(x).relu())
    """)
    write(root, "src/tinyvision/__init__.py", "")
    write(root, "src/tinyvision/layers.py", """
        import torch
        from torch import nn


        class Attention(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.qkv = nn.Linear(dim, 3 * dim)

            def forward(self, x):
                q, k, v = self.qkv(x).chunk(3, dim=-1)
                scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
                return torch.softmax(scores, dim=-1) @ v
    """)
    write(root, "src/tinyvision/models/__init__.py", "from .vit import ViT\n")
    write(root, "src/tinyvision/models/vit.py", """
        import torch
        from torch import nn

        from blocks import MLP
        from tinyvision.layers import Attention as AbsoluteAttention

        from ..layers import Attention


        class ViT(nn.Module):
            def __init__(self, dim=16, depth=1):
                super().__init__()
                assert Attention is AbsoluteAttention  # one module, under one name
                self.blocks = nn.ModuleList(Attention(dim) for _ in range(depth))
                self.mlp = MLP(dim)

            def forward(self, x):
                for block in self.blocks:
                    x = x + block(x)
                return self.mlp(x)


        def make_vit():
            return ViT(dim=16, depth=1), (torch.randn(2, 8, 16),)
    """)
    write(root, "xformer/__init__.py", "from xformer.xformer import Decoder, Wrapper\n")
    write(root, "xformer/attend.py", """
        import torch
        from torch import nn


        class Attend(nn.Module):
            def forward(self, q, k, v):
                weights = torch.softmax(q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5, dim=-1)
                return weights @ v
    """)
    write(root, "xformer/xformer.py", """
        import torch
        from torch import nn

        import xformer
        from xformer.attend import Attend


        class Decoder(nn.Module):
            def __init__(self, dim=16):
                super().__init__()
                self.dim = dim
                self.qkv = nn.Linear(dim, 3 * dim)
                self.attend = Attend()

            def forward(self, x):
                return self.attend(*self.qkv(x).chunk(3, dim=-1))


        class Wrapper(nn.Module):
            def __init__(self, attn_layers):
                super().__init__()
                self.project = nn.Linear(attn_layers.dim, attn_layers.dim)
                self.attn_layers = attn_layers

            def forward(self, x):
                return self.attn_layers(self.project(x))


        def make_decoder():
            model = Decoder()
            assert isinstance(model, xformer.Decoder)  # the package's class is this file's class
            return model, (torch.randn(2, 8, 16),)
    """)
    write(root, "scripts/build.py", """
        import torch

        from script_settings import DIM
        from tinyvision.models import ViT


        def make():
            return ViT(dim=DIM), (torch.randn(2, 8, DIM),)
    """)
    write(root, "scripts/script_settings.py", "DIM = 16\n")
    return root


@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> Path:
    return _project(tmp_path_factory.mktemp("layout"))


def _findings_by_target(stdout: str) -> dict[str, set[tuple[str, str, int]]]:
    report = json.loads(stdout)
    assert not report["errors"], report["errors"]
    found: dict[str, set[tuple[str, str, int]]] = {}
    for finding in report["findings"]:
        for target in finding["targets"]:
            found.setdefault(target, set()).add((finding["rule"], finding["location"]["path"],
                                                 finding["location"]["line"]))
    return found


# -- how a file is imported ----------------------------------------------------------------------------------------


def test_a_packaged_file_is_imported_under_its_dotted_name_from_the_package_root(layout):
    assert package_of(layout / "src/tinyvision/models/vit.py") == (layout / "src", "tinyvision.models.vit")
    assert package_of(layout / "src/tinyvision/models/__init__.py") == (layout / "src", "tinyvision.models")


def test_a_file_named_like_its_package_goes_after_the_package_root_on_sys_path(layout):
    spec = TargetSpec.parse("xformer/xformer.py:Decoder", layout)
    first, last = search_path(spec, [layout])
    assert first[0] == layout and last == [layout / "xformer"]


def test_a_script_folder_and_a_namespace_package_are_imported_from_their_own_folder(layout):
    assert package_of(layout / "scripts/build.py") is None
    spec = TargetSpec.parse("scripts/build.py:make", layout)
    assert search_path(spec, [layout / "src"])[0] == [layout / "scripts", layout / "src"]


def test_the_project_imports_from_pytests_pythonpath_then_src_then_its_root(layout):
    project = Project.discover(layout)
    assert project.pythonpath == [layout / "lib", layout / "src", layout]


def test_graphlints_own_pythonpath_replaces_pytests(tmp_path):
    write(tmp_path, "pyproject.toml", '[tool.graphlint]\npythonpath = ["code"]\n'
                                      '[tool.pytest.ini_options]\npythonpath = "lib other"\n')
    assert read_config(tmp_path / "pyproject.toml").pythonpath == (str(tmp_path / "code"),)
    write(tmp_path, "pyproject.toml", '[tool.pytest.ini_options]\npythonpath = "lib other"\n')
    assert read_config(tmp_path / "pyproject.toml").pythonpath == (str(tmp_path / "lib"), str(tmp_path / "other"))


def test_pytest_ini_pythonpath_counts_unless_pyproject_sets_one(tmp_path):
    write(tmp_path, "pytest.ini", "[pytest]\npythonpath = lib\n")
    write(tmp_path, "pyproject.toml", '[project]\nname = "p"\n')
    assert Project.discover(tmp_path).pythonpath == [tmp_path / "lib", tmp_path]
    write(tmp_path, "pyproject.toml", "[tool.graphlint]\npythonpath = []\n")
    assert Project.discover(tmp_path).pythonpath == [tmp_path]


def test_the_result_cache_key_depends_on_the_pythonpath(tmp_path, layout):
    cache = ResultCache(tmp_path / "cache")
    project = Project.discover(layout)
    before = cache.key("scripts/build.py:make", layout, project, "meta", ("GL101",))
    project.add_pythonpath([layout / "elsewhere"])
    assert cache.key("scripts/build.py:make", layout, project, "meta", ("GL101",)) != before


@pytest.mark.parametrize("target", ["twin/model.py:make", "twin.model:make"])
def test_a_second_checkout_imports_its_own_package_not_a_copy_imported_before(tmp_path, monkeypatch, target):
    for checkout in ("first", "second"):
        write(tmp_path, f"{checkout}/twin/__init__.py", f"WHERE = {checkout!r}\n")
        write(tmp_path, f"{checkout}/twin/model.py", "from . import WHERE\n\n\ndef make():\n    return WHERE\n")
    monkeypatch.syspath_prepend(str(tmp_path / "first"))  # as an installed copy of the first checkout would be
    importlib.import_module("twin.model")
    spec = TargetSpec.parse(target, tmp_path / "second")
    try:
        with importable(spec):
            assert load_factory(spec).factory.build() == "second"
    finally:
        for name in [name for name in sys.modules if name.partition(".")[0] == "twin"]:
            del sys.modules[name]


# -- every target form lints, with the factory's findings ----------------------------------------------------------


@pytest.mark.cli
def test_file_module_and_class_targets_give_the_factorys_findings(layout):
    targets = {
        "factory": "src/tinyvision/models/vit.py:make_vit",
        "module factory": "tinyvision.models.vit:make_vit",
        "file class": f"src/tinyvision/models/vit.py:ViT --input {INPUT}",
        "module class": f"tinyvision.models.vit:ViT --input {INPUT}",
        "package class": f"src/tinyvision/models/__init__.py:ViT --input {INPUT}",
        "script": "scripts/build.py:make",
    }
    done = run_graphlint("check", "--no-cache", "--format", "json", "--select", "GL1", *targets.values(), cwd=layout)
    assert done.returncode == 1, done.stderr
    found = _findings_by_target(done.stdout)
    expected = found[targets["factory"]]
    assert ("GL101", "src/tinyvision/layers.py", line_of(layout / "src/tinyvision/layers.py", "softmax")) in expected
    for form, target in targets.items():
        assert found.get(target) == expected, form


@pytest.mark.cli
def test_a_suppression_in_a_package_file_holds_for_a_module_target(layout, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(layout, copy)
    layers = copy / "src/tinyvision/layers.py"
    layers.write_text(layers.read_text().replace("@ v\n", "@ v  # graphlint: ignore[GL101]\n"))
    done = run_graphlint("check", "--no-cache", "--select", "GL101", "--show-suppressed",
                         "tinyvision.models.vit:make_vit", cwd=copy)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"src/tinyvision/layers.py:{line_of(layers, 'softmax')}:" in done.stdout and "(suppressed)" in done.stdout


@pytest.mark.cli
def test_a_file_named_like_its_package_lints_as_a_file_a_class_and_a_module(layout):
    targets = ["xformer/xformer.py:make_decoder", f"xformer/xformer.py:Decoder --input {INPUT}",
               "xformer.xformer:make_decoder"]
    done = run_graphlint("check", "--no-cache", "--format", "json", "--select", "GL101", *targets, cwd=layout)
    assert done.returncode == 1, done.stderr
    found = _findings_by_target(done.stdout)
    line = line_of(layout / "xformer/attend.py", "softmax")
    assert {target: found.get(target) for target in targets} == {
        target: {("GL101", "xformer/attend.py", line)} for target in targets}


@pytest.mark.cli
def test_a_class_that_needs_a_module_argument_says_to_write_a_factory(layout):
    done = run_graphlint("check", "--no-cache", "xformer/xformer.py:Wrapper", "--init", "attn_layers=Decoder",
                         "--input", INPUT, cwd=layout)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert "'str' object has no attribute 'dim'" in lines[0]
    assert "attn_layers as the text 'Decoder'" in lines[0] and "write a factory function" in lines[0]


# -- what is still not importable says where graphlint looked, and the setting ------------------------------------


@pytest.mark.cli
def test_a_missing_pythonpath_is_one_line_naming_the_package_root_and_the_setting(layout, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(layout, copy)
    pyproject = copy / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('pythonpath = ["lib"]', "pythonpath = []"))
    done = run_graphlint("check", "--no-cache", "src/tinyvision/models/vit.py:make_vit", cwd=copy)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert "No module named 'blocks'" in lines[0]
    assert "package root src" in lines[0]
    assert 'pythonpath = ["lib"]' in lines[0] and "--pythonpath lib" in lines[0]
    fixed = run_graphlint("check", "--no-cache", "--select", "GL101", "--pythonpath", "lib",
                          "src/tinyvision/models/vit.py:make_vit", cwd=copy)
    assert fixed.returncode == 1 and "GL101" in fixed.stdout, fixed.stderr


@pytest.mark.cli
def test_a_relative_import_outside_a_package_says_to_add_an_init_file(tmp_path):
    write(tmp_path, "pyproject.toml", "")
    write(tmp_path, "models/net.py", "from .layers import Block\n\ndef make():\n    pass\n")
    write(tmp_path, "models/layers.py", "Block = None\n")
    done = run_graphlint("check", "--no-cache", "models/net.py:make", cwd=tmp_path)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert "has no __init__.py" in done.stderr and "add an __init__.py" in done.stderr


# -- fixes are proven on a copy that imports the copy --------------------------------------------------------------


@pytest.mark.cli
@pytest.mark.proof
def test_a_fix_in_a_src_package_is_proven_on_the_copy_and_applied(layout, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(layout, copy)
    done = run_graphlint("check", "--no-cache", "--select", "GL101", "--fix", "tinyvision.models.vit:make_vit",
                         cwd=copy)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "scaled_dot_product_attention" in (copy / "src/tinyvision/layers.py").read_text()
    assert "scaled_dot_product_attention" not in (layout / "src/tinyvision/layers.py").read_text()


@pytest.mark.cli
@pytest.mark.proof
def test_a_fix_in_a_folder_given_by_pythonpath_on_the_command_line_is_proven_on_the_copy(tmp_path):
    write(tmp_path, "pyproject.toml", "")
    write(tmp_path, "vendor/attn_block.py", """
        import torch


        def attend(q, k, v):
            return torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1) @ v
    """)
    write(tmp_path, "models/__init__.py", "")
    write(tmp_path, "models/net.py", """
        import torch
        from torch import nn

        from attn_block import attend


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.qkv = nn.Linear(16, 48)

            def forward(self, x):
                return attend(*self.qkv(x).chunk(3, dim=-1))


        def make():
            return Net(), (torch.randn(2, 8, 16),)
    """)
    # The proof's copies import the copy of vendor/: the original one still holds the hand-written attention.
    done = run_graphlint("check", "--no-cache", "--select", "GL101", "--fix", "--pythonpath", "vendor",
                         "models/net.py:make", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "scaled_dot_product_attention" in (tmp_path / "vendor/attn_block.py").read_text()
