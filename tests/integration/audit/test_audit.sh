#!/usr/bin/env bash
# dfm audit on a real tiny run: the report's counted figures equal the formulas (L=32: K=16 and K=8),
# the measured token-level baseline ran, audit.json/md/svg exist; --compare accepts a run whose targets
# were rewritten on another number of ranks and names the difference of a changed count and of a
# run with another K.
source "$(dirname "$0")/../lib.sh"
PY=${DFM_PYTHON:-python3}

head -n 8 "$DFM_CORPUS" > "$WORK/corpus.jsonl"
cat > "$WORK/a.json" <<JSON
{"run": "$WORK/a", "inputs": ["$WORK/corpus.jsonl"], "tokenizer": "$DFM_TOKENIZER",
 "chunk": {"seq-len": 256}, "encode": {"device": "cpu", "model": "$DFM_MODEL", "block-chunks": 64},
 "write-targets": {"target-shards": 2}}
JSON
mpirun -np 2 "$DFM" build "$WORK/a.json" > "$WORK/a.log" 2>&1 || { cat "$WORK/a.log"; fail "dfm build"; }
ok "tiny run built"

# the audit takes the run lock like a writing stage: while another process holds it, the audit is refused
# naming the holder (this shell holds it on fd 9, as a stage would), and it runs once the lock is free
exec 9>"$WORK/a/.lock"
flock -n 9 || fail "cannot take the run lock for the test"
echo "host test pid $$ command rebuilding-in-test since now" >&9
expect_fail "rebuilding-in-test" "$DFM" audit "$WORK/a" --token-level-sample 0
exec 9>&-

