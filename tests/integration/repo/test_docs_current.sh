#!/usr/bin/env bash
# The docs name only commands and flags that exist, and docs/COMMANDS.md is what the binaries print:
#  1. docs/COMMANDS.md equals the output of scripts/gen_command_docs.sh (every command's --help);
#  2. every `dfm X` / `dfm-train X` command, every --flag and every key of a JSON config named in the
#     README and the other hand-written docs exists in the --help of the program that takes it
#     (build/dfm, build/dfm-train, jobs/submit.sh, jobs/submit_train.sh);
#  3. no doc points at an issue number or at a file outside the repository;
#  4. every #include and Python import keeps to the floor plan of docs/ARCHITECTURE.md;
#  5. each check fails on a planted break (made-up names, references, includes);
#  6. the Makefile parses without a word on stderr before `make deps` has written the cache's paths.mk
#     (a newcomer's first `make demo` once opened with bash's usage text, many times over).
source "$(dirname "$0")/../lib.sh"
: "${DFM_TRAIN:?run through tests/run.sh (DFM_TRAIN unset)}"

bash "$DFM_ROOT/scripts/gen_command_docs.sh" "$WORK/COMMANDS.md" >/dev/null
diff -u "$DFM_ROOT/docs/COMMANDS.md" "$WORK/COMMANDS.md" ||
  fail "docs/COMMANDS.md is stale: run scripts/gen_command_docs.sh and commit it"
ok "docs/COMMANDS.md matches every command's --help"

# 6. a fresh machine: no paths.mk yet (make -n: the makefile is read, nothing is built)
mkdir "$WORK/nocache"
noise=$(cd "$DFM_ROOT" && env -u DFM_PYTHON -u DFM_ARROW DFM_CACHE="$WORK/nocache" make -n all 2>&1 >/dev/null) || true
[ -z "$noise" ] || fail "make without the cache's paths.mk writes to stderr ($(grep -c . <<<"$noise") lines): $(head -3 <<<"$noise")"
ok "the Makefile is quiet before make deps (no paths.mk)"

