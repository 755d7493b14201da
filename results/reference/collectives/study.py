#!/usr/bin/env python3
"""The allreduce algorithm study: every flat algorithm, 2..8 ranks, 4 KiB..64 MiB, in simulated time, with the
alpha-beta predictions beside the measurements (README.md in this folder says what the columns mean).

  results/reference/collectives/study.py run   [--terse build-cpu/bin/terse]   # the benches -> raw/*.json
  results/reference/collectives/study.py table                                # raw/*.json -> table.md, table.csv

Run from the repository root. `run` took 29 minutes on the 2-core development machine under load; `table` only reads raw/
"""
import argparse
import csv
import json
import math
import os
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


def bench(terse, algo, net):
    name, bw, lat, _, _ = net
    cmd = [terse, "bench", "allreduce", "--clock", "simulated", "-n", "2..8", *SIZES.split(), "--algo", algo,
           "--bandwidth", bw, "--latency", lat, "--iters", "2", "-w", "1", "--json", "--check"]
    if net is not FREE:
        cmd += ["--nic", bw, "--nic-ingress", bw]
    out = os.path.join(RAW, f"{name}_{algo}.json")
    print(" ".join(cmd), file=sys.stderr, flush=True)
    res = subprocess.run(cmd, check=True, capture_output=True, text=True)
    with open(out, "w") as f:
        f.write(res.stdout)


def run(args):
    os.makedirs(RAW, exist_ok=True)
    for net in [FREE, *NETWORKS]:
        for algo in ALGOS:
            bench(args.terse, algo, net)


def load(name, algo):
    with open(os.path.join(RAW, f"{name}_{algo}.json")) as f:
        d = json.load(f)
    assert d["wrong"] == 0, f"{name} {algo}: wrong values"
    return {(r["ranks"], row["size"]): row for r in d["runs"] for row in r["rows"]}


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
    free = {a: load("free", a) for a in ALGOS}
    rows = []
    for name, _, _, bw, lat in NETWORKS:
        meas = {a: load(name, a) for a in ALGOS}
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["run", "table"])
    ap.add_argument("--terse", default="build-cpu/bin/terse")
    args = ap.parse_args()
    run(args) if args.what == "run" else table(args)


if __name__ == "__main__":
    main()
