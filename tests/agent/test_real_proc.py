"""This machine's real /proc: ``/metrics`` agrees with /proc/meminfo read at the same moment."""

from __future__ import annotations

import re
from pathlib import Path

from nodeguard.sources.meminfo import parse_meminfo
from tests.support.agent import get, running_agent

MiB = 1 << 20
NODE = 'container="",namespace="",pod=""'  # a node series names no workload


def _metric(body: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", body, re.M)
    assert m, f"{name} missing from /metrics"
    return float(m.group(1))


def test_metrics_agree_with_proc_meminfo(tmp_path: Path) -> None:
    args = ["--interval=100ms", "--no-collector.kmsg", f"--path.state={tmp_path}"]
    with running_agent(args=args, log_path=tmp_path / "agent.log") as base:
        body = get(f"{base}/metrics")[1]
        fields, _ = parse_meminfo(Path("/proc/meminfo").read_text())
    assert _metric(body, f"nodeguard_node_memory_total_bytes{{{NODE}}}") == fields["MemTotal"]
    meminfo_total = (
        'nodeguard_node_meminfo_bytes{container="",field="MemTotal",namespace="",pod=""}'
    )
    assert _metric(body, meminfo_total) == fields["MemTotal"]
    # Sampled at most 100 ms apart on a machine running other things: within 2 % of total.
    tolerance = max(64 * MiB, 0.02 * fields["MemTotal"])
    for metric, field in (
        ("available_bytes", "MemAvailable"),
        ("free_bytes", "MemFree"),
        ("slab_unreclaimable_bytes", "SUnreclaim"),
    ):
        got = _metric(body, f"nodeguard_node_memory_{metric}{{{NODE}}}")
        assert abs(got - fields[field]) <= tolerance, (metric, got, fields[field])
    used = _metric(body, f"nodeguard_node_memory_used_bytes{{{NODE}}}")
    assert abs(used - (fields["MemTotal"] - fields["MemAvailable"])) <= tolerance
    assert _metric(body, 'nodeguard_collector_success{collector="meminfo"}') == 1.0


def test_names_and_rss_are_psutils_for_every_process_of_this_machine() -> None:
    # psutil is the oracle: processes with names longer than comm's 15 characters, one that
    # rewrote its command line with spaces, one with a name that is not UTF-8, and every other
    # process of the machine.
    import subprocess
    import sys
    import tempfile

    import psutil

    from nodeguard.paths import HostPaths
    from nodeguard.sources.processes import process_name, read_top_processes

    with tempfile.TemporaryDirectory() as tmp:
        long_exe = Path(tmp) / "a-training-loader-with-a-long-name"
        long_exe.symlink_to(sys.executable)
        odd = Path(tmp) / "caf\xe9-\udcff-loader-x".encode("utf-8", "surrogateescape").decode(
            "utf-8", "surrogateescape"
        )
        odd.symlink_to(sys.executable)
        sleep = "import time; time.sleep(30)"
        rewrite = (
            "import ctypes, time\n"
            "libc = ctypes.CDLL(None)\n"
            "libc.prctl(15, b'worker-with-a-long-comm-name', 0, 0, 0)\n"  # PR_SET_NAME
            "time.sleep(30)\n"
        )
        procs = [
            subprocess.Popen([str(long_exe), "-c", sleep]),
            subprocess.Popen([str(odd), "-c", sleep]),
            subprocess.Popen([sys.executable, "-c", rewrite]),
        ]
        try:
            import time

            time.sleep(0.5)
            checked = 0
            for pid in [p.pid for p in procs] + psutil.pids():
                try:
                    want = psutil.Process(pid).name()
                except (psutil.NoSuchProcess, psutil.ZombieProcess):
                    continue
                got = process_name(procfs="/proc", pid=pid)
                if got is None:
                    continue  # gone in between
                raw = want.encode("utf-8", "surrogateescape")
                if not raw.isascii():
                    continue  # below: psutil counts comm's 15 in characters, the kernel in bytes
                assert got == want[:128], (pid, got, want)
                checked += 1
            assert checked > 10
            assert process_name(procfs="/proc", pid=procs[0].pid) == long_exe.name
            # comm is "café-\xff-loader-", 15 bytes (14 characters): cut, so the command line's
            # name is taken, its byte that is not UTF-8 replaced.
            assert process_name(procfs="/proc", pid=procs[1].pid) == "caf\xe9-\ufffd-loader-x"
        finally:
            for p in procs:
                p.kill()
                p.wait()
    top = read_top_processes(paths=HostPaths(), limit=5)
    for proc in top:
        try:
            rss = psutil.Process(proc.pid).memory_info().rss
        except psutil.NoSuchProcess:
            continue
        assert abs(rss - proc.rss_bytes) <= 16 * MiB, (proc, rss)  # read a moment apart
