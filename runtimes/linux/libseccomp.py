"""pyseccomp, imported without running `ldconfig -p` twice, and without ctypes.util.

pyseccomp finds libc and libseccomp with ctypes.util.find_library at import, and on Linux each call forks and
execs `ldconfig -p` and parses the whole cache it prints (a few ms each, on the cold path of every process that
imports it: a Lambda function's init, every zygote's start). Here the import first tries the libraries' sonames,
which the dynamic loader resolves from the same cache (dlopen by soname is what a found name is used for anyway),
and falls back to find_library for any it cannot load (another libc, a renamed libseccomp).

Importing ctypes.util alone costs more than pyseccomp itself: it imports subprocess, shutil, tempfile and
threading, none of which a zygote needs otherwise, and a zygote's modules are what every run inherits. So while
pyseccomp imports, `ctypes.util` is a stand-in with that find_library (the real module is imported only for a
fallback), and afterwards it is what it was before: absent, or the real module.

Another thread importing ctypes.util meanwhile would get the stand-in (find_library only): the processes that
import this (a zygote, a runtime function's probe child, the service at its start) import pyseccomp before they
start threads. Standard library and pyseccomp only: a zygote imports it before it confines itself.
"""

from __future__ import annotations

import ctypes
import sys
import types

SONAMES = {"c": "libc.so.6", "seccomp": "libseccomp.so.2"}  # glibc's, and libseccomp 2.x's (Debian, Ubuntu, RHEL)


def _real_util() -> types.ModuleType:
    """The real ctypes.util, imported (once) beside whatever sys.modules holds under its name now."""
    held = sys.modules.pop("ctypes.util", None)
    attribute = ctypes.__dict__.get("util")
    try:
        import ctypes.util as real

        return real
    finally:
        if held is not None:
            sys.modules["ctypes.util"] = held
        if attribute is not None:
            ctypes.util = attribute


def _find_by_soname(find):
    def find_library(name: str) -> str | None:
        soname = SONAMES.get(name)
        if soname is not None:
            try:
                ctypes.CDLL(soname)
            except OSError:
                pass
            else:
                return soname
        return find()(name)

    return find_library


def _import():
    if "pyseccomp" in sys.modules:
        return sys.modules["pyseccomp"]
    before = sys.modules.get("ctypes.util")
    loaded: list[types.ModuleType] = [before] if before is not None else []

    def find():  # the real find_library, for a library whose soname does not load
        if not loaded:
            loaded.append(_real_util())
        return loaded[0].find_library

    stand_in = types.ModuleType("ctypes.util", "find_library by soname while pyseccomp imports (libseccomp.py)")
    stand_in.find_library = _find_by_soname(find)
    attribute = ctypes.__dict__.get("util")
    sys.modules["ctypes.util"] = stand_in
    ctypes.util = stand_in
    try:
        import pyseccomp
    finally:
        if loaded:
            sys.modules["ctypes.util"] = ctypes.util = loaded[0]
        else:
            del sys.modules["ctypes.util"]
            if attribute is None:
                del ctypes.util
            else:
                ctypes.util = attribute
    return pyseccomp


pyseccomp = _import()
