#!/usr/bin/env python3
"""Prints the zoo table of docs/compressors-and-schedulers.md ("Reference results: the compressor zoo") from this
folder's compare.json. (The name is older than docs/: the table used to be in the top-level README.)

    results/reference/zoo/readme_table.py [compare.json]            print the table
    results/reference/zoo/readme_table.py --check docs/compressors-and-schedulers.md [compare.json]
                                      exit 1, naming the first row that differs, when the document's table is not
                                      this one (ctest zoo_readme_table: the page cannot drift from the committed
                                      tables)

The two studies (zoo_1gbps, zoo_10gbps) run the same variants at the same seeds, and their runs are deterministic in
everything but time, so accuracy and bytes come from the 1 Gbps study and each time column from its own study. A
value is the mean over the seeds; `± h` is the half-width of its 95% t-interval (left out when it is 0), and `≈`
marks a value within dense's seed-to-seed noise (compare's Welch test, p >= 0.05). Rows in compare's order: by bytes
to target, then final accuracy.
"""
import json
import pathlib
import sys


def sig3(x):
    """Three significant figures, but whole numbers from 100 up (1002 MB, not 1.00e+03)."""
    a = abs(x)
    if a >= 100:
        return f"{x:.0f}"
    if a >= 10:
        return f"{x:.1f}"
    if a >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def cell(row, field, fmt, scale=1.0):
    """mean [± ci] [≈] of one compare field, or "not reached" when the target was not reached at every seed."""
    value = row.get(field)
    if value is None or (field.endswith("_to_target") and not row.get("reached_target")):
        return "not reached"
    text = fmt(value * scale)
    stats = row.get("over_seeds", {}).get(field)
    if stats:
        if stats.get("ci95"):
            text += " ± " + fmt(stats["ci95"] * scale)
        if stats.get("within_noise") and not row.get("baseline"):
            text += " ≈"
    return text


def table(path):
    studies = {s["study"]: s for s in json.loads(path.read_text())["studies"]}
    slow, fast = studies["zoo_1gbps"], studies["zoo_10gbps"]
    fast_rows = {r["variant"]: r for r in fast["rows"]}
    acc = lambda x: f"{x:.4f}"
    secs = lambda x: f"{x:.2f}"
    lines = []
    lines.append("| variant | final acc | best acc | wire MB/worker | ratio vs dense | MB to 0.85 | s to 0.85 (1 Gbps) "
          "| s to 0.85 (10 Gbps) | step ms (1 / 10 Gbps) |")
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in slow["rows"]:
        other = fast_rows[row["variant"]]
        name = f"**{row['variant']}** (baseline)" if row.get("baseline") else row["variant"]
        cells = [
            name,
            cell(row, "final_accuracy", acc),
            cell(row, "best_accuracy", acc),
            cell(row, "wire_bytes_per_worker", sig3, 1e-6),
            f"{row['ratio_vs_baseline']:.1f}×",
            cell(row, "bytes_to_target", sig3, 1e-6),
            cell(row, "seconds_to_target", secs),
            cell(other, "seconds_to_target", secs),
            f"{row['step_s'] * 1e3:.1f} / {other['step_s'] * 1e3:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main():
    args = sys.argv[1:]
    readme = None
    if args[:1] == ["--check"]:
        if len(args) < 2:
            sys.exit("readme_table.py: --check needs the path of the document that holds the table")
        readme, args = pathlib.Path(args[1]), args[2:]
    lines = table(pathlib.Path(args[0]) if args else pathlib.Path(__file__).with_name("compare.json"))
    if readme is None:
        print("\n".join(lines))
        return
    text = readme.read_text().splitlines()
    if lines[0] not in text:
        sys.exit(f"readme_table.py: {readme} has no zoo table (its header line is missing)")
    first = text.index(lines[0])
    for i, want in enumerate(lines):
        have = text[first + i] if first + i < len(text) else "(end of file)"
        if have != want:
            sys.exit(f"readme_table.py: {readme}:{first + i + 1} differs from compare.json's table\n"
                     f"  document:     {have}\n  compare.json: {want}\n"
                     "regenerate it with results/reference/zoo/readme_table.py")
    if first + len(lines) < len(text) and text[first + len(lines)].startswith("|"):
        sys.exit(f"readme_table.py: {readme}:{first + len(lines) + 1} is a row compare.json does not have")
    print(f"readme_table.py: {readme}'s zoo table matches compare.json ({len(lines) - 2} rows)")


if __name__ == "__main__":
    main()
