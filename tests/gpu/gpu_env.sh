# shellcheck shell=bash
# tests/gpu/gpu_env.sh — SOURCE this (bash) on a GPU machine that has no network, from the repository root:
#
#   source tests/gpu/gpu_env.sh && make CUDA=1 BUILD=build-cuda build-cuda/dfm-train
#
# It makes the libraries and tools that tests/gpu/gpu_carry.sh packed into .gpu-carry/ (the `run` tool's
# carry: [".gpu-carry"]) usable WITHOUT installing anything into /: for each unit of .gpu-carry/manifest.tsv
# it first asks the machine (pkg-config --exists, a tool on PATH, the sonames in the linker cache); what the
# machine has is used as is, the rest is unpacked (dpkg-deb -x, else Python) into a private prefix
# $DFM_CARRY_PREFIX (default /tmp/dfm-carry) and exported:
#   PATH, CPATH, LIBRARY_PATH, PKG_CONFIG_PATH (the .pc files' prefixes rewritten), LD_LIBRARY_PATH (a folder of
#   links to only the sonames the machine lacks, so no system library is shadowed; OpenMPI's are always ours),
#   OPAL_PREFIX, OPAL_SYSCONFDIR, PMIX_* and OMPI_MCA_* (the relocated OpenMPI and PMIx), FAISS_C_LIB, FAISS_LIB
#   and FAISS_C_INCLUDE (the Makefile's ?= variables: environment wins over it and over $DFM_CACHE/paths.mk),
#   as root OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 for mpirun, and without ssh/rsh
#   OMPI_MCA_plm_rsh_agent=false (else OpenMPI refuses even one-node and singleton runs).
# Idempotent (a second source in the same or a new shell reuses the prefix and adds no duplicate paths) and
# quiet on success; otherwise one line per missing thing on stderr and a non-zero status. Works under the
# caller's `set -euo pipefail`. DFM_CARRY_DIR overrides where the carry is (default REPO/.gpu-carry).

_dfm_gpu_env() {
  local root carry P m stamp sum kind name probe deb soname path link target f d n rc=0 python
  local -a fields
  local -A unpack=() sys=() done_deb=() used=()
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  carry=${DFM_CARRY_DIR:-$root/.gpu-carry}
  P=${DFM_CARRY_PREFIX:-/tmp/dfm-carry}
  m=$carry/manifest.tsv
  _dfm_say() { echo "gpu_env: $*" >&2; }
  _dfm_pre() {  # _dfm_pre VAR DIR: put DIR first in the colon list VAR, once
    local cur=${!1:-}
    case ":$cur:" in *":$2:"*) ;; *) export "$1=$2${cur:+:$cur}" ;; esac
  }
  python=$(command -v python3 || true)

  if [ -f "$m" ]; then
    sum=$(cksum <"$m" | cut -d' ' -f1)
    stamp="$(cat "$P/.stamp" 2>/dev/null || true)"
    if [ "$stamp" != "$sum" ] || [ ! -f "$P/units" ]; then
      # ---- first time for this carry: decide what the machine lacks, unpack only that -------------------
      rm -rf "$P" && mkdir -p "$P/root" "$P/ld" || { _dfm_say "cannot create $P (set DFM_CARRY_PREFIX)"; return 1; }
      # sonames the machine has: the linker cache plus the usual folders
      while read -r n; do sys[$n]=1; done < <({ ldconfig -p 2>/dev/null | awk '/x86-64/{print $1}'
        for d in /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /lib64 /usr/lib64 /usr/local/lib; do
          ls "$d" 2>/dev/null; done; } | grep '\.so')
      : >"$P/units"
      while IFS=$'\t' read -r -a fields; do
        [ "${fields[0]}" = U ] || continue
        name=${fields[1]}; probe=${fields[2]}
        case $probe in
          pc:*) command -v pkg-config >/dev/null && pkg-config --exists "${probe#pc:}" 2>/dev/null && continue ;;
          bin:*) command -v "${probe#bin:}" >/dev/null && continue ;;
          mpi) command -v mpicc >/dev/null && command -v mpirun >/dev/null && continue ;;
          faiss)
            [ -f "${FAISS_C_LIB:-${DFM_CACHE:-/var/cache/dfm}/faiss_c-1.7.3/lib/libfaiss_c.a}" ] &&
              [ -f "${FAISS_LIB:-/usr/lib/x86_64-linux-gnu/libfaiss.a}" ] &&
              [ -f "${FAISS_C_INCLUDE:-/usr/include}/faiss/c_api/Index_c.h" ] && continue ;;
          so:*)   # a runtime dependency: only for the units that need it, if they are unpacked
            n=0
            for f in $(echo "${probe#so:}" | tr , ' '); do [ -n "${used[$f]:-}" ] && n=1; done
            [ $n = 0 ] && continue
            n=0
            while IFS=$'\t' read -r kind deb soname path; do
              [ "$kind" = S ] && [ "$deb" = "${fields[3]}" ] && [ -z "${sys[$soname]:-}" ] && n=1
            done <"$m"
            [ $n = 0 ] && continue ;;
        esac
        echo "$name" >>"$P/units"; used[$name]=1
        for deb in "${fields[@]:3}"; do unpack[$deb]=$name; done
      done <"$m"
      for deb in "${!unpack[@]}"; do
        f=$carry/debs/$deb
        [ -f "$f" ] || { _dfm_say "missing $f (re-run tests/gpu/gpu_carry.sh)"; rc=1; continue; }
        if command -v dpkg-deb >/dev/null; then
          dpkg-deb -x "$f" "$P/root" || { _dfm_say "dpkg-deb -x $deb failed"; rc=1; }
        elif [ -n "$python" ]; then   # no dpkg: an .deb is an ar archive holding data.tar.{xz,gz,zst}
          "$python" - "$f" "$P/root" <<'EOF' || { _dfm_say "cannot unpack $deb without dpkg-deb"; rc=1; }