# check_names FILE...: prints each unknown name as FILE:LINE: what; exits 1 if there is one.
# Names are taken from code: `inline spans` and fenced blocks (shell lines, with \ continuations
# joined; JSON configs of `dfm build`); a --flag outside code must exist in some program's --help.
check_names() {
  "$DFM_PYTHON" - "$@" <<'PY'
import json, os, re, subprocess, sys

ROOT, DFM, TRAIN = os.environ["DFM_ROOT"], os.environ["DFM"], os.environ["DFM_TRAIN"]
CLEAN = ["env", "-i", "PATH=" + os.environ["PATH"], "HOME=/root"]  # no DFM_* defaults leak in

def run_help(argv):
    return subprocess.run(CLEAN + argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout

def commands(text):  # the names listed under "commands:" in a program's --help
    m = re.search(r"^commands:\n((?:  \S.*\n)+)", text, re.M)
    return [l.split()[0] for l in m.group(1).splitlines()] if m else []

def flags(text):  # the option lines of a --help text
    return set(re.findall(r"^\s+(--[a-z0-9][a-z0-9-]*)", text, re.M))

programs = {}  # program -> {subcommand or "": set of flags}
for prog, path in (("dfm", DFM), ("dfm-train", TRAIN)):
    top = run_help([path, "--help"])
    subs = commands(top)
    if not subs:
        sys.exit(f"{path} --help lists no commands")
    programs[prog] = {"": flags(top) | {"--help"}}
    for s in subs:
        programs[prog][s] = flags(run_help([path, s, "--help"]))
for script in ("jobs/submit.sh", "jobs/submit_train.sh"):
    programs[script] = {"": flags(run_help(["bash", os.path.join(ROOT, script), "--help"]))}
    if len(programs[script][""]) < 3:
        sys.exit(f"{script} --help lists no options")
every_flag = set().union(*(f for p in programs.values() for f in p.values()))
stages = set(programs["dfm"]) - {""}

FOREIGN = {"mpirun", "srun", "sbatch", "squeue", "scontrol", "make", "git", "python", "python3", "bash", "env", "pip", "pip3"}
INVOKE = re.compile(r"(?:^|(?<=[\s(]))(?:build[\w-]*/)?(dfm-train|dfm|jobs/submit_train\.sh|jobs/submit\.sh)(?=\s|$)")
FLAG = re.compile(r"^--[a-z][a-z0-9-]*")
errors = []

def err(where, msg):
    errors.append(f"{where}: {msg}")

def check_flags(where, toks, prog, subs):
    for t in toks:
        m = FLAG.match(t)
        if not m:
            continue
        f = m.group(0)
        known = set().union(*(programs[prog][s] for s in subs)) if subs else \
                set().union(*programs[prog].values())
        if f not in known:
            err(where, f"{f} is not a flag of {prog} {'|'.join(subs)}".rstrip())

def check_segment(where, seg):
    hits = list(INVOKE.finditer(seg))
    head = seg[: hits[0].start()] if hits else seg
    words = head.split()
    if not any(os.path.basename(w) in FOREIGN or w.endswith((".sh", ".py")) for w in words):
        for t in words:  # flags of no program in sight: they must exist somewhere
            m = FLAG.match(t)
            if m and m.group(0) not in every_flag:
                err(where, f"{m.group(0)} is no program's flag")
    for i, h in enumerate(hits):
        prog = h.group(1)
        end = hits[i + 1].start() if i + 1 < len(hits) else len(seg)
        toks = seg[h.end():end].split()
        cut = next((j for j, t in enumerate(toks) if os.path.basename(t) in FOREIGN), len(toks))
        toks = toks[:cut]
        if prog in ("dfm", "dfm-train"):
            subs = []
            if toks and re.fullmatch(r"[a-z][a-z0-9-]*(\|[a-z][a-z0-9-]*)*", toks[0]):
                subs = toks[0].split("|")
                for s in subs:
                    if s not in programs[prog]:
                        err(where, f"'{prog} {s}': {prog} has no command {s}")
                subs = [s for s in subs if s in programs[prog]]
                toks = toks[1:]
            check_flags(where, toks, prog, subs)
        elif prog == "jobs/submit_train.sh" and "--" in toks:
            j = toks.index("--")
            check_flags(where, toks[:j], prog, [""])
            mode = toks[0] if toks and toks[0] in programs["dfm-train"] else None
            check_flags(where, toks[j + 1:], "dfm-train", [mode] if mode else [])
        else:
            check_flags(where, toks, prog, [""])

def check_config(where, text):
    try:
        cfg = json.loads(text)
    except ValueError:
        return
    if not isinstance(cfg, dict) or "run" not in cfg:
        return  # not a dfm build config
    for key, val in cfg.items():
        if isinstance(val, dict):
            if key not in stages:
                err(where, f"config section '{key}' is not a dfm command")
                continue
            for k in val:
                if "--" + k not in programs["dfm"][key]:
                    err(where, f"config key {key}.{k}: --{k} is not a flag of dfm {key}")
        elif key not in ("run", "inputs") and not any("--" + key in programs["dfm"][s] for s in stages):
            err(where, f"config key '{key}' is no stage's flag")

def shell_lines(block, first):  # (line number, text) with continuations joined and comments cut
    out, buf, start = [], "", None
    for n, line in enumerate(block.splitlines(), first):
        line = re.sub(r"(^|\s)#.*$", "", line)
        start = start or n
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        out.append((start, buf + line))
        buf, start = "", None
    return out

for path in sys.argv[1:]:
    text = open(path).read()
    rel = os.path.relpath(path, ROOT) if path.startswith(ROOT) else path
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^\s*```(\w*)", lines[i])
        if fence:
            j = next((k for k in range(i + 1, len(lines)) if lines[k].strip().startswith("```")), len(lines))
            block = "\n".join(lines[i + 1:j])
            if fence.group(1) == "json":
                check_config(f"{rel}:{i + 2}", block)
            elif fence.group(1) in ("", "sh", "bash", "console"):
                for n, l in shell_lines(block, i + 2):
                    for seg in re.split(r"\s(?:\|\||&&|;|\|)\s|;\s*$", l):
                        check_segment(f"{rel}:{n}", seg)
            i = j + 1
            continue
        line = lines[i]
        for span in re.findall(r"`([^`]+)`", line):
            for seg in re.split(r"\s(?:\|\||&&|;|\|)\s", span):
                check_segment(f"{rel}:{i + 1}", seg)
        for f in re.findall(r"(?:^|[\s(])(--[a-z][a-z0-9-]*)", re.sub(r"`[^`]*`", "", line)):
            if f not in every_flag:
                err(f"{rel}:{i + 1}", f"{f} is no program's flag")
        i += 1
for e in errors:
    print(e)
sys.exit(1 if errors else 0)
PY
}

cd "$DFM_ROOT"
DOCS=(README.md BENCHMARKS.md docs/ARCHITECTURE.md docs/GUIDE.md docs/GUARANTEES.md */README.md */*/README.md schemas/*.md)
check_names "${DOCS[@]/#/$DFM_ROOT/}" || fail "the docs above name commands or flags that the programs do not have"
ok "every command, flag and config key named in ${DOCS[*]} exists"

# docs stand on their own: no issue numbers, no design files or folders outside the repository
OUTSIDE='[Ii]ssue #?[0-9]|\(#[0-9]+\)|design\.md|design §|\.\./shared|/work/'
refs=$(grep -nE "$OUTSIDE" "${DOCS[@]}" docs/COMMANDS.md || true)
[ -z "$refs" ] || fail "docs point at issue numbers or files outside the repository:
$refs"
printf 'see issue 7 and design.md\n' > "$WORK/outside.md"
grep -qE "$OUTSIDE" "$WORK/outside.md" || fail "the outside-reference pattern misses 'issue 7'"
ok "no doc points at an issue number or a file outside the repository"

# the floor plan of docs/ARCHITECTURE.md: what each folder's #include "..." may name; Python under tests/
# (files and shell heredocs) imports nothing of bench/, and bench/ of tests/ only tests/ref/
floor_rule() {
  case $1 in
    common) echo '^common/' ;;
    schemas) echo '^(common|schemas)/' ;;
    tokenizer) echo '^(common|schemas|tokenizer)/' ;;
    pipeline|encoder|retriever|shard) echo '^(common|schemas|tokenizer|pipeline|encoder|retriever|shard)/' ;;
    trainer|trainer/cmd) echo '^(common|schemas|trainer)/|^shard/target_reader\.h$|^tokenizer/tokenizer\.h$' ;;
    # the trainer's rooms (trainer/README.md): each includes only the rooms below it
    trainer/kernels) echo '^common/|^trainer/kernels/' ;;
    trainer/model/model) echo '^(common|schemas)/|^trainer/(kernels|model)/' ;;
    trainer/data/data) echo '^(common|schemas)/|^trainer/(kernels|model|data)/|^shard/target_reader\.h$' ;;
    trainer/lm) echo '^(common|schemas)/|^trainer/(kernels|model|lm)/|^tokenizer/tokenizer\.h$' ;;
    trainer/run) echo '^(common|schemas)/|^trainer/(kernels|model|data|lm|run)/|^shard/target_reader\.h$|^tokenizer/tokenizer\.h$' ;;
    tests) echo '^(common|schemas|tokenizer|pipeline|encoder|retriever|shard|trainer|tests)/' ;;
    bench) echo '^(common|schemas|tokenizer|pipeline|encoder|retriever|shard|trainer|bench)/|^tests/ref/' ;;
  esac
}
floor_breaks() {  # FOLDER...: each include or import outside its floor's rule, as FILE:LINE: text
  local d f n inc re
  for d in "$@"; do
    re=$(floor_rule "$d")
    while IFS=: read -r f n inc; do
      inc=${inc#*\"}; inc=${inc%%\"*}
      [[ $inc != */* || $inc =~ $re ]] || echo "$f:$n: #include \"$inc\""
    done < <(find "$d" -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh' -o -name '*.def' | sort |
             xargs -r grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"' /dev/null)
    case $d in
      tests) find "$d" -name '*.py' -o -name '*.sh' | sort |
               xargs -r grep -nE "sys\.path[^#]*[\"'/]bench|^[[:space:]]*(from|import) bench" /dev/null ;;
      bench) find "$d" -name '*.py' -o -name '*.sh' | sort |
               xargs -r grep -nE "sys\.path[^#]*tests" /dev/null | grep -vE "tests/ref|\"tests\", \"ref\"" ;;
    esac
  done
  return 0
}
breaks=$(floor_breaks common schemas tokenizer pipeline encoder retriever shard trainer tests bench \
         trainer/kernels trainer/model/model trainer/data/data trainer/lm trainer/run trainer/cmd)
