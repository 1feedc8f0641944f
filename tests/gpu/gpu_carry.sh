#!/usr/bin/env bash
# tests/gpu/gpu_carry.sh — fill .gpu-carry/ with what a bare GPU machine (no network, no apt registry; an image
# with a C compiler, the CUDA toolkit and Python, probably Ubuntu 24.04) lacks to build and run dfm: the
# Debian 12 .deb files of the libraries and tools the Makefile needs, their runtime library dependencies,
# and the FAISS C API build from $DFM_CACHE. Run it HERE (Debian 12, as root, network), before a GPU session:
#
#   bash tests/gpu/gpu_carry.sh            # prints the carry entry to use: .gpu-carry
#
# then, on the GPU machine, from the repository root (the `run` tool with carry [".gpu-carry"]):
#
#   source tests/gpu/gpu_env.sh && make CUDA=1 BUILD=build-cuda build-cuda/dfm-train
#
# What is carried: every package of UNITS below plus the closure of its Depends/Pre-Depends, minus
#   - packages every image with gcc has (BASE: libc6, libgcc-s1, libstdc++6, zlib1g, ...);
#   - -dev packages other than the ones named in UNITS (libopenmpi-dev's libhwloc-dev, libevent-dev, ...:
#     the MPI compiler wrapper links only -lmpi);
#   - EXCLUDE: dlopen()ed plugins and tools a one-node run does not need (hwloc's plugins would pull in
#     X11, libxml2 and ICU; ibverbs-providers are RDMA drivers; openssh-client).
# .gpu-carry/manifest.tsv tells tests/gpu/gpu_env.sh, per unit, how to tell whether the machine already has
# it (then the system's is used and nothing is unpacked), which .debs to unpack otherwise, the sonames
# each .deb ships and the update-alternatives links its postinst would have made.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
C=$ROOT/.gpu-carry
DFM_CACHE=${DFM_CACHE:-/var/cache/dfm}
FAISS_VERSION=1.7.3
FAISS_C_DIR=$DFM_CACHE/faiss_c-$FAISS_VERSION
LIMIT_MB=56   # the whole working tree that travels (this + the tree, ~4 MiB) must stay under 64 MiB

