# ruff: noqa: UP031, B905  (gpu-burn's printf formats, kept as printf formats)
"""A stand-in for gpu-burn's ``gpu_burn`` where no CUDA exists: its command line, its process
tree, its signals and its output, as shared/notes/gpu-burn.md describes them (our own code).

- Command line: flags matched by substring (``-d``, ``-tc``, ``-l``, ``-h``), ``-m``/``-i`` take
  the next argument, ``-c``/``-stts`` count the next argument without skipping it, and TIME is
  ``argv[1 + number of flag words]`` (so ``gpu_burn 60 -d`` burns for 0 s).
- Processes: the parent forks one worker per visible device (one with ``-i N``, which it calls
  device N but lists as GPU 0); the parent has no SIGTERM handler, the workers stop on SIGTERM.
  At TIME the parent SIGTERMs them, sleeps ``-stts`` seconds (default 30), SIGKILLs what is left,
  then prints ``Tested N GPUs:`` and one ``GPU i: OK|FAULTY`` per worker.
- Output: the ``nvidia-smi -L`` list of every GPU of the node whatever CUDA_VISIBLE_DEVICES
  says, ``Initialized device ...`` per worker, one progress line rewritten with ``\\r``, a
  ``Summary at:`` block every 10 percent (error counters reset after it), the CUDA errors of a
  dying worker on stderr, ``No clients are alive!  Aborting`` when every worker died.
- Temperatures: like gpu-burn's ``nvidia-smi -q -d TEMPERATURE`` reader, readings of ALL the
  node's GPUs (GPU k reads ``40 + k`` C) go round-robin into the workers' slots.

The fake node (environment): STANDIN_GPUS (count, default 1), STANDIN_UUIDS (comma list),
STANDIN_FAULTY / STANDIN_DIE / STANDIN_INITFAIL (comma lists of physical GPU indices whose
worker reports errors / dies during compute / fails to initialise), STANDIN_STUCK=1 (workers
ignore SIGTERM, like a GPU hung in the kernel), STANDIN_RECORD (a file: argv and
CUDA_VISIBLE_DEVICES as JSON), STANDIN_PERIOD (seconds between a worker's reports, 0.05).
"""

import json
import os
import select
import signal
import struct
import subprocess
import sys
import time

OPS_PER_MUL = 2 * 8192**3
GEMMS_PER_REPORT = 10


def atoi(text: str) -> int:
    digits = ""
    for i, ch in enumerate(text.strip()):
        if ch.isdigit() or (i == 0 and ch in "+-"):
            digits += ch
        else:
            break
    try:
        return int(digits)
    except ValueError:
        return 0


def decode_mem(text: str) -> int:
    """gpu-burn's -m: MB, or N% as a negative number; 0 is a syntax error."""
    n = atoi(text)
    rest = text.lstrip("+-0123456789")
    if rest == "%":
        return -n
    return n * 1024 * 1024 if rest == "" else 0


def parse(argv: list[str]) -> dict[str, object]:
    opts: dict[str, object] = {
        "time": 10,
        "doubles": False,
        "tensors": False,
        "device": -1,
        "kernel": "compare.fatbin",
        "stts": 30,
    }
    params = 0
    i = 1
    while i < len(argv):
        a = argv[i]
        if "-h" in a:
            print("GPU Burn\nUsage: gpu-burn [OPTIONS] [TIME]")
            sys.exit(0)
        if "-l" in a:
            for k, (name, _) in enumerate(node_gpus()):
                print("ID %i: %s, %ldMB" % (k, name, 81559))
            sys.exit(0)
        if "-d" in a:
            opts["doubles"] = True
            params += 1
        if "-tc" in a:
            opts["tensors"] = True
            params += 1
        for flag in ("-m", "-i"):
            if a.startswith(flag):
                params += 1
                if a[2:]:
                    value = a[2:]
                elif i + 1 < len(argv):
                    i += 1
                    params += 1
                    value = argv[i]
                else:
                    sys.stderr.write("Syntax error near %s\n" % flag)
                    sys.exit(22)
                if flag == "-m":
                    if decode_mem(value) == 0:
                        sys.stderr.write("Syntax error near -m\n")
                        sys.exit(22)
                else:
                    opts["device"] = atoi(value)
        if a.startswith("-c"):
            params += 1
            if i + 1 < len(argv):
                opts["kernel"] = argv[i + 1]
                params += 1
        if a.startswith("-s"):
            params += 1
            if i + 1 < len(argv):
                opts["stts"] = atoi(argv[i + 1])
                params += 1
        i += 1
    if len(argv) - params < 2:
        sys.stdout.write("Run length not specified in the command line. ")
    else:
        opts["time"] = atoi(argv[1 + params])
    return opts


