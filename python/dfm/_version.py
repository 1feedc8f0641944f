"""The package version: the C library's (common/version.h), read from the checkout when the package is
used from it, else the value setup.py wrote here at build time."""
import os
import re

_H = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "common", "version.h")


def c_version(header: str = _H) -> str:
    """DFM_VERSION of common/version.h."""
    with open(header) as f:
        m = re.search(r'#define\s+DFM_VERSION\s+"([^"]+)"', f.read())
    if not m:
        raise RuntimeError(f"{header} has no DFM_VERSION")
    return m.group(1)


try:
    __version__ = c_version()
except OSError:  # installed: setup.py's build step replaces the line below with the header's value
    __version__ = "0+unknown"
