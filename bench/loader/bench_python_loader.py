"""bench_python_loader.py — the Python package's batches (dfm.Batches) beside dfm-train's C loader
(build/bench/bench_loader, trainer/data/prefetch.h) on the same run: batches/s and target records/s for the
pure-Python reader (python/dfm_targets.py), the libdfm binding in one process (one thread, and two
reading threads), and the binding under a torch DataLoader with 2 worker processes. Each mode runs REPS times, interleaved with the others (the machine is
shared: A/B pairs see the same load); the table gives the median wall-clock rate and CPU-seconds per 1000
records (process + children). Prints a Markdown table.
  python bench/loader/bench_python_loader.py RUN [SEQ_LEN BATCH N_BATCHES REPS CHUNK_LEN]
(bench/loader/bench_python_loader.sh makes a run of the demo's target shape and calls this.)
"""
import os
import re
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
import dfm  # noqa: E402


def cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def c_loader(run, T, B, n, L):
    """The C loader's 1-thread row (batches/s) and its CPU-s per batch over its 1/2/4-thread runs."""
    c0 = cpu()
    out = subprocess.run([os.path.join(ROOT, "build", "bench", "bench_loader"), run, str(T), str(B), str(n), str(L)],
                         capture_output=True, text=True, check=True, env=dict(os.environ, DFM_LOG_LEVEL="warn")).stdout
    rows = [r for r in out.splitlines() if re.match(r"\| [124] \|", r)]
    bps = float(rows[0].split("|")[2])
    return bps, (cpu() - c0) / (n * len(rows))


def py_loader(run, T, B, n, L, backend, workers, threads=1):
    ds = dfm.Batches(run, T, B, 0, 1, 1, chunk_len=L, steps=n, backend=backend, format="torch" if workers else "numpy",
                     threads=threads)
    it = ds
    if workers:
        from torch.utils.data import DataLoader
        it = DataLoader(ds, batch_size=None, num_workers=workers, prefetch_factor=4, persistent_workers=False)
    c0, t0 = cpu(), time.perf_counter()
    k = sum(1 for _ in it)
    dt, dc = time.perf_counter() - t0, cpu() - c0
    assert k == n
    return n / dt, dc / n


def main():
    a = sys.argv[1:]
    if not a:
        sys.exit(__doc__)
    run = a[0]
    T, B, N, REPS, L = (int(x) for x in (a[1:] + ["256", "16", "100", "3", "32"][len(a) - 1:])[:5])
    recs = B * (T // L)
    modes = [("C loader (dfm-train, 1 thread)", lambda: c_loader(run, T, B, N, L)),
             ("pure-Python reader (dfm_targets)", lambda: py_loader(run, T, B, max(N // 5, 5), L, "python", 0)),
             ("binding (dfm.Batches, 1 process)", lambda: py_loader(run, T, B, N, L, "c", 0)),
             ("binding, 2 threads (dfm.Batches(threads=2))", lambda: py_loader(run, T, B, N, L, "c", 0, 2)),
             ("binding + DataLoader(num_workers=2)", lambda: py_loader(run, T, B, N, L, "c", 2))]
    res = {m: [] for m, _ in modes}
    for _ in range(REPS):
        for m, fn in modes:
            res[m].append(fn())
    c_bps = statistics.median(r[0] for r in res[modes[0][0]])
    print("| loader | batches/s (%d x %d) | target records/s | CPU-s per 1000 records | vs C loader |" % (B, T))
    print("|---|---:|---:|---:|---:|")
    for m, _ in modes:
        bps = statistics.median(r[0] for r in res[m])
        cps = statistics.median(r[1] for r in res[m])
        print("| %s | %.1f | %.0f | %.3f | %.0f%% |" % (m, bps, bps * recs, cps / recs * 1000, 100 * bps / c_bps))


if __name__ == "__main__":
    main()