def node_gpus() -> list[tuple[str, str]]:
    count = int(os.environ.get("STANDIN_GPUS", "1"))
    uuids = [u for u in os.environ.get("STANDIN_UUIDS", "").split(",") if u]
    uuids += ["GPU-5ca1ab1e-0000-4000-8000-%012d" % k for k in range(len(uuids), count)]
    return [("NVIDIA H100 80GB HBM3", uuids[k]) for k in range(count)]


def visible(gpus: list[tuple[str, str]]) -> list[int]:
    """Physical indices CUDA would show, in order (CUDA stops at the first bad entry)."""
    text = os.environ.get("CUDA_VISIBLE_DEVICES")
    if text is None:
        return list(range(len(gpus)))
    out = []
    for entry in text.split(","):
        entry = entry.strip()
        if entry.isdigit() and int(entry) < len(gpus):
            out.append(int(entry))
        elif entry.startswith("GPU-") and any(u.startswith(entry) for _, u in gpus):
            out.append(next(k for k, (_, u) in enumerate(gpus) if u.startswith(entry)))
        else:
            break
    return out


def indices(var: str) -> set[int]:
    return {int(x) for x in os.environ.get(var, "").split(",") if x.strip()}


def worker(cuda_index: int, physical: int, fd: int, opts: dict[str, object]) -> None:
    running = [True]
    if os.environ.get("STANDIN_STUCK") != "1":
        signal.signal(signal.SIGTERM, lambda s, f: running.__setitem__(0, False))
    else:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if not os.path.exists(str(opts["kernel"])):
        sys.stderr.write(
            "Couldn't init a GPU test: Error in load module (gpu_burn-drv.cpp:239): "
            "file not found\n"
        )
        os._exit(124)
    if physical in indices("STANDIN_INITFAIL"):
        sys.stderr.write(
            'Couldn\'t init a GPU test: Error in "C alloc" (gpu_burn-drv.cpp:221): out of memory\n'
        )
        os._exit(124)
    kind = "DOUBLES" if opts["doubles"] else "FLOATS"
    tc = ", using Tensor Cores" if opts["tensors"] else ""
    sys.stdout.write(
        "Initialized device %d with 81559 MB of memory (80886 MB available, using 72797 MB "
        "of it), using %s%s\n" % (cuda_index, kind, tc)
    )
    sys.stdout.flush()
    period = float(os.environ.get("STANDIN_PERIOD", "0.05"))
    errors = 3 if physical in indices("STANDIN_FAULTY") else 0
    dies = physical in indices("STANDIN_DIE")
    step = 0
    while running[0]:
        time.sleep(period)  # the GEMMs this worker "computes" between two reports
        step += 1
        if dies and step == 5:
            sys.stderr.write(
                'Failure during compute: Error in "SGEMM" (gpu_burn-drv.cpp:197): '
                "an illegal memory access was encountered\n"
            )
            os.write(fd, struct.pack("ii", -1, -1))
            os._exit(111)
        os.write(fd, struct.pack("ii", GEMMS_PER_REPORT, errors))
    sys.stdout.write("Freed memory for dev %d\n" % cuda_index)
    sys.stdout.flush()
    os._exit(0)


def main() -> None:
    opts = parse(sys.argv)
    record = os.environ.get("STANDIN_RECORD")
    if record:
        with open(record, "w") as f:
            json.dump(
                {
                    "argv": sys.argv[1:],
                    "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                    "pid": os.getpid(),
                },
                f,
            )
    out = sys.stdout
    out.write("Using compare file: %s\nBurning for %d seconds.\n" % (opts["kernel"], opts["time"]))
    gpus = node_gpus()
    for k, (name, uuid) in enumerate(gpus):  # nvidia-smi -L: every GPU of the node
        out.write("GPU %d: %s (UUID: %s)\n" % (k, name, uuid))
    out.flush()
    shown = visible(gpus)
    if not shown:
        sys.stderr.write("No CUDA devices\n")
        sys.exit(19)
    device = int(str(opts["device"]))
    plan = [(device, shown[device] if device < len(shown) else -1)] if device >= 0 else []
    plan = plan or list(enumerate(shown))
    pids, fds = [], []
    for cuda_index, physical in plan:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            if physical < 0:
                sys.stderr.write(
                    "Couldn't init a GPU test: Error (gpu_burn-drv.cpp:107): invalid device\n"
                )
                os._exit(124)
            worker(cuda_index, physical, w, opts)
        os.close(w)
        pids.append(pid)
        fds.append(r)
    temp_reader = subprocess.Popen(["sleep", "3600"])  # gpu-burn's nvidia-smi -l child
    listen(opts, pids, fds, [g for g in range(len(gpus))], temp_reader)


