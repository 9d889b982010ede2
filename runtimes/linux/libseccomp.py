"""pyseccomp, imported without running `ldconfig -p` twice.

pyseccomp finds libc and libseccomp with ctypes.util.find_library at import, and on Linux each call forks and
execs `ldconfig -p` and parses the whole cache it prints (a few ms each, on the cold path of every process that
imports it: a Lambda function's init, every zygote's start). Here the import first tries the libraries' sonames,
which the dynamic loader resolves from the same cache (dlopen by soname is what a found name is used for anyway),
and falls back to find_library for any it cannot load (another libc, a renamed libseccomp).

find_library is swapped only while pyseccomp imports; another thread calling it meanwhile gets the same answers
(a soname that loads, or find_library's). Standard library and pyseccomp only: a zygote imports it before it
confines itself.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

SONAMES = {"c": "libc.so.6", "seccomp": "libseccomp.so.2"}  # glibc's, and libseccomp 2.x's (Debian, Ubuntu, RHEL)


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
        return find(name)

    return find_library


def _import():
    if "pyseccomp" in sys.modules:
        return sys.modules["pyseccomp"]
    find = ctypes.util.find_library
    ctypes.util.find_library = _find_by_soname(find)
    try:
        import pyseccomp
    finally:
        ctypes.util.find_library = find
    return pyseccomp


pyseccomp = _import()
