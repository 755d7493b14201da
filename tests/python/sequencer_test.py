#!/usr/bin/env python3
"""terse.torch's _Sequencer (the order the chained hook issues its rounds in) on its own, in one process, without
collectives: buckets are handed over and their rounds complete in random orders, as on ranks whose threads run at
different speeds, and what the sequencer issues must not depend on that order.

  order     two and three rounds, four and seven buckets, 300 random event orders each: the issued items are exactly
            the diagonal order (round r of bucket b in diagonal b + r, rounds from 0 up), every bucket ends, and the
            sequencer begins the next step (its buckets numbered from 0 again)
  failures  a failure at a random place (a refused hook call, a failed encode of a later round), noticed at a random
            moment: the items issued are exactly those before the failure's place, in order, whatever the event
            order; a failed decode stops nothing in its step; every bucket handed over ends or fails; no hook call
            is admitted once the step is over
  callbacks _Callbacks, which close() waits on: a state waits for its own callbacks only, not for another state's
            that torch still holds (a stuck collective of another model), and every state's at exit

The end-to-end tests with gloo are tests/python/ddp_hook_test.py (chained_order, overlap)."""
import argparse
import functools
import random
import sys
import threading
import time

import terse
import terse.torch

from checks import check  # tests/python/checks.py, beside this file

place = terse.torch._place


class FakeAggregator:
    def __init__(self):
        self.exposed = 0

    def add_exposed(self, seconds):
        self.exposed += 1


class FakeState:
    """What _Sequencer reads of a CompressionState."""

    def __init__(self):
        self.error = None
        self._agg = FakeAggregator()

    def _failed_again(self):
        return terse.InvalidArgument("an earlier bucket failed: %s" % (self.error,))


class FakeBucket:
    """What _Sequencer reads of a _ChainedBucket."""

    def __init__(self):
        self.ordinal = None
        self.round = 0
        self.error = None

    def failed(self, error):
        self.error = error


def sequencer(rounds, issued):
    state = FakeState()
    seq = terse.torch._Sequencer(state, rounds)
    # Recorded, not sent: each issued item as (ordinal, round), read off the sums stand-in.
    seq._issue = lambda sums: issued.append(sums) or ([], 0.0)

    def chain(out):
        for bucket, _, error in out:
            if error is not None:
                bucket.failed(error)
    seq._chain = chain
    return state, seq


def expected_order(n, rounds):
    return sorted(((b, r) for b in range(n) for r in range(rounds)), key=lambda item: place(*item))


def run_step(rng, n, rounds, fail=None):
    """One step of n buckets with random event order. fail: None, or (kind, bucket, round) -- kind "refused" (bucket's
    hook call refused; round 0), "encode" (the bucket's round `round` >= 1 fails to encode) or "decode" (its decode
    fails). Returns (issued items, buckets, state, sequencer)."""
    issued = []
    state, seq = sequencer(rounds, issued)
    buckets = []
    in_flight = []  # buckets whose current round was issued and has not completed
    stopped = False  # backward stopped: no more hook calls
    while True:
        # What can happen next: the next hook call, or the completion of an issued round.
        issued_now = set(issued)
        completable = [b for b in in_flight if (b.ordinal, b.round) in issued_now]
        can_hand = len(buckets) < n and not stopped
        if not completable and not can_hand:
            break
        if can_hand and (not completable or rng.random() < 0.4):
            k = len(buckets)
            bucket = FakeBucket()
            if state.error is not None and not seq.admits():
                stopped = True  # the hook call raises: backward stops
                continue
            buckets.append(bucket)
            if fail == ("refused", k, 0):
                state.error = terse.InvalidArgument("refused")
                seq.refused()
                buckets.pop()
                stopped = True
                continue
            seq.add(bucket, k == n - 1, 0.0, (k, 0))
            if bucket.error is None:
                in_flight.append(bucket)
            continue
        bucket = rng.choice(completable)
        in_flight.remove(bucket)
        if not seq.proceeds(bucket):
            state.error = state.error or terse.InvalidArgument("stopped")
            seq.end(bucket, bucket.round + 1, None)
            bucket.failed(state._failed_again())
            continue
        nxt = bucket.round + 1
        if fail is not None and fail[0] == "encode" and fail[1] == bucket.ordinal and fail[2] == nxt:
            state.error = terse.InvalidArgument("encode failed")
            seq.end(bucket, bucket.round + 1, place(bucket.ordinal, nxt))
            bucket.failed(state.error)
            continue
        if nxt < rounds:
            bucket.round = nxt
            seq.next_round(bucket, (bucket.ordinal, nxt))
            if bucket.error is None:
                in_flight.append(bucket)
            continue
        if fail is not None and fail[0] == "decode" and fail[1] == bucket.ordinal:
            state.error = terse.InvalidArgument("decode failed")
            seq.end(bucket, bucket.round + 1, None)
            bucket.failed(state.error)
            continue
        bucket.round = nxt
        seq.end(bucket, bucket.round)
    # A bucket still waiting here, not failed, would wait forever in a real run (its Future never completes).
    left = [b for b in in_flight if b.error is None]
    check(not left, "buckets left waiting: %s" % [(b.ordinal, b.round) for b in left])
    return issued, buckets, state, seq


