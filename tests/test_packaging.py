"""Packaging (issue 14): licence, metadata, extras, installed schemas, and an sdist without tests.

The sdist and wheel are built from a copy of the tree with the setuptools of the test venv (no
build isolation, so no download), and their contents and metadata are read back.
"""

from __future__ import annotations

import email
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGED = ("schemas", "spec")


def test_licence_file_is_the_declared_licence() -> None:
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'license = "Apache-2.0"' in pyproject and 'license-files = ["LICENSE"]' in pyproject


def test_installed_schemas_and_rules_are_the_spec_s() -> None:
    """``refplan/schemas`` and ``refplan/spec/validation.md`` are copies that ship; they must not drift."""
    spec = sorted(p.name for p in (ROOT / "spec" / "schemas").glob("*.json"))
    packaged = sorted(p.name for p in (ROOT / "refplan" / "schemas").glob("*.json"))
    assert spec == packaged and spec
    for name in spec:
        assert (ROOT / "spec" / "schemas" / name).read_bytes() == (ROOT / "refplan" / "schemas" / name).read_bytes(), (
            f"refplan/schemas/{name} differs from spec/schemas/{name}: copy it over"
        )
    assert (ROOT / "spec" / "validation.md").read_bytes() == (ROOT / "refplan" / "spec" / "validation.md").read_bytes()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    pytest.importorskip("setuptools", minversion="77")
    src = tmp_path_factory.mktemp("src")
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", ".hypothesis", "work", "artifacts")
    for name in ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in", "CHANGELOG.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("refplan", "tests", "spec", "fuzz", "proofs"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    out = tmp_path_factory.mktemp("dist")
    for hook in ("build_sdist", "build_wheel"):  # one process each, as a build frontend runs them
        script = f"import sys; from setuptools import build_meta as b; b.{hook}(sys.argv[1])"
        done = subprocess.run([sys.executable, "-W", "always", "-c", script, str(out)], cwd=src,
                              capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        # The table form `license = {text = ...}` printed a deprecation warning on every install.
        assert "project.license` as a TOML table is deprecated" not in done.stderr, done.stderr[-3000:]
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return sdist, wheel


def test_sdist_has_the_licence_and_package_data_and_leaves_tests_out(built: tuple[Path, Path]) -> None:
    sdist, _ = built
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml", "refplan/schemas/maps.schema.json",
            "refplan/spec/validation.md", "refplan/conformance/cases/rules.json", "refplan/py.typed"} <= names
    assert not [n for n in names if n.startswith(("tests/", "fuzz/", "proofs/"))]


def test_wheel_metadata_declares_licence_classifiers_and_extras(built: tuple[Path, Path]) -> None:
    _, wheel = built
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = email.message_from_bytes(zf.read(meta_name))
        for name in PACKAGED:
            assert any(n.startswith(f"refplan/{name}/") for n in names), name
        assert zf.read("refplan/schemas/maps.schema.json") == (ROOT / "spec/schemas/maps.schema.json").read_bytes()
    assert meta["License-Expression"] == "Apache-2.0"
    assert "LICENSE" in (meta.get_all("License-File") or [])
    classifiers = meta.get_all("Classifier") or []
    assert "Typing :: Typed" in classifiers
    assert any(c.startswith("Programming Language :: Python :: 3") for c in classifiers)
    extras = set(meta.get_all("Provides-Extra") or [])
    assert {"torch", "hypothesis", "png", "peers"} <= extras
    requires = meta.get_all("Requires-Dist") or []
    hypothesis_extra = [r for r in requires if 'extra == "hypothesis"' in r]
    assert hypothesis_extra and all(r.startswith("hypothesis") for r in hypothesis_extra)  # not the test stack
    assert any(r.startswith("matplotlib") and 'extra == "png"' in r for r in requires)
    assert any(r.startswith("deepspeed") and 'extra == "peers"' in r for r in requires)



def test_strategies_without_hypothesis_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    monkeypatch.setitem(sys.modules, "hypothesis", None)
    monkeypatch.delitem(sys.modules, "refplan.strategies", raising=False)
    with pytest.raises(ModuleNotFoundError, match=r"refplan\[hypothesis\]"):
        importlib.import_module("refplan.strategies")
