"""graphlint.libraries: the versions of the libraries a capture ran, read from their metadata once per change of it
(every lint reads them twice, in the warm parent and in the target's child), and the modules a forked child
depends on, read from its parent for those it inherited."""

from __future__ import annotations

import importlib.metadata
import os
import sys
import types

import pytest

from conftest import lint_file, write
from graphlint import libraries
from graphlint.run.parent import start_method


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """A distribution `gl_probe` as pip installs it, in a site folder on sys.path, with its module imported."""
    site = tmp_path / "site"
    write(site, "gl_probe/__init__.py", "")
    info = site / "gl_probe-1.0.dist-info"
    write(info, "METADATA", "Metadata-Version: 2.1\nName: gl_probe\nVersion: 1.0\n")
    write(info, "top_level.txt", "gl_probe\n")
    write(info, "RECORD", "")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    libraries._owners.cache_clear()
    monkeypatch.setattr(libraries, "_READ", {}, raising=False)  # no memo from other tests
    import gl_probe  # noqa: F401
    yield info / "METADATA"
    sys.modules.pop("gl_probe", None)
    libraries._owners.cache_clear()
    libraries._distribution.cache_clear()


def _reads(monkeypatch) -> list[str]:
    """The distributions whose version is parsed from their metadata from now on."""
    read = []
    version = importlib.metadata.Distribution.version

    def counted(distribution):
        read.append(distribution.metadata["Name"])
        return version.fget(distribution)

    monkeypatch.setattr(importlib.metadata.Distribution, "version", property(counted))
    return read


def test_an_unchanged_distribution_is_not_parsed_again(installed, monkeypatch):
    first = libraries.loaded_libraries()
    assert first[0]["gl_probe"] == "1.0"
    read = _reads(monkeypatch)
    assert libraries.loaded_libraries() == first
    assert read == []