[ -z "$breaks" ] || fail "includes or imports that break the floor plan of docs/ARCHITECTURE.md:
$breaks"
mkdir -p "$WORK/schemas" "$WORK/tokenizer" "$WORK/tests" "$WORK/bench" "$WORK/trainer/kernels"
printf '#include "common/error.h"\n#include "shard/target_reader.h"\n' > "$WORK/schemas/x.c"
printf '#include "trainer/kernels/ops.h"\n#include "trainer/model/model.h"\n' > "$WORK/trainer/kernels/x.c"
printf '#include "schemas/gguf.h"\n#include "pipeline/chunk/chunk.h"\n' > "$WORK/tokenizer/x.c"
P='sys.path.insert(0, "%s")\n'  # the planted imports, written so that this file does not match them
printf "import sys\n$P" bench > "$WORK/tests/x.py"
printf "import sys\n$P$P" tests/ref tests/py > "$WORK/bench/x.py"
breaks=$(cd "$WORK" && floor_breaks schemas tokenizer tests bench trainer/kernels)
[ "$(grep -c . <<<"$breaks")" = 5 ] && grep -q 'schemas/x.c:2: #include "shard/target_reader.h"' <<<"$breaks" &&
  grep -q 'trainer/kernels/x.c:2: #include "trainer/model/model.h"' <<<"$breaks" &&
  grep -q 'tokenizer/x.c:2: #include "pipeline/chunk/chunk.h"' <<<"$breaks" &&
  grep -q 'tests/x.py:2:' <<<"$breaks" && grep -q 'bench/x.py:3:' <<<"$breaks" ||
  fail "the floor check missed a planted break, or reported a good line: $breaks"
