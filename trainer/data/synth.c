/* synth.c — synthetic corpora with target memory (see synth.h). */
#include "trainer/data/synth.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/fsutil.h"
#include "trainer/data/data.h"
#include "trainer/kernels/rng.h"

#define TOPIC_FAV 40 /* topic mode: ids a topic favours */

static const char *const mode_names[] = {"topic", "keyed", "keyed-random"};

const char *synth_mode_name(SynthMode mode) { return mode_names[mode]; }

int synth_mode_parse(const char *s, SynthMode *mode) {
    for (int m = 0; m < 3; m++)
        if (!strcmp(s, mode_names[m])) {
            *mode = (SynthMode)m;
            return DFM_OK;
        }
    return DFM_FAIL(DFM_EARG, "--mode %s: use topic, keyed or keyed-random", s);
}

void synth_config_defaults(SynthConfig *c, SynthMode mode) {
    /* keyed: 128 keys of 16 ids in a 512 vocabulary (each id in about 4 keys' sets); 16-token chunks, so
     * the key is worth at most ln 128 / 16 = 0.30 nats per token. 128, not 64: a chain of 64 keys is
     * small enough that a 2-layer, 64-wide backbone pretrained on the corpus learns much of it itself,
     * leaving memory less than it is asked to show (trainer/README.md, "What memory can add"). */
    *c = (SynthConfig){.mode = mode, .vocab = 512, .keys = mode == SYNTH_TOPIC ? 16 : 128, .seq_len = 128,
                       .chunk_len = 16, .seqs = 400, .slots = 4, .d_mem = 32, .key_tokens = 16, .key_share = 0.8f,
                       .follow = 0.95f, .noise = 0.2f, .seed = 1};
}

int synth_config_check(const SynthConfig *c) {
    if (c->chunk_len < 1 || c->seq_len < c->chunk_len || c->seq_len % c->chunk_len)
        return DFM_FAIL(DFM_EARG, "synth: --seq-len %d must be a positive multiple of --chunk-len %d", c->seq_len,
                        c->chunk_len);
    if (c->vocab < 50) return DFM_FAIL(DFM_EARG, "synth: --vocab %d: at least 50", c->vocab);
    if (c->keys < 2) return DFM_FAIL(DFM_EARG, "synth: --keys %d: at least 2", c->keys);
    if (c->slots < 1 || c->d_mem < 1) return DFM_FAIL(DFM_EARG, "synth: --slots and --d-mem must be >= 1");
    if (c->seqs < 2) return DFM_FAIL(DFM_EARG, "synth: --seqs %d: at least 2", c->seqs);
    if ((size_t)c->seqs * c->seq_len + c->chunk_len > 0x7fffffffu)
        return DFM_FAIL(DFM_EARG, "synth: %d sequences of %d tokens do not fit one token shard", c->seqs, c->seq_len);
    if (c->mode != SYNTH_TOPIC) {
        if (c->key_tokens < 1 || c->key_tokens > c->vocab)
            return DFM_FAIL(DFM_EARG, "synth: --key-tokens %d must be in [1, vocab %d]", c->key_tokens, c->vocab);
        if (!(c->key_share >= 0 && c->key_share <= 1) || !(c->follow >= 0 && c->follow <= 1))
            return DFM_FAIL(DFM_EARG, "synth: --key-share and --follow are probabilities in [0, 1]");
        if (!(c->noise >= 0)) return DFM_FAIL(DFM_EARG, "synth: --noise must be >= 0");
    }
    return DFM_OK;
}

void synth_free(SynthData *s) {
    if (!s) return;
    free(s->tokens);
    free(s->mask);
    free(s->emb);
    free(s->keys);
    memset(s, 0, sizeof *s);
}

static void normalize(float *v, int d) {
    double n = 0;
    for (int i = 0; i < d; i++) n += (double)v[i] * v[i];
    float inv = n > 0 ? (float)(1.0 / sqrt(n)) : 0.0f;
    for (int i = 0; i < d; i++) v[i] *= inv;
}

/* The historic corpus: its random stream is kept draw for draw, so old seeds give the same bytes. */
static void gen_topic(const SynthConfig *c, dfm_rng *r, SynthData *s, int *fav, float *temb) {
    int V = c->vocab, L = c->chunk_len, K = c->slots, d = c->d_mem;
    for (int z = 0; z < c->keys; z++) {
        for (int j = 0; j < TOPIC_FAV; j++) fav[z * TOPIC_FAV + j] = (int)(rng_u32(r) % V);
        rng_normal(r, temb + (size_t)z * d, d, 1.0f);
        normalize(temb + (size_t)z * d, d);
    }
    int z = 0;
    for (size_t ch = 0; ch < s->n_chunks; ch++) {
        z = rng_f32(r) < 0.75f ? (z + 1) % c->keys : (int)(rng_u32(r) % c->keys);
        s->keys[ch] = z;
        for (int j = 0; j < L; j++)
            s->tokens[ch * L + j] =
                rng_f32(r) < 0.85f ? (uint32_t)fav[z * TOPIC_FAV + rng_u32(r) % TOPIC_FAV] : rng_u32(r) % V;
        for (int k = 0; k < K; k++) {
            float *e = s->emb + (ch * K + k) * d;
            rng_normal(r, e, d, 0.05f);
            for (int i = 0; i < d; i++) e[i] += temb[z * d + i];
        }
    }
}

