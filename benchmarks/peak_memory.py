"""Where a command's peak memory is reached: run it, sample its resident memory, and take a Python
stack (py-spy) each time the peak grows by a step, so the stack at the final peak says which code made it.

    python benchmarks/peak_memory.py --out trace/ -- svdmlp compress qwen2.5-coder-1.5b --keep 0.8 ...

Writes to ``--out``: ``rss.tsv`` (seconds, RSS in MB of 10^6 bytes and its two parts: anonymous memory, and
file pages mapped in such as a memory-mapped safetensors file's, which the kernel can drop; the last line
the command printed to stderr),
``stderr.log`` and ``stdout.log`` (the command's), and ``peak-NN.txt`` (the stack at each new peak);
prints the peak and its stack at the end. ``VmHWM`` (what ``/usr/bin/time -v`` reports) can be above
the largest sample: a spike shorter than the sampling interval is seen only there, and the summary says so.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path


def _status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon and RssFile of ``pid`` in bytes (empty once it has exited)."""
    values = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                values[key] = int(rest.split()[0]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return values


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="directory for the trace")
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between samples")
    parser.add_argument(
        "--step-mb", type=float, default=100.0, help="a new stack each time the peak grows this many MB"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    args.out.mkdir(parents=True, exist_ok=True)
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    started = time.monotonic()
    last_line = [""]
    with open(args.out / "stdout.log", "w") as stdout, open(args.out / "stderr.log", "w") as stderr_log:
        child = subprocess.Popen(command, stdout=stdout, stderr=subprocess.PIPE)

        def copy_stderr() -> None:  # keep the command's last progress line, for the timeline
            pending = ""
            while chunk := os.read(child.stderr.fileno(), 4096).decode(errors="replace"):
                stderr_log.write(chunk)
                stderr_log.flush()
                lines = (pending + chunk).replace("\r", "\n").split("\n")
                pending = lines[-1]
                shown = [line for line in lines if line.strip()]
                if shown:
                    last_line[0] = shown[-1].strip()[:160]

        reader = threading.Thread(target=copy_stderr, daemon=True)
        reader.start()
        peak, peak_at, peak_line, hwm, next_stack, stacks = 0, 0.0, "", 0, 0, 0
        with open(args.out / "rss.tsv", "w") as trace:
            trace.write("seconds\trss_mb\tanon_mb\tfile_mb\tlast_stderr\n")
            while child.poll() is None:
                status = _status(child.pid)
                rss, hwm = status.get("VmRSS", 0), max(hwm, status.get("VmHWM", 0))
                now = time.monotonic() - started
                anon, mapped = status.get("RssAnon", 0), status.get("RssFile", 0)
                trace.write(
                    f"{now:.1f}\t{rss / 1e6:.0f}\t{anon / 1e6:.0f}\t{mapped / 1e6:.0f}\t{last_line[0]}\n"
                )
                trace.flush()  # readable while the command runs
                if rss > peak:
                    peak, peak_at, peak_line = rss, now, last_line[0]
                if spy and rss >= next_stack:
                    stacks += 1
                    dump = subprocess.run(
                        [spy, "dump", "--pid", str(child.pid)], capture_output=True, text=True, check=False
                    )
                    header = f"RSS {rss / 1e9:.2f} GB at {now:.1f} s; last stderr: {last_line[0]}\n\n"
                    (args.out / f"peak-{stacks:02d}.txt").write_text(header + dump.stdout + dump.stderr)
                    next_stack = rss + args.step_mb * 1e6
                time.sleep(args.interval)
        reader.join(timeout=5)
    print(
        f"exit {child.returncode}; largest sampled RSS {peak / 1e9:.2f} GB at {peak_at:.0f} s ({peak_line})"
    )
    print(f"VmHWM last read {hwm / 1e9:.2f} GB" + (" (a spike between samples)" if hwm > peak * 1.02 else ""))
    if stacks:
        print(f"stack at the last new peak: {args.out / f'peak-{stacks:02d}.txt'}")
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
