"""The kernel log of OOM kills, kernel by kernel, assembled into kills.

Each input is the records a kernel prints for one situation, written from that kernel's source
(mm/oom_kill.c ``dump_header``, ``oom_kill_process``, ``__oom_kill_process``,
``oom_kill_memcg_member``; mm/memcontrol.c ``mem_cgroup_print_oom_info`` (< 4.19),
``mem_cgroup_print_oom_context`` and ``mem_cgroup_print_oom_group`` (>= 4.19)), and the values
expected are what those functions say happened: which process was killed, in which cgroup, under
which constraint, and whether the kernel killed (and counted) a victim a second time.
"""

from __future__ import annotations

from nodeguard.sources.kmsg_record import parse_record
from nodeguard.sources.oom_events import OomEventParser, ParsedKill, constraint_of_prefix
from tests.fixtures.make_hosts import B_SLICE, CID, UID_B, UID_BE, UID_G

BOOT = 1_700_000_000.0
B = B_SLICE
C3 = f"{B}/cri-containerd-{CID[3]}.scope"
C4 = f"{B}/cri-containerd-{CID[4]}.scope"
G_CFS = f"/kubepods/pod{UID_G}"
BE_CFS = f"/kubepods/besteffort/pod{UID_BE}"


def feed(records: list[str | tuple[str, str]]) -> list[ParsedKill]:
    """Feed records (text, or ``(flags, text)``) in order; every kill, the held one included."""
    parser = OomEventParser()
    out: list[ParsedKill] = []
    for i, item in enumerate(records):
        flags, text = item if isinstance(item, tuple) else ("-", item)
        rec = parse_record(f"3,{i},{1_000_000 * i},{flags};{text}")
        assert rec is not None
        out += parser.feed(record=rec, boot_time=BOOT)
    return out + parser.flush()


def summary(kills: list[ParsedKill]) -> list[tuple[int, str | None, str | None, str | None, bool]]:
    """(pid, constraint, pod, container, repeat) of each kill, in order."""
    return [
        (p.kill.pid, p.kill.constraint, p.kill.pod_uid, p.kill.container_id, p.repeat)
        for p in kills
    ]


def context(
    *, task_memcg: str, pid: int, comm: str = "python3", memcg: str | None = None, c: str = "MEMCG"
) -> str:
    where = f"oom_memcg={memcg}" if memcg else "global_oom"
    return (
        f"oom-kill:constraint=CONSTRAINT_{c},nodemask=(null),cpuset=/,mems_allowed=0,{where},"
        f"task_memcg={task_memcg},task={comm},pid={pid},uid=0"
    )


def killed(pid: int, comm: str = "python3", prefix: str = "Memory cgroup out of memory: ") -> str:
    return (
        f"{prefix}Killed process {pid} ({comm}) total-vm:2000kB, anon-rss:1000kB, "
        "file-rss:8kB, shmem-rss:0kB, UID:0 pgtables:40kB oom_score_adj:0"
    )


def group(cgroup: str) -> str:
    return f"Tasks in {cgroup} are going to be killed due to memory.oom.group set"


# -- memory.oom.group: one event, several kills (4.19 and later) --------------------------------
def test_group_kill_every_victim_in_the_container_once() -> None:
    # kubelet >= 1.28 on cgroup v2 sets memory.oom.group on the container: __oom_kill_process
    # kills the victim, then oom_kill_memcg_member every process of the group, the victim again.
    kills = feed(
        [
            "python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
            context(task_memcg=C3, pid=10, memcg=C3),
            killed(10),
            group(C3),
            killed(10),
            killed(11, "worker"),
            killed(12, "worker"),
        ]
    )
    assert summary(kills) == [
        (10, "CONSTRAINT_MEMCG", UID_B, CID[3], False),
        (10, "CONSTRAINT_MEMCG", UID_B, CID[3], True),  # killed and counted again by the kernel
        (11, "CONSTRAINT_MEMCG", UID_B, CID[3], False),
        (12, "CONSTRAINT_MEMCG", UID_B, CID[3], False),
    ]
    assert [p.kill.oom_group for p in kills] == [C3, C3, C3, C3]  # the victim's group too
    assert {p.kill.oom_memcg for p in kills} == {C3}


def test_group_at_the_pod_counts_the_others_to_the_pod() -> None:
    # memory.oom.group on the pod's cgroup (set by hand): the victim is in its container (the
    # oom-kill line names it), the others only in the group's cgroup, the pod.
    kills = feed(
        [
            context(task_memcg=C3, pid=20, memcg=B),
            killed(20),
            group(B),
            killed(21, "sidecar"),
        ]
    )
    assert summary(kills) == [
        (20, "CONSTRAINT_MEMCG", UID_B, CID[3], False),
        (21, "CONSTRAINT_MEMCG", UID_B, None, False),
    ]


