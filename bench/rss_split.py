#!/usr/bin/env python3
"""Runs a command and samples /proc/PID/smaps every 50 ms; prints (stderr, one JSON line) the peak RSS and how it
splits at that moment: the .pte file's mapping, anonymous memory (heap, planned memory, the XNNPACK backend's
packed weights), libraries. RSS_SERIES=FILE also writes every sample (seconds, total kB, .pte kB, anonymous kB).

    python3 bench/rss_split.py build/kiln generate model.pte --prompt-file p.txt --max-new-tokens 128 --ignore-eos
"""
import collections
import json
import os
import subprocess
import sys
import time


def sample(pid):
    split, kind = collections.Counter(), None
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                parts = line.split()
                if not parts:
                    continue
                if "-" in parts[0] and not parts[0].endswith(":"):  # a mapping's header line
                    path = parts[5] if len(parts) > 5 else ""
                    kind = ("pte" if path.endswith(".pte") else "anon" if path in ("", "[heap]")
                            else "other" if path.startswith("[") else "files")
                elif parts[0] == "Rss:":
                    split[kind] += int(parts[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return split


def main():
    proc = subprocess.Popen(sys.argv[1:])
    series = open(os.environ["RSS_SERIES"], "w") if os.environ.get("RSS_SERIES") else None
    peak, at, t0 = collections.Counter(), 0.0, time.time()
    while proc.poll() is None:
        s = sample(proc.pid)
        if s:
            if series:
                series.write(f"{time.time() - t0:.2f} {sum(s.values())} {s['pte']} {s['anon']}\n")
            if sum(s.values()) > sum(peak.values()):
                peak, at = s, time.time() - t0
        time.sleep(0.05)
    print(json.dumps({"peak_rss_kB": sum(peak.values()), "at_s": round(at, 2), "pte_kB": peak["pte"],
                      "anon_kB": peak["anon"], "files_kB": peak["files"], "rc": proc.returncode}), file=sys.stderr)
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