def test_metadata_rewritten_in_place_is_read_again(installed, monkeypatch):
    assert libraries.loaded_libraries()[0]["gl_probe"] == "1.0"
    installed.write_text("Metadata-Version: 2.1\nName: gl_probe\nVersion: 1.1\n", encoding="utf-8")
    stat = installed.stat()
    os.utime(installed, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # a later write, however coarse the clock
    read = _reads(monkeypatch)
    assert libraries.loaded_libraries()[0]["gl_probe"] == "1.1"
    assert "gl_probe" in read


def test_warm_parents_walk_the_loaded_modules_once_per_process(monkeypatch):
    """A test worker makes a warm parent for each lint: walking sys.modules after a fork copies every module's page, so
    the walk before a fork is made again only when modules were added or removed since."""
    from graphlint.run import parent

    parent.WarmParent()
    walks = []
    walk = libraries.loaded_modules
    monkeypatch.setattr(libraries, "loaded_modules", lambda: walks.append(1) or walk())
    monkeypatch.setattr(libraries, "_walked", None)
    parent.WarmParent()
    libraries.note_fork()
    parent.WarmParent()
    libraries.note_fork()
    assert len(walks) == 1


def test_an_upgrade_in_a_long_lived_process_is_read_from_the_new_version(installed, monkeypatch):
    """A language server lives on while the user upgrades a library: the old version's folder goes, a new one comes."""
    assert libraries.loaded_libraries()[0]["gl_probe"] == "1.0"
    old = installed.parent
    for file in old.iterdir():
        file.unlink()
    old.rmdir()
    new = old.parent / "gl_probe-2.0.dist-info"
    write(new, "METADATA", "Metadata-Version: 2.1\nName: gl_probe\nVersion: 2.0\n")
    write(new, "top_level.txt", "gl_probe\n")
    write(new, "RECORD", "")
    importlib.invalidate_caches()
    assert libraries.loaded_libraries()[0]["gl_probe"] == "2.0"


def _module(name: str) -> types.ModuleType:
    return types.ModuleType(name)


def test_modules_imported_since_a_mark_are_read_from_the_end_unless_one_before_it_went(monkeypatch):
    monkeypatch.setitem(sys.modules, "gl_old", _module("gl_old"))
    mark, before = libraries.newest(), len(sys.modules)
    assert mark == ("gl_old", sys.modules["gl_old"])
    monkeypatch.setitem(sys.modules, "gl_new_a", _module("gl_new_a"))
    monkeypatch.setitem(sys.modules, "gl_new_b", _module("gl_new_b"))
    assert [name for name, _ in libraries.imported_since(mark, before)] == ["gl_new_a", "gl_new_b"]
    # The mark removed and put back (it would read as the newest module), or another module removed: only a walk
    # of every module can say what is new.
    old = sys.modules.pop("gl_old")
    sys.modules["gl_old"] = old
    assert libraries.imported_since(mark, before) is None
    mark, before = libraries.newest(), len(sys.modules)
    monkeypatch.delitem(sys.modules, "gl_new_a")
    monkeypatch.setitem(sys.modules, "gl_new_c", _module("gl_new_c"))
    assert libraries.imported_since(mark, before) is None
    assert libraries.imported_since(None, before) is None


@pytest.fixture
def watched(tmp_path, monkeypatch):
    """A first-party module the test's process has imported, whose `__file__` notes the process that reads it."""
    readers = tmp_path / "readers"
    path = write(tmp_path, "helper.py", "")

    class Watched(types.ModuleType):
        @property
        def __file__(self):
            with open(readers, "a") as out:
                out.write(f"{os.getpid()}\n")
            return str(path)

    monkeypatch.setitem(sys.modules, "gl_helper", Watched("gl_helper"))
    return path, readers


@pytest.mark.skipif(start_method() != "fork", reason="spawned children import everything themselves")
def test_a_forked_child_reads_its_parents_modules_from_the_parent_and_depends_on_them_and_its_own(
        installed, watched, tmp_path):
    """A test worker or a notebook is a warm parent with thousands of modules: a child that walked them all copied
    every page they lie on. Its result still depends on the project's modules the parent had imported, on those
    the target imported, and on the libraries of both."""
    helper, readers = watched
    write(tmp_path, "sibling.py", "SCALE = 2\n")
    path = write(tmp_path, "model.py", """
        import torch
        import sibling


        def make():
            return torch.nn.Linear(4, sibling.SCALE), (torch.randn(2, 4),)
    """)
    [result] = lint_file(path).results
    assert not result.errors
    assert {str(helper), str(tmp_path / "sibling.py"), str(path)} <= set(result.inputs)
    assert result.libraries["gl_probe"] == "1.0" and "torch" in result.libraries
    assert set(readers.read_text().split()) == {str(os.getpid())}  # read here, never in the child


@pytest.mark.skipif(start_method() != "fork", reason="spawned children import everything themselves")
def test_a_child_that_removes_a_module_it_inherited_still_depends_on_what_it_imported(watched, tmp_path):
    helper, _ = watched
    write(tmp_path, "sibling.py", "SCALE = 2\n")
    path = write(tmp_path, "model.py", """
        import sys

        import torch
        import sibling

        sys.modules.pop("gl_helper")


        def make():
            return torch.nn.Linear(4, sibling.SCALE), (torch.randn(2, 4),)
    """)
    [result] = lint_file(path).results
    assert not result.errors
    assert str(tmp_path / "sibling.py") in result.inputs and str(helper) not in result.inputs


def test_the_owners_of_top_level_names_come_from_top_level_txt_or_record_without_parsing_metadata(tmp_path,
                                                                                                  monkeypatch):
    """Every command's warm parent maps top-level modules to their distributions: naming each by its folder, as pip
    writes it, instead of parsing its METADATA, halves that. A distribution without top_level.txt (most build
    backends but setuptools) is read from the Python files its RECORD lists."""
    site = tmp_path / "site"
    declared = site / "gl_declared-1.0.dist-info"
    write(declared, "METADATA", "Metadata-Version: 2.1\nName: GL-Declared\nVersion: 1.0\n")
    write(declared, "top_level.txt", "gl_declared_mod\n")
    recorded = site / "gl_recorded-2.0.dist-info"
    write(recorded, "METADATA", "Metadata-Version: 2.1\nName: GL.Recorded\nVersion: 2.0\n")
    write(recorded, "RECORD", "gl_recorded_pkg/__init__.py,,\ngl_recorded_pkg/data.json,,\ngl_single.py,,\n"
                              "gl_recorded-2.0.dist-info/METADATA,,\n")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    parsed = []
    metadata = importlib.metadata.Distribution.metadata
    monkeypatch.setattr(importlib.metadata.Distribution, "metadata",
                        property(lambda distribution: parsed.append(1) or metadata.fget(distribution)))
    libraries._owners.cache_clear()
    try:
        owners = libraries._owners()
    finally:
        libraries._owners.cache_clear()
    assert owners["gl_declared_mod"] == ["gl_declared"]
    assert owners["gl_recorded_pkg"] == owners["gl_single"] == ["gl_recorded"]
    assert "torch" in owners and not parsed
    assert libraries._normalized("GL.Recorded") == libraries._normalized("gl_recorded") == "gl-recorded"


@pytest.mark.skipif(start_method() != "fork", reason="spawned children import everything themselves")
def test_a_lazily_loaded_module_that_imports_when_read_leaves_the_dependencies_whole(tmp_path):
    """A module loaded through importlib's LazyLoader (as the `lazy_loader` package loads scikit-image's and
    librosa's) runs its code at the first attribute read, which may import more while its files are read."""
    write(tmp_path, "lazy_dep.py", "VALUE = 4\n")
    write(tmp_path, "lazy_mod.py", "import lazy_dep\n\nWIDTH = lazy_dep.VALUE\n")
    path = write(tmp_path, "model.py", """
        import importlib.util
        import sys

        import torch


        def make():
            spec = importlib.util.find_spec("lazy_mod")
            spec.loader = importlib.util.LazyLoader(spec.loader)
            module = importlib.util.module_from_spec(spec)
            sys.modules["lazy_mod"] = module
            spec.loader.exec_module(module)  # nothing runs until an attribute is read
            return torch.nn.Linear(4, 4), (torch.randn(2, 4),)
    """)
    [result] = lint_file(path).results
    assert not result.errors, result.errors
    assert {str(tmp_path / "lazy_mod.py"), str(path)} <= set(result.inputs)
