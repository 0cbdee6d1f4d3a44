"""Pure parsers: text as the host printed it in, typed values out. No I/O here.

Each parser is tested on real captures (tests/fixtures/), never on text written to fit it.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from gpuhost.facts.model import (
    NVIDIA_IN_TREE_NAMESAKES,
    CpuInfo,
    HugePagePool,
    KernelCommandLine,
    LoaderEntry,
    MemInfo,
    ModprobeDirective,
    Mount,
    NvidiaFlavour,
    NvidiaModuleFile,
    OutOfTreeModule,
    Package,
)
from gpuhost.facts.pci import Bar

_PCI_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_HEX_FIELD = re.compile(r"^(0[xX])?[0-9a-fA-F]+$")
# ASCII digits only: str.isdigit() also accepts '²' or '٣', which int() then refuses or misreads.
_EXIT_STATUS = re.compile(r"^-?[0-9]+$")


def is_pci_address(text: str) -> bool:
    return bool(_PCI_ADDRESS.fullmatch(text))


def parse_int(text: str | None, base: int = 10) -> int | None:
    """An integer attribute file ('0x10de', '-1', '16'); None when unreadable or not a number."""
    if text is None:
        return None
    try:
        return int(text.strip(), base)
    except ValueError:
        return None


def is_plain_number(text: str) -> bool:
    """ASCII decimal digits only: how the kernel names IOMMU groups (int() also takes '+6', ' 6', '٦')."""
    return bool(text) and text.isascii() and text.isdigit()


_DRIVER_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def parse_driver_link(text: str | None) -> str | None:
    """A recorded driver link ('../../../bus/pci/drivers/vfio-pci') -> 'vfio-pci'; None when the
    record names no driver the kernel could have (empty, or characters no driver name has)."""
    name = parse_link_target_basename(text)
    return name if name is not None and _DRIVER_NAME.fullmatch(name) else None


def parse_hex(text: str | None) -> int | None:
    return parse_int(text, 16)


def parse_bool_attribute(text: str | None) -> bool | None:
    value = parse_int(text)
    return None if value is None else value != 0


def parse_optional_text(text: str | None) -> str | None:
    """A one-line attribute; '(null)' (an unset driver_override) and '' are no value."""
    if text is None:
        return None
    value = text.strip()
    return None if value in ("", "(null)") else value


def parse_link_speed(text: str | None) -> float | None:
    """'32.0 GT/s PCIe' (6.x kernels) or '8 GT/s' (older) -> 32.0; 'Unknown' -> None."""
    if text is None:
        return None
    # One decimal number only: '1.2.3 GT/s' from an odd device is an unknown speed, not a crash.
    match = re.match(r"\s*([0-9]+(?:\.[0-9]+)?)\s*GT/s", text)
    return float(match.group(1)) if match else None


def parse_reset_methods(text: str | None) -> tuple[str, ...] | None:
    """reset_method lists what the kernel can use, best first ('flr bus'); empty: none."""
    if text is None:
        return None
    return tuple(text.split())


def parse_pci_resource(text: str | None) -> tuple[Bar, ...]:
    """The `resource` file: one 'start end flags' line per region; BARs are lines 0-5."""
    if text is None:
        return ()
    bars = []
    for index, line in enumerate(text.splitlines()[:6]):
        fields = line.split()
        if len(fields) != 3 or not all(_HEX_FIELD.fullmatch(f) for f in fields):
            continue  # not 'start end flags' in hex: an unknown region, never a crash
        start, end, flags = (int(f, 16) for f in fields)
        if end > start:
            bars.append(Bar(index=index, start=start, end=end, flags=flags))
    return tuple(bars)


def parse_cpulist(text: str | None) -> tuple[int, ...]:
    """'0-3,8,10-11' -> (0, 1, 2, 3, 8, 10, 11): the kernel's CPU list form (cpulist, thread_siblings_list)."""
    cpus: list[int] = []
    for part in (text or "").strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.extend(range(int(low), int(high or low) + 1))
    return tuple(sorted(set(cpus)))


def parse_cpuinfo(text: str) -> CpuInfo:
    vendor = model = None
    flags: frozenset[str] = frozenset()
    processors = 0
    physical_bits: int | None = None
    family: int | None = None
    model_number: int | None = None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        value = value.strip()
        if key == "processor":
            processors += 1
        elif key == "vendor_id" and vendor is None:
            vendor = value
        elif key == "model name" and model is None:
            model = value
        elif key == "flags" and not flags:
            flags = frozenset(value.split())
        elif key == "address sizes" and physical_bits is None:
            physical_bits = _physical_address_bits(value)
        elif key == "cpu family" and family is None and value.isdigit():
            family = int(value)
        elif key == "model" and model_number is None and value.isdigit():
            model_number = int(value)
    return CpuInfo(
        vendor=vendor,
        model_name=model,
        logical_cpus=processors,
        flags=flags,
        physical_address_bits=physical_bits,
        family=family,
        model=model_number,
    )