die() { echo "gpu_carry: ERROR: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root (apt-get download needs the package lists; the FAISS cache is root's)"
for t in apt-get apt-cache dpkg-deb readelf python3 tar; do command -v $t >/dev/null || die "$t not found"; done
[ -f "$FAISS_C_DIR/lib/libfaiss_c.a" ] || die "$FAISS_C_DIR/lib/libfaiss_c.a missing: run 'make deps' first"
[ -f /usr/include/faiss/c_api/Index_c.h ] || die "/usr/include/faiss/c_api missing: apt-get install libfaiss-dev"

# unit <TAB> probe <TAB> packages. A probe says how gpu_env.sh recognises the unit on the GPU machine:
#   pc:NAME    pkg-config --exists NAME (the Makefile asks pkg-config for all its libraries at once)
#   bin:NAME   NAME on PATH        mpi: the MPI wrapper and mpirun on PATH   faiss: the Makefile's FAISS paths exist
# The unit 'mpi' is all or nothing: a relocated OpenMPI (and its PMIx, configured with absolute folders)
# must not mix with pieces of a system one.
UNITS=$(cat <<'EOF'
openblas	pc:openblas	libopenblas-dev libopenblas-pthread-dev libopenblas0 libopenblas0-pthread
jansson	pc:jansson	libjansson-dev libjansson4
pcre2	pc:libpcre2-8	libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
utf8proc	pc:libutf8proc	libutf8proc-dev libutf8proc2
zstd	pc:libzstd	libzstd-dev libzstd1
lmdb	pc:lmdb	liblmdb-dev liblmdb0
xxhash	pc:libxxhash	libxxhash-dev libxxhash0
cmocka	pc:cmocka	libcmocka-dev libcmocka0
mpi	mpi	openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev libpmix2
faiss	faiss	libfaiss-dev
pkgconfig	bin:pkg-config	pkg-config pkgconf pkgconf-bin libpkgconf3
make	bin:make	make
EOF
)
BASE="libc6 libc-dev libc6-dev libgcc-s1 libstdc++6 gcc-12-base zlib1g libuuid1 liblzma5 libcrypt1 libselinux1
      libbz2-1.0 libcap2 libgomp1 debconf adduser perl-base dpkg libtinfo6 libmd0 libsystemd0"
EXCLUDE="libhwloc-plugins ibverbs-providers openssh-client ssh-client libjs-jquery libjs-jquery-ui
         gfortran-12 gfortran-mod-15 libblas-dev liblapack-dev libblas.so liblapack.so mpi-default-bin"

# both folders are git-ignored before anything is written (an unignored one would travel with every run)
EXCL=$(git -C "$ROOT" rev-parse --git-path info/exclude 2>/dev/null || echo "$ROOT/.git/info/exclude")
case $EXCL in /*) ;; *) EXCL=$ROOT/$EXCL ;; esac
mkdir -p "$(dirname "$EXCL")"
for e in /.gpu-carry/ /.gpu-carry.tmp/; do grep -qxF "$e" "$EXCL" 2>/dev/null || echo "$e" >>"$EXCL"; done
trap 'rm -rf "$C.tmp"' EXIT

echo "gpu_carry: resolving the package closure"
rm -rf "$C.tmp"; mkdir -p "$C.tmp/debs"
CLOSURE=$(NEEDFILE="$C.tmp/needed-by.tsv" UNITS="$UNITS" BASE="$BASE" EXCLUDE="$EXCLUDE" python3 - <<'EOF'
import os, re, subprocess, sys
units = [l.split("\t") for l in os.environ["UNITS"].splitlines() if l.strip()]
roots = [p for u in units for p in u[2].split()]
base, excl = set(os.environ["BASE"].split()), set(os.environ["EXCLUDE"].split())
cache = {}
def fetch(names):   # one apt-cache call for many names (each call reads the whole cache: ~2 s)
    names = [n for n in set(names) if n not in cache]
    if not names: return
    r = subprocess.run(["apt-cache", "show", "--no-all-versions"] + names, capture_output=True, text=True)
    for rec in r.stdout.split("\n\n"):
        f, key = {}, None
        for line in rec.splitlines():
            if line[:1] in " \t" and key: f[key] += " " + line.strip(); continue
            key, _, v = line.partition(":"); f[key] = v.strip()
        if f.get("Package") in names and f["Package"] not in cache: cache[f["Package"]] = f
    for n in names: cache.setdefault(n, None)   # None: virtual or unknown
def info(p):
    fetch([p]); return cache[p]
def dep_names(f):
    d = ", ".join(x for x in (f.get("Pre-Depends", ""), f.get("Depends", "")) if x)
    return [re.sub(r"[ (].*|:any", "", a.strip()) for c in d.split(",") for a in c.split("|") if a.strip()]
def skip(p):
    return p in base or p in excl or p.startswith("libjs-") or (p.endswith("-dev") and p not in roots)
chosen, kids, todo, notes = [], {}, list(roots), []
while todo:
    fetch(todo); fetch([n for q in todo if cache[q] for n in dep_names(cache[q])])
    p = todo.pop(0)
    if p in chosen: continue
    f = info(p)
    if f is None: sys.exit(f"gpu_carry: no candidate for package {p}")
    chosen.append(p)
    deps = ", ".join(x for x in (f.get("Pre-Depends", ""), f.get("Depends", "")) if x)
    for clause in filter(None, (c.strip() for c in deps.split(","))):
        alts = [re.sub(r"[ (].*|:any", "", a.strip()) for a in clause.split("|")]
        have = [a for a in alts if a in chosen or a in todo]
        if have: kids.setdefault(p, []).append(have[0]); continue
        if any(skip(a) for a in alts):
            if not all(a in base for a in alts): notes.append(f"{p}: not carried: {clause}")
            continue
        real = [a for a in alts if info(a) is not None]
        if not real: notes.append(f"{p}: unresolved: {clause}"); continue
        kids.setdefault(p, []).append(real[0]); todo.append(real[0])
for n in notes: print("#", n)
for p in chosen: print(p)
# which units need each package (its closure): written for the manifest
need = {}
for name, _, pkgs in units:
    seen, stack = set(), pkgs.split()
    while stack:
        q = stack.pop()
        if q in seen: continue
        seen.add(q); stack += kids.get(q, [])
    for q in seen: need.setdefault(q, []).append(name)
with open(os.environ["NEEDFILE"], "w") as f:
    for q, us in need.items(): f.write(f"{q}\t{','.join(us)}\n")
EOF
)
echo "$CLOSURE" | grep '^#' | sed 's/^# /gpu_carry:   /'
PKGS=$(echo "$CLOSURE" | grep -v '^#')

# reuse the .debs of an earlier run that are still the candidates; download the others
# shellcheck disable=SC2086
URIS=$(apt-get download --print-uris $PKGS 2>/tmp/gpu_carry.apt.log) ||
  { tail -5 /tmp/gpu_carry.apt.log >&2; die "apt-get download --print-uris failed (try apt-get update)"; }
get=""
while read -r _ file size _; do
  pkg=${file%%_*}
  if [ -f "$C/debs/$file" ] && [ "$(stat -c %s "$C/debs/$file")" = "$size" ]; then cp "$C/debs/$file" "$C.tmp/debs/"
  else get="$get $pkg"; fi
done <<<"$URIS"
echo "gpu_carry: $(echo $PKGS | wc -w) packages, downloading $(echo $get | wc -w)"
# shellcheck disable=SC2086
[ -z "$get" ] || (cd "$C.tmp/debs" && apt-get download -q $get >/tmp/gpu_carry.apt.log 2>&1) ||
  { tail -5 /tmp/gpu_carry.apt.log >&2; die "apt-get download failed (log: /tmp/gpu_carry.apt.log; try apt-get update)"; }
[ "$(ls "$C.tmp/debs" | wc -l)" = "$(echo $PKGS | wc -w)" ] || die "expected $(echo $PKGS | wc -w) .debs in $C.tmp/debs"

# the FAISS C API: the static library built by scripts/deps.sh and the C API headers it was built with
mkdir -p "$C.tmp/faiss/faiss_c-$FAISS_VERSION/lib" "$C.tmp/faiss/faiss_c-$FAISS_VERSION/include/faiss"
cp "$FAISS_C_DIR/lib/libfaiss_c.a" "$C.tmp/faiss/faiss_c-$FAISS_VERSION/lib/"
cp -r /usr/include/faiss/c_api "$C.tmp/faiss/faiss_c-$FAISS_VERSION/include/faiss/"
tar -C "$C.tmp/faiss" -czf "$C.tmp/faiss_c-$FAISS_VERSION.tar.gz" "faiss_c-$FAISS_VERSION"
rm -rf "$C.tmp/faiss"

# the manifest: units, and per .deb its sonames (file where it lives) and its update-alternatives links
echo "gpu_carry: writing the manifest"
UNITS="$UNITS" python3 - "$C.tmp" <<'EOF'
import glob, os, re, shlex, subprocess, sys, tempfile
c = sys.argv[1]
debs = {}
for d in sorted(glob.glob(f"{c}/debs/*.deb")):
    pkg = subprocess.run(["dpkg-deb", "-f", d, "Package"], capture_output=True, text=True, check=True).stdout.strip()
    debs[pkg] = os.path.basename(d)
units = [l.split("\t") for l in os.environ["UNITS"].splitlines() if l.strip()]
in_unit = {p for u in units for p in u[2].split()}
need = dict(l.rstrip("\n").split("\t") for l in open(f"{c}/needed-by.tsv"))
out = ["# dfm GPU carry manifest: written by tests/gpu/gpu_carry.sh, read by tests/gpu/gpu_env.sh",
       "# U unit probe debs... | S deb soname path | A deb link target"]
for name, probe, pkgs in units:
    out.append("\t".join(["U", name, probe] + [debs[p] for p in pkgs.split()]))
for p in sorted(set(debs) - in_unit):   # runtime dependencies: one unit each, present if its sonames are
    out.append("\t".join(["U", "dep:" + p, "so:" + need[p], debs[p]]))
for p, deb in sorted(debs.items()):
    with tempfile.TemporaryDirectory() as t:
        subprocess.run(["dpkg-deb", "-x", f"{c}/debs/{deb}", t], check=True)
        subprocess.run(["dpkg-deb", "-e", f"{c}/debs/{deb}", t + "/DEBIAN"], check=True)
        for dirpath, _, files in os.walk(t):
            if "/DEBIAN" in dirpath: continue
            for f in files:
                fp = os.path.join(dirpath, f)
                if os.path.islink(fp) or ".so" not in f: continue
                r = subprocess.run(["readelf", "-d", fp], capture_output=True, text=True)
                m = re.search(r"\(SONAME\)\s+Library soname: \[(lib[^\]]+)\]", r.stdout)
                if m: out.append("\t".join(["S", deb, m.group(1), os.path.relpath(fp, t)]))
        pi = os.path.join(t, "DEBIAN", "postinst")
        if os.path.exists(pi):
            text = open(pi).read().replace("\\\n", " ")
            for line in text.splitlines():
                if "update-alternatives" not in line or "--install" not in line: continue
                tok = shlex.split(line)
                for i, w in enumerate(tok):
                    if w in ("--install", "--slave") and i + 3 < len(tok):
                        link, target = tok[i + 1], tok[i + 3]
                        if "$" in link + target or "/man/" in link: continue
                        out.append("\t".join(["A", deb, link.lstrip("/"), target.lstrip("/")]))
open(f"{c}/manifest.tsv", "w").write("\n".join(out) + "\n")
EOF

# keep the encoder carry (tests/gpu/encoder_carry.sh), which this script does not make
[ -d "$C/encoder" ] && mv "$C/encoder" "$C.tmp/encoder"
rm -rf "$C"; mv "$C.tmp" "$C"
git -C "$ROOT" check-ignore -q .gpu-carry/manifest.tsv 2>/dev/null || echo "gpu_carry: WARNING: .gpu-carry/ is not ignored by git"
size_kb=$(du -sk "$C" | cut -f1)
echo "gpu_carry: $(ls "$C/debs" | wc -l) .debs + faiss_c-$FAISS_VERSION.tar.gz + manifest.tsv, $((size_kb / 1024)) MiB ($size_kb KiB) in $C"
[ $((size_kb / 1024)) -lt $LIMIT_MB ] || echo "gpu_carry: WARNING: more than $LIMIT_MB MiB; the tree that travels is limited to 64 MiB"
echo "gpu_carry: carry entry: .gpu-carry"
echo "gpu_carry: on the GPU machine: source tests/gpu/gpu_env.sh && make CUDA=1 BUILD=build-cuda build-cuda/dfm-train"
