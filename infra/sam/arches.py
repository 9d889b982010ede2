"""What `sam build` made, checked by its metadata against the template's Architecture (x86_64 or arm64).

    arches.py zip DIR ARCH          every ELF file of the API function's zip (its extension modules: manylinux
                                    wheels) is built for ARCH (the ELF header's e_machine)
    arches.py image IMAGE ARCH      the runtime image's own architecture (`podman image inspect`), and its files
                                    (`podman image mount`): the interpreters (the venv's python, node where the
                                    image has it) and every ELF file under /opt/sandlot (the extension modules of
                                    the venv and of the layers) are ARCH's
    arches.py root DIR ARCH         those files' check alone, on an image's root already at hand

One line per check, `PASS name: detail` or `FAIL name: detail` (infra/sam_local_test.sh counts them). Needs only
Python's standard library and podman: run with any python3.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys

# Lambda's names (template.yaml's Architecture) -> the ELF header's e_machine, and the OCI image's architecture
E_MACHINE = {"x86_64": 62, "arm64": 183}  # EM_X86_64, EM_AARCH64
OCI_ARCH = {"x86_64": "amd64", "arm64": "arm64"}
MACHINE_NAMES = {62: "x86_64", 183: "aarch64", 3: "i386", 40: "arm"}


def elf_machine(path: str) -> int | None:
    """The e_machine of an ELF file, None for any other file."""
    with open(path, "rb") as f:
        head = f.read(20)
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None
    order = "<" if head[5] == 1 else ">"  # EI_DATA: 1 little-endian, 2 big-endian
    (machine,) = struct.unpack_from(order + "H", head, 18)
    return machine


def elf_files(root: str) -> dict[str, int]:
    """Every ELF file under root (not following links), by its path relative to root, with its e_machine."""
    found = {}
    for directory, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(directory, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            machine = elf_machine(path)
            if machine is not None:
                found[os.path.relpath(path, root)] = machine
    return found


def check_zip(root: str, arch: str) -> list[str]:
    want = E_MACHINE[arch]
    found = elf_files(root)
    wrong = {path: MACHINE_NAMES.get(m, str(m)) for path, m in found.items() if m != want}
    name = f"the API zip's {len(found)} ELF files are {arch}"
    if not found:
        return [f"FAIL {name}: none found under {root} (the zip's extension modules: pydantic_core, orjson...)"]
    if wrong:
        shown = ", ".join(f"{path} ({machine})" for path, machine in sorted(wrong.items())[:3])
        return [f"FAIL {name}: {len(wrong)} are not: {shown}"]
    return [f"PASS {name}"]


def image_arch(image: str) -> str:
    result = _podman("image", "inspect", "--format", "{{.Architecture}}", image)
    if result.returncode != 0:
        raise LookupError(result.stderr.strip() or f"podman image inspect {image} failed")
    return result.stdout.strip()


def check_image(image: str, arch: str) -> list[str]:
    name = f"the image {image} is {OCI_ARCH[arch]}"
    try:
        found = image_arch(image)
    except LookupError as exc:
        return [f"FAIL {name}: {exc}"]
    lines = [f"PASS {name}" if found == OCI_ARCH[arch] else f"FAIL {name}: it is {found}"]
    mounted = _podman("image", "mount", image)
    if mounted.returncode != 0:
        return [*lines, f"FAIL {image}'s files: podman image mount: {mounted.stderr.strip()}"]
    try:
        return [*lines, *check_root(mounted.stdout.strip(), arch, image)]
    finally:
        _podman("image", "unmount", image)


# the runtime images' programs: the venv's interpreter (a link to the base image's), node where it is installed
INTERPRETERS = ("/opt/sandlot/venv/bin/python", "/usr/local/bin/node")
INSTALLED = "/opt/sandlot"  # the venv and the layers: their extension modules


def inside(root: str, path: str, depth: int = 0) -> str:
    """path of the image whose root is root, as a path here, its links followed inside that root (an absolute
    link names the image's own file, never this machine's)."""
    full = os.path.join(root, path.lstrip("/"))
    if depth < 40 and os.path.islink(full):
        target = os.readlink(full)
        return inside(
            root, target if target.startswith("/") else os.path.join(os.path.dirname(path), target), depth + 1
        )
    return full


def check_root(root: str, arch: str, label: str = "") -> list[str]:
    """An image's files, at root: its interpreters and the ELF files under /opt/sandlot are arch's machine."""
    want, label = E_MACHINE[arch], label or root
    lines = []
    interpreters = [p for p in INTERPRETERS if os.path.lexists(os.path.join(root, p.lstrip("/")))]
    if not interpreters:
        lines.append(f"FAIL {label}'s interpreter is {arch}: none of {', '.join(INTERPRETERS)} in it")
    for path in interpreters:
        full = inside(root, path)
        machine = elf_machine(full) if os.path.isfile(full) else None
        name = f"{label}'s {path} is {arch}"
        if machine == want:
            lines.append(f"PASS {name} (ELF machine {machine}, {os.path.relpath(full, root)})")
        else:
            lines.append(f"FAIL {name}: {MACHINE_NAMES.get(machine, machine) if machine else 'no ELF file'}")
    found = elf_files(os.path.join(root, INSTALLED.lstrip("/")))
    modules = sorted(path for path in found if ".so" in os.path.basename(path))
    wrong = {path: MACHINE_NAMES.get(m, str(m)) for path, m in found.items() if m != want}
    name = f"{label}'s {len(found)} ELF files under {INSTALLED} are {arch}"
    if not modules:
        lines.append(f"FAIL {name}: no extension module among them (awslambdaric's, pydantic_core's...)")
    elif wrong:
        shown = ", ".join(f"{path} ({machine})" for path, machine in sorted(wrong.items())[:3])
        lines.append(f"FAIL {name}: {len(wrong)} are not: {shown}")
    else:
        lines.append(f"PASS {name} ({len(modules)} extension modules, {modules[0]}...)")
    return lines


def _podman(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=False)


def main(argv: list[str]) -> int:
    checks = {"zip": check_zip, "image": check_image, "root": check_root}
    if len(argv) != 4 or argv[1] not in checks or argv[3] not in E_MACHINE:
        print(__doc__, file=sys.stderr)
        return 2
    lines = checks[argv[1]](argv[2], argv[3])
    print("\n".join(lines))
    return 0 if all(line.startswith("PASS") for line in lines) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
