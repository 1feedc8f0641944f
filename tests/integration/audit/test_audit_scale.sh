#!/usr/bin/env bash
# dfm audit --measure-tokens on a tiny run with real keys: a tiny backbone pretrained on the run's tokens,
# its hidden states written by `dfm-train hidden` (the file checked and refused when damaged), both
# datastores measured at growing sizes of the same text (IVF-PQ token level, the run's index chunk level),
# the cost model (layout bytes = serialised bytes, rates, validation) and its extrapolation in audit.json / audit.md; random keys are labelled; the chart renders with every
# label inside the canvas (tests/integration/audit/audit_chart_check.py, rsvg-convert); two runs built from
# identical inputs compare with identical counted figures.
source "$(dirname "$0")/../lib.sh"
PY=${DFM_PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
[ -x "$DFM_TRAIN" ] || fail "dfm-train is not built ($DFM_TRAIN)"

head -n 6 "$DFM_CORPUS" > "$WORK/corpus.jsonl"
cat > "$WORK/a.json" <<JSON
{"run": "$WORK/a", "inputs": ["$WORK/corpus.jsonl"], "tokenizer": "$DFM_TOKENIZER",
 "chunk": {"seq-len": 256}, "encode": {"device": "cpu", "model": "$DFM_MODEL", "block-chunks": 64},
 "write-targets": {"target-shards": 2}}
JSON
"$DFM" build "$WORK/a.json" > "$WORK/a.log" 2>&1 || { cat "$WORK/a.log"; fail "dfm build"; }
ok "tiny run built"

# ---- real keys: a tiny decoder's hidden states over the run's tokens ----
"$DFM_TRAIN" pretrain --data "$WORK/a" --out "$WORK/pre" --compact-vocab --seq-len 64 --batch 2 --steps 2 --layers 1 \
  --hidden 32 --heads 2 --kv-heads 1 --threads 1 --no-ckpt > "$WORK/pre.log" 2>&1 || { cat "$WORK/pre.log"; fail "pretrain"; }
mkdir -p "$WORK/a/audit"
H=$WORK/a/audit/hidden_states.bin
"$DFM_TRAIN" hidden --backbone "$WORK/pre/model" --data "$WORK/a" --out "$H" --seq-len 64 --threads 1 > "$WORK/h.log" 2>&1 \
  || { cat "$WORK/h.log"; fail "dfm-train hidden"; }
"$PY" - "$H" "$WORK/a/manifest.json" <<'PY' || fail "hidden-states file"
import json, struct, sys, numpy as np, xxhash
b = open(sys.argv[1], "rb").read(); m = json.load(open(sys.argv[2]))
magic, ver, hb, n, dim, T, read, unseen, bbh, tkh, pb, pxx, hxx = struct.unpack_from("<8sIIQIIQQQQQQQ", b)
assert magic == b"DFMHIDN1" and ver == 1 and hb == 128 and dim == 32 and T == 64, (magic, ver, hb, dim, T)
assert unseen == 0, unseen  # the backbone was trained on these very tokens
real = m["stages"]["chunk"]["counts"]["tokens"]
assert 0.9 * real < n <= real, (n, real)  # every real token of the full sequences
assert pb == n * (dim * 4 + 4) and len(b) == 128 + pb
assert xxhash.xxh3_64_intdigest(b[128:]) == pxx
z = bytearray(b[:128]); z[80:88] = bytes(8)
assert xxhash.xxh3_64_intdigest(bytes(z)) == hxx
keys = np.frombuffer(b, np.float32, n * dim, 128).reshape(n, dim)
assert np.isfinite(keys).all() and keys.std() > 0.1
# final-normed states of a tiny model: rows differ (they depend on context, not only on the token)
assert len(np.unique(keys.round(4), axis=0)) > n // 2
print("hidden states ok:", n, "keys")
PY
ok "dfm-train hidden: $(tail -1 "$WORK/h.log")"
cp "$H" "$WORK/bad.bin"
printf '\x01' | dd of="$WORK/bad.bin" bs=1 seek=300 conv=notrunc 2>/dev/null
expect_fail "payload checksum" "$DFM" audit "$WORK/a" --measure-tokens 4000 --measure-sizes 2 --token-keys "$WORK/bad.bin" --out "$WORK/bad"
head -c 100 "$H" > "$WORK/short.bin"
expect_fail "shorter than the 128-byte header" "$DFM" audit "$WORK/a" --measure-tokens 4000 --measure-sizes 2 --token-keys "$WORK/short.bin" --out "$WORK/bad"

# ---- the measurement at scale ----
N=$("$PY" -c "import struct,sys; print(struct.unpack_from('<Q', open(sys.argv[1],'rb').read(), 16)[0])" "$H")
"$DFM" audit "$WORK/a" --token-level-sample 0 --measure-tokens 100000 --measure-sizes 2 --repeats 2 --build-repeats 2 --measure-queries 40 \
  --recall-queries 10 > "$WORK/audit.log" 2>&1 || { cat "$WORK/audit.log"; fail "dfm audit --measure-tokens"; }
"$PY" - "$WORK/a/audit/audit.json" "$N" <<'PY' || fail "audit.json scale"
import json, math, sys
a = json.load(open(sys.argv[1])); N = int(sys.argv[2]); s = a["scale"]
assert "hidden states of a real decoder" in s["token_keys_are"], s["token_keys_are"]
assert s["text_keys"] == N and s["text_differs_at"] == -1 and s["text_agrees_with_run_tokens"] > 0.9 * N, s
z = s["sizes"]; assert [x["tokens"] for x in z] == [N // 4, N], [x["tokens"] for x in z]  # capped at the text, x4 apart
for x in z:
    t, c, cq = x["token_level"], x["chunk_level"], x["chunk_level_ivfpq"]
    # like for like, or nothing: a size with too few chunk keys for IVF-PQ is not measured, never a Flat index called IVF-PQ
    if cq["skipped"]:
        assert "too few for IVF-PQ" in cq["why"] and "factory" not in cq and cq["keys"] == c["keys"] < 1000, cq
    else:
        assert cq["factory"].startswith("IVF") and ",PQ" in cq["factory"] and cq["keys"] == c["keys"] and cq["queries"] == c["queries"]
    assert t["factory"].startswith("IVF") and ",PQ8np" in t["factory"], t["factory"]  # width 32: 8-byte codes
    assert t["keys"] == x["tokens"] and 0 < t["recall_at_k"] <= 1 and t["recall_queries"] == 10
    assert c["recall_at_k"] == 1 and c["keys"] == x["chunk_real_keys"] > 0   # the run's embeddings, exact Flat
    for side in (t, c):
        for f in ("build_s", "s_per_query", "build_cpu_s", "cpu_s_per_query"):
            sp = side[f]; assert sp["n"] == 2 and 0 < sp["min"] <= sp["median"] <= sp["max"], (f, sp)
        assert side["index_bytes"] > 0 and side["queries"] == 40  # the same batch at every size, keys repeated when fewer
        assert side["layout_bytes"] == side["index_bytes"], side  # the layout arithmetic is FAISS's serialisation
        # each of the 2 timed repeats ran until it had used 0.25 s of CPU (one call of a tiny index is the clock's noise)
        # and counts its median run
        assert side["search_passes_timed"] >= 2 and side["builds_timed"] >= 2, side
    assert c["search_passes_timed"] > 2 and c["builds_timed"] > 2, c  # a Flat index of a few keys: microseconds a call, repeated
M = s["model"]
assert M["valid_max_rel_error"] == 0.25 and M["defensible_factor"] == 100
for side in ("token_level", "chunk_level"):
    m = M[side]; assert m["ok"] and m["sizes"] == 2 and m["layout_max_rel_error"] == 0, m
    for q in ("search", "build"):
        assert m[q]["points"] == 2 and m[q]["largest_predicted_rel_error"] is None and m[q]["validated"] is None  # 2 sizes: not validated
assert M["token_level"]["family"] == "IVF-PQ" and M["chunk_level"]["family"] == "Flat"
ex = {e["name"]: e for e in s["extrapolated"]}
assert ex["large"]["tokens"] == 5e9 and ex["large"]["token_level"]["queries"] == 5e9 and ex["large"]["model_only"]
L = ex["large"]
for side in ("token_level", "chunk_level", "chunk_level_ivfpq"):
    x = L[side]
    assert x["search_s"] > 0 and x["index_bytes"] > 0 and x["factory"].startswith("IVF"), (side, x)
    assert abs(x["search_s"] - x["queries"] * x["s_per_query"]) <= 1e-9 * x["search_s"]
    assert x["search_s_low"] < x["search_s"] < x["search_s_high"] and x["build_s_low"] < x["build_s"] < x["build_s_high"]
    # the goal: extrapolated index bytes within 5 % of the layout arithmetic (computed here on its own: codes + ids + centroids + codebooks)
    f = x["factory"]; nl = int(f[3:f.index(",")]); d = 32 if side == "token_level" else s["chunk_key_dim"]; keys = x["keys"]
    per_key = (int(f.split("PQ")[1].rstrip("np")) + 8) if ",PQ" in f else 4 * d + 8
    lay = keys * per_key + nl * d * 4 + (256 * d * 4 if ",PQ" in f else 0)
    assert abs(x["index_bytes"] / lay - 1) < 0.05, (side, x["index_bytes"], lay)
# 64 bytes and wider codes are at least their keys' codes: 5e9 tokens of 8-byte codes + ids
assert L["token_level"]["index_bytes"] >= 5e9 * 16
assert L["token_level"]["rates_from"] == "token_level" and L["chunk_level_ivfpq"]["rates_from"] in ("token_level", "chunk_level_ivfpq")
assert abs(L["savings"]["search_s"] - (1 - L["chunk_level"]["search_s"] / L["token_level"]["search_s"])) < 1e-12
assert abs(L["savings_ivfpq"]["index_bytes"] - (1 - L["chunk_level_ivfpq"]["index_bytes"] / L["token_level"]["index_bytes"])) < 1e-12
# the token level issues one query per token, the chunk level the run's rate
assert L["token_level"]["queries"] == 5e9 and abs(L["chunk_level"]["queries"] / 5e9 - s["chunk_queries_per_token"]) < 1e-12
assert len(s["load_average_before"]) == 3 and s["threads"] == 1 and s["cpu"]
assert a["version"] == 2
print("scale ok")
PY
grep -q "## Measured at scale" "$WORK/a/audit/audit.md" || fail "audit.md lacks the scale section"
grep -q "### The cost model, and its validation" "$WORK/a/audit/audit.md" || fail "audit.md lacks the cost model"
grep -q "### Extrapolated from the cost model" "$WORK/a/audit/audit.md" || fail "audit.md lacks the extrapolation"
grep -q "model only" "$WORK/a/audit/audit.md" || fail "audit.md does not say that 5e9 tokens is a model only"
# words that cannot contradict themselves: never a negative number before "less" / "fewer"
if grep -nE -- '-[0-9.]+ % (less|fewer)' "$WORK/a/audit/audit.md" "$WORK/audit.log" "$WORK/a/audit/audit.svg"; then fail "a negative saving written as less"; fi
grep -q "model, token level (IVF-PQ, 2 sizes)" "$WORK/audit.log" || fail "the summary lacks the model's validation line: $(cat "$WORK/audit.log")"
grep -q "like for like: the chunk level's [0-9]* keys are too few for IVF-PQ (not measured" "$WORK/audit.log" \
  || fail "the summary does not say why the chunk level was not measured in IVF-PQ: $(cat "$WORK/audit.log")"
grep -q "load average" "$WORK/a/audit/audit.md" || fail "audit.md lacks the conditions"
grep -q "min / med / max" "$WORK/a/audit/audit.md" || fail "audit.md lacks the spreads"
ok "scale: two sizes of real hidden states, IVF-PQ vs the run's index, the cost model and its extrapolation"

"$DFM" audit "$WORK/a" --token-level-sample 0 --measure-tokens 4000 --measure-sizes 2 --repeats 1 --measure-queries 20 \
  --recall-queries 5 --token-keys random --token-key-dim 16 --out "$WORK/rnd" > "$WORK/rnd.log" 2>&1 || { cat "$WORK/rnd.log"; fail "random keys"; }
grep -q "RANDOM: seeded pseudo-random" "$WORK/rnd/audit.md" || fail "random keys are not labelled in audit.md"
# the operation-mix check: the largest token-level size searched again at 4x the lists, predicted by the same rates
"$PY" - "$WORK/rnd/audit.json" <<'PY' || fail "the operation-mix check"
import json, math, sys
s = json.load(open(sys.argv[1]))["scale"]; big = s["sizes"][-1]["token_level"]; small = s["sizes"][0]["token_level"]
assert "wide_nprobe" not in small, small  # the largest size only
assert big["nprobe"] == 32 and big["wide_nprobe"] == min(4 * 32, big["nlist"]) > 32, big
w = big["wide_cpu_s_per_query"]; assert w["n"] == 1 and w["median"] > 0, w
m = s["model"]["token_level"]; mc = m["operation_mix_check"]
assert mc["nprobe"] == big["wide_nprobe"] and 0 < m["codes_share"] < 1 and 0 < mc["codes_share"] < 1, (m["codes_share"], mc)
assert abs(mc["codes_share"] - m["codes_share"]) > 0.01, (m["codes_share"], mc)  # the mix moved
# the prediction there is the fitted rates times the operations at wide_nprobe: recomputed from the rates and the ratio
pred = (mc["predicted_rel_error"] + 1) * w["median"]
fixed, rate = m["search"]["fixed_s_per_query"], m["search"]["s_per_operation"]
assert pred > fixed and rate > 0 and mc["validated"] == (abs(mc["predicted_rel_error"]) <= 0.25), mc
for e in s["extrapolated"]:
    assert 0 < e["token_level"]["codes_share"] < 1, e["token_level"]
print("mix check ok:", mc)
PY
grep -q "The operation mix" "$WORK/rnd/audit.md" || fail "audit.md lacks the operation-mix check"
grep -q "RANDOM (not hidden states)" "$WORK/rnd/audit.svg" || fail "random keys are not labelled in audit.svg"
ok "random keys are labelled"

# ---- the chart: every label inside the canvas, rendered ----
"$PY" "$HERE/audit_chart_check.py" "$WORK/a/audit/audit.svg" "$WORK/chart.png" || fail "audit.svg (scale) clips a label"
"$DFM" audit "$WORK/a" --token-level-sample 1 --token-key-dim 64 --out "$WORK/plain" > /dev/null 2>&1 || fail "audit without scale"
"$PY" "$HERE/audit_chart_check.py" "$WORK/plain/audit.svg" "$WORK/plain.png" || fail "audit.svg (bars) clips a label"
ok "charts render with every label inside"
# the check can fail: a right-aligned percentage pushed past the edge, as the old chart cut "97.266 % fewe"
sed -e '0,/text-anchor="end" font-size="12" font-weight="bold" fill="#2f855a"/s//text-anchor="start" font-size="12" font-weight="bold" fill="#2f855a"/' \
  "$WORK/plain/audit.svg" > "$WORK/clipped.svg"
cmp -s "$WORK/plain/audit.svg" "$WORK/clipped.svg" && fail "the clipping mutation changed nothing"
if "$PY" "$HERE/audit_chart_check.py" "$WORK/clipped.svg" "$WORK/clipped.png" > "$WORK/clipped.log" 2>&1; then fail "a clipped label passed the check"; fi
grep -q "leaves the" "$WORK/clipped.log" && grep -q "border band" "$WORK/clipped.log" || fail "clipping not named: $(cat "$WORK/clipped.log")"
ok "a label pushed off the canvas is caught by both checks"

# ---- reproducibility: a second run from identical inputs ----
sed -e "s#$WORK/a\"#$WORK/b\"#" "$WORK/a.json" > "$WORK/b.json"
"$DFM" build "$WORK/b.json" > "$WORK/b.log" 2>&1 || { cat "$WORK/b.log"; fail "second build"; }
"$DFM" audit --compare "$WORK/a" "$WORK/b" > "$WORK/cmp.log" 2>&1 || { cat "$WORK/cmp.log"; fail "identical inputs compared different"; }
grep -q "counted figures identical" "$WORK/cmp.log" || fail "compare did not show counted figures: $(cat "$WORK/cmp.log")"
[ "$(grep -c ' identical$' "$WORK/cmp.log")" -ge 8 ] || fail "compare printed fewer than 8 identical counted figures"
"$DFM" audit "$WORK/b" --token-level-sample 0 --out "$WORK/b/audit" > /dev/null 2>&1 || fail "audit of b"
"$DFM" audit "$WORK/a" --token-level-sample 0 --out "$WORK/a0" > /dev/null 2>&1 || fail "audit of a"
"$PY" - "$WORK/a0/audit.json" "$WORK/b/audit/audit.json" <<'PY' || fail "counted figures of identical runs differ"
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:])
for k in ("counted", "run_counts", "config_hash"):
    assert a[k] == b[k], k
PY
ok "two runs from identical inputs: identical counted figures"
echo "all audit scale checks passed"
