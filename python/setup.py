"""Build step of the dfm package (pyproject.toml holds the metadata): the version is DFM_VERSION of the
checkout's common/version.h, and build/libdfm.so is bundled into the package when it has been built
(`make`), so an installed copy finds its library without DFM_LIB (see dfm/_lib.py)."""
import os
import re
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def c_version():
    with open(os.path.join(REPO, "common", "version.h")) as f:
        return re.search(r'#define\s+DFM_VERSION\s+"([^"]+)"', f.read()).group(1)


class BuildPy(build_py):
    def run(self):
        super().run()
        pkg = os.path.join(self.build_lib, "dfm")
        vf = os.path.join(pkg, "_version.py")
        with open(vf) as f:
            text = f.read()
        with open(vf, "w") as f:
            f.write(text.replace('"0+unknown"', repr(c_version())))
        lib = os.environ.get("DFM_LIB") or os.path.join(REPO, "build", "libdfm.so")
        if os.path.isfile(lib):
            shutil.copy2(lib, os.path.join(pkg, "libdfm.so"))
            print(f"dfm: bundled {lib}")
        else:
            print(f"dfm: {lib} not built: the installed package needs DFM_LIB at run time (or run `make` and reinstall)")


setup(version=c_version(), cmdclass={"build_py": BuildPy})
