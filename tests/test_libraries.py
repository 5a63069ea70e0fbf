"""graphlint.libraries: the versions of the libraries a capture ran, read from their metadata once per change of it
(every lint reads them twice, in the warm parent and in the target's child)."""

from __future__ import annotations

import importlib.metadata
import os
import sys

import pytest

from conftest import write
from graphlint import libraries


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
    """A test worker makes a warm parent for each lint: walking sys.modules after a fork copies every module's page."""
    import graphlint.pipeline  # noqa: F401 - imported before the patch below, which it must not keep
    from graphlint.run import parent

    walks = []
    monkeypatch.setattr(libraries, "loaded_libraries", lambda modules=None: walks.append(1) or ({}, ()))
    once = getattr(libraries, "read_once", None)
    if once is not None:
        once.cache_clear()
    try:
        parent.WarmParent()
        parent.WarmParent()
    finally:
        if once is not None:
            once.cache_clear()  # the next warm parent reads the real metadata
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