def parse_cpuinfo_machine(text: str) -> str | None:
    """The architecture /proc/cpuinfo's form gives away: x86's 'vendor_id' with the long-mode flag
    'lm' (x86_64), ARM's 'CPU architecture: 8' (aarch64); None for anything else."""
    keys: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            keys.setdefault(key.strip(), value.strip())
    if "vendor_id" in keys:
        return "x86_64" if "lm" in keys.get("flags", "").split() else None
    if keys.get("CPU architecture") == "8":
        return "aarch64"
    return None


def _physical_address_bits(value: str) -> int | None:
    """'46 bits physical, 57 bits virtual' -> 46."""
    match = re.match(r"(\d+) bits physical", value)
    return int(match.group(1)) if match else None


def parse_cmdline(text: str) -> KernelCommandLine:
    """Split a kernel command line as the kernel does: on blanks, double quotes group.

    Everything after a lone `--` goes to init, not to the kernel, and is left out.
    """
    tokens: list[str] = []
    current: list[str] = []
    in_quotes = False
    started = False
    for char in text.strip():
        if char == '"':
            in_quotes = not in_quotes
            started = True
        elif char.isspace() and not in_quotes:
            if started:
                tokens.append("".join(current))
            current, started = [], False
        else:
            current.append(char)
            started = True
    if started:
        tokens.append("".join(current))
    if "--" in tokens:
        tokens = tokens[: tokens.index("--")]
    return KernelCommandLine(tuple(tokens))


def _kib(value: str) -> int | None:
    fields = value.split()
    return parse_int(fields[0]) if fields else None


def parse_meminfo(text: str) -> MemInfo:
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            values[key.strip()] = value.strip()

    def get(key: str) -> int | None:
        return _kib(values[key]) if key in values else None

    return MemInfo(
        total_kib=get("MemTotal"),
        available_kib=get("MemAvailable"),
        hugepages_total=get("HugePages_Total"),
        hugepages_free=get("HugePages_Free"),
        hugepage_size_kib=get("Hugepagesize"),
        hugetlb_kib=get("Hugetlb"),
    )


def parse_node_meminfo_total(text: str) -> int | None:
    """'Node 0 MemTotal:       24600000 kB' -> 24600000."""
    match = re.search(r"MemTotal:\s+(\d+)\s*kB", text)
    return int(match.group(1)) if match else None


def parse_hugepage_dir_size(name: str) -> int | None:
    """'hugepages-1048576kB' -> 1048576."""
    match = re.fullmatch(r"hugepages-(\d+)kB", name)
    return int(match.group(1)) if match else None


def hugepage_pool(size_kib: int, total: str | None, free: str | None) -> HugePagePool:
    return HugePagePool(size_kib=size_kib, total=parse_int(total), free=parse_int(free))


def parse_mounts(text: str) -> tuple[Mount, ...]:
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4:
            source, target, fstype, options = fields[:4]
            mounts.append(Mount(source, _unescape_mount(target), fstype, tuple(options.split(","))))
    return tuple(mounts)


def _unescape_mount(path: str) -> str:
    # /proc/mounts escapes space, tab, newline and backslash as octal.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def parse_proc_modules(text: str) -> frozenset[str]:
    return frozenset(line.split()[0] for line in text.splitlines() if line.strip())


def parse_modules_builtin(text: str) -> frozenset[str]:
    """modules.builtin lists 'kernel/drivers/vfio/pci/vfio-pci.ko'; module names use '_'."""
    names = set()
    for line in text.splitlines():
        base = line.strip().rsplit("/", 1)[-1]
        if base.endswith(".ko"):
            names.add(base[:-3].replace("-", "_"))
    return frozenset(names)


_MODPROBE_COMMANDS = ("blacklist", "options", "install", "softdep", "alias", "remove")
_INTERESTING_MODULE = re.compile(r"^(nvidia\w*|nouveau|vfio\w*|snd_hda_intel)$")


