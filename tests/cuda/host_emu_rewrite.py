"""host_emu_rewrite.py IN.cu OUT.cpp — a CUDA source as C++ for the host emulation (host_emu_cuda.h).

Three rewrites, none adding a line (a `#line` at the top keeps the compiler's messages and __FILE__:__LINE__
pointing at the .cu file):
- every launch `kernel<<<grid, block[, smem[, stream]]>>>(args);` becomes
  `emu_launch(emu_cfg(grid, block[, ...]), kernel, emu_site{"kernel", __FILE__, __LINE__},
  typename emu_sig<decltype(&kernel)>::args(args));`: the arguments are converted to the kernel's
  parameter types and copied at the launch, as CUDA does, because the emulation may run the kernel later
  (on a stream, at a synchronisation);
- every `__global__` function's body starts with `emu_kernel_entry(B);`, B its `__launch_bounds__`'s first
  argument (0 without; the attribute itself is removed): the launch reads the bound from there;
- every `__shared__ T a[..], b[..];` inside a function becomes `static T a[..], b[..]; emu_shared(a, sizeof a);
  emu_shared(b, sizeof b);`: each block finds them poisoned.
The Makefile compiles the result with $(CXX) and `-include tests/cuda/host_emu_cuda.h` (make emu-checks).
Exits 1, writing nothing, if a launch, a kernel or a __shared__ declaration is left that it does not cover
(dynamic `extern __shared__` is not emulated).
"""
import re
import sys

# kernel<<<grid, block, smem, stream>>>(args);  the kernel may carry template arguments: k<HDM>, k<COL_SUM>
LAUNCH = re.compile(r"(\w+(?:<[\w:,\s]+>)?)<<<(.*?)>>>\((.*?)\);", re.S)
GLOBAL = re.compile(r"__global__\b")
SHARED = re.compile(r"__shared__\s+([^;{}]*);")


def balanced(src, i, open_="(", close=")"):
    """Index just past the bracket closing the one at src[i]."""
    depth = 0
    for j in range(i, len(src)):
        if src[j] == open_:
            depth += 1
        elif src[j] == close:
            depth -= 1
            if depth == 0:
                return j + 1
    raise ValueError(f"unbalanced {open_}{close} from offset {i}")


def first_arg(text):
    """The first top-level argument of a comma-separated list (template angle brackets and parentheses
    kept whole)."""
    depth = 0
    for j, ch in enumerate(text):
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            depth -= 1
        elif ch == "," and depth == 0:
            return text[:j].strip()
    return text.strip()


def rewrite_kernels(src):
    """Each __global__ definition: __launch_bounds__ removed, emu_kernel_entry(bound) first in its body."""
    out, pos, n = [], 0, 0
    for m in GLOBAL.finditer(src):
        if m.start() < pos:
            continue
        i = m.end()
        lb = re.compile(r"\s*(?:void\s+)?__launch_bounds__\s*\(").match(src, i)
        bound = "0"
        head_end = i
        if lb:
            close = balanced(src, lb.end() - 1)
            bound = first_arg(src[lb.end():close - 1])
            # keep `void` (and spacing) before the attribute, drop the attribute
            out.append(src[pos:i])
            out.append(src[i:lb.end()].replace("__launch_bounds__", "").rstrip("(").rstrip() + " ")
            pos = close
            head_end = close
        name = re.compile(r"[^;{(]*?(\w+)\s*\(").match(src, head_end)
        if not name:
            raise ValueError(f"a __global__ at offset {m.start()} is not followed by a function")
        params_end = balanced(src, name.end() - 1)
        rest = re.compile(r"\s*([;{])").match(src, params_end)
        if not rest:
            raise ValueError(f"kernel {name.group(1)}: no body or ';' after its parameters")
        if rest.group(1) == ";":  # a declaration
            continue
        body = rest.end()
        out.append(src[pos:body])
        out.append(f" emu_kernel_entry({bound});")
        pos = body
        n += 1
    out.append(src[pos:])
    return "".join(out), n


def declared_names(decl):
    """The names declared by `T a[..], b[..]` (each declarator's identifier before its first '[')."""
    parts, depth, cur = [], 0, ""
    for ch in decl:
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    names = []
    for k, p in enumerate(parts):
        head = p.split("[")[0]
        ids = re.findall(r"[A-Za-z_]\w*", head)
        if not ids or (k == 0 and len(ids) < 2):
            raise ValueError(f"__shared__ {decl}: cannot tell the names declared")
        names.append(ids[-1] if k == 0 else ids[0])
    return names


DYN_SHARED = re.compile(r"extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?([\w:]+)\s+(\w+)\s*\[\s*\]\s*;")


def rewrite_shared(src):
    # dynamic shared memory: a pointer to the launch's buffer (host_emu_launch.h), poisoned per block
    src = DYN_SHARED.sub(lambda m: "%s *%s = (%s *)emu_dynamic_shared();" % (m.group(1), m.group(2), m.group(1)), src)
    if re.search(r"extern\s+__shared__", src):
        raise ValueError("an extern __shared__ declaration the pattern does not cover (T name[];)")

    def one(m):
        names = declared_names(m.group(1))
        return "static %s;%s" % (m.group(1), "".join(" emu_shared(%s, sizeof %s);" % (v, v) for v in names))
    return SHARED.subn(one, src)


def rewrite(src):
    """The source with every launch, kernel and __shared__ declaration rewritten; raises ValueError if one
    is left."""
    n = src.count("<<<")
    out = LAUNCH.sub(lambda m: "emu_launch(emu_cfg(%s), %s, emu_site{\"%s\", __FILE__, __LINE__}, "
                     "typename emu_sig<decltype(&%s)>::args(%s));"
                     % (m.group(2), m.group(1), m.group(1), m.group(1), m.group(3)), src)
    if out.count("<<<"):
        raise ValueError(f"{out.count('<<<')} of {n} launches not rewritten (the pattern is in {__file__})")
    kernels = len(GLOBAL.findall(out))
    out, defined = rewrite_kernels(out)
    declared = len(re.findall(r"__global__[^;{]*\)\s*;", out))
    if defined + declared != kernels:
        raise ValueError(f"{kernels - defined - declared} of {kernels} __global__ functions not rewritten")
    out, _ = rewrite_shared(out)
    if "__shared__" in out:
        raise ValueError("a __shared__ declaration is left that the pattern does not cover")
    if out.count("\n") != src.count("\n"):
        raise ValueError("the rewrite changed the line count (messages would point at wrong lines)")
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
