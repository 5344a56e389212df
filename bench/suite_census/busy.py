"""How busy a command kept the machine's cores: wall time, and the CPU time every process on the
machine used meanwhile (from /proc/stat, so processes a test killed, or that left their parent,
count too). On an otherwise idle machine of its own (a container sharing a host's CPUs sees the
host's counts) that CPU time is the command's, and it bounds the wall time from below: no
schedule on N cores finishes N cores' worth of work sooner.

    python bench/suite_census/busy.py -- make test

Prints one JSON line after the command ends; its exit status is the command's.
"""

import json
import os
import subprocess
import sys
import time


def _busy_seconds() -> float:
    """CPU seconds spent on anything but idling and waiting for I/O, over all cores, since boot.
    Steal (a hypervisor's other guests) is left out: it is not this machine's work."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    command = sys.argv[1:]
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        sys.exit(__doc__)
    cores = len(os.sched_getaffinity(0))
    busy, start = _busy_seconds(), time.monotonic()
    status = subprocess.call(command)
    wall, busy = time.monotonic() - start, _busy_seconds() - busy
    print(json.dumps({"command": command, "wall_s": round(wall, 1), "busy_cpu_s": round(busy, 1), "cores": cores,
                      "busy_share": round(busy / (cores * wall), 3), "floor_s": round(busy / cores, 1)}))
    return status


if __name__ == "__main__":
    sys.exit(main())
