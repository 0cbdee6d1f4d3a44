"""Pure parsers of NCCL's own files in a guest: /etc/nccl.conf and a topology file (NCCL_TOPO_FILE)."""

from __future__ import annotations

import xml.etree.ElementTree as ET


def parse_nccl_conf_topology(text: str) -> str | None:
    """The NCCL_TOPO_FILE value of an nccl.conf, as NCCL reads it (src/misc/param.cc): lines of
    KEY=VALUE taken verbatim (no blanks stripped, '#' lines skipped), the first setting of a key
    winning. None: not set."""
    for line in text.splitlines():
        line = line.rstrip("\r")
        if line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if sep and key == "NCCL_TOPO_FILE":
            return value
    return None


def parse_nccl_topology(text: str) -> dict[str, int]:
    """The GPUs an NCCL topology file lists: the bus ID (lower case) of each <pci> node of a display
    class (0x03....) -> the numaid of the <cpu> above it (-1 when it has none). Raises ValueError for
    text that is no XML or no NCCL topology (<system version="1">)."""
    try:
        # Host text: ElementTree resolves no external entity, and expat caps entity expansion.
        root = ET.fromstring(text)  # noqa: S314
    except ET.ParseError as error:
        raise ValueError(f"not XML ({error})") from error
    if root.tag != "system" or root.get("version") != "1":
        raise ValueError('not an NCCL topology (no <system version="1">)')
    found: dict[str, int] = {}
    for cpu in root.iter("cpu"):
        numaid = cpu.get("numaid", "-1")
        node = int(numaid) if numaid.lstrip("-").isdigit() else -1
        for pci in cpu.iter("pci"):
            busid = pci.get("busid")
            if busid is not None and (pci.get("class") or "").lower().startswith("0x03"):
                found.setdefault(busid.lower(), node)
    return found
