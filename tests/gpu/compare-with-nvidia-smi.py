#!/usr/bin/env python3
"""Compares the agent's GPU series with nvidia-smi's view of the same GPUs, from the files
tests/gpu/real-driver-check.sh leaves: nvidia-smi.csv and metrics-every-second.txt.

Identity must be equal; slowly moving values (link, limits) equal, framebuffer sizes
within 1 MiB (the agent cuts bytes to MiB as DCGM does, nvidia-smi rounds); values
that move between the two reads (utilization, temperature, power, clocks, memory used)
within a tolerance. Prints one line per GPU and field, and exits non-zero on a mismatch.
Usage: compare-with-nvidia-smi.py DIR
"""

import csv
import re
import sys
from pathlib import Path

SERIES = re.compile(r'^(\w+)\{(.*)\} (\S+)$')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

# nvidia-smi column -> (agent family, tolerance; None: must be equal).
FIELDS = {
    "utilization.gpu [%]": ("DCGM_FI_DEV_GPU_UTIL", 25.0),
    "utilization.memory [%]": ("DCGM_FI_DEV_MEM_COPY_UTIL", 25.0),
    "memory.total [MiB]": ("DCGM_FI_DEV_FB_TOTAL", 1.0),
    "memory.used [MiB]": ("DCGM_FI_DEV_FB_USED", 64.0),
    "memory.free [MiB]": ("DCGM_FI_DEV_FB_FREE", 64.0),
    "memory.reserved [MiB]": ("DCGM_FI_DEV_FB_RESERVED", 1.0),
    "temperature.gpu": ("DCGM_FI_DEV_GPU_TEMP", 3.0),
    "temperature.memory": ("DCGM_FI_DEV_MEMORY_TEMP", 3.0),
    "power.draw [W]": ("DCGM_FI_DEV_POWER_USAGE", 30.0),
    "enforced.power.limit [W]": ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", 0.5),
    "clocks.current.sm [MHz]": ("DCGM_FI_DEV_SM_CLOCK", 400.0),
    "clocks.current.memory [MHz]": ("DCGM_FI_DEV_MEM_CLOCK", 0.0),
    "pcie.link.gen.current": ("DCGM_FI_DEV_PCIE_LINK_GEN", 0.0),
    "pcie.link.width.current": ("DCGM_FI_DEV_PCIE_LINK_WIDTH", 0.0),
    "ecc.errors.corrected.volatile.total": ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 0.0),
    "ecc.errors.uncorrected.volatile.total": ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 0.0),
}


def number(text):
    text = text.strip().split(" ")[0]
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def agent_series(path):
    by_gpu = {}
    for line in Path(path).read_text().splitlines():
        m = SERIES.match(line)
        if not m or not m.group(1).startswith("DCGM_"):
            continue
        labels = dict(LABEL.findall(m.group(2)))
        by_gpu.setdefault(labels.get("gpu"), {})[m.group(1)] = (labels, float(m.group(3)))
    return by_gpu


def main(folder):
    folder = Path(folder)
    rows = list(csv.DictReader((folder / "nvidia-smi.csv").read_text().splitlines(), skipinitialspace=True))
    agent = agent_series(folder / "metrics-every-second.txt")
    failures = 0
    for row in rows:
        gpu = row["index"].strip()
        series = agent.get(gpu, {})
        labels = next(iter(series.values()), ({}, 0))[0]
        for column, label in [("uuid", "UUID"), ("pci.bus_id", "pci_bus_id"), ("name", "modelName"),
                              ("driver_version", "DCGM_FI_DRIVER_VERSION")]:
            ok = row[column].strip().lower() == labels.get(label, "").lower()
            failures += not ok
            print(f"gpu {gpu} {label}: nvidia-smi {row[column].strip()!r} agent {labels.get(label)!r} {'ok' if ok else 'MISMATCH'}")
        for column, (family, tolerance) in FIELDS.items():
            smi = number(row.get(column, ""))
            got = series.get(family, (None, None))[1]
            if smi is None and got is None:
                verdict = "both absent"
            elif smi is None or got is None:
                verdict = "only one has it"
            else:
                verdict = "ok" if abs(smi - got) <= tolerance else "MISMATCH"
                failures += verdict == "MISMATCH"
            print(f"gpu {gpu} {family}: nvidia-smi {smi} agent {got} ({verdict})")
    print(f"{len(rows)} GPUs, {failures} mismatches")
    return 1 if failures or not rows else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
