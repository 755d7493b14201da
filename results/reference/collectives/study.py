#!/usr/bin/env python3
"""The allreduce algorithm study: every flat algorithm, 2..8 ranks, 4 KiB..64 MiB, in simulated time, with the
alpha-beta predictions beside the measurements (README.md in this folder says what the columns mean), and the rows of
`auto`'s table read off it.

  results/reference/collectives/study.py run [--terse build/bin/terse] [--repeats 3]  # benches -> raw/run*/*.json
  results/reference/collectives/study.py table  [RUN ...]  # medians over the runs -> table.md, table.csv
  results/reference/collectives/study.py derive [RUN ...]  # auto's rows -> auto_table.csv, auto_cells.csv

Run from the repository root; RUN folders default to every raw/run*. `run` took 3 minutes a repeat on the 2-core
development machine, quiet; `table` and `derive` only read raw/.
"""
import argparse
import csv
import glob
import json
import math
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RAW = os.path.join(HERE, "raw")
ALGOS = ["ring", "rd", "hd", "tree", "reduce_broadcast"]
# name, bandwidth (bits/s), latency (s). Every rank has one NIC of the link's bandwidth each way (--nic,
# --nic-ingress): the single-port, full-duplex network the textbook alpha-beta model assumes.
NETWORKS = [("10gbps", "10Gbps", "5us", 10e9, 5e-6), ("1gbps", "1Gbps", "50us", 1e9, 50e-6)]
# The same benches on a network that costs nothing (100 Tbps, no latency): what is left is the CPU time the
# simulation charges (the sums, and the communicator's and transport's own work per message).
FREE = ("free", "100000Gbps", "0us", None, None)
SIZES = "-b 4K -e 64M -f 4"
SEGMENT = 256 * 1024  # the bench's default for inproc (--segment auto)


def bench(terse, algo, net, raw):
    name, bw, lat, _, _ = net
    cmd = [terse, "bench", "allreduce", "--clock", "simulated", "-n", "2..8", *SIZES.split(), "--algo", algo,
           "--bandwidth", bw, "--latency", lat, "--iters", "2", "-w", "1", "--json", "--check"]
    if net is not FREE:
        cmd += ["--nic", bw, "--nic-ingress", bw]
    out = os.path.join(raw, f"{name}_{algo}.json")
    print(" ".join(cmd), file=sys.stderr, flush=True)
    res = subprocess.run(cmd, check=True, capture_output=True, text=True)
    with open(out, "w") as f:
        f.write(res.stdout)


def run(args):
    for r in range(1, args.repeats + 1):
        raw = os.path.join(args.raw, f"run{r}")
        os.makedirs(raw, exist_ok=True)
        for net in [FREE, *NETWORKS]:
            for algo in ALGOS:
                bench(args.terse, algo, net, raw)


def load_from(raw, name, algo):
    path = os.path.join(raw, f"{name}_{algo}.json")
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"study.py: cannot read {path}: {e}")
    assert d["wrong"] == 0, f"{raw}: {name} {algo}: wrong values"
    return {(r["ranks"], row["size"]): row for r in d["runs"] for row in r["rows"]}


def load(runs, name, algo):
    """Per (ranks, bytes): the median over the runs of time_us and busbw_gbps."""
    each = [load_from(d, name, algo) for d in runs]
    return {cell: {k: statistics.median(r[cell][k] for r in each) for k in ("time_us", "busbw_gbps")}
            for cell in each[0]}


def log2floor(n):
    return n.bit_length() - 1


def network_time(algo, n, S, alpha, beta):
    """Textbook alpha-beta time of one allreduce of S bytes among n ranks on single-port full-duplex links
    (Thakur, Rabenseifner and Gropp 2005; each formula is the header's algorithm, step by step)."""
    p = 1 << log2floor(n)
    fold = 2 * (alpha + S * beta) if n > p else 0.0  # non-power-of-two: in and out of the power of two
    if algo == "ring":
        return 2 * (n - 1) * (alpha + S / n * beta)
    if algo == "rd":
        return fold + log2floor(p) * (alpha + S * beta)
    if algo == "hd":
        return fold + 2 * log2floor(p) * alpha + 2 * (p - 1) / p * S * beta
    if algo == "tree":
        # Two pipelined phases over depth D with k segments of s bytes; a node with two children moves 2s per
        # segment through its one port (receives them in the reduce, sends them in the broadcast).
        depth = log2floor(n)
        s = min(S, SEGMENT)
        k = math.ceil(S / s)
        c = 2 if n >= 3 else 1
        return 2 * (depth * alpha + (k + depth - 1) * c * s * beta)
    if algo == "reduce_broadcast":
        return 2 * (alpha + (n - 1) * S * beta)
    raise ValueError(algo)


