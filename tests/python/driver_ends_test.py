"""`terse run` of a PyTorch workload, stopped by its user:
- SIGTERM to terse run alone, as `kill PID` sends: terse run sends it on to the Python driver, and the ranks it started
  end with it (experiments/runner/pytorch_runner.cc and terse/train.py set PR_SET_PDEATHSIG), rather than train on
  and mark completed a run that was stopped; terse run marks the folder failed, "terminated by SIGTERM", and ends by
  SIGTERM (core/common/stop_signals.h);
- Ctrl-C, SIGINT to the whole process group as a terminal sends it: the driver and the ranks record the run failed,
  "interrupted", and leave; then terse run settles the folder and ends by SIGINT;
- SIGINT to terse run alone: terse run passes it to the driver, which ends its ranks and leaves, without terse run
  having to kill it.
Either way the study's second variant does not start.
- Ctrl-C while the ranks take longer than terse run's 2 s to leave (here they ignore SIGINT, as one busy in a long
  operation would not see it for a while): terse run's SIGINT to the driver, 2 s on, must not interrupt the driver's
  ending of its ranks (a traceback, the driver killed by the signal), and the driver ends them itself.
- A second signal while terse run waits for a driver that does not end (stopped: SIGSTOP; a Python process takes
  SIGINT with a handler, so it stays pending): terse run kills the driver at once rather than after its 20 s grace.

usage: driver_ends_test.py TERSE
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

MODULE = '''
import torch


def model():
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))


def data(rank, world):
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(4096, 16, generator=g)
    return (x, (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()), (x[:256], (x[:256, 0] > 0).long())
'''

# The ranks ignore Ctrl-C: model() runs in each rank alone.
DEAF_MODULE = MODULE.replace("def model():\n",
                             "def model():\n    import signal\n    signal.signal(signal.SIGINT, signal.SIG_IGN)\n")

CONFIG = '''
study: "ends"
workload { name: "pytorch" pytorch { module: "model.py" } }
data { batch_size: 8 }
optimizer { lr: 0.05 }
workers: 2
mode: SYNC
transport: INPROC
epochs: 1000
compressor { name: "fp16" }
eval { every_steps: 5 }
variants { name: "first" }
variants { name: "second" }
'''


def descendants(root):
    """The pids below `root`, from /proc's parent links."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _parent(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def main():
    stop(sys.argv[1], signal.SIGTERM, whole_group=False)
    stop(sys.argv[1], signal.SIGINT, whole_group=True)
    # SIGINT to terse run alone (`kill -INT`): it reaches the driver only, whose ranks must still end with it.
    stop(sys.argv[1], signal.SIGINT, whole_group=False)
    stop(sys.argv[1], signal.SIGINT, whole_group=True, ranks_deaf=True)
    stop(sys.argv[1], signal.SIGINT, whole_group=False, driver_stuck=True)


