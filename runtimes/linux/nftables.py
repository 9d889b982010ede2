"""An nftables ruleset installed in the caller's network namespace through libnftables (ctypes).

Used where the `nft` command cannot be: a zygote without root installs the egress rules of its
own network namespace (pasta.py) while it holds CAP_NET_ADMIN there, which an exec'ed
`nft` would lose (its uid is not 0 in that user namespace). Callers load it in a forked child
(protections.in_child), so it is never mapped into the zygote, whose address space every fork copies.

Standard library only: the zygote imports this before it confines itself.
"""

from __future__ import annotations

import ctypes

LIBRARY = "libnftables.so.1"  # Debian: libnftables1, installed with nftables


def run(ruleset: str) -> None:
    """Apply ruleset in this process (nft -f -). Raises OSError with nft's own message."""
    try:
        lib = ctypes.CDLL(LIBRARY)
    except OSError as exc:
        raise OSError(f"{LIBRARY} is not installed (apt-get install nftables): {exc}") from exc
    lib.nft_ctx_new.restype = ctypes.c_void_p
    lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
    lib.nft_ctx_buffer_error.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
    lib.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
    lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
    ctx = lib.nft_ctx_new(0)
    if not ctx:
        raise OSError("nft_ctx_new failed")
    try:
        lib.nft_ctx_buffer_error(ctx)
        if lib.nft_run_cmd_from_buffer(ctx, ruleset.encode()) != 0:
            message = (lib.nft_ctx_get_error_buffer(ctx) or b"").decode(errors="replace").strip()
            raise OSError(f"nft refused the ruleset: {message or 'no reason given'}")
    finally:
        lib.nft_ctx_free(ctx)
