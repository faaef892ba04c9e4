#!/usr/bin/python3
"""Checks bench/machine_limits on this machine: a --quick run's JSON against the CPU's flags.

    check_machine_limits.py MACHINE_LIMITS_BINARY

- every key is there; the figures are numbers (null only where a feature is absent)
- the f32 FMA peak per core is plausible (1..1000 GFLOP/s), and all cores do at least 0.8x one
  (all cores' best repetition against one core's median: on a shared machine the best 1-thread
  repetition catches a moment when its CPU was free, which every CPU at once seldom gets)
- vdpbf16ps / AMX figures are null exactly when /proc/cpuinfo lacks avx512_bf16 / amx_bf16,
  and the AVX-512 FMA figure exactly when it lacks avx512f
- the bf16 peak is taken from the best bf16 unit present (AMX, then vdpbf16ps, then the FMA)
- on one thread, L1 bandwidth is at least main memory's
- bad options exit with status 2 and a message
"""

import json
import os
import subprocess
import sys
import tempfile

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


def cpu_flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def is_rate(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    binary = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "out.json")
        run = subprocess.run([binary, "--quick", "--json", out_path], capture_output=True, text=True, timeout=300)
        print(run.stdout)
        if run.returncode != 0:
            print(f"FAIL: machine_limits exited {run.returncode}: {run.stderr}")
            return 1
        with open(out_path) as f:
            r = json.load(f)

    flags = cpu_flags()
    keys = ["cpu", "threads", "isa", "cache_bytes", "fma_isa", "fma_f32_gflops_per_core", "fma_f32_gflops_all_cores",
            "fma_f32_avx2_gflops_per_core", "fma_f32_avx2_gflops_all_cores", "fma_f32_avx512_gflops_per_core",
            "fma_f32_avx512_gflops_all_cores", "vdpbf16ps_gflops_per_core", "vdpbf16ps_gflops_all_cores",
            "amx_bf16_gflops_per_core", "amx_bf16_gflops_all_cores", "amx_bf16_note", "bf16_peak_source",
            "bf16_peak_gflops_per_core", "bandwidth_convention", "bandwidth_gbs", "read_bandwidth_gbs",
            "working_set_bytes", "median"]
    missing = [k for k in keys if k not in r]
    if missing:
        print(f"FAIL: keys missing from the JSON: {missing}")
        return 1

    check(isinstance(r["cpu"], str) and r["cpu"], "cpu is an empty string")
    check(r["threads"] == len(os.sched_getaffinity(0)),
          f"threads {r['threads']} is not the {len(os.sched_getaffinity(0))} CPUs this process may use")

    per_core, all_cores = r["fma_f32_gflops_per_core"], r["fma_f32_gflops_all_cores"]
    per_core_median = r["median"].get("fma_f32_gflops_per_core")
    check(is_rate(per_core) and 1 <= per_core <= 1000, f"f32 FMA peak per core {per_core} outside 1..1000 GFLOP/s")
    check(is_rate(per_core_median) and per_core_median <= per_core,
          f"median f32 FMA per core {per_core_median} is not a rate at most the best {per_core}")
    check(is_rate(all_cores) and is_rate(per_core_median) and all_cores >= 0.8 * per_core_median,
          f"f32 FMA peak on all cores {all_cores} is below 0.8x the per-core median {per_core_median}")
    check(r["fma_isa"] in ("avx2", "avx512"), f"fma_isa {r['fma_isa']!r} is neither avx2 nor avx512")
    check(is_rate(r["fma_f32_avx2_gflops_per_core"]), "no AVX2 FMA figure")

    # each optional unit: a figure exactly when /proc/cpuinfo lists the flag
    for key, flag in (("fma_f32_avx512", "avx512f"), ("vdpbf16ps", "avx512_bf16"), ("amx_bf16", "amx_bf16")):
        has = flag in flags
        for suffix in ("per_core", "all_cores"):
            v = r[f"{key}_gflops_{suffix}"]
            if has:
                note = f" ({r['amx_bf16_note']})" if key == "amx_bf16" and r["amx_bf16_note"] else ""
                check(is_rate(v), f"{key}_gflops_{suffix} is {v} although the CPU has {flag}{note}")
            else:
                check(v is None, f"{key}_gflops_{suffix} is {v} although the CPU lacks {flag}")
        check(r["isa"].get(flag) == has, f"isa.{flag} is {r['isa'].get(flag)} but /proc/cpuinfo says {has}")
    if r["fma_isa"] == "avx512":
        check("avx512f" in flags, "fma_isa is avx512 on a CPU without avx512f")

    source = "amx" if r["amx_bf16_gflops_per_core"] is not None else \
        "vdpbf16ps" if r["vdpbf16ps_gflops_per_core"] is not None else "fma_f32"
    check(r["bf16_peak_source"] == source, f"bf16_peak_source is {r['bf16_peak_source']}, expected {source}")
    source_key = {"amx": "amx_bf16_gflops_per_core", "vdpbf16ps": "vdpbf16ps_gflops_per_core",
                  "fma_f32": "fma_f32_gflops_per_core"}[source]
    check(r["bf16_peak_gflops_per_core"] == r[source_key],
          f"bf16_peak_gflops_per_core {r['bf16_peak_gflops_per_core']} is not {source_key} {r[source_key]}")

    for table in ("bandwidth_gbs", "read_bandwidth_gbs"):
        for level in ("l1", "l2", "l3", "memory"):
            cell = r[table].get(level, {})
            for t in ("1", "all"):
                check(is_rate(cell.get(t)), f"{table}.{level}.{t} is {cell.get(t)}, not a positive number")
    bw = r["bandwidth_gbs"]
    if is_rate(bw["l1"].get("1")) and is_rate(bw["memory"].get("1")):
        check(bw["l1"]["1"] >= bw["memory"]["1"],
              f"1-thread copy bandwidth from L1 ({bw['l1']['1']} GB/s) is below main memory's ({bw['memory']['1']} GB/s)")

    for bad in (["--threads", "0"], ["--threads"], ["--threads", "two"], ["--bogus"]):
        run = subprocess.run([binary] + bad, capture_output=True, text=True, timeout=60)
        check(run.returncode == 2 and "machine_limits:" in run.stderr,
              f"machine_limits {' '.join(bad)} exited {run.returncode} (expected 2) with stderr {run.stderr!r}")

    for f in failures:
        print("FAIL:", f)
    if failures:
        return 1
    print(f"machine_limits: every check passed ({r['cpu']}, f32 FMA {per_core} GFLOP/s per core, {r['fma_isa']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
