"""A throw-away network namespace whose loopback behaves like 1500-MTU Ethernet.

The host loopback has a 64 KiB MTU and offloads (TSO/GSO/GRO), so a capture
on it shows whole Kafka requests in one segment.  Inside a namespace we create
ourselves we set `lo` to MTU 1500 and turn the offloads off, so large
requests and fetch responses are split into many ~1448-byte TCP segments,
like on a real network: that is what exercises TCP reassembly.

Needs root (or CAP_SYS_ADMIN + CAP_NET_ADMIN), `ip` (iproute2) and
`ethtool`; `available()` says whether this machine allows it.  Only the
namespace's own loopback is used; nothing is routed anywhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid

MTU = 1500


class NetnsError(RuntimeError):
    pass


def _run(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise NetnsError(f"{' '.join(cmd)} failed: {res.stderr.strip() or res.stdout.strip()}")
    return res


def _tool(name: str) -> str | None:
    for cand in (shutil.which(name), f"/usr/sbin/{name}", f"/sbin/{name}", f"/usr/bin/{name}"):
        if cand and os.path.exists(cand):
            return cand
    return None


def unavailable_reason() -> str | None:
    """None when namespaces can be used here, else a one-line reason."""
    if _tool("ip") is None:
        return "iproute2 (`ip`) is not installed"
    if _tool("ethtool") is None:
        return "ethtool is not installed (make sysdeps installs it)"
    if os.geteuid() != 0:
        return "network namespaces need root"
    try:
        with NetNamespace() as ns:
            ns.exec(["true"])
    except (NetnsError, OSError, subprocess.SubprocessError) as exc:
        return f"network namespaces are not permitted here: {exc}"
    return None


def available() -> bool:
    return unavailable_reason() is None


class NetNamespace:
    """`ip netns add kwinspect-XXXX`, lo up with MTU 1500 and no offloads; deleted on close."""

    def __init__(self, name: str | None = None, mtu: int = MTU) -> None:
        self.name = name or f"kwinspect-{uuid.uuid4().hex[:8]}"
        self.mtu = mtu
        self.created = False
        self.offloads: dict[str, str] = {}

    @property
    def prefix(self) -> list[str]:
        """Prepend to a command to run it inside the namespace."""
        return [_tool("ip") or "ip", "netns", "exec", self.name]

    def exec(self, cmd: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run([*self.prefix, *cmd], check=check)

    def create(self) -> NetNamespace:
        ip = _tool("ip")
        ethtool = _tool("ethtool")
        if ip is None or ethtool is None:
            raise NetnsError("ip and ethtool are required for the namespace variant")
        _run([ip, "netns", "add", self.name])
        self.created = True
        try:
            self.exec([ip, "link", "set", "lo", "up", "mtu", str(self.mtu)])
            self.exec([ethtool, "-K", "lo", "tso", "off", "gso", "off", "gro", "off"])
            out = self.exec([ethtool, "-k", "lo"], check=False).stdout
            for line in out.splitlines():
                for feat in ("tcp-segmentation-offload", "generic-segmentation-offload",
                             "generic-receive-offload"):
                    if line.strip().startswith(feat + ":"):
                        self.offloads[feat] = line.split(":", 1)[1].strip()
        except BaseException:
            self.delete()
            raise
        return self

    def delete(self) -> None:
        if self.created:
            _run([_tool("ip") or "ip", "netns", "del", self.name], check=False)
            self.created = False

    def __enter__(self) -> NetNamespace:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.delete()

    def describe(self) -> dict:
        return {"netns": True, "mtu": self.mtu, "offloads": dict(self.offloads)}