def table(args):
    free = {a: load(args.runs, "free", a) for a in ALGOS}
    rows = []
    for name, _, _, bw, lat in NETWORKS:
        meas = {a: load(args.runs, name, a) for a in ALGOS}
        beta = 8.0 / bw
        for (n, S) in sorted(meas["ring"]):
            row = {"network": name, "ranks": n, "bytes": S}
            for a in ALGOS:
                m = meas[a][(n, S)]
                t_net = network_time(a, n, S, lat, beta) * 1e6
                t_cpu = free[a][(n, S)]["time_us"]
                row[f"{a}_us"] = m["time_us"]
                row[f"{a}_busbw"] = m["busbw_gbps"]
                row[f"{a}_ab_us"] = t_net
                row[f"{a}_cpu_us"] = t_cpu
                row[f"{a}_pred_us"] = t_net + t_cpu
            row["best"] = min(ALGOS, key=lambda a: row[f"{a}_us"])
            row["best_ab"] = min(ALGOS, key=lambda a: row[f"{a}_ab_us"])
            rows.append(row)
    with open(os.path.join(HERE, "table.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.2f}" if isinstance(v, float) else v) for k, v in r.items()})

    def size(b):
        return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"

    out = []
    for name, bw_text, lat_text, _, _ in NETWORKS:
        out.append(f"\n## {bw_text}, {lat_text} (single port: NIC egress and ingress at {bw_text})\n")
        out.append("Each cell: measured time in us / alpha-beta prediction + measured CPU time in us (ratio "
                   "measured/prediction), busbw GB/s. `best`: fastest measured; `ab`: fastest by the pure "
                   "alpha-beta model.\n")
        out.append("| ranks | size | " + " | ".join(ALGOS) + " | best | ab |")
        out.append("|" + "---|" * (len(ALGOS) + 4))
        for r in rows:
            if r["network"] != name:
                continue
            cells = []
            for a in ALGOS:
                ratio = r[f"{a}_us"] / r[f"{a}_pred_us"]
                cells.append(f"{r[f'{a}_us']:.0f} / {r[f'{a}_pred_us']:.0f} ({ratio:.2f}), {r[f'{a}_busbw']:.3f}")
            out.append(f"| {r['ranks']} | {size(r['bytes'])} | " + " | ".join(cells) + f" | {r['best']} | {r['best_ab']} |")
        within = [r[f"{a}_us"] / r[f"{a}_pred_us"] for r in rows if r["network"] == name for a in ALGOS]
        ok = sum(1 for x in within if 0.8 <= x <= 1.2)
        out.append(f"\nWithin 20% of the prediction: {ok} of {len(within)} cells; ratio range "
                   f"{min(within):.2f}..{max(within):.2f}.\n")
        pure = [r[f"{a}_us"] / r[f"{a}_ab_us"] for r in rows if r["network"] == name for a in ALGOS]
        okp = sum(1 for x in pure if 0.8 <= x <= 1.2)
        out.append(f"Against the pure alpha-beta time (no CPU term): {okp} of {len(pure)} within 20%; ratio range "
                   f"{min(pure):.2f}..{max(pure):.2f}.\n")
    with open(os.path.join(HERE, "table.md"), "w") as f:
        f.write("# Allreduce algorithms in simulated time (generated by study.py table)\n" + "\n".join(out))


# What `auto` picks among. The tree and the master-worker baseline are in the study to check the model: they beat all
# three only at 4 KiB on 3 and 5 ranks, by 1-3 us (README.md).
AUTO_ALGOS = ["ring", "rd", "hd"]
# A band of one size whose winner leads its neighbour band's algorithm there by less than this is noise, not a
# crossover: the three runs of a cell differ by up to 2% in most cells and by far more in a few small-message ones.
NOISE = 0.10