def listen(
    opts: dict[str, object],
    pids: list[int],
    fds: list[int],
    node: list[int],
    temp_reader: "subprocess.Popen[bytes]",
) -> None:
    out = sys.stdout
    n = len(pids)
    run_time = int(str(opts["time"]))
    calcs, errs, temps = [0] * n, [0] * n, [0] * n
    gflops = [0.0] * n
    faulty = [False] * n
    updated = [time.time()] * n
    next_report = 10.0
    child_report = False
    smi_cursor = slot = 0
    start = time.time()
    while True:
        readable, _, _ = select.select(fds, [], [], 0.5)
        now = time.time()
        saw_eof = False
        for i, fd in enumerate(fds):
            if fd not in readable:
                continue
            data = os.read(fd, 8)
            if len(data) < 8:
                sys.stderr.write("read[%d] error %d" % (i, len(data)))  # no newline, like it
                processed, errors = -1, 0
                saw_eof = True
            else:
                processed, errors = struct.unpack("ii", data)
            errs[i] += errors
            if processed == -1:
                calcs[i] = -1
            else:
                gflops[i] = processed * OPS_PER_MUL / max(now - updated[i], 1e-6) / 1e9
                updated[i] = now
                calcs[i] += processed
            child_report = True
        # one line of the temperature reader per wake-up: GPU k of the NODE into slot i
        temps[slot] = 40 + node[smi_cursor]
        smi_cursor = (smi_cursor + 1) % len(node)
        slot = (slot + 1) % n
        if child_report:
            pct = min((now - start) / max(run_time, 1e-9) * 100.0, 100.0) if run_time else 100.0
            line = "\r%.1f%%  proc'd: " % pct
            line += "- ".join("%d (%.0f Gflop/s) " % (c, g) for c, g in zip(calcs, gflops))
            line += "  errors: "
            notes = []
            for c, e in zip(calcs, errs):
                notes.append(("%d  (DIED!) " if c == -1 else "%d  (WARNING!) " if e else "%d ") % e)
            line += "- ".join(notes)
            line += "  temps: " + "- ".join("%d C " % t if t else "-- " for t in temps)
            out.write(line)
            out.flush()
            for i in range(n):
                if errs[i]:
                    faulty[i] = True
            if next_report < pct:
                next_report = pct + 10.0
                out.write("\n\tSummary at:   ")
                out.write(time.strftime("%a %b %d %H:%M:%S UTC %Y\n", time.gmtime()))
                out.write("\n")
                out.flush()
                errs = [0] * n
        if all(c == -1 for c in calcs):
            sys.stderr.write("\n\nNo clients are alive!  Aborting\n")
            sys.exit(123)
        if saw_eof:
            time.sleep(0.02)  # gpu-burn spins on a dead worker's closed pipe; a little slower
        if start + run_time < now:
            break
    out.write("\nKilling processes with SIGTERM (soft kill)\n")
    out.flush()
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    temp_reader.terminate()
    time.sleep(int(str(opts["stts"])))  # gpu-burn sleeps the whole threshold, always
    finished = [pid for pid in pids if os.waitpid(pid, os.WNOHANG)[0] == pid]
    if len(finished) != len(pids):
        out.write("\nKilling processes with SIGKILL (force kill)\n")
        for pid in pids:
            if pid not in finished:
                os.kill(pid, signal.SIGKILL)
    for pid in pids:
        if pid not in finished:
            os.waitpid(pid, 0)
    temp_reader.wait()
    out.write("done\n\nTested %d GPUs:\n" % n)
    for i in range(n):
        out.write("\tGPU %d: %s\n" % (i, "FAULTY" if faulty[i] else "OK"))
    out.flush()


def install(folder: "os.PathLike[str]", compare: bool = True) -> str:
    """An executable ``gpu_burn`` in ``folder`` that runs this stand-in (with ``compare.fatbin``
    next to it unless ``compare`` is False); returns its path."""
    path = os.path.join(folder, "gpu_burn")
    os.makedirs(folder, exist_ok=True)
    with open(path, "w") as f:
        f.write('#!/bin/sh\nexec "%s" "%s" "$@"\n' % (sys.executable, os.path.abspath(__file__)))
    os.chmod(path, 0o755)
    if compare:
        with open(os.path.join(folder, "compare.fatbin"), "wb") as f:
            f.write(b"\0")
    return path


if __name__ == "__main__":
    main()