def parse_modprobe_conf(path: str, text: str) -> tuple[ModprobeDirective, ...]:
    """The directives of a modprobe.d file that concern the GPU drivers or vfio.

    For `alias`, the module is the alias's target (the second word). Module names are given
    with '_' (modprobe treats '-' and '_' alike); line numbers are those of the first line of a
    directive continued with a backslash.
    """
    directives = []
    for number, raw, source in _join_continuations(text):
        fields = raw.split("#", 1)[0].split()
        if len(fields) < 2 or fields[0] not in _MODPROBE_COMMANDS:
            continue
        command = fields[0]
        names = [name.replace("-", "_") for name in fields[1:3]]
        module = names[1] if command == "alias" and len(names) > 1 else names[0]
        if not any(_INTERESTING_MODULE.fullmatch(name) for name in (names if command == "alias" else names[:1])):
            continue
        directives.append(
            ModprobeDirective(
                path=path,
                line_number=number,
                command=command,
                module=module,
                arguments=" ".join(fields[3 if command == "alias" else 2 :]),
                source=source,
            )
        )
    return tuple(directives)


def _join_continuations(text: str) -> list[tuple[int, str, str]]:
    """(first line number, the joined line, its lines as in the file) per logical line."""
    lines: list[tuple[int, str, str]] = []
    pending, first = "", 0
    physical: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not pending:
            first, physical = number, []
        physical.append(raw)
        if raw.endswith("\\"):
            pending += raw[:-1] + " "
            continue
        lines.append((first, pending + raw, "\n".join(physical)))
        pending = ""
    if pending:
        lines.append((first, pending, "\n".join(physical)))
    return lines


def parse_modprobe_options(arguments: str) -> dict[str, str]:
    """'ids=10de:2330,10de:22e8 disable_vga=1' -> {'ids': '10de:2330,10de:22e8', 'disable_vga': '1'}."""
    options = {}
    for word in arguments.split():
        key, _, value = word.partition("=")
        options[key] = value
    return options


def parse_key_value_lines(text: str) -> dict[str, str]:
    """'NAME=value' lines (the gather script's grub-effective.txt, os-release with quotes).

    Lines end at '\n' only: a value sourced from a CRLF /etc/default/grub carries a '\r' that is
    part of the value (str.splitlines would cut the value there and lose what follows it).
    """
    values = {}
    for line in text.split("\n"):
        key, sep, value = line.partition("=")
        if sep and key.strip():
            values[key.strip()] = value
    return values


def parse_os_release(text: str) -> dict[str, str]:
    values = {}
    for key, value in parse_key_value_lines(text).items():
        try:
            words = shlex.split(value)
        except ValueError:
            words = [value]
        values[key] = words[0] if words else ""
    return values


def parse_dpkg_status(text: str) -> tuple[Package, ...]:
    """`dpkg-query -W -f '${db:Status-Abbrev} ${Package} ${Version}'`; only installed ones ('ii')."""
    packages = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[0] in ("ii", "hi", "iU", "iF"):
            packages.append(Package(fields[1], fields[2]))
    return tuple(packages)


def parse_rpm_list(text: str) -> tuple[Package, ...]:
    packages = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 2:
            packages.append(Package(fields[0], fields[1]))
    return tuple(packages)


def parse_pci_device_paths(text: str) -> dict[str, tuple[str, ...]]:
    """'0000:01:00.0 ../../../devices/pci0000:00/0000:00:03.0/0000:01:00.0' -> upstream bridges.

    The result maps each function to the addresses above it, nearest first.
    """
    parents: dict[str, tuple[str, ...]] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) != 2:
            continue
        address, target = fields
        chain = [part for part in target.split("/") if is_pci_address(part)]
        if chain and chain[-1] == address:
            parents[address] = tuple(reversed(chain[:-1]))
    return parents


def parse_command_status(text: str) -> dict[str, int]:
    """The gather script's commands/status.txt: 'NAME RC' per command run."""
    status = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2 and _EXIT_STATUS.fullmatch(fields[1]):
            status[fields[0]] = int(fields[1])
    return status


def parse_od_bytes(text: str) -> bytes | None:
    """`od -An -v -tx1 FILE` output (hex bytes separated by blanks) -> the bytes; None if not that."""
    words = text.split()
    try:
        return bytes(int(word, 16) for word in words if len(word) == 2)
    except ValueError:
        return None


def parse_loader_entry(text: str) -> LoaderEntry:
    """A Boot Loader Specification type 1 entry: `key value` lines, `#` comments.

    As systemd-boot reads it: a repeated key keeps the last value, except `initrd` (each one is
    loaded) and `options` (joined with spaces).
    """
    single: dict[str, str] = {}
    initrds: list[str] = []
    options: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.replace("\t", " ").partition(" ")
        value = value.strip()
        if key == "initrd":
            initrds.append(value)
        elif key == "options":
            options.append(value)
        else:
            single[key] = value
    return LoaderEntry(
        title=single.get("title"),
        version=single.get("version"),
        sort_key=single.get("sort-key"),
        linux=single.get("linux"),
        initrds=tuple(initrds),
        options=parse_cmdline(" ".join(options)),
    )