def test_group_kill_on_419_with_a_sacrificed_child() -> None:
    # 4.19 prints "Kill process ... or sacrifice child" and may kill a child with another PID;
    # its kill records carry no prefix. The group scan then meets the chosen parent (pid 30,
    # in task_memcg) and the child again.
    kills = feed(
        [
            "java invoked oom-killer: gfp_mask=0x6000c0(GFP_KERNEL), nodemask=(null), order=0, "
            "oom_score_adj=0",
            context(task_memcg=C4, pid=30, comm="java", memcg=C4),
            "Memory cgroup out of memory: Kill process 30 (java) score 999 or sacrifice child",
            killed(35, "jcmd", prefix=""),
            group(C4),
            killed(30, "java", prefix=""),
            killed(35, "jcmd", prefix=""),
        ]
    )
    assert summary(kills) == [
        (35, "CONSTRAINT_MEMCG", UID_B, CID[4], False),
        (30, "CONSTRAINT_MEMCG", UID_B, CID[4], False),
        (35, "CONSTRAINT_MEMCG", UID_B, CID[4], True),
    ]


def test_rate_limited_header_group_line_names_the_container() -> None:
    # dump_header is behind __ratelimit; the kill records and the group line are not. The first
    # kill waits for the group line, which names its cgroup.
    kills = feed([killed(40), group(C3), killed(40), killed(41)])
    assert summary(kills) == [
        (40, "CONSTRAINT_MEMCG", UID_B, CID[3], False),
        (40, "CONSTRAINT_MEMCG", UID_B, CID[3], True),
        (41, "CONSTRAINT_MEMCG", UID_B, CID[3], False),
    ]


def test_headerless_event_after_a_group_kill() -> None:
    # In an OOM storm: a group kill of C3, then an event whose header was rate limited away.
    # Its kill record reads like one more member of C3's group; the group line after it says
    # it began a new event (a member never comes before another group's line).
    kills = feed(
        [
            context(task_memcg=C3, pid=1, memcg=C3),
            killed(1),
            group(C3),
            killed(1),
            killed(2),
            killed(3),
            group(C4),
            killed(3),
        ]
    )
    assert summary(kills) == [
        (1, "CONSTRAINT_MEMCG", UID_B, CID[3], False),
        (1, "CONSTRAINT_MEMCG", UID_B, CID[3], True),
        (2, "CONSTRAINT_MEMCG", UID_B, CID[3], False),
        (3, "CONSTRAINT_MEMCG", UID_B, CID[4], False),
        (3, "CONSTRAINT_MEMCG", UID_B, CID[4], True),
    ]
    assert kills[3].kill.oom_memcg is None  # the new event's header, and its memcg, are lost


def test_next_event_does_not_inherit_the_previous_context() -> None:
    # An event with its header, then a kill whose header was rate limited away (no group): a new
    # event, a cgroup OOM by its prefix, in no known cgroup.
    kills = feed([context(task_memcg=C3, pid=50, memcg=C3), killed(50), killed(60, "other")])
    assert summary(kills) == [
        (50, "CONSTRAINT_MEMCG", UID_B, CID[3], False),
        (60, "CONSTRAINT_MEMCG", None, None, False),
    ]


def test_same_pid_in_two_events_counts_twice() -> None:
    # A PID counts once per event, not once ever: a container restarted in place can OOM again.
    kills = feed(
        [
            context(task_memcg=C3, pid=70, memcg=C3),
            killed(70),
            "python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
            context(task_memcg=C3, pid=70, memcg=C3),
            killed(70),
        ]
    )
    assert [p.repeat for p in kills] == [False, False]


def test_already_exiting_is_no_kill() -> None:
    # __oom_kill_process finds no mm: it skips the task and counts nothing.
    kills = feed(
        [
            context(task_memcg=C3, pid=80, memcg=C3),
            killed(80),
            group(C3),
            "Memory cgroup out of memory: OOM victim 80 (python3) is already exiting. Skip",
            killed(81),
        ]
    )
    assert summary(kills) == [
        (80, "CONSTRAINT_MEMCG", UID_B, CID[3], False),
        (81, "CONSTRAINT_MEMCG", UID_B, CID[3], False),
    ]


# -- the one-line summary split on a busy machine ---------------------------------------------
def test_summary_split_in_two_with_another_cpus_record_between() -> None:
    kills = feed(
        [
            ("c", "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0"),
            "e1000e 0000:00:1f.6 eth0: NIC Link is Up 1000 Mbps Full Duplex",
            f",oom_memcg={C3},task_memcg={C3},task=python3,pid=90,uid=0",
            killed(90),
        ]
    )
    assert summary(kills) == [(90, "CONSTRAINT_MEMCG", UID_B, CID[3], False)]
    assert kills[0].kill.oom_memcg == C3


