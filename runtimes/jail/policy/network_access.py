"""What runs that ask for network get where their egress cannot be filtered (SANDLOT_UNFILTERED_EGRESS).

The jail filters a run's egress by nft rules on its uid (root, with CAP_NET_ADMIN) or in a
network namespace of the zygote's own behind pasta (userns without root). Where neither can be
had (a container on default privileges has no NET_ADMIN; a host without pasta), a run with
network would reach whatever the service's host reaches: its loopback services, its private
networks, the cloud's metadata address. Dify asks for network on every run, and most code
nodes never use it, so the default keeps those runs working without handing them that:

- `no-network` (default): such runs are served without network. The filter is the one of a
  run without network (no socket but socketpair: enforcement is seccomp's), and their socket
  calls fail with PermissionError (Python: an audit hook the runner installs; Node: the
  wrapper's net, dgram and dns) whose text says why and what the operator can change.
- `allow`: the operator chose unfiltered egress: runs with network get the network as it is.
- `refuse`: runs with network are refused (`-500`, saying why); the others are served.

The start-up log and the health detail (`network`, `network_reason`) say which applies.
"""

from __future__ import annotations

from dataclasses import dataclass

NO_NETWORK = "no-network"
ALLOW = "allow"
REFUSE = "refuse"
CHOICES = (NO_NETWORK, ALLOW, REFUSE)

FILTERED = "filtered"  # the egress rules are in force
UNFILTERED = "unfiltered"  # the operator allowed it
PROXY = "proxy"  # only the operator's proxy's port (proxy_egress.py)
NONE = "none"  # served without network
REFUSED = "refused"  # refused with -500


@dataclass(frozen=True)
class RunNetwork:
    """What a runtime's runs that ask for network get."""

    kind: str  # filtered | proxy | unfiltered | none | refused
    why: str = ""  # why egress cannot be filtered here ("" where it can)

    @property
    def message(self) -> str:
        """What a run is told: its failing socket calls (none), or the refusal (refused)."""
        if self.kind == NONE:
            return (
                f"network is not available to runs here: {self.why}. Runs asking for network get none "
                f"(SANDLOT_UNFILTERED_EGRESS={NO_NETWORK}; `allow` gives them unfiltered egress)"
            )
        if self.kind == REFUSED:
            return (
                f"runs with network are refused: {self.why} "
                f"(SANDLOT_UNFILTERED_EGRESS={REFUSE}; `{NO_NETWORK}` serves them without network)"
            )
        return ""

    @property
    def log_line(self) -> str:
        """What the start-up log says ("" where the egress rules are in force)."""
        if self.kind == PROXY:
            return self.why
        if self.kind == UNFILTERED:
            return (
                f"runs with network get it unfiltered (SANDLOT_UNFILTERED_EGRESS={ALLOW}): they reach what this "
                f"host reaches, its loopback services, private networks and metadata address included: {self.why}"
            )
        return self.message

    def health(self) -> dict:
        """The health detail's fields."""
        return {"network": self.kind, "network_reason": self.why}


def decide(can_filter: bool, why: str, setting: str) -> RunNetwork:
    """What runs with network get: filtered where the rules can be installed, else what the setting says.
    why: what keeps egress from being filtered (the record's reason)."""
    if setting not in CHOICES:
        raise ValueError(f"SANDLOT_UNFILTERED_EGRESS={setting!r}: one of {', '.join(CHOICES)}")
    if can_filter:
        return RunNetwork(FILTERED)
    kind = {NO_NETWORK: NONE, ALLOW: UNFILTERED, REFUSE: REFUSED}[setting]
    return RunNetwork(kind, why or "egress cannot be filtered here")


def chroot_reason(host_nft: bool, error: str) -> str:
    """Why the chroot mode cannot filter egress, from the protections record's host_nft probe."""
    if host_nft:
        return ""
    if not error or "Operation not permitted" in error:
        return "egress rules by uid need CAP_NET_ADMIN, which this container lacks (--cap-add NET_ADMIN gives it)"
    return f"egress rules by uid cannot be installed here: {error}"
