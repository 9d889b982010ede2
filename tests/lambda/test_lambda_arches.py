"""Lambda's two architectures: what `sam build` makes for each, checked by metadata (infra/sam/arches.py).

The API function's zip is built by infra/build-api.sh for SANDLOT_API_ARCH (x86_64 or arm64) from manylinux
binary wheels: its extension modules are ELF files of that machine (e_machine 62 or 183), whatever builds them.
"""

from __future__ import annotations

import importlib.util
import os
import struct
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("sam_arches", os.path.join(REPO, "infra", "sam", "arches.py"))
arches = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(arches)


def elf(machine: int, little: bool = True) -> bytes:
    """The first bytes of a 64-bit ELF shared object for machine."""
    order = "<" if little else ">"
    ident = b"\x7fELF" + bytes([2, 1 if little else 2, 1]) + b"\0" * 9
    return ident + struct.pack(order + "HHI", 3, machine, 1) + b"\0" * 40


def test_elf_machine_reads_the_header(tmp_path):
    for machine, little in ((62, True), (183, True), (183, False)):
        path = tmp_path / f"m{machine}{little}.so"
        path.write_bytes(elf(machine, little))
        assert arches.elf_machine(str(path)) == machine
    (tmp_path / "text.py").write_text("print(1)\n")
    (tmp_path / "short").write_bytes(b"\x7fELF")
    assert arches.elf_machine(str(tmp_path / "text.py")) is None
    assert arches.elf_machine(str(tmp_path / "short")) is None


def test_this_interpreters_own_extension_modules_are_this_machines():
    import _ctypes  # an extension module of every CPython build

    native = {"x86_64": 62, "aarch64": 183}[os.uname().machine]
    assert arches.elf_machine(_ctypes.__file__) == native


def test_a_zip_with_a_module_of_another_machine_fails_and_names_it(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "fast.cpython-312-aarch64-linux-gnu.so").write_bytes(elf(183))
    (tmp_path / "pkg" / "slow.py").write_text("")
    assert arches.check_zip(str(tmp_path), "arm64") == ["PASS the API zip's 1 ELF files are arm64"]
    (tmp_path / "pkg" / "stray.cpython-312-x86_64-linux-gnu.so").write_bytes(elf(62))
    [line] = arches.check_zip(str(tmp_path), "arm64")
    assert line.startswith("FAIL") and "stray.cpython-312-x86_64-linux-gnu.so (x86_64)" in line
    [line] = arches.check_zip(str(tmp_path / "pkg" / "nothing"), "x86_64")
    assert line.startswith("FAIL") and "none found" in line


def test_the_cli_exits_non_zero_on_a_failure(tmp_path):
    (tmp_path / "m.so").write_bytes(elf(62))
    script = os.path.join(REPO, "infra", "sam", "arches.py")
    ok = subprocess.run(["python3", script, "zip", str(tmp_path), "x86_64"], capture_output=True, text=True)
    bad = subprocess.run(["python3", script, "zip", str(tmp_path), "arm64"], capture_output=True, text=True)
    usage = subprocess.run(["python3", script, "zip", str(tmp_path), "riscv"], capture_output=True, text=True)
    assert (ok.returncode, bad.returncode, usage.returncode) == (0, 1, 2)
    assert ok.stdout.startswith("PASS") and bad.stdout.startswith("FAIL")


@pytest.mark.parametrize("arch", ["arm64", "x86_64"])
def test_build_api_makes_a_zip_of_the_asked_architecture(tmp_path, arch):
    """infra/build-api.sh as `sam build` runs it, for each Architecture: pip's manylinux wheels of that machine."""
    out = tmp_path / "zip"
    env = {**os.environ, "SANDLOT_API_ARCH": arch, "PYTHON": "python3"}
    result = subprocess.run(
        [os.path.join(REPO, "infra", "build-api.sh"), str(out)], env=env, capture_output=True, text=True, timeout=600
    )
    if result.returncode != 0 and "No matching distribution" in result.stderr + result.stdout:
        pytest.skip(f"no {arch} wheels reachable from here: {result.stderr.strip().splitlines()[-1:]}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert arches.check_zip(str(out), arch)[0].startswith("PASS"), arches.check_zip(str(out), arch)


def test_build_api_refuses_an_unknown_architecture(tmp_path):
    env = {**os.environ, "SANDLOT_API_ARCH": "aarch64"}  # Lambda's name is arm64
    result = subprocess.run(
        [os.path.join(REPO, "infra", "build-api.sh"), str(tmp_path / "zip")], env=env, capture_output=True, text=True
    )
    assert result.returncode == 1 and "x86_64 or arm64" in result.stderr


def image_root(tmp_path, machine: int, node: bool = False):
    """An image's root as the runtime images lay it out: the venv's python a link (absolute, as venv makes it) to
    the base image's, which links on to the real file; an extension module in the venv and one in the layer."""
    root = tmp_path / "root"
    for directory in (
        "usr/bin",
        "usr/local/bin",
        "opt/sandlot/venv/bin",
        "opt/sandlot/venv/lib/site",
        "opt/sandlot/layers/python/m",
    ):
        (root / directory).mkdir(parents=True)
    (root / "usr/bin/python3.11").write_bytes(elf(machine))
    (root / "usr/local/bin/python3").symlink_to("/usr/bin/python3.11")
    (root / "opt/sandlot/venv/bin/python").symlink_to("/usr/local/bin/python3")
    (root / "opt/sandlot/venv/lib/site/_fast.cpython-311-linux-gnu.so").write_bytes(elf(machine))
    (root / "opt/sandlot/layers/python/m/_speedups.cpython-311-linux-gnu.so").write_bytes(elf(machine))
    if node:
        (root / "usr/local/bin/node").write_bytes(elf(machine))
    return root


def test_an_image_root_of_the_asked_machine_passes_its_links_followed_inside_it(tmp_path):
    root = image_root(tmp_path, 183, node=True)
    lines = arches.check_root(str(root), "arm64", "img")
    assert [line.split(" ", 1)[0] for line in lines] == ["PASS"] * 3, lines
    assert "img's /opt/sandlot/venv/bin/python is arm64 (ELF machine 183, usr/bin/python3.11)" in lines[0]
    assert lines[1].startswith("PASS img's /usr/local/bin/node is arm64")
    assert lines[2].startswith("PASS img's 2 ELF files under /opt/sandlot are arm64 (2 extension modules")
    # the same root read as x86_64: every check fails (this machine's own /usr/bin/python3.11 is never read)
    assert all(line.startswith("FAIL") for line in arches.check_root(str(root), "x86_64", "img"))


def test_an_image_root_with_a_module_of_another_machine_or_none_fails_and_says_which(tmp_path):
    root = image_root(tmp_path, 183)
    stray = root / "opt/sandlot/layers/python/m/_stray.cpython-311-linux-gnu.so"
    stray.write_bytes(elf(62))
    *_, line = arches.check_root(str(root), "arm64", "img")
    assert (
        line.startswith("FAIL img's 3 ELF files") and "layers/python/m/_stray.cpython-311-linux-gnu.so (x86_64)" in line
    )
    for module in root.glob("opt/sandlot/**/*.so"):
        module.unlink()
    *_, line = arches.check_root(str(root), "arm64", "img")
    assert line.startswith("FAIL") and "no extension module" in line
    (root / "opt/sandlot/venv/bin/python").unlink()
    (root / "usr/bin/python3.11").unlink()
    assert arches.check_root(str(root), "arm64", "img")[0].startswith("FAIL img's interpreter is arm64: none of")