import io, sys, tarfile
b = open(sys.argv[1], "rb").read(); i = 8
while i < len(b):
    name, size = b[i:i + 16].decode().strip().rstrip("/"), int(b[i + 48:i + 58]); i += 60
    if name.startswith("data.tar"):
        t = tarfile.open(fileobj=io.BytesIO(b[i:i + size]), mode="r:*")
        kw = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
        t.extractall(sys.argv[2], **kw); break
    i += size + (size & 1)
else: sys.exit("no data.tar in " + sys.argv[1])
EOF
        else
          _dfm_say "neither dpkg-deb nor python3: cannot unpack $deb"; rc=1
        fi
        done_deb[$deb]=1
      done
      # update-alternatives links the postinst scripts would have made; absolute links into the prefix
      while IFS=$'\t' read -r kind deb link target; do
        [ "$kind" = A ] && [ -n "${done_deb[$deb]:-}" ] && [ -e "$P/root/$target" ] || continue
        [ -e "$P/root/$link" ] && continue
        mkdir -p "$(dirname "$P/root/$link")" && ln -sfn "$P/root/$target" "$P/root/$link"
      done <"$m"
      while IFS= read -r f; do
        target=$(readlink "$f")
        case $target in "$P"/*) ;; /*) [ -e "$P/root$target" ] && ln -sfn "$P/root$target" "$f" ;; esac
      done < <(find "$P/root" -type l -lname '/*' 2>/dev/null)
      # pkg-config files: prefix=/usr and -I/-L/usr/... point into the prefix
      find "$P/root" -name '*.pc' -type f -exec sed -i -e "s#^\([A-Za-z_]*\)=/usr#\1=$P/root/usr#" \
        -e "s#\([ =]\)-\([IL]\)/usr/#\1-\2$P/root/usr/#g" {} + 2>/dev/null
      # the runtime library folder: sonames the machine lacks (OpenMPI's always: it must not mix)
      while IFS=$'\t' read -r kind deb soname path; do
        [ "$kind" = S ] && [ -n "${done_deb[$deb]:-}" ] || continue
        if [ "${unpack[$deb]}" = mpi ] || [ -z "${sys[$soname]:-}" ]; then ln -sfn "$P/root/$path" "$P/ld/$soname"; fi
      done <"$m"
      if grep -qx faiss "$P/units" && [ -f "$carry"/faiss_c-1.7.3.tar.gz ]; then
        tar -C "$P" -xzf "$carry"/faiss_c-1.7.3.tar.gz || { _dfm_say "cannot unpack faiss_c-1.7.3.tar.gz"; rc=1; }
      elif grep -qx faiss "$P/units"; then
        _dfm_say "missing $carry/faiss_c-1.7.3.tar.gz (re-run tests/gpu/gpu_carry.sh)"; rc=1
      fi
      [ $rc = 0 ] && echo "$sum" >"$P/.stamp"
    fi
  else
    _dfm_say "no $m: run 'bash tests/gpu/gpu_carry.sh' here and name .gpu-carry in the run's carry list"
    rc=1
  fi

  # ---- exports (every time; no duplicates) ---------------------------------------------------------------
  if [ -s "$P/units" ]; then
    [ -d "$P/root/usr/bin" ] && _dfm_pre PATH "$P/root/usr/bin"
    [ -n "$(ls -A "$P/ld" 2>/dev/null)" ] && _dfm_pre LD_LIBRARY_PATH "$P/ld"
    for d in "$P/root/usr/lib/x86_64-linux-gnu" "$P/root/lib/x86_64-linux-gnu"; do
      [ -d "$d" ] && _dfm_pre LIBRARY_PATH "$d"; done
    for d in "$P/root/usr/include/x86_64-linux-gnu" "$P/root/usr/include"; do [ -d "$d" ] && _dfm_pre CPATH "$d"; done
    for d in "$P/root/usr/share/pkgconfig" "$P/root/usr/lib/x86_64-linux-gnu/pkgconfig"; do
      [ -d "$d" ] && _dfm_pre PKG_CONFIG_PATH "$d"; done
    if grep -qx mpi "$P/units"; then
      export OPAL_PREFIX=$P/root/usr OPAL_SYSCONFDIR=$P/root/etc/openmpi
      # PMIx (OpenMPI's launcher library) was configured with absolute folders: each must be relocated
      d=$P/root/usr/lib/x86_64-linux-gnu/pmix2
      export PMIX_PREFIX=$d PMIX_LIBDIR=$d/lib PMIX_PKGLIBDIR=$d/lib/pmix PMIX_DATAROOTDIR=$d/share \
        PMIX_DATADIR=$d/share PMIX_PKGDATADIR=$d/share/pmix
      # Debian's /etc/openmpi/openmpi-mca-params.conf, in case OPAL_SYSCONFDIR is not honoured; no shared-memory
      # single copy (CMA needs ptrace rights that containers often refuse)
      export OMPI_MCA_btl_base_warn_component_unused=0 OMPI_MCA_mtl=^ofi OMPI_MCA_btl=^uct,openib,ofi \
        OMPI_MCA_pml=^ucx OMPI_MCA_osc=^ucx,pt2pt OMPI_MCA_btl_vader_single_copy_mechanism=none
    fi
    if grep -qx faiss "$P/units"; then
      export FAISS_C_LIB=$P/faiss_c-1.7.3/lib/libfaiss_c.a FAISS_LIB=$P/root/usr/lib/x86_64-linux-gnu/libfaiss.a \
        FAISS_C_INCLUDE=$P/faiss_c-1.7.3/include
    fi
  fi
  [ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  # OpenMPI 4 refuses every launch, singletons included, when its rsh launcher finds neither ssh nor rsh;
  # one node never calls it, so any existing program will do
  if [ -z "${OMPI_MCA_plm_rsh_agent:-}" ] && ! command -v ssh >/dev/null && ! command -v rsh >/dev/null; then
    export OMPI_MCA_plm_rsh_agent=false
  fi
  if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then _dfm_pre PATH /usr/local/cuda/bin; fi

  # ---- what is still missing: one line each --------------------------------------------------------------
  for n in gcc g++ make pkg-config mpicc mpirun; do
    command -v $n >/dev/null || { _dfm_say "missing: $n not on PATH"; rc=1; }
  done
  if command -v pkg-config >/dev/null; then
    for n in jansson libpcre2-8 libutf8proc libzstd lmdb libxxhash openblas cmocka; do
      pkg-config --exists $n || { _dfm_say "missing: pkg-config $n (library and headers)"; rc=1; }
    done
  fi
  if command -v mpicc >/dev/null && ! mpicc --showme:version >/dev/null 2>&1 && ! mpicc -show >/dev/null 2>&1; then
    _dfm_say "broken: mpicc does not run ($(command -v mpicc))"; rc=1
  fi
  for f in "${FAISS_C_LIB:-${DFM_CACHE:-/var/cache/dfm}/faiss_c-1.7.3/lib/libfaiss_c.a}" \
           "${FAISS_LIB:-/usr/lib/x86_64-linux-gnu/libfaiss.a}" "${FAISS_C_INCLUDE:-/usr/include}/faiss/c_api/Index_c.h"; do
    [ -f "$f" ] || { _dfm_say "missing: $f (FAISS)"; rc=1; }
  done
  if command -v nvidia-smi >/dev/null && ! command -v nvcc >/dev/null; then
    _dfm_say "missing: nvcc not on PATH (CUDA=1 builds need it)"; rc=1
  fi
  unset -f _dfm_say _dfm_pre
  return $rc
}
if _dfm_gpu_env "$@"; then unset -f _dfm_gpu_env; else unset -f _dfm_gpu_env; return 1; fi
