"""Torch's intra-op threads per process, so that a run's processes share the cores instead of oversubscribing them.

N processes computing groups side by side on C cores get max(1, C // N) threads each: the driver alone (the local
executor) takes every core, a pool of N workers a share each, a Ray task one per CPU it holds (one). Two
processes with C threads each on C cores spend their time preempting each other in OpenMP barriers.
LEAKBENCH_THREADS overrides the count in every process of a run (Ray tasks get it from the driver). HE
chunks have their own pool size (bench/crypto/parallel.py). Cores are those this process may run on (its
CPU affinity), not the machine's.

The count is not adapted to what other programs load the machine with, though that is where it matters
most: torch's parallel reductions may sum in another order with another thread count, so a count that
followed the load average could change a group's numbers between two runs of the same command. On a
shared machine set LEAKBENCH_THREADS=1: the smoke suite in process took 10-13 s with one thread and
23-61 s with both cores of a 2-core machine whose load average stood at 11-12 (measured; medians 12.1
and 42.5 s), where OpenMP's threads wait at every barrier for a preempted sibling.
"""
from __future__ import annotations

from bench.crypto.parallel import env_count, usable_cores

ENV = "LEAKBENCH_THREADS"


def threads_for(processes: int, cores: int | None = None) -> int:
    """Threads for each of `processes` computing side by side on `cores` (default: the usable cores), or
    LEAKBENCH_THREADS; a bad override is a one-line ValueError."""
    return env_count(ENV) or max(1, (cores or usable_cores()) // max(1, processes))


def share_cores(processes: int, cores: int | None = None) -> int:
    """Set this process's torch intra-op threads for `processes` side by side; returns the count."""
    import torch

    n = threads_for(processes, cores)
    torch.set_num_threads(n)
    return n