def stop(terse, sig, whole_group, driver_stuck=False, ranks_deaf=False):
    with tempfile.TemporaryDirectory(prefix="terse-driver-ends-") as tmp:
        with open(os.path.join(tmp, "model.py"), "w") as f:
            f.write(DEAF_MODULE if ranks_deaf else MODULE)
        with open(os.path.join(tmp, "ends.textproto"), "w") as f:
            f.write(CONFIG)
        run = subprocess.Popen([terse, "run", os.path.join(tmp, "ends.textproto"), "--out", os.path.join(tmp, "out")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        try:
            # Training: the driver and both ranks are up once the ranks' first record is written (each eval point).
            deadline = time.monotonic() + 120
            below = []
            while time.monotonic() < deadline and run.poll() is None:
                below = descendants(run.pid)
                written = [os.path.join(d, "metrics.jsonl") for d, _, files in os.walk(os.path.join(tmp, "out"))
                           if "metrics.jsonl" in files]
                if len(below) >= 3 and any(os.path.getsize(m) > 0 for m in written):
                    break
                time.sleep(0.2)
            if run.poll() is not None:
                sys.exit("terse run ended before it was stopped (status %s): %s" % (run.returncode,
                                                                                     run.stderr.read().decode()[-2000:]))
            if len(below) < 3:
                os.killpg(run.pid, signal.SIGKILL)
                sys.exit("no driver and ranks below terse run within 120 s: %s" % below)
            if driver_stuck:
                # The driver (terse run's child) stopped: it cannot end by the signal terse run passes on after 2 s
                # (stop::kSigintOwnGrace), and terse run would wait out stop::kDelegateGrace (20 s) for it.
                driver = [p for p in below if _parent(p) == run.pid]
                os.kill(driver[0], signal.SIGSTOP)
                run.send_signal(sig)
                time.sleep(3.0)
                if run.poll() is not None:
                    sys.exit("terse run ended %s 3 s after %s, its driver stopped" % (run.returncode,
                                                                                     signal.Signals(sig).name))
                second = time.monotonic()
                run.send_signal(sig)
                try:
                    run.wait(timeout=8)
                except subprocess.TimeoutExpired:
                    sys.exit("terse run still there 8 s after a second %s" % signal.Signals(sig).name)
                print("driver_ends: a second %s ended terse run %.1f s after it" % (signal.Signals(sig).name,
                                                                                  time.monotonic() - second))
            elif whole_group:
                os.killpg(run.pid, sig)
            else:
                run.send_signal(sig)
            try:
                run.wait(timeout=60)
            except subprocess.TimeoutExpired:
                sys.exit("terse run still there 60 s after %s" % signal.Signals(sig).name)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and any(alive(p) for p in below):
                time.sleep(0.2)
            left = [p for p in below if alive(p)]
            if left:
                os.killpg(run.pid, signal.SIGKILL)
                sys.exit("processes left training 20 s after terse run was stopped: %s" % left)
            # Ctrl-C: the ranks recorded it, and terse run settled the folder after the driver; SIGTERM: terse run
            # recorded it once the driver had ended. Only the first variant's folder exists.
            folders = sorted(d for d, _, files in os.walk(os.path.join(tmp, "out")) if "status.json" in files)
            statuses = [json.load(open(os.path.join(d, "status.json"))) for d in folders]
            words = "interrupted" if sig == signal.SIGINT else "terminated by SIGTERM"
            check = len(statuses) == 1 and os.path.basename(folders[0]) == "first" \
                and statuses[0].get("state") == "failed" and words in statuses[0].get("error", "") \
                and statuses[0].get("signal") == signal.Signals(sig).name
            if not check:
                sys.exit("after %s the folders %s say %s, not failed: %s" % (signal.Signals(sig).name, folders,
                                                                            statuses, words))
            # Ctrl-C: each process says so in one line; no traceback (mp.spawn's join printed one in the driver).
            # And the driver ends by itself: terse run did not have to kill it after its grace (a SIGINT to terse run
            # alone reaches the driver only, and its ranks must still be ended).
            err = run.stderr.read().decode("utf-8", "replace")
            if driver_stuck:
                if "terse: a second stop signal: not waiting for the child process; killing it" not in err:
                    sys.exit("after a second %s terse run did not say it killed the driver:\n%s"
                             % (signal.Signals(sig).name, err[-3000:]))
            elif "; killing it" in err:
                sys.exit("after %s terse run had to kill the driver:\n%s" % (signal.Signals(sig).name, err[-3000:]))
            if sig == signal.SIGINT and "Traceback" in err:
                sys.exit("after SIGINT terse run's output holds a traceback:\n%s" % err[-3000:])
            if sig == signal.SIGINT and not driver_stuck and "killed by signal" in err:
                sys.exit("after SIGINT the driver was killed rather than ending its ranks:\n%s" % err[-3000:])
            if run.returncode != -sig:
                sys.exit("terse run ended with status %s after %s, not by the signal" % (run.returncode,
                                                                                        signal.Signals(sig).name))
            print("driver_ends: %s: %d processes below terse run, none left after it" % (signal.Signals(sig).name,
                                                                                      len(below)))
        finally:
            # Whatever ended the test (a failed check, a timeout), nothing of the job trains on after it: terse run
            # runs in a session of its own, out of ctest's reach.
            try:
                os.killpg(run.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


if __name__ == "__main__":
    main()