def test_summary_in_every_pr_cont_piece() -> None:
    # mem_cgroup_print_oom_context prints ",oom_memcg=", the path, ",task_memcg=", the path with
    # pr_cont each; dump_oom_summary ends with ",task=...,pid=...,uid=...".
    kills = feed(
        [
            ("c", "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null)"),
            ("c", ",cpuset=cri-containerd-x.scope,mems_allowed=0"),
            "IPv6: ADDRCONF(NETDEV_CHANGE): veth12ab: link becomes ready",
            ("c", ",oom_memcg="),
            ("c", B),
            'audit: type=1400 audit(1700000000.000:42): apparmor="DENIED"',
            ("c", ",task_memcg="),
            ("c", C4),
            ",task=java,pid=91,uid=1000",
            killed(91, "java"),
        ]
    )
    assert summary(kills) == [(91, "CONSTRAINT_MEMCG", UID_B, CID[4], False)]
    assert kills[0].kill.oom_memcg == B


def test_another_cpus_stack_trace_is_no_piece() -> None:
    # A stack trace line (it starts with a space) from another CPU while the summary is open.
    kills = feed(
        [
            ("c", "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0"),
            " dump_stack_lvl+0x4a/0x70",
            "/dev/sda1: clean, 11/65536 files",
            f",oom_memcg={C3},task_memcg={C3},task=python3,pid=95,uid=0",
            killed(95),
        ]
    )
    assert summary(kills) == [(95, "CONSTRAINT_MEMCG", UID_B, CID[3], False)]


def test_group_line_in_pieces() -> None:
    # mem_cgroup_print_oom_group: pr_info("Tasks in "), the path, pr_cont(" are going ...").
    kills = feed(
        [
            context(task_memcg=C3, pid=96, memcg=C3),
            killed(96),
            ("c", "Tasks in "),
            ("c", C3),
            "nf_conntrack: table full, dropping packet",
            " are going to be killed due to memory.oom.group set",
            killed(97, "worker"),
        ]
    )
    assert summary(kills) == [
        (96, "CONSTRAINT_MEMCG", UID_B, CID[3], False),
        (97, "CONSTRAINT_MEMCG", UID_B, CID[3], False),
    ]


def test_summary_missing_its_end_still_gives_what_it_has() -> None:
    # The last piece was lost (ring buffer overwritten): the kill record ends the line.
    kills = feed(
        [
            ("c", f"oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),oom_memcg={C3}"),
            ("c", f",task_memcg={C3}"),
            killed(92),
        ]
    )
    assert summary(kills) == [(92, "CONSTRAINT_MEMCG", UID_B, CID[3], False)]


def test_global_oom_and_cpuset_constraints() -> None:
    kills = feed(
        [
            context(task_memcg=f"{BE_CFS}/{CID[6]}", pid=93, comm="dd", c="NONE"),
            killed(93, "dd", prefix="Out of memory: "),
            context(task_memcg="/system.slice/cron.service", pid=94, comm="cron", c="CPUSET"),
            killed(94, "cron", prefix="Out of memory: "),
        ]
    )
    assert summary(kills) == [
        (93, "CONSTRAINT_NONE", UID_BE, CID[6], False),
        (94, "CONSTRAINT_CPUSET", None, None, False),
    ]
    assert kills[0].kill.oom_memcg is None  # global_oom


# -- before 4.19: "Task in", "Kill process ... or sacrifice child", "Killed process" -----------
def test_310_memcg_kill_of_a_sacrificed_child() -> None:
    # 3.10 (RHEL 7): mem_cgroup_print_oom_info, then oom_kill_process's two lines; the child
    # killed has another PID than the process chosen. 3.10 prints no shmem-rss.
    c = f"/kubepods/burstable/pod{UID_B}/{CID[3]}"
    kills = feed(
        [
            "java invoked oom-killer: gfp_mask=0xd0, order=0, oom_score_adj=-998",
            f"java cpuset={CID[3]} mems_allowed=0",
            f"Task in {c} killed as a result of limit of {c}",
            "memory: usage 524288kB, limit 524288kB, failcnt 4563",
            "Memory cgroup out of memory: Kill process 24572 (java) score 0 or sacrifice child",
            "Killed process 28438 (java) total-vm:20255636kB, anon-rss:466160kB, file-rss:13684kB",
        ]
    )
    assert summary(kills) == [(28438, "CONSTRAINT_MEMCG", UID_B, CID[3], False)]
    k = kills[0].kill
    assert (k.anon_rss_bytes, k.file_rss_bytes, k.shmem_rss_bytes) == (
        466160 * 1024,
        13684 * 1024,
        None,
    )
    assert k.oom_memcg == c


