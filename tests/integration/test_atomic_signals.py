"""A signal at any moment of an atomic write leaves no temporary and no half-replaced output.

A child process writes atomically again and again, and gets SIGINT or SIGTERM (or both, one
right after the other) at a random moment, a few hundred times: whatever bytecode the
handler's exception comes from (making a private folder, writing, the renames, the cleanup),
and whichever of the child's two threads the signal reaches, nothing is left under a temporary name, and the outputs of one write are all of one write.
Forking from a small driver keeps each trial to a few milliseconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

# argv: folder, "paths" or "dir", signals (comma-separated numbers), trials
_DRIVER = r"""
import json, os, random, signal, sys, threading, time
from pathlib import Path
from smiexlm.atomic import atomic_dir, atomic_paths, is_temporary_name

NAMES = ("a.npy", "a.ids.csv", "a.rejects.csv")


def write_forever(folder, kind):
    for count in range(10**9):
        if kind == "paths":
            with atomic_paths(*(folder / n for n in NAMES)) as tmps:
                for tmp in tmps:
                    tmp.write_text(str(count))
        else:
            with atomic_dir(folder / "model") as tmp:
                (tmp / "w").write_text(str(count))


def child(folder, kind, ready):
    def terminate(signum, frame):  # as the CLI does
        raise SystemExit(128 + signum)

    try:
        signal.signal(signal.SIGTERM, terminate)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        threading.Thread(target=time.sleep, args=(600,), daemon=True).start()  # as tqdm's
        os.write(ready, b"1")
        write_forever(folder, kind)
    finally:
        os._exit(3)  # never the driver's loop


def broken(folder, kind):
    left = [p.name for p in folder.iterdir() if is_temporary_name(p.name)]
    if kind == "paths" and (folder / NAMES[0]).exists():
        if len({(folder / n).read_text() for n in NAMES}) != 1:
            left.append("outputs of different writes")
    if kind == "dir" and (folder / "model").exists() and not (folder / "model" / "w").exists():
        left.append("model folder without its file")
    return left


root, kind, sigs, trials = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
sigs = [int(s) for s in sigs.split(",")]
rng, failures = random.Random(0), []
for trial in range(trials):
    folder = root / str(trial)
    folder.mkdir()
    read, ready = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        child(folder, kind, ready)
    os.close(ready)
    os.read(read, 1)  # the child's handlers are in place
    os.close(read)
    for sig in sigs:
        time.sleep(rng.uniform(0, 0.004))  # a random moment of the write loop
        try:
            os.kill(pid, sig)
        except ProcessLookupError:  # the first signal ended it already
            pass
    os.waitpid(pid, 0)
    if left := broken(folder, kind):
        failures.append([trial, left])
print(json.dumps(failures))
"""


@pytest.mark.parametrize("kind", ["paths", "dir"])
@pytest.mark.parametrize(
    "sigs", [[signal.SIGTERM], [signal.SIGINT], [signal.SIGTERM, signal.SIGINT]],
    ids=["SIGTERM", "SIGINT", "SIGTERM+SIGINT"],
)  # fmt: skip
def test_a_signal_at_any_moment_of_an_atomic_write_leaves_no_temporary(tmp_path, kind, sigs):
    numbers = ",".join(str(int(s)) for s in sigs)
    res = subprocess.run(
        [sys.executable, "-c", _DRIVER, str(tmp_path), kind, numbers, "250"],
        capture_output=True, text=True, timeout=600, env=os.environ | {"OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    failures = json.loads(res.stdout)
    assert failures == [], f"{len(failures)} of 250 interrupted writes left: {failures[:5]}"
