/* hidden_cmd.c — `dfm-train hidden`: a frozen backbone's hidden states over a token stream, one key per
 * token, written as a token-level datastore (schemas/hidden_states.h) for `dfm audit --token-keys`.
 *
 * The key of a position is the final-normed hidden state (what the LM head reads), as kNN-LM and Memory
 * Decoder key their datastores; its value is the next token. Sequences of --seq-len tokens are run
 * independently (a key sees at most that much context). Only the decoder runs: no LM head. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/opts.h"
#include "schemas/hidden_states.h"
#include "trainer/cmd/commands.h"
#include "trainer/run/model_setup.h"
#include "trainer/data/data.h"
#include "trainer/lm/hf_model.h"
#include "trainer/model/model.h"
#include "trainer/kernels/ops.h"
#include "trainer/run/train_opts.h"
#include "trainer/data/vocab_map.h"

#include <xxhash.h>

/* The backbone's input ids of n source tokens (its compact vocabulary's when it has one, vm != NULL). A
 * token the backbone lacks is refused, or with replace counted in *unseen and run as id 0. */
static int map_tokens(const VocabMap *vm, const char *backbone, int vocab, int replace, const int *tok, size_t n, size_t at, int *ids,
                      uint64_t *unseen) {
    for (size_t i = 0; i < n; i++) {
        int t = tok[i], id = t;
        if (vm) id = t >= 0 && (uint32_t)t < vm->source_vocab ? vm->to_compact[t] : -1;
        if (id < 0 || id >= vocab) {
            if (!replace)
                return DFM_FAIL(DFM_EMISMATCH, "token %d at position %zu is not in the vocabulary of the backbone %s. "
                                "HINT: --unseen replace runs such tokens as id 0 and counts them", t, at + i, backbone);
            id = 0;
            (*unseen)++;
        }
        ids[i] = id;
    }
    return DFM_OK;
}

