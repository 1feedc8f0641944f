"""host_emu_rewrite.py IN.cu OUT.cpp — a CUDA source as C++ for the host emulation (host_emu_cuda.h).

Every launch `kernel<<<grid, block[, smem[, stream]]>>>(args);` becomes
`emu_launch(emu_cfg(grid, block[, ...]), kernel, typename emu_sig<decltype(&kernel)>::args(args));`: the
arguments are converted to the kernel's parameter types and copied at the launch, as CUDA does, because
the emulation may run the kernel later (on a stream, at a synchronisation). The rest is unchanged.
The Makefile compiles the result with $(CXX) and `-include tests/cuda/host_emu_cuda.h` (make emu-checks).
Exits 1, writing nothing, if a launch is left that the pattern does not cover.
"""
import re
import sys

# kernel<<<grid, block, smem, stream>>>(args);  the kernel may carry template arguments: k<HDM>, k<COL_SUM>
LAUNCH = re.compile(r"(\w+(?:<[\w:,\s]+>)?)<<<(.*?)>>>\((.*?)\);", re.S)


def rewrite(src):
    """The source with every <<<>>> launch replaced by emu_launch; raises ValueError if one is left."""
    n = src.count("<<<")
    out = LAUNCH.sub(lambda m: "emu_launch(emu_cfg(%s), %s, typename emu_sig<decltype(&%s)>::args(%s));"
                     % (m.group(2), m.group(1), m.group(1), m.group(3)),
                     src)
    if out.count("<<<"):
        raise ValueError(f"{out.count('<<<')} of {n} launches not rewritten (the pattern is in {__file__})")
    return out


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        out = rewrite(open(argv[1], encoding="utf-8").read())
    except ValueError as e:
        print(f"host_emu_rewrite: {argv[1]}: {e}", file=sys.stderr)
        return 1
    # `#line` keeps compiler messages pointing at the .cu file, not at the generated copy
    open(argv[2], "w", encoding="utf-8").write(f'#line 1 "{argv[1]}"\n' + out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
