"""The GPU run bundle (scripts/gpu_bundle.py, scripts/gpu_install.py): what travels to a host without a package
index, and how it is unpacked there. No network: a resolution is given as nodes, archives are made here."""

from __future__ import annotations

import importlib.util
import io
import json
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


bundle = _load("gpu_bundle")
install = _load("gpu_install")


def nodes(**graph: tuple[str, list[str]]) -> dict[str, object]:
    return {name: bundle.Node(name, version, requires) for name, (version, requires) in graph.items()}


def test_what_travels_is_reachable_not_the_hosts_and_not_left_out(tmp_path: Path) -> None:
    host = tmp_path / "host.txt"
    host.write_text("# the host\nnumpy==2.5.2   # old enough\nscipy\nrich==15.0.0\n")
    graph = nodes(
        app=("1.0", ["numpy>=2", "rich~=14.1", "datasets>=3", "scipy", "torch", "uvloop; sys_platform == 'win32'",
                     "extra-only; extra == 'fancy'"]),
        numpy=("2.4.6", []),
        rich=("14.1.0", []),
        datasets=("5.2.0", ["pyarrow>=18"]),
        pyarrow=("25.0.1", []),
        scipy=("1.17.1", []),
        torch=("2.10.0", ["nvidia-cublas-cu12"]),
        **{"nvidia-cublas-cu12": ("12.8", []), "extra-only": ("1.0", []), "uvloop": ("0.23.0", [])},
    )
    carry, left = bundle.choose(graph, ["app"], "3.12", host)
    assert sorted(n.name for n in carry) == ["app", "rich"]  # rich: the host's 15.0.0 is outside ~=14.1
    assert left["numpy"] == "the host has 2.5.2"
    assert left["scipy"] == "the host has it (version not read)"
    assert left["torch"].startswith("the host's") and left["nvidia-cublas-cu12"].startswith("the host's")
    assert "datasets" not in left and "pyarrow" not in left  # left out with the reason NOT_NEEDED gives
    assert "datasets" in bundle.NOT_NEEDED


def test_an_extra_asked_for_brings_its_requirements(tmp_path: Path) -> None:
    host = tmp_path / "host.txt"
    host.write_text("")
    graph = nodes(app=("1", ["lib[fast]"]), lib=("1", ["speedup; extra == 'fast'", "slowpath; extra == 'slow'"]),
                  speedup=("1", []), slowpath=("1", []))
    carry, _ = bundle.choose(graph, ["app"], "3.12", host)
    assert sorted(n.name for n in carry) == ["app", "lib", "speedup"]


def test_nvidia_ml_py_travels_the_cuda_libraries_do_not() -> None:
    assert bundle._host_only("nvidia-cudnn-cu12") and bundle._host_only("cuda-bindings")
    assert not bundle._host_only("nvidia-ml-py")


def _archive(path: Path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:xz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def test_the_bundle_unpacks_and_its_console_scripts_run_on_this_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    src.mkdir()
    _archive(src / "site.tar.xz", {
        "site/hello/__init__.py": b"def main():\n    print('hello from the bundle')\n    return 3\n",
        "site/hello-1.0.dist-info/entry_points.txt": b"[console_scripts]\nHello = hello:main\n",
    })
    into = tmp_path / "site"
    install.unpack(src / "site.tar.xz", into)
    assert install.write_launchers(into) == ["Hello"]
    launcher = into / "bin" / "Hello"
    assert launcher.stat().st_mode & 0o111 and launcher.read_text().startswith(f"#!{sys.executable}\n")
    monkeypatch.syspath_prepend(str(into))  # run the launcher's code here, as its shebang's Python would
    with pytest.raises(SystemExit) as exited:
        exec(compile(launcher.read_text(), str(launcher), "exec"), {"__name__": "__main__"})
    assert (exited.value.code, capsys.readouterr().out) == (3, "hello from the bundle\n")
    install.unpack(src / "site.tar.xz", into)  # again: replaces what is there, no leftover staging folder
    assert not (tmp_path / "site.part").exists()


def test_a_member_outside_the_site_is_refused(tmp_path: Path) -> None:
    _archive(tmp_path / "site.tar.xz", {"site/ok.py": b"", "../escaped.py": b"import os\n"})
    with pytest.raises(tarfile.FilterError):
        install.unpack(tmp_path / "site.tar.xz", tmp_path / "out" / "site")
    assert not (tmp_path / "out" / "escaped.py").exists() and not (tmp_path / "escaped.py").exists()


def test_a_changed_archive_is_refused_before_anything_is_unpacked(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    _archive(tmp_path / "site.tar.xz", {"site/ok.py": b""})
    (tmp_path / "bundle.json").write_text(json.dumps({
        "archive": "site.tar.xz", "archive_sha256": "0" * 64, "python_version": "3.12", "wheels": [],
        "left_to_the_host": {}}))
    sys_argv = sys.argv
    sys.argv = ["gpu_install.py", "--bundle", str(tmp_path), "--into", str(tmp_path / "site")]
    try:
        assert install.main() == 1
    finally:
        sys.argv = sys_argv
    assert "make gpu-bundle again" in capsys.readouterr().err
    assert not (tmp_path / "site").exists()