def test_310_task_in_in_two_printk_records() -> None:
    # 3.10 prints "Task in %s killed" and " as a result of limit of %s\n" with two printk calls;
    # another CPU's record can come between them.
    c = f"/kubepods/burstable/pod{UID_B}/{CID[4]}"
    kills = feed(
        [
            ("c", f"Task in {c} killed"),
            "IPVS: rr: TCP 10.96.0.1:443 - no destination available",
            ("+", f" as a result of limit of /kubepods/burstable/pod{UID_B}"),
            "Memory cgroup out of memory: Kill process 100 (python) score 1000 or sacrifice child",
            "Killed process 100 (python) total-vm:1200000kB, anon-rss:1000000kB, file-rss:4000kB",
        ]
    )
    assert summary(kills) == [(100, "CONSTRAINT_MEMCG", UID_B, CID[4], False)]
    assert kills[0].kill.oom_memcg == f"/kubepods/burstable/pod{UID_B}"


def test_414_task_in_in_pr_cont_pieces() -> None:
    # 4.x: pr_info("Task in "), pr_cont_cgroup_path, pr_cont(" killed as a result of limit
    # of "), pr_cont_cgroup_path: four records when interrupted.
    kills = feed(
        [
            ("c", "Task in "),
            ("c", C3),
            "docker0: port 1(veth5e6f7a8) entered blocking state",
            ("c", " killed as a result of limit of "),
            B,
            "Memory cgroup out of memory: Kill process 200 (node) score 1990 or sacrifice child",
            "Killed process 200 (node) total-vm:1500000kB, anon-rss:19kB, file-rss:2kB, "
            "shmem-rss:3kB",
        ]
    )
    assert summary(kills) == [(200, "CONSTRAINT_MEMCG", UID_B, CID[3], False)]
    assert kills[0].kill.shmem_rss_bytes == 3 * 1024


def test_old_node_oom_has_no_cgroup() -> None:
    # Before 4.19 a node OOM prints no cgroup at all; "Out of memory" is CONSTRAINT_NONE.
    kills = feed(
        [
            "kthreadd invoked oom-killer: gfp_mask=0x3000d0, order=2, oom_score_adj=0",
            "Out of memory: Kill process 2188 (mysqld) score 60 or sacrifice child",
            "Killed process 2188 (mysqld) total-vm:3330016kB, anon-rss:864176kB, file-rss:8072kB",
            # then a memcg OOM: its "Task in" must not reach back to the node kill
            f"Task in {G_CFS}/{CID[1]} killed as a result of limit of {G_CFS}",
            "Memory cgroup out of memory: Kill process 300 (train) score 900 or sacrifice child",
            "Killed process 300 (train) total-vm:3kB, anon-rss:2kB, file-rss:1kB, shmem-rss:0kB",
        ]
    )
    assert summary(kills) == [
        (2188, "CONSTRAINT_NONE", None, None, False),
        (300, "CONSTRAINT_MEMCG", UID_G, CID[1], False),
    ]


def test_rhel6_uid_in_the_kill_record() -> None:
    # 2.6.32 (RHEL 6): "Killed process <pid>, UID <uid>, (<comm>)".
    kills = feed(
        [
            "Task in /LXC011175068174 killed as a result of limit of /LXC011175068174",
            "Memory cgroup out of memory: Kill process 215701 (java) score 854 or sacrifice child",
            "Killed process 215701, UID 679, (java) total-vm:11017300kB, anon-rss:7152432kB, "
            "file-rss:1232kB",
        ]
    )
    assert summary(kills) == [(215701, "CONSTRAINT_MEMCG", None, None, False)]
    assert kills[0].kill.process == "java"
    assert kills[0].kill.task_memcg == "/LXC011175068174"


def test_a_process_name_with_parentheses() -> None:
    kills = feed([context(task_memcg=C3, pid=5, comm="a (b)", memcg=C3), killed(5, "a (b)")])
    assert kills[0].kill.process == "a (b)"


def test_prefixes() -> None:
    assert constraint_of_prefix("Memory cgroup out of memory") == "CONSTRAINT_MEMCG"
    assert constraint_of_prefix("Out of memory") == "CONSTRAINT_NONE"
    assert constraint_of_prefix("Out of memory (oom_kill_allocating_task)") == "CONSTRAINT_NONE"
    assert constraint_of_prefix("lowmemorykiller") is None
    assert constraint_of_prefix(None) is None
