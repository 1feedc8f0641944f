/* cmd_debug.c — test and demo helpers: `dfm-train debug-state` (the reference dump of
 * trainer/debug_state.h) and `dfm-train synth` (synthetic tokens + targets). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/opts.h"
#include "trainer/commands.h"
#include "trainer/data.h"
#include "trainer/debug_state.h"
#include "trainer/rng.h"

int cmd_debug_state(int argc, char **argv) {
    char *out = NULL, *variant = NULL;
    int64_t seed = 0;
    dfm_opt opts[] = {
        {"out", DFM_OPT_STR, &out, NULL, "FILE", "safetensors file to write", 1},
        {"variant", DFM_OPT_STR, &variant, "dfm-head", "NAME", "dfm-head, dfm-channel or pretrain", 0},
        {"seed", DFM_OPT_INT, &seed, "1", "N", "random seed of the tiny model and its inputs", 0},
        {0},
    };
    char **pos = NULL;
    int npos = 0;
    int rc = dfm_opts_parse("debug-state", "--out FILE [--variant NAME]",
                            "Builds a tiny random model, runs one training step's forward and backward and writes "
                            "parameters, inputs, loss, gradients and activations for tests/py/test_train_torch_parity.py.",
                            opts, argc, argv, &pos, &npos, NULL);
    free(pos);
    if (rc == DFM_OPTS_HELP) { dfm_opts_free(opts); return 0; }
    if (!rc && !out) rc = DFM_FAIL(DFM_EARG, "--out is required");
    if (!rc) rc = debug_state_write(out, variant, (uint64_t)seed);
    dfm_opts_free(opts);
    return rc;
}

/* ---- `dfm-train synth`: a synthetic corpus with useful target memory (tests and demos) ----------------
 * Every chunk of L tokens has a hidden topic z; the next chunk's topic is z+1 (mod topics) with
 * probability 0.75, else a random topic. A topic favours 40 random token ids (overlapping between
 * topics): 85% of its tokens come from them, 15% are uniform.
 * The target memory of a chunk is K noisy copies of a random unit embedding of its topic, so the
 * targets carry exactly what the tokens only hint at: fusing them (upper bound) lowers CE, and a
 * predictor can learn the cycle from the previous chunk. */
int cmd_synth(int argc, char **argv) {
    char *out = NULL;
    int64_t vocab, topics, T, L, seqs, K, d, seed;
    dfm_opt opts[] = {
        {"out", DFM_OPT_STR, &out, NULL, "DIR", "writes DIR/tokens.bin and DIR/targets.bin", 1},
        {"vocab", DFM_OPT_INT, &vocab, "512", "V", "vocabulary", 0},
        {"topics", DFM_OPT_INT, &topics, "16", "N", "hidden topics", 0},
        {"seq-len", DFM_OPT_INT, &T, "128", "T", "tokens per sequence", 0},
        {"chunk-len", DFM_OPT_INT, &L, "16", "L", "tokens per chunk", 0},
        {"seqs", DFM_OPT_INT, &seqs, "400", "N", "sequences", 0},
        {"slots", DFM_OPT_INT, &K, "4", "K", "target slots per chunk", 0},
        {"d-mem", DFM_OPT_INT, &d, "32", "D", "target dimension", 0},
        {"seed", DFM_OPT_INT, &seed, "1", "N", "seed", 0},
        {0},
    };
    char **pos = NULL;
    int npos = 0;
    int rc = dfm_opts_parse("synth", "--out DIR [options]",
                            "Writes a synthetic token shard and targets file whose target memory is informative "
                            "(hidden chunk topics), for tests and small demos.",
                            opts, argc, argv, &pos, &npos, NULL);
    free(pos);
    if (rc == DFM_OPTS_HELP) { dfm_opts_free(opts); return 0; }
    if (!rc && !out) rc = DFM_FAIL(DFM_EARG, "--out is required");
    if (!rc && (T % L || vocab < 50 || topics < 2 || K < 1 || d < 1 || seqs < 2))
        rc = DFM_FAIL(DFM_EARG, "synth: seq-len must be a multiple of chunk-len; vocab >= 50, topics >= 2");
    if (rc) { dfm_opts_free(opts); return rc; }
    size_t n_tok = (size_t)seqs * T + L, n_chunks = n_tok / L;
    uint32_t *tok = malloc(n_tok * sizeof(uint32_t));
    uint8_t *mask = malloc(n_chunks * K);
    float *emb = malloc(n_chunks * K * d * sizeof(float));
    int *fav = malloc(topics * 40 * sizeof(int));
    float *temb = malloc(topics * d * sizeof(float));
    dfm_rng r;
    rng_seed(&r, (uint64_t)seed);
    for (int z = 0; z < topics; z++) {
        for (int j = 0; j < 40; j++) fav[z * 40 + j] = rng_u32(&r) % vocab;
        rng_normal(&r, temb + z * d, d, 1.0f);
        double nrm = 0;
        for (int i = 0; i < d; i++) nrm += temb[z * d + i] * temb[z * d + i];
        for (int i = 0; i < d; i++) temb[z * d + i] /= (float)sqrt(nrm);
    }
    int z = 0;
    for (size_t c = 0; c < n_chunks; c++) {
        z = rng_f32(&r) < 0.75f ? (z + 1) % topics : (int)(rng_u32(&r) % topics);
        for (int j = 0; j < L; j++)
            tok[c * L + j] = rng_f32(&r) < 0.85f ? (uint32_t)fav[z * 40 + rng_u32(&r) % 40] : rng_u32(&r) % vocab;
        for (int k = 0; k < K; k++) {
            mask[c * K + k] = 1;
            float *e = emb + (c * K + k) * d;
            rng_normal(&r, e, d, 0.05f);
            for (int i = 0; i < d; i++) e[i] += temb[z * d + i];
        }
    }
    rc = dfm_mkdir_p(out);
    char *tp = dfm_path_join(out, "tokens.bin"), *gp = dfm_path_join(out, "targets.bin");
    if (!rc) rc = tokens_bin_write(tp, tok, n_tok);
    if (!rc) rc = targets_file_write(gp, (uint32_t)K, (uint32_t)d, (uint32_t)L, n_chunks, mask, emb);
    if (!rc) DFM_LOG_I("synth: %zu tokens (%lld sequences of %lld) in %s, %zu chunks of targets (K=%lld d=%lld) in %s",
                       n_tok, (long long)seqs, (long long)T, tp, n_chunks, (long long)K, (long long)d, gp);
    free(tp), free(gp), free(tok), free(mask), free(emb), free(fav), free(temb);
    dfm_opts_free(opts);
    return rc;
}