# An efivarfs file is 4 bytes of attributes (little-endian u32), then the variable's value.
EFIVAR_ATTRIBUTES = 4


def parse_efivar_bool(data: bytes | None) -> bool | None:
    """A one-byte boolean EFI variable (SecureBoot, SetupMode): 1 is on; None if malformed."""
    if data is None or len(data) != EFIVAR_ATTRIBUTES + 1 or data[EFIVAR_ATTRIBUTES] not in (0, 1):
        return None
    return data[EFIVAR_ATTRIBUTES] == 1


def parse_efivar_string(data: bytes | None) -> str | None:
    """A UTF-16LE, NUL-terminated EFI variable (systemd-boot's LoaderInfo, LoaderEntrySelected)."""
    if data is None or len(data) <= EFIVAR_ATTRIBUTES or (len(data) - EFIVAR_ATTRIBUTES) % 2:
        return None
    value = data[EFIVAR_ATTRIBUTES:].decode("utf-16-le", errors="replace").split("\0", 1)[0].strip()
    return value or None


def parse_out_of_tree_modules(text: str) -> tuple[OutOfTreeModule, ...]:
    """The gather script's 'PATH<TAB>SIGNER' lines; an empty signer is an unsigned module."""
    modules = []
    for line in text.splitlines():
        path, _, signer = line.partition("\t")
        if path.startswith("/") and ".ko" in path:
            modules.append(OutOfTreeModule(path=path, signer=signer.strip() or None))
    return tuple(modules)


_GPUHOST_DROPIN_OPTIONS = re.compile(
    r'^GRUB_CMDLINE_LINUX_DEFAULT="\$\{gpuhost_kept:\+\$gpuhost_kept \}([^"]*)"$', re.MULTILINE
)


def parse_gpuhost_grub_dropin(text: str) -> KernelCommandLine | None:
    """The options gpuhost's GRUB drop-in (templates/grub/gpuhost.cfg.j2) appends to
    GRUB_CMDLINE_LINUX_DEFAULT; None when the text has no such line."""
    match = _GPUHOST_DROPIN_OPTIONS.search(text)
    return None if match is None else parse_cmdline(match.group(1))


def parse_link_target_basename(text: str | None) -> str | None:
    """A recorded symlink ('../../../bus/pci/drivers/vfio-pci') -> 'vfio-pci'."""
    if text is None:
        return None
    target = text.strip().rstrip("/")
    return target.rsplit("/", 1)[-1] or None


# /proc/driver/nvidia/version's first line, both flavours (the architecture is one word, `uname -m`'s):
#   NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024
#   NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.120  Release Build  (dvs-builder@...)  ...
_NVRM_VERSION = re.compile(
    r"NVRM version: NVIDIA UNIX (?:(?P<open>Open Kernel Module for \S+)|\S+ Kernel Module)"
    r"\s+(?P<version>\d+(?:\.\d+)+)\b"
)


def parse_nvidia_version(text: str) -> str | None:
    """/proc/driver/nvidia/version -> the driver's version ('535.183.01', '550.120'), either flavour."""
    return parse_nvidia_release(text)[0]


def parse_nvidia_release(text: str) -> tuple[str | None, NvidiaFlavour | None]:
    """/proc/driver/nvidia/version -> (version, flavour); (None, None) where the line is not NVRM's."""
    match = _NVRM_VERSION.search(text)
    if match is None:
        return None, None
    return match.group("version"), NvidiaFlavour.OPEN if match.group("open") else NvidiaFlavour.PROPRIETARY


# modinfo's license of NVIDIA's modules: the proprietary source's, and the open source's (GPL-compatible).
_NVIDIA_LICENSES = {"NVIDIA": NvidiaFlavour.PROPRIETARY, "Dual MIT/GPL": NvidiaFlavour.OPEN}


