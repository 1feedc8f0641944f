"""`pip install ./python` in a fresh venv, offline: the installed package imports from anywhere, carries the
C library's version (common/version.h), finds its bundled copy of build/libdfm.so without DFM_LIB, reads a
run through it, and `python -m dfm inspect` works from the install. A copy of the checkout's python/ is
installed (pip builds in the source folder; the shared tree stays clean), with --no-build-isolation so no
network is needed (the venv sees the system's setuptools and NumPy). Exits non-zero on failure.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from train_cli import check, finish  # noqa: E402

DFM = os.environ.get("DFM", os.path.join(ROOT, "build", "dfm"))


def main():
    version = re.search(r'DFM_VERSION\s+"([^"]+)"', open(os.path.join(ROOT, "common", "version.h")).read()).group(1)
    env = {k: v for k, v in os.environ.items() if k not in ("DFM_LIB", "PYTHONPATH", "VIRTUAL_ENV")}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", DFM_LOG_LEVEL="warn")
    with tempfile.TemporaryDirectory() as w:
        repo = os.path.join(w, "checkout")
        shutil.copytree(os.path.join(ROOT, "python"), os.path.join(repo, "python"),
                        ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
        os.makedirs(os.path.join(repo, "common"))
        shutil.copy(os.path.join(ROOT, "common", "version.h"), os.path.join(repo, "common"))
        venv = os.path.join(w, "venv")
        base = getattr(sys, "_base_executable", sys.executable)
        # --without-pip: the system pip (seen through --system-site-packages) installs into the venv; ensurepip is slow
        subprocess.run([base, "-m", "venv", "--system-site-packages", "--without-pip", venv], check=True, env=env)
        py = os.path.join(venv, "bin", "python")
        p = subprocess.run([py, "-m", "pip", "install", "-q", "--no-build-isolation", "--disable-pip-version-check",
                            os.path.join(repo, "python")], capture_output=True, text=True,
                           env=dict(env, DFM_LIB=os.path.join(ROOT, "build", "libdfm.so"), PIP_NO_INDEX="1"))
        check(p.returncode == 0, "pip install ./python (offline, fresh venv): exit %d %s" % (p.returncode, p.stderr[-500:]))
        run = os.path.join(w, "run")
        subprocess.run([DFM, "write-targets", run, "--synthetic", "40", "--k", "3", "--d", "8", "--seq-chunks", "4"],
                       check=True, env=env, stdout=subprocess.DEVNULL)
        code = ("import dfm, os; r = dfm.open_run(%r); "
                "print(dfm.__version__, type(r).__name__, r.n_chunks, r.k, r.d, os.path.dirname(dfm.__file__), "
                "dfm._lib.library_path())" % run)
        q = subprocess.run([py, "-c", code], capture_output=True, text=True, env=env, cwd=w)
        out = q.stdout.split()
        check(q.returncode == 0 and out[:5] == [version, "TargetRun", "40", "3", "8"],
              "installed dfm %s reads a run through libdfm: %s %s" % (version, q.stdout.strip(), q.stderr[-300:]))
        check(len(out) == 7 and out[5].startswith(venv) and out[6] == os.path.join(out[5], "libdfm.so"),
              "it uses the copy of libdfm.so bundled in the venv, without DFM_LIB")
        a = subprocess.run([DFM, "inspect", run, "--chunk", "5"], capture_output=True, text=True, env=env).stdout
        b = subprocess.run([py, "-m", "dfm", "inspect", run, "--chunk", "5"], capture_output=True, text=True, env=env,
                           cwd=w).stdout
        check(a == b and a.startswith("chunk 5"), "python -m dfm inspect from the install prints what dfm inspect prints")
    finish("pip install ./python in a fresh venv")


if __name__ == "__main__":
    main()