/* Keyed corpora. sets [keys * key_tokens] ids per key, next [2 * keys] the chain (+ scratch), kemb [(keys + 1) * d] (the
 * last row is scratch). */
static void gen_keyed(const SynthConfig *c, dfm_rng *r, SynthData *s, int *sets, int *next, float *kemb,
                      uint8_t *seen) {
    int V = c->vocab, N = c->keys, M = c->key_tokens, L = c->chunk_len, K = c->slots, d = c->d_mem;
    /* the memory side (key embeddings, slot noise) has its own stream, so tokens and keys do not depend
     * on K, d or the noise */
    dfm_rng rn;
    rng_seed(&rn, c->seed ^ 0x5eed5107ull);
    for (int k = 0; k < N; k++) { /* M distinct ids per key */
        memset(seen, 0, (size_t)V);
        for (int j = 0; j < M; j++) {
            int t;
            do t = (int)(rng_u32(r) % V);
            while (seen[t]);
            seen[t] = 1;
            sets[k * M + j] = t;
        }
        rng_normal(&rn, kemb + (size_t)k * d, d, 1.0f);
        normalize(kemb + (size_t)k * d, d);
    }
    /* one cycle through all keys in a random order: no short cycle the backbone could count along.
     * next[N..2N) is scratch for the order. */
    int *order = next + N;
    for (int k = 0; k < N; k++) order[k] = k;
    for (int k = N; k > 1; k--) {
        int j = (int)(rng_u32(r) % (uint32_t)k), t = order[k - 1];
        order[k - 1] = order[j], order[j] = t;
    }
    for (int i = 0; i < N; i++) next[order[i]] = order[(i + 1) % N];
    size_t per_seq = (size_t)(c->seq_len / L);
    float *noise = kemb + (size_t)N * d; /* scratch row */
    int z = 0;
    for (size_t ch = 0; ch < s->n_chunks; ch++) {
        int fresh = c->mode == SYNTH_KEYED_RANDOM || ch % per_seq == 0 || rng_f32(r) >= c->follow;
        z = fresh ? (int)(rng_u32(r) % (uint32_t)N) : next[z];
        s->keys[ch] = z;
        for (int j = 0; j < L; j++)
            s->tokens[ch * L + j] =
                rng_f32(r) < c->key_share ? (uint32_t)sets[z * M + rng_u32(r) % (uint32_t)M] : rng_u32(r) % (uint32_t)V;
        for (int k = 0; k < K; k++) {
            float *e = s->emb + (ch * K + k) * d;
            rng_normal(&rn, noise, d, c->noise / sqrtf((float)d));
            for (int i = 0; i < d; i++) e[i] = kemb[(size_t)z * d + i] + noise[i];
            normalize(e, d);
        }
    }
}

int synth_generate(const SynthConfig *c, SynthData *s) {
    memset(s, 0, sizeof *s);
    DFM_TRY(synth_config_check(c));
    int L = c->chunk_len, K = c->slots, d = c->d_mem, N = c->keys;
    s->n_tokens = (size_t)c->seqs * c->seq_len + L; /* one chunk more: the last sequence's last target */
    s->n_chunks = s->n_tokens / L;
    s->tokens = malloc(s->n_tokens * sizeof(uint32_t));
    s->mask = malloc(s->n_chunks * K);
    s->emb = malloc(s->n_chunks * K * d * sizeof(float));
    s->keys = malloc(s->n_chunks * sizeof(int32_t));
    int per_key = c->mode == SYNTH_TOPIC ? TOPIC_FAV : c->key_tokens;
    int *sets = malloc((size_t)N * per_key * sizeof(int)), *next = malloc(2 * (size_t)N * sizeof(int));
    float *kemb = malloc((size_t)(N + 1) * d * sizeof(float));
    uint8_t *seen = malloc((size_t)c->vocab);
    int rc = DFM_OK;
    if (!s->tokens || !s->mask || !s->emb || !s->keys || !sets || !next || !kemb || !seen) {
        rc = DFM_FAIL(DFM_ENOMEM, "synth: %zu tokens, %llu chunks of %d x %d targets", s->n_tokens,
                      (unsigned long long)s->n_chunks, K, d);
    } else {
        memset(s->mask, 1, s->n_chunks * K);
        dfm_rng r;
        rng_seed(&r, c->seed);
        if (c->mode == SYNTH_TOPIC) gen_topic(c, &r, s, sets, kemb);
        else gen_keyed(c, &r, s, sets, next, kemb, seen);
    }
    free(sets), free(next), free(kemb), free(seen);
    if (rc) synth_free(s);
    return rc;
}

int synth_write(const char *dir, const SynthConfig *c, const SynthData *s) {
    DFM_TRY(dfm_mkdir_p(dir));
    char *tp = dfm_path_join(dir, "tokens.bin"), *gp = dfm_path_join(dir, "targets.bin"),
         *kp = dfm_path_join(dir, "keys.bin");
    int rc = tp && gp && kp ? DFM_OK : DFM_FAIL(DFM_ENOMEM, "paths under %s", dir);
    if (!rc) rc = tokens_bin_write(tp, s->tokens, s->n_tokens);
    if (!rc)
        rc = targets_file_write(gp, (uint32_t)c->slots, (uint32_t)c->d_mem, (uint32_t)c->chunk_len, s->n_chunks,
                                s->mask, s->emb);
    if (!rc) rc = tokens_bin_write(kp, (const uint32_t *)s->keys, s->n_chunks);
    free(tp), free(gp), free(kp);
    return rc;
}