def parse_nvidia_modules(text: str) -> tuple[NvidiaModuleFile, ...]:
    """The gather's nvidia-modules.txt: per module file a 'module PATH' line, then modinfo's 'version:',
    'license:' and 'signer:' lines for it (none where modinfo could not read it). Only NVIDIA's driver
    modules under /lib/modules/<kernel>/ are kept (not the kernel's NVIDIA_IN_TREE_NAMESAKES)."""
    found: list[NvidiaModuleFile] = []
    path: str | None = None
    fields: dict[str, str] = {}

    def close() -> None:
        if path is None:
            return
        module = NvidiaModuleFile(
            path=path,
            version=fields.get("version") or None,
            flavour=_NVIDIA_LICENSES.get(fields.get("license", "")),
            signer=fields.get("signer") or None,
        )
        if (
            path.startswith("/lib/modules/")
            and path.count("/") >= 4
            and module.name.startswith("nvidia")
            and module.name not in NVIDIA_IN_TREE_NAMESAKES
        ):
            found.append(module)

    for line in text.splitlines():
        if line.startswith("module "):
            close()
            path, fields = line[len("module ") :].strip(), {}
            continue
        key, sep, value = line.partition(":")
        if sep and path is not None and key in ("version", "license", "signer") and key not in fields:
            fields[key] = value.strip()
    close()
    return tuple(found)


def parse_memory_size_kib(text: str) -> int | None:
    """'1G', '2M', '1048576K', '1GB' -> KiB, as the kernel reads hugepagesz=."""
    match = re.fullmatch(r"(\d+)\s*([KMGkmg])?[Bb]?", text.strip())
    if not match:
        return None
    factor = {"k": 1, "m": 1024, "g": 1024 * 1024, None: 1 / 1024}[match.group(2).lower() if match.group(2) else None]
    return int(int(match.group(1)) * factor)


DEFAULT_HUGEPAGE_KIB = 2048


_NODE_COUNTS = re.compile(r"^\d+:\d+(?:,\d+:\d+)*$")


def parse_hugepages_request(tokens: tuple[str, ...]) -> dict[int, int]:
    """Huge pages the command line asks the kernel to reserve at boot, by page size in KiB.

    `hugepages=N` applies to the size of the latest `hugepagesz=` before it, or to
    `default_hugepagesz` (2 MiB when unset) when none came before it; as the kernel reads it.
    The node form (`hugepages=0:1,1:3`, Linux 5.16 on) counts the pages of all its nodes.
    """
    return {size: sum(count for _, count in nodes) for size, nodes in parse_hugepages_by_node(tokens).items()}


def parse_hugepages_by_node(tokens: tuple[str, ...]) -> dict[int, tuple[tuple[int | None, int], ...]]:
    """The same request by NUMA node: ((node, count), ...) per page size in KiB; the node is None
    for the plain form (`hugepages=N`, which the kernel spreads over the nodes itself)."""
    default = DEFAULT_HUGEPAGE_KIB
    for token in tokens:
        key, _, value = token.partition("=")
        if key == "default_hugepagesz":
            default = parse_memory_size_kib(value) or default
    requested: dict[int, tuple[tuple[int | None, int], ...]] = {}
    current: int | None = None
    for token in tokens:
        key, _, value = token.partition("=")
        if key == "hugepagesz":
            current = parse_memory_size_kib(value)
        elif key == "hugepages":
            size = current if current is not None else default
            if _NODE_COUNTS.fullmatch(value):
                pairs = (pair.split(":") for pair in value.split(","))
                requested[size] = tuple((int(node), int(count)) for node, count in pairs)
                continue
            count = parse_int(value)
            if count is not None:
                requested[size] = ((None, count),)
    return requested


@dataclass(frozen=True)
class LspciEntry:
    address: str  # with the domain, 0000:41:00.0
    class_code: int  # 16-bit class, e.g. 0x0300
    vendor: int
    device: int
    description: str  # 'VGA compatible controller: NVIDIA Corporation Device'


_LSPCI_NN = re.compile(
    r"^(?P<address>(?:[0-9a-f]{4}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) "
    r"(?P<class_name>[^\[]+?) \[(?P<class>[0-9a-f]{4})\]: "
    r"(?P<name>.*) \[(?P<vendor>[0-9a-f]{4}):(?P<device>[0-9a-f]{4})\](?: \(rev [0-9a-f]+\))?(?: \(prog-if .*\))?$"
)


def parse_lspci_nn(text: str) -> tuple[LspciEntry, ...]:
    """`lspci -nn` (or -Dnn) lines; lines of other shapes are skipped."""
    entries = []
    for line in text.splitlines():
        match = _LSPCI_NN.fullmatch(line.strip())
        if not match:
            continue
        address = match.group("address")
        entries.append(
            LspciEntry(
                address=address if address.count(":") == 2 else f"0000:{address}",
                class_code=int(match.group("class"), 16),
                vendor=int(match.group("vendor"), 16),
                device=int(match.group("device"), 16),
                description=f"{match.group('class_name')}: {match.group('name')}",
            )
        )
    return tuple(entries)
