"""Shapes of target found while linting real repositories' packages as their users would (a `vit_small(**kwargs)`
helper that fixes some constructor arguments, a model configured by a dataclass): each case is written here
for the test, in the same class of code, and run through the real command."""

from __future__ import annotations

import pytest

from conftest import WITHOUT_COMPILE, line_of, run_graphlint, write

NET = """
    from torch import nn


    class Net(nn.Module):
        def __init__(self, depth=1, width=4):
            super().__init__()
            self.layers = nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)])

        def forward(self, x):
            return self.layers(x)


    def small(**kwargs):
        return Net(depth=2, **kwargs)
"""


@pytest.mark.parametrize("command", ["check", "memory"])
def test_an_error_of_the_users_call_reads_as_python_raises_it_after_the_cpu_rebuild(project_dir, command):
    # The CPU rebuild used to run inside the meta attempt's `except`, where Python 3.11 reports a keyword given
    # twice as KeyError: 'depth' instead of its TypeError.
    path = write(project_dir, "zoo.py", NET)
    result = run_graphlint(command, "zoo.py:small", "--init", "depth=3", "--input", "float32[2,4]", cwd=project_dir)
    assert result.returncode == 2, result.stderr
    assert "got multiple values for keyword argument 'depth'" in result.stderr, result.stderr
    assert "KeyError" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert f"(at zoo.py:{line_of(path, 'return Net(depth=2')})" in result.stderr, result.stderr



def test_a_plain_files_module_is_named_by_its_stem_in_pythons_messages(project_dir):
    # A file outside any package (nanoGPT's model.py) is imported under a private module name, which Python's
    # message for the class named it by.
    write(project_dir, "zoo.py", NET)
    result = run_graphlint("check", "zoo.py:small", "--init", "depth=3", "--input", "float32[2,4]", cwd=project_dir)
    assert "TypeError: zoo.Net() got multiple values for keyword argument 'depth'" in result.stderr, result.stderr
    assert "_graphlint_target_" not in result.stderr, result.stderr

def test_a_missing_module_imported_by_a_sibling_that_the_package_re_exports_names_that_line(project_dir):
    # vit_pytorch/__init__.py imports dino.py, which needs torchvision: linting vit.py fails on an import that
    # vit.py does not have.
    write(project_dir, "zoo/__init__.py", "from zoo.vit import ViT\nfrom zoo.dino import Dino\n")
    write(project_dir, "zoo/vit.py", "from torch import nn\n\n\nclass ViT(nn.Linear):\n    pass\n")
    dino = write(project_dir, "zoo/dino.py", "import torch\nfrom not_installed_xyz import transforms\n\nDino = 1\n")
    where = f"No module named 'not_installed_xyz' (imported at zoo/dino.py:{line_of(dino, 'not_installed_xyz')});"
    for target in ("zoo/vit.py:ViT", "zoo.vit:ViT"):
        result = run_graphlint("check", *WITHOUT_COMPILE, target, "--init", "in_features=4", "--init", "out_features=4",
                               "--input", "float32[2,4]", cwd=project_dir)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert where in result.stderr, result.stderr
    # The file that has the import is not named twice.
    result = run_graphlint("check", *WITHOUT_COMPILE, "zoo/dino.py:Dino", cwd=project_dir)
    assert "No module named 'not_installed_xyz'; graphlint imported it" in result.stderr, result.stderr


def test_a_table_given_for_a_config_object_says_to_write_a_factory(project_dir):
    # nanoGPT's GPT(config) and mamba.py's LM(model_config) read attributes of a config dataclass.
    write(project_dir, "gpt.py", """
        from dataclasses import dataclass

        from torch import nn


        @dataclass
        class GPTConfig:
            n_embd: int = 16
            n_layer: int = 2


        class GPT(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.blocks = nn.Sequential(*[nn.Linear(config.n_embd, config.n_embd) for _ in range(config.n_layer)])

            def forward(self, x):
                return self.blocks(x)
    """)
    result = run_graphlint("check", "gpt.py:GPT", "--init", 'config={"n_layer": 1}', "--input", "float32[2,16]",
                           cwd=project_dir)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "GPT() raised AttributeError: 'dict' object has no attribute 'n_layer'" in result.stderr, result.stderr
    assert ("--init gave config as the table {'n_layer': 1}: an argument that must be an object (a module, a "
            "config) cannot be written on the command line: write a factory function") in result.stderr, result.stderr