# ---- the report ----
"$DFM" audit "$WORK/a" --token-level-sample 1 --token-key-dim 512 > "$WORK/audit.log" 2>&1 || { cat "$WORK/audit.log"; fail "dfm audit"; }
for f in audit.json audit.md audit.svg; do [ -s "$WORK/a/audit/$f" ] || fail "RUN/audit/$f missing"; done
grep -q '</svg>' "$WORK/a/audit/audit.svg" || fail "audit.svg is not a complete SVG"
grep -q '96.8750 %' "$WORK/a/audit/audit.md" || fail "audit.md lacks the 96.8750 % query saving"
grep -q '99.9512 %' "$WORK/a/audit/audit.md" || fail "audit.md lacks the 99.9512 % item saving"
check_json() {  # audit.json manifest.json K KEYDIM
  "$PY" - "$@" <<'PY'
import json, sys
a = json.load(open(sys.argv[1])); m = json.load(open(sys.argv[2])); K = int(sys.argv[3]); D = int(sys.argv[4])
def eq(x, y, what):
    if x != y: sys.exit(f"FAIL {what}: {x!r} != {y!r}")
c = a["counted"]; st = m["stages"]
eq(a["format"], "dfm-audit", "format"); eq(a["dfm_version"], m["dfm_version"], "dfm_version")
eq(len(a["config_hash"]), 32, "config hash length")
eq(a["inputs"], st["chunk"]["inputs"], "input hashes")
eq(a["config"]["chunk_len"], 32, "L"); eq(a["config"]["k"], K, "K")
eq(c["query_saving_formula"], 1 - 1 / 32, "query formula"); eq(c["per_chunk"]["query_saving"], 1 - 1 / 32, "query per chunk")
eq(c["item_saving_formula"], 1 - K / (32 * 1024), "item formula"); eq(c["per_chunk"]["item_saving"], 1 - K / (32 * 1024), "item per chunk")
rc = a["run_counts"]
for k, (s, n) in {"tokens": ("chunk", "tokens"), "chunks": ("chunk", "chunks"), "queries": ("retrieve", "queries"),
                  "candidates_fetched": ("retrieve", "candidates_fetched"), "items_kept": ("retrieve", "items_kept"),
                  "target_stored_bytes": ("targets", "stored_bytes")}.items():
    eq(rc[k], st[s]["counts"][n], "run_counts." + k)
eq(c["as_run"]["query_saving"], 1 - rc["queries"] / rc["tokens"], "as-run query saving")
eq(c["per_chunk"]["token_queries"], rc["chunks"] * 32, "token slot queries")
me = a["measured"]
tl, cl = me["token_level"], me["chunk_level"]
eq(tl["queries"], me["sample"]["tokens"], "token-level queries = sample tokens")
eq(tl["keys"], me["sample"]["tokens"], "token-level keys = sample tokens")
eq(tl["k"], 1024, "token k"); eq(tl["key_dim"], D, "token key width"); eq(cl["key_dim"], st["index"]["dim"], "chunk key width")
eq(cl["k"], K + m["stages"]["retrieve"].get("margin", m["stages"]["retrieve"]["config"]["margin"]), "chunk k'")
assert tl["index_bytes"] > tl["keys"] * D * 4, "token index smaller than its keys"
assert tl["search_s"] > 0 and cl["search_s"] > 0, "search times"
assert tl["factory"].endswith("Flat") and cl["factory"] == st["index"]["factory"], "same index family"
ex = {e["name"]: e for e in a["extrapolated"]}
eq(ex["large"]["tokens"], 5e9, "large corpus"); eq(ex["corpus"]["tokens"], rc["tokens"], "corpus tokens")
assert ex["large"]["token_level"]["index_bytes"] > ex["large"]["chunk_level"]["index_bytes"] > 0
# the target memory's storage, by this test's own arithmetic: mask 8 + K·(id 8 + score 4) + the slot values
sg = a["storage"]; tc = st["targets"]; b = {"fp32": 4, "fp16": 2, "bf16": 2}[tc["config"]["dtype"]]; d = st["index"]["dim"]
eq(sg["value_bytes"], b, "storage value bytes")
eq([(r["per_neighbour"], r["width"]) for r in sg["layouts"]], [(1, d), (1, 576), (4, 576), (32, 576)], "storage layouts")
for r in sg["layouts"]:
    vals = r["per_neighbour"] * r["width"] * b
    eq(r["bytes_per_chunk_in_records"], 8 + 12 * K + K * vals, "in-record bytes " + r["slots_hold"])
    eq(r["bytes_per_chunk_with_table"], 8 + 12 * K + vals, "with-table bytes " + r["slots_hold"])
    eq(r["at"]["large"]["bytes_with_table"], 5e9 / 32 * (8 + 12 * K + vals), "large-corpus bytes " + r["slots_hold"])
    eq(r["at"]["corpus"]["chunks"], rc["chunks"], "corpus chunks")
# the run stored embeddings: its raw bytes per record are the first layout's arithmetic, exactly
eq(tc["config"]["store"], "embeddings", "the run's store")
eq(sg["run_raw_bytes_per_record"], tc["counts"]["raw_bytes"] / tc["counts"]["records"], "raw bytes per record")
eq(sg["run_raw_bytes_per_record"], sg["layouts"][0]["bytes_per_chunk_in_records"], "raw bytes = layout")
eq(sg["run_raw_matches_layout"], True, "raw_matches")
print("audit.json checks passed")
PY
}
check_json "$WORK/a/audit/audit.json" "$WORK/a/manifest.json" 16 512 || fail "audit.json (K=16)"
grep -q "## Target memory: what it costs to store" "$WORK/a/audit/audit.md" || fail "audit.md lacks the target memory's storage"
grep -q "the raw bytes equal the first row's arithmetic exactly" "$WORK/a/audit/audit.md" || fail "audit.md: the run's record bytes not checked"
grep -q "storage  target memory at 5 G tokens" "$WORK/audit.log" || fail "the summary lacks the storage line: $(cat "$WORK/audit.log")"
ok "report: counted figures equal the formulas, measured baseline ran"

