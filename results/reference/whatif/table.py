#!/usr/bin/env python3
# The what-if matrix (README.md here): from `terse compare --out` JSON, one table per cluster with a row per
# compressor and, per worker count, the simulated step time, the time to the target accuracy and the wire bytes per
# worker and step. Usage: table.py compare.json > whatif.md
import json
import sys

COMPRESSORS = ["dense", "fp16", "topk-1pct-ef", "powersgd-r4-ef", "onebit-ef"]
SCALES = [16, 128, 1024]


def cell(row, key, scale, digits):
    if row is None:
        return "not run"
    v = row.get(key)
    if v is None:
        return "not reached" if key == "seconds_to_target" else "-"
    return f"{v * scale:.{digits}f}"


def main():
    data = json.load(open(sys.argv[1]))
    print(f"Target test accuracy {data['target']:.2f}. Simulated milliseconds (FLOP model); "
          "wire KB per worker and step; \"not reached\": not within the study's steps; "
          "partial rows (runs stopped early) are marked *.\n")
    for study in data["studies"]:
        rows = {r["variant"]: r for r in study["rows"]}
        print(f"### {study['study']}\n")
        head = ["compressor"]
        for n in SCALES:
            head += [f"{n}: step ms", f"{n}: ms to target", f"{n}: KB/step"]
        print("| " + " | ".join(head) + " |")
        print("|---" + "|---:" * (len(head) - 1) + "|")
        for c in COMPRESSORS:
            cells = [c]
            for n in SCALES:
                r = rows.get(f"{c}-{n}")
                mark = "*" if r is not None and r.get("state") != "completed" else ""
                cells += [cell(r, "step_s", 1e3, 3) + mark, cell(r, "seconds_to_target", 1e3, 2) + mark,
                          cell(r, "wire_bytes_per_step", 1e-3, 1) + mark]
            print("| " + " | ".join(cells) + " |")
        print()


if __name__ == "__main__":
    main()
