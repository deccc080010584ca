"""A node with huge pages: its ``/proc/meminfo`` and its Node status."""

from __future__ import annotations


def meminfo_text(fields: dict[str, int] | None = None, /, **kb: int) -> str:
    """Meminfo lines in the kernel's format: ``kB`` fields by name (``Hugetlb=...``); page
    counts (``HugePages_Total`` ...) for the names that start with ``HugePages_``."""
    lines = []
    for name, value in {**(fields or {}), **kb}.items():
        if name.startswith("HugePages_"):
            lines.append(f"{name + ':':<16}{value:>8}")
        else:
            lines.append(f"{name + ':':<16}{value:>8} kB")
    return "\n".join(lines) + "\n"


KiB, MiB = 1 << 10, 1 << 20


def hugepages(
    *, total: int, free: int, surp: int = 0, size_kb: int = 2048, hugetlb_kb: int | None = None
) -> dict[str, int]:
    """The default size's pool as meminfo writes it (``hugetlb_report_meminfo``): the
    ``HugePages_*`` page counts (none reserved), ``Hugepagesize`` and, where given (4.16 and
    later), the ``Hugetlb:`` sum over every size, in kB; for :func:`meminfo_text`."""
    lines = {
        "HugePages_Total": total,
        "HugePages_Free": free,
        "HugePages_Rsvd": 0,
        "HugePages_Surp": surp,
        "Hugepagesize": size_kb,
    }
    return lines if hugetlb_kb is None else {**lines, "Hugetlb": hugetlb_kb}


# -- a node whose RAM is 90 % huge pages ------------------------------------------------------
HUGE_NODE = {
    "MemTotal": 320 * MiB,
    "MemFree": 12 * MiB,
    "Buffers": 64 * KiB,
    "Cached": 2 * MiB,
    "Shmem": 64 * KiB,
    "Active(file)": 1 * MiB,
    "Inactive(file)": 1 * MiB,
    "SReclaimable": 512 * KiB,
    "SUnreclaim": 1 * MiB,
    # 288 x 1 GiB pages, all backing VMs (KubeVirt with GPU passthrough).
    **hugepages(total=288, free=0, size_kb=1048576, hugetlb_kb=288 * MiB),
}