"$DFM" audit "$WORK/a" --token-level-sample 0 --out "$WORK/out0" > /dev/null 2>&1 || fail "audit without a measurement"
"$PY" -c "import json,sys; a=json.load(open(sys.argv[1])); sys.exit(a['measured'] is not None)" "$WORK/out0/audit.json" \
  || fail "--token-level-sample 0 still measured"
expect_fail "--token-k" "$DFM" audit "$WORK/a" --token-k 0 --out "$WORK/out1"

# ---- compare ----
cp -r "$WORK/a" "$WORK/b"
"$DFM" write-targets "$WORK/b" --target-shards 2 --force > "$WORK/b.log" 2>&1 || { cat "$WORK/b.log"; fail "rewrite targets on 1 rank"; }
"$DFM" audit --compare "$WORK/a" "$WORK/b" > "$WORK/cmp.log" 2>&1 || { cat "$WORK/cmp.log"; fail "identical runs reported different"; }
grep -q "target records identical" "$WORK/cmp.log" || fail "compare did not compare records: $(cat "$WORK/cmp.log")"
ok "compare: targets rewritten on 1 rank agree with the 2-rank run"

# the same corpus built on 1 rank: one index shard instead of two, the same run counts and records
sed -e "s#$WORK/a\"#$WORK/e\"#" "$WORK/a.json" > "$WORK/e.json"
"$DFM" build "$WORK/e.json" > "$WORK/e.log" 2>&1 || { cat "$WORK/e.log"; fail "dfm build on 1 rank"; }
"$DFM" audit --compare "$WORK/a" "$WORK/e" > "$WORK/cmp1.log" 2>&1 || { cat "$WORK/cmp1.log"; fail "1-rank and 2-rank runs reported different"; }
grep -q "target records identical" "$WORK/cmp1.log" || fail "compare did not compare records: $(cat "$WORK/cmp1.log")"
"$PY" - "$WORK/a/manifest.json" "$WORK/e/manifest.json" <<'PY' || fail "shard-level figures"
import json, sys
a, e = (json.load(open(f))["stages"]["retrieve"]["counts"] for f in sys.argv[1:])
# the shard-level figures do grow with the shards; the run's figures do not
assert a["shard_searches"] == 2 * e["shard_searches"], (a["shard_searches"], e["shard_searches"])
assert a["excluded"] == e["excluded"] > 0 and a["candidates_fetched"] == e["candidates_fetched"]
PY
ok "compare: a 1-rank build of the same corpus agrees with the 2-rank run (counts and records)"

cp -r "$WORK/a" "$WORK/c"
"$PY" - "$WORK/c/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1])); m["stages"]["retrieve"]["counts"]["items_kept"] += 1
json.dump(m, open(sys.argv[1], "w"), indent=2)
PY
expect_fail "retrieve.counts.items_kept" "$DFM" audit --compare "$WORK/a" "$WORK/c"

cp -r "$WORK/a" "$WORK/d"
sed -e "s#$WORK/a#$WORK/d#" -e 's#"write-targets"#"retrieve": {"k": 8}, "write-targets"#' "$WORK/a.json" > "$WORK/d.json"
mpirun -np 2 "$DFM" build "$WORK/d.json" --stages retrieve,write-targets --force > "$WORK/d.log" 2>&1 || { cat "$WORK/d.log"; fail "K=8 rebuild"; }
expect_fail "items_kept" "$DFM" audit --compare "$WORK/a" "$WORK/d"
"$DFM" audit "$WORK/d" --token-level-sample 1 --token-key-dim 512 > /dev/null 2>&1 || fail "audit of the K=8 run"
check_json "$WORK/d/audit/audit.json" "$WORK/d/manifest.json" 8 512 || fail "audit.json (K=8)"
ok "compare names a changed count and a run with another K; K=8 gives 1 - 8/(32*1024)"
echo "all audit checks passed"