ok "every include stays on its floor (docs/ARCHITECTURE.md)"

# the check must be able to fail: a made-up command, flags and config keys, each reported
cat > "$WORK/bad.md" <<'EOF'
Run `dfm chunk RUN in.jsonl --chunk-len 32 --no-such-flag` then `dfm frobnicate RUN`.
```sh
dfm-train train --backbone B \
    --bogus-rate 3
jobs/submit_train.sh train --ntasks 2 -- --device cuda --not-a-train-flag 1
```
```json
{"run": "r", "inputs": ["a"], "chunk": {"seq-len": 64, "wrong-key": 1}, "nosuch": 2}
```
EOF
out=$(check_names "$WORK/bad.md") && fail "the name check passed a document with made-up names: $out"
for needle in "--no-such-flag is not a flag of dfm chunk" "dfm has no command frobnicate" \
              "--bogus-rate is not a flag of dfm-train train" "--not-a-train-flag is not a flag of dfm-train train" \
              "chunk.wrong-key" "'nosuch' is no stage's flag"; do
  grep -qF -- "$needle" <<<"$out" || fail "the name check did not report '$needle': $out"
done
[ "$(grep -c . <<<"$out")" = 6 ] || fail "the name check reported more than the 6 planted names: $out"
ok "the name check reports made-up commands, flags and config keys"