def derive(args):
    """auto's rows from one or more runs of one network's benches (10 Gbps unless --network): the median time per cell
    over the runs, the fastest of AUTO_ALGOS per size, then bands of one size that win by less than NOISE merged into
    a neighbour. Only the 10 Gbps rows are written (auto_table.csv, auto_cells.csv); another network's are printed."""
    runs = [{a: load_from(d, args.network, a) for a in AUTO_ALGOS} for d in args.runs]  # each run, for the ranges
    medians = {a: load(args.runs, args.network, a) for a in AUTO_ALGOS}
    cells = sorted(medians["ring"])
    rows = {}
    report = []
    for n in sorted({c[0] for c in cells}):
        sizes = [S for (m, S) in cells if m == n]
        med = {(a, S): medians[a][(n, S)]["time_us"] for a in AUTO_ALGOS for S in sizes}
        # On two ranks halving-doubling is the ring (one exchange of halves each way), so only the ring stands.
        cands = [a for a in AUTO_ALGOS if not (n == 2 and a == "hd")]
        win = [min(cands, key=lambda a: med[(a, S)]) for S in sizes]
        changed = True
        while changed:  # merge a lone size into a neighbour whose algorithm is within the noise there
            changed = False
            for i, S in enumerate(sizes):
                left = win[i - 1] if i > 0 else None
                right = win[i + 1] if i + 1 < len(sizes) else None
                if win[i] in (left, right):
                    continue
                near = [b for b in (left, right) if b is not None and med[(b, S)] <= med[(win[i], S)] * (1 + NOISE)]
                if near:  # the faster neighbour takes it
                    win[i] = min(near, key=lambda b: med[(b, S)])
                    changed = True
        bands = []
        for S, a in zip(sizes, win):
            if bands and bands[-1][1] == a:
                continue
            if bands:
                bands[-1][0] = S
            bands.append([None, a])
        rows[n] = bands
        for S, a in zip(sizes, win):
            fastest = min(cands, key=lambda b: med[(b, S)])
            report.append(f"{n},{S},{a},{fastest},"
                          + ",".join(f"{med[(b, S)]:.1f}" for b in AUTO_ALGOS)
                          + "," + ",".join(f"{min(r[b][(n, S)]['time_us'] for r in runs):.1f}-"
                                           f"{max(r[b][(n, S)]['time_us'] for r in runs):.1f}" for b in AUTO_ALGOS))
    for n, bands in rows.items():
        print(n, " ".join(f"<{b}:{a}" if b else a for b, a in bands))
    if args.network != NETWORKS[0][0]:
        return  # auto's rows are read off the first network's runs; others are printed to compare
    with open(os.path.join(HERE, "auto_table.csv"), "w") as f:
        f.write("# auto's bands per world (generated by study.py derive; core/comm/allreduce_auto.cc must match):\n"
                "# messages below `below` bytes take `algo`; the last band of a world has no bound\n")
        f.write("ranks,below,algo\n")
        for n, bands in rows.items():
            for below, a in bands:
                f.write(f"{n},{below if below is not None else ''},{a}\n")
    with open(os.path.join(HERE, "auto_cells.csv"), "w") as f:
        f.write("ranks,bytes,picked,fastest," + ",".join(f"{a}_us" for a in AUTO_ALGOS) + ","
                + ",".join(f"{a}_range_us" for a in AUTO_ALGOS) + "\n")
        f.write("\n".join(report) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["run", "table", "derive"])
    ap.add_argument("--terse", default="build/bin/terse")
    ap.add_argument("--raw", default=RAW, help="run: the folder of the runs' folders run1, run2, ... (default: raw/)")
    ap.add_argument("--repeats", type=int, default=3, help="run: how many times to run every bench")
    ap.add_argument("--network", default="10gbps", choices=[n[0] for n in NETWORKS], help="derive: which network's benches")
    ap.add_argument("runs", nargs="*", help="table, derive: the folders of the runs (default: every raw/run*)")
    args = ap.parse_intermixed_args()
    if not args.runs:
        args.runs = sorted(glob.glob(os.path.join(RAW, "run*")))
    if args.what != "run" and not args.runs:
        sys.exit(f"study.py: no runs under {RAW} (make them with `study.py run`)")
    {"run": run, "table": table, "derive": derive}[args.what](args)


if __name__ == "__main__":
    main()
