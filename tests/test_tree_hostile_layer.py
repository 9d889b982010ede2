"""A Python layer's file names, as a hostile package (a plain wheel: no code runs at install) lays them out, and
what the service then puts in the runs' tree. Each expected failure is a weakness found on main."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from conftest import needs_root

from runtimes.config import RuntimeConfig
from runtimes.jail.trees import image_trees
from runtimes.linux import rootfs
from runtimes.python.runtime import PythonRuntime


@pytest.fixture
def place():
    path = tempfile.mkdtemp(prefix="sandlot-hostile-tree-", dir="/var/tmp")  # not under /tmp: runs replace it
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def hostile_layer(place: str, named: str) -> str:
    """A layer whose package holds a file (".so" in its name: an ELF file to elf_files_under) at
    `hostile/x <named> (0x.so`: ldd's header line for it then reads `.../hostile/x <named> (0x.so:`, which the
    service's pattern for a library's line (`/path (0x...`) takes for the library `named`."""
    layer = tempfile.mkdtemp(prefix="sandlot-layer-", dir=place)
    directory, name = os.path.split(named)
    inner = layer + "/hostile/x " + directory
    os.makedirs(inner)
    with open(os.path.join(inner, f"{name} (0x.so"), "w") as f:
        f.write("not an ELF file\n")
    with open(os.path.join(layer, "hostile", "_speedups.so"), "w") as f:  # a second file: ldd names each
        f.write("not an ELF file either\n")
    with open(os.path.join(layer, "hostile", "__init__.py"), "w") as f:
        f.write("")
    os.chmod(layer, 0o755)
    return layer


@pytest.mark.skipif(shutil.which("ldd") is None, reason="needs ldd")
def test_a_layer_file_name_never_puts_a_host_path_in_the_runs_tree(place):
    secret = os.path.join(place, "operator", "config.yaml")  # a file of the host's runs must not read
    os.makedirs(os.path.dirname(secret))
    with open(secret, "w") as f:
        f.write("api_key: the-service-key\n")
    layer = hostile_layer(place, secret)

    found = rootfs.shared_libraries(rootfs.elf_files_under(layer))
    runtime = PythonRuntime(RuntimeConfig(python_layer=layer))
    spec, base = runtime.tree().to_dict(), runtime.tree(layer=False).to_dict()
    added = image_trees.additions(spec, base) or {"binds": []}
    assert secret not in found, found
    assert secret not in spec["binds"]
    assert secret not in added["binds"]


READ = """
try:
    print(open({path!r}).read().strip())
except OSError as exc:
    print(type(exc).__name__)
"""


@needs_root
@pytest.mark.skipif(shutil.which("ldd") is None, reason="needs ldd")
def test_a_run_never_reads_a_host_file_a_wheel_named(place):
    from test_image_trees_hostile import serving, stdout
    from test_layers import make_wheel, readable

    secret = os.path.join(place, "operator", "config.yaml")
    os.makedirs(os.path.dirname(secret))
    with open(secret, "w") as f:
        f.write("api_key: the-service-key\n")
    house = os.path.join(place, "wheels")
    os.makedirs(house)
    files = {"hostile/__init__.py": "", "hostile/_speedups.so": "x\n", f"hostile/x {secret} (0x.so": "x\n"}
    make_wheel(Path(house), "sandlot-hostile", "1.0", files)
    requirements = os.path.join(house, "requirements.txt")
    with open(requirements, "w") as f:
        f.write("sandlot-hostile\n")
    readable(Path(place))
    data, image = os.path.join(place, "data"), os.path.join(place, "image")
    os.makedirs(data)
    os.makedirs(image)
    svc = serving(
        data,
        image,
        SANDLOT_TEST_IMAGE_LAYERLESS="1",
        SANDLOT_PYTHON_REQUIREMENTS=requirements,
        SANDLOT_PIP_FIND_LINKS=house,
    )
    try:
        assert stdout(svc, READ.format(path=secret)).strip() == "FileNotFoundError"
    finally:
        svc.stop()
