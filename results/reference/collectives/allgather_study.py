#!/usr/bin/env python3
"""The allgatherv crossover study behind core/comm/allgather_auto.h: the ring against Bruck's allgather on flat,
single-port networks of 1, 10 and 100 Gbps at 8 and 64 ranks, and the hierarchical allgatherv against both on a
two-level cluster of 2, 8 and 32 nodes, all in simulated time (`terse bench allgather --clock simulated`).

  results/reference/collectives/allgather_study.py run   [--terse build-cpu/bin/terse]   # the benches -> raw/
  results/reference/collectives/allgather_study.py table                                # raw/ -> allgather.md

Run from the repository root; `table` only reads raw/.
"""
import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
RAW = os.path.join(HERE, "raw")
# name, bandwidth, latency: every rank has one NIC of the link's bandwidth each way (--nic, --nic-ingress), as in
# study.py's allreduce networks.
FLAT = [("1gbps", "1Gbps", "50us"), ("10gbps", "10Gbps", "5us"), ("100gbps", "100Gbps", "5us")]
# The what-if study's nodes (results/reference/whatif): 8 workers on 2400 Gbps / 2 us, one NIC per node.
TOPOLOGIES = [("nodes-100gbps", "workers=8,intra=2400Gbps,intra_latency=2us,nic=100Gbps,nic_latency=5us"),
              ("nodes-10gbps", "workers=8,intra=2400Gbps,intra_latency=2us,nic=10Gbps,nic_latency=5us")]
# Worlds of 2, 8 and 32 nodes: whether auto's multi-node bands hold across world sizes.
NODE_WORLDS = (16, 64, 256)
SIZES = "-b 4K -e 16M -f 4"


def benches(terse):
    for name, bw, lat in FLAT:
        for n in (8, 64):
            for algo in ("ring", "bruck"):
                yield (f"flat-{name}_{n}_{algo}",
                       ["--bandwidth", bw, "--latency", lat, "--nic", bw, "--nic-ingress", bw, "-n", str(n),
                        "--algo", algo])
    for name, spec in TOPOLOGIES:
        for n in NODE_WORLDS:
            for algo in ("ring", "bruck", "hierarchical"):
                yield f"{name}_{n}_{algo}", ["--topology", spec, "-n", str(n), "--algo", algo]


def bench(terse, name, extra):
    cmd = [terse, "bench", "allgather", "--clock", "simulated", *SIZES.split(), "--iters", "2", "-w", "1", "--json",
           "--check", *extra]
    print(" ".join(cmd), file=sys.stderr, flush=True)
    res = subprocess.run(cmd, check=True, capture_output=True, text=True)
    with open(os.path.join(RAW, f"allgather_{name}.json"), "w") as f:
        f.write(res.stdout)


def run(args):
    os.makedirs(RAW, exist_ok=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        for f in [pool.submit(bench, args.terse, name, extra) for name, extra in benches(args.terse)]:
            f.result()


def load(name):
    with open(os.path.join(RAW, f"allgather_{name}.json")) as f:
        d = json.load(f)
    assert d["wrong"] == 0, f"{name}: wrong values"
    return {row["size"]: row["time_us"] for r in d["runs"] for row in r["rows"]}


def table(args):
    out = ["# Allgatherv: ring, Bruck and hierarchical in simulated time", "",
           "Made by `results/reference/collectives/allgather_study.py run` then `... table` (this file). Time per",
           "allgather in simulated us (slowest rank, median batch); size = gathered bytes (size / n per rank); the",
           "winner in bold. The simulated times include the communicator's measured CPU work per message, so a rerun",
           "moves them (the ring's most). On the two-level clusters hierarchical is the fastest or within 7% in 34 of",
           "42 cells; flat Bruck's wins (4-256 KiB at 16 and 64 ranks, only 4 KiB on 10 Gbps at 256) and the ring's",
           "(4 and 16 MiB on two nodes of 100 Gbps) do not hold across world sizes, so `auto` keeps hierarchical on",
           "several nodes (core/comm/allgather_auto.h).", ""]
    groups = [(f"flat {name} ({bw} / {lat} per link and NIC), {n} ranks", f"flat-{name}_{n}", ("ring", "bruck"))
              for name, bw, lat in FLAT for n in (8, 64)]
    groups += [(f"two-level {name} ({spec}), {n} ranks", f"{name}_{n}", ("ring", "bruck", "hierarchical"))
               for name, spec in TOPOLOGIES for n in NODE_WORLDS]
    for title, prefix, algos in groups:
        rows = {a: load(f"{prefix}_{a}") for a in algos}
        out += [f"## {title}", "", "| size | " + " | ".join(algos) + " | best |",
                "|---:|" + "---:|" * (len(algos) + 1)]
        for size in sorted(rows[algos[0]]):
            t = {a: rows[a][size] for a in algos}
            best = min(t, key=t.get)
            cells = [f"**{t[a]:,.0f}**" if a == best else f"{t[a]:,.0f}" for a in algos]
            out.append(f"| {size:,} | " + " | ".join(cells) + f" | {best} |")
        out.append("")
    with open(os.path.join(HERE, "allgather.md"), "w") as f:
        f.write("\n".join(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["run", "table"])
    ap.add_argument("--terse", default="build-cpu/bin/terse")
    ap.add_argument("--jobs", type=int, default=2, help="benches at once (each is one simulation on one core)")
    args = ap.parse_args()
    run(args) if args.what == "run" else table(args)


if __name__ == "__main__":
    main()
