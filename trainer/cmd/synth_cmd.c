/* synth_cmd.c — `dfm-train synth`: write a synthetic token shard and targets file (trainer/data/synth.h). */
#include <stdlib.h>

#include "common/error.h"
#include "common/log.h"
#include "common/opts.h"
#include "trainer/cmd/commands.h"
#include "trainer/data/synth.h"

int cmd_synth(int argc, char **argv) {
    char *out = NULL, *mode = NULL;
    int64_t vocab, keys, T, L, seqs, K, d, key_tokens, seed;
    double share, follow, noise;
    dfm_opt opts[] = {
        {"out", DFM_OPT_STR, &out, NULL, "DIR", "writes DIR/tokens.bin, DIR/targets.bin and DIR/keys.bin", 1},
        {"mode", DFM_OPT_STR, &mode, "topic", "MODE",
         "topic (smoke test: the tokens reveal the topic at once), keyed (keys follow a chain the predictor can "
         "learn from the previous chunk) or keyed-random (independent keys: only target memory helps)", 0,
         .choices = "topic|keyed|keyed-random"},
        {"vocab", DFM_OPT_INT, &vocab, "512", "V", "vocabulary", 0, .min = "50", .max = "16777216"},
        {"keys", DFM_OPT_INT, &keys, "0", "N", "hidden keys (topics) (0 = 16 for topic, 128 for keyed)", 0,
         .min = "0", .max = "65536"},
        {"seq-len", DFM_OPT_INT, &T, "128", "T", "tokens per sequence", 0, .min = "1", .max = "1048576"},
        {"chunk-len", DFM_OPT_INT, &L, "16", "L", "tokens per chunk", 0, .min = "1", .max = "65535"},
        {"seqs", DFM_OPT_INT, &seqs, "400", "N", "sequences", 0, .min = "2"},
        {"slots", DFM_OPT_INT, &K, "4", "K", "target slots per chunk", 0, .min = "1", .max = "4096"},
        {"d-mem", DFM_OPT_INT, &d, "32", "D", "target dimension", 0, .min = "1", .max = "65536"},
        {"key-tokens", DFM_OPT_INT, &key_tokens, "16", "M", "keyed: token ids each key owns", 0, .min = "1"},
        {"key-share", DFM_OPT_DOUBLE, &share, "0.8", "P", "keyed: share of a chunk's tokens drawn from its key's ids", 0,
         .min = "0", .max = "1"},
        {"follow", DFM_OPT_DOUBLE, &follow, "0.95", "P", "keyed: probability that the next chunk's key follows the chain", 0,
         .min = "0", .max = "1"},
        {"noise", DFM_OPT_DOUBLE, &noise, "0.2", "X", "keyed: relative noise of each target slot around its key's embedding", 0,
         .min = "0"},
        {"seed", DFM_OPT_INT, &seed, "1", "N", "seed", 0},
        {0},
    };
    int rc = dfm_opts_parse("synth", "--out DIR [--mode topic|keyed|keyed-random] [options]",
                            "Writes a synthetic token shard and targets file whose target memory is informative: "
                            "every chunk carries a hidden key (topic) that decides its tokens and that its target "
                            "memory encodes (trainer/data/synth.h).",
                            opts, argc, argv, NULL, NULL, NULL);
    if (rc == DFM_OPTS_HELP) return 0; /* the parser freed the options */
    SynthConfig c;
    if (!rc && !out) rc = DFM_FAIL(DFM_EARG, "--out is required");
    if (!rc) {
        SynthMode m;
        rc = synth_mode_parse(mode, &m);
        if (!rc) synth_config_defaults(&c, m);
    }
    SynthData s = {0};
    if (!rc) {
        c.vocab = (int)vocab, c.seq_len = (int)T, c.chunk_len = (int)L, c.seqs = (int)seqs, c.slots = (int)K;
        c.d_mem = (int)d, c.key_tokens = (int)key_tokens, c.key_share = (float)share, c.follow = (float)follow;
        c.noise = (float)noise, c.seed = (uint64_t)seed;
        if (keys > 0) c.keys = (int)keys;
        rc = synth_generate(&c, &s);
    }
    if (!rc) rc = synth_write(out, &c, &s);
    if (!rc)
        DFM_LOG_I("synth (%s): %zu tokens (%d sequences of %d) and %llu chunks of targets (K=%d d=%d, %d keys) in %s",
                  synth_mode_name(c.mode), s.n_tokens, c.seqs, c.seq_len, (unsigned long long)s.n_chunks, c.slots,
                  c.d_mem, c.keys, out);
    synth_free(&s);
    dfm_opts_free(opts);
    return rc;
}
