"""The machine-load measurement: other processes' share of the CPUs over an interval."""

import os
import subprocess
import sys
import time

from lmforge.device import busy


def test_a_busy_process_beside_us_counts_as_others():
    if not busy.sample().known:
        return  # no /proc/stat (macOS): others_share answers None, checked below
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        start = busy.sample()
        time.sleep(1.0)
        share = busy.others_share(start, busy.sample())
    finally:
        hog.kill()
        hog.wait()
    assert 0.3 / (os.cpu_count() or 1) < share <= 1.0  # at least part of one CPU of them all


def test_our_own_cpu_time_is_not_counted(monkeypatch, tmp_path):
    stat = tmp_path / "stat"
    monkeypatch.setattr(busy, "PROC_STAT", stat)
    monkeypatch.setattr(busy.os, "sysconf", lambda name: 100)
    clock = iter([10.0, 12.0])
    monkeypatch.setattr(busy.time, "monotonic", lambda: next(clock))
    times = iter([os.times_result((1.0, 0.0, 0.0, 0.0, 0.0)), os.times_result((2.5, 0.5, 0, 0, 0))])
    monkeypatch.setattr(busy.os, "times", lambda: next(times))
    # cpu user nice system idle iowait irq softirq steal: busy ticks 1000, then 1500
    stat.write_text("cpu 600 0 400 5000 0 0 0 0 0 0\ncpu0 1 2 3 4\n")
    start = busy.sample()
    stat.write_text("cpu 900 0 600 5300 0 0 0 0 0 0\n")
    end = busy.sample()
    # 5 s of busy CPU in 2 s on 4 CPUs, 2 s of it ours: others used 3 / 8 of the capacity
    assert busy.others_share(start, end, cpus=4) == 3 / 8


def test_unknown_without_proc_stat(monkeypatch, tmp_path):
    monkeypatch.setattr(busy, "PROC_STAT", tmp_path / "missing")
    a = busy.sample()
    assert not a.known and busy.others_share(a, busy.sample()) is None