static double cpu_now(void) { /* this process's CPU-seconds, all threads */
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct {
    char *backbone, *data, *out, *unseen;
    int64_t seq_len, batch, max_tokens, threads;
} HiddenOpts;

static int run_hidden(const HiddenOpts *o) {
    DataSet ds;
    memset(&ds, 0, sizeof ds);
    DfmModel *m = NULL;
    dfm_hidden_writer *w = NULL;
    uint32_t *vals = NULL;
    int *inputs = NULL;
    VocabMap vm;
    int have_vm = 0;
    XXH3_state_t *th = NULL; /* of the source ids read */
    int T = (int)o->seq_len, B = (int)o->batch;
    BackboneConfig bc;
    int rc = setup_frozen_backbone(o->backbone, B, T, &bc, &m);
    if (!rc) rc = data_open(o->data, T, &ds);
    if (!rc) rc = vocab_map_load(o->backbone, &vm, &have_vm);
    dfm_hidden_header meta;
    memset(&meta, 0, sizeof meta);
    if (!rc) rc = dfm_hidden_writer_open(o->out, (uint32_t)bc.dec.hidden, &w);
    int C = bc.dec.hidden;
    if (!rc && (!(inputs = malloc(sizeof(int) * (size_t)B * T)) || !(vals = malloc(sizeof(uint32_t) * (size_t)B * T))))
        rc = DFM_FAIL(DFM_ENOMEM, "no memory");
    if (rc) goto done;
    meta.seq_len = (uint32_t)T;
    meta.backbone_hash = dfm_checksum64(m->bb_memory, m->bb_num * sizeof(float));
    uint64_t want = o->max_tokens > 0 ? (uint64_t)o->max_tokens : UINT64_MAX, keys = 0;
    size_t seq = 0;
    if (!(th = XXH3_createState())) {
        rc = DFM_FAIL(DFM_ENOMEM, "no memory");
        goto done;
    }
    XXH3_64bits_reset(th);
    double t0 = dfm_now(), c0 = cpu_now();
    DFM_LOG_I("hidden: backbone %s (%s, %d layers, hidden %d), %zu tokens in %zu sequences of %d%s", o->backbone, bc.arch, bc.dec.n_layers, C,
              ds.n_tokens, ds.n_seq, T, o->max_tokens > 0 ? " (stopping at --max-tokens keys)" : "");
    /* the stream covers n_seq * T positions; the token after the last one is the value of the last key */
    for (; seq < ds.n_seq && keys < want; seq += (size_t)B) {
        int nb = ds.n_seq - seq < (size_t)B ? (int)(ds.n_seq - seq) : B;
        size_t base = seq * (size_t)T;
        rc = map_tokens(have_vm ? &vm : NULL, o->backbone, bc.vocab_size, !strcmp(o->unseen, "replace"), ds.tokens + base, (size_t)nb * T,
                        base, inputs, &meta.unseen);
        if (rc) goto done;
        XXH3_64bits_update(th, ds.tokens + base, sizeof(int) * (size_t)nb * T);
        model_backbone_forward(m, inputs, nb, T);
        meta.tokens_read += (uint64_t)nb * T;
        /* keep the rows of real (non-padding) tokens, in stream order */
        size_t kept = 0;
        for (size_t p = 0; p < (size_t)nb * T && keys + kept < want; p++) {
            if (ds.pad && ds.pad[base + p]) continue;
            if (kept != p) memcpy(m->lnf_out + kept * C, m->lnf_out + p * C, sizeof(float) * C);
            size_t nx = base + p + 1;
            vals[kept++] = nx < ds.n_tokens && !(ds.pad && ds.pad[nx]) ? (uint32_t)ds.tokens[nx] : DFM_HIDDEN_NO_NEXT;
        }
        if ((rc = dfm_hidden_writer_add(w, m->lnf_out, vals, kept))) goto done;
        keys += kept;
        if ((seq / B) % 64 == 0)
            DFM_LOG_I("hidden: %llu keys, %.1f s", (unsigned long long)keys, dfm_now() - t0);
    }
    meta.tokens_hash = XXH3_64bits_digest(th);
    rc = dfm_hidden_writer_close(w, &meta);
    w = NULL;
    if (!rc) {
        printf("hidden: %llu keys of width %d from %llu token positions (%llu tokens outside the backbone's vocabulary, run as id 0) "
               "in %.3f s (%.3f CPU-s) -> %s\n",
               (unsigned long long)keys, C, (unsigned long long)meta.tokens_read, (unsigned long long)meta.unseen, dfm_now() - t0,
               cpu_now() - c0, o->out);
        if (keys < want && o->max_tokens > 0)
            printf("hidden: the data holds %llu keys, fewer than --max-tokens %lld\n", (unsigned long long)keys, (long long)o->max_tokens);
    }
done:
    if (th) XXH3_freeState(th);
    if (have_vm) vocab_map_free(&vm);
    dfm_hidden_writer_abort(w);
    model_free(m);
    data_close(&ds);
    free(vals);
    free(inputs);
    return rc;
}

int cmd_hidden(int argc, char **argv) {
    HiddenOpts o;
    memset(&o, 0, sizeof o);
    dfm_opt opts[] = {
        {"backbone", DFM_OPT_STR, &o.backbone, NULL, "DIR", "the decoder: a Hugging Face folder (e.g. SmolLM2-135M's, $DFM_CACHE/models/smollm2-135m, from make lm)", 0},
        {"data", DFM_OPT_STR, &o.data, NULL, "PATH", "tokens: llm.c .bin shard or a `dfm chunk` run folder", 0},
        {"out", DFM_OPT_STR, &o.out, NULL, "FILE", "the hidden-states file to write (schemas/hidden_states.md)", 0},
        {"seq-len", DFM_OPT_INT, &o.seq_len, "256", "T", "tokens per forward pass", 0, .min = "1"},
        {"batch", DFM_OPT_INT, &o.batch, "8", "B", "sequences per forward pass", 0, .min = "1"},
        {"max-tokens", DFM_OPT_INT, &o.max_tokens, "0", "N", "stop after N keys (0: the whole stream)", 0, .min = "0"},
        {"unseen", DFM_OPT_STR, &o.unseen, "refuse", "WHAT", "a token the backbone's vocabulary lacks: refuse, or replace (run it as id 0; counted in the file)", 0, .choices = "refuse|replace"},
        {"threads", DFM_OPT_INT, &o.threads, "0", "N", "OpenMP/BLAS threads (0 = default)", 1},
        {0},
    };
    int rc = dfm_opts_parse("hidden", "--backbone DIR --data TOKENS --out FILE",
                            "Run a frozen decoder over a token stream and write its final-normed hidden state at every "
                            "real token, with the next token as its value: the keys of a token-level datastore (kNN-LM, "
                            "Memory Decoder), read by `dfm audit --token-keys`.",
                            opts, argc, argv, NULL, NULL, NULL);
    if (rc == DFM_OPTS_HELP) return 0; /* the parser freed the options */
    if (!rc && (!o.backbone || !o.data || !o.out)) rc = DFM_FAIL(DFM_EARG, "--backbone, --data and --out are required");
    if (!rc) {
        train_set_threads(o.threads);
        rc = run_hidden(&o);
    }
    dfm_opts_free(opts);
    return rc;
}