def order():
    for rounds, n in ((2, 4), (2, 7), (3, 4), (3, 7), (1, 5)):
        want = expected_order(n, rounds)
        for seed in range(300):
            issued, buckets, state, seq = run_step(random.Random(seed), n, rounds)
            check(issued == want, "rounds %d, %d buckets, seed %d: issued %s, expected %s"
                  % (rounds, n, seed, issued, want))
            check(all(b.error is None for b in buckets), "seed %d: a bucket failed" % seed)
            # The step ended: the next one numbers its buckets from 0 again, and backward's wait was counted once.
            check(seq._handed == 0 and seq._count is None and state._agg.exposed == 1,
                  "seed %d: the step did not end (handed %d, count %s, exposed %d)"
                  % (seed, seq._handed, seq._count, state._agg.exposed))
    print("order: ok")


def failures():
    rng = random.Random(7)
    for rounds, n in ((2, 5), (3, 4)):
        kinds = [("refused", b, 0) for b in range(n)]
        kinds += [("encode", b, r) for b in range(n) for r in range(1, rounds)]
        kinds += [("decode", b, rounds) for b in range(n)]
        for fail in kinds:
            # A refused hook call or a failed encode stops every item from its place on; a failed decode, noticed at
            # any moment, stops nothing in its step.
            stop = place(fail[1], fail[2]) if fail[0] != "decode" else (n + rounds, 0)
            want = [item for item in expected_order(n, rounds) if place(*item) < stop]
            for seed in range(60):
                issued, buckets, state, seq = run_step(random.Random(rng.random()), n, rounds, fail)
                check(issued == want, "rounds %d, %d buckets, failure %s, seed %d: issued %s, expected %s"
                      % (rounds, n, fail, seed, issued, want))
                check(state.error is not None, "failure %s: the state did not fail" % (fail,))
                check(not seq.admits(), "failure %s: a hook call is still admitted after the step" % (fail,))
    print("failures: ok")


def callbacks():
    cbs = terse.torch._Callbacks()
    a, b = FakeState(), FakeState()

    def fn():
        pass

    held_a = [functools.partial(fn) for _ in range(3)]
    held_b = functools.partial(fn)
    for f in held_a:
        cbs.track(a, f)
    del f  # the list holds them, nothing else
    cbs.track(b, held_b)
    check(cbs.count(a) == 3 and cbs.count(b) == 1 and cbs.count() == 4,
          "tracked %d, %d, %d" % (cbs.count(a), cbs.count(b), cbs.count()))
    # torch lets go of a's callbacks on another thread while a's close() waits.
    release = threading.Timer(0.2, held_a.clear)
    release.start()
    start = time.monotonic()
    cbs.wait(10.0, a)
    took = time.monotonic() - start
    release.join()
    check(cbs.count(a) == 0, "a still has %d callbacks" % cbs.count(a))
    check(took < 5.0, "a's wait took %.1f s: it waited for b's callback" % took)
    # b's callback is still held: its own wait, and the process-wide one, run to their timeout.
    start = time.monotonic()
    cbs.wait(0.3, b)
    cbs.wait(0.3)
    took = time.monotonic() - start
    check(took >= 0.55 and cbs.count(b) == 1 and cbs.count() == 1,
          "b's waits took %.2f s, count %d" % (took, cbs.count()))
    del held_b
    cbs.wait(10.0)
    check(cbs.count() == 0, "callbacks left: %d" % cbs.count())
    print("callbacks: ok")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("case", choices=["order", "failures", "callbacks"])
    args = p.parse_args()
    {"order": order, "failures": failures, "callbacks": callbacks}[args.case]()


if __name__ == "__main__":
    sys.exit(main())
