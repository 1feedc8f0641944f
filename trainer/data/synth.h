/* synth.h — synthetic corpora with target memory, for tests, demos and the memory benchmark.
 *
 * A corpus is a token stream of seqs * T + L tokens cut into chunks of L tokens (sequence s is chunks
 * [s*T/L, (s+1)*T/L)), plus per chunk K target slots of dimension d (the simple targets file of
 * trainer/data/data.h). Every chunk c carries a hidden state z_c that decides which tokens appear in it, and
 * its target memory is K noisy copies of a unit embedding of z_c. Modes:
 *
 *   topic   16-ish topics; z_c = z_{c-1} + 1 (mod topics) with probability 0.75, else random. A topic
 *           favours 40 random ids (85% of its tokens). The backbone learns the topic from a chunk's own
 *           first tokens, so memory is worth about 0.01 nats: a smoke-test corpus (the historic default).
 *   keyed   z_c is a key in [0, keys). Keys follow one random cycle through all keys (the chain):
 *           z_c = next(z_{c-1}) with probability `follow`, else a uniform key; chunk 0 of each sequence
 *           draws a uniform key. Key k owns a set of `key_tokens` ids; a token is drawn from its chunk's
 *           set with probability `key_share`, else uniformly from the vocabulary. The memory of chunk c
 *           encodes z_c, which is predictable from chunk c-1's tokens (they reveal z_{c-1}; the chain gives
 *           z_c), while the backbone meets chunk c's key only through chunk c's own tokens: at the chunk's
 *           first token it has none of them, and locating chunk boundaries (absolute position mod L) is
 *           hard for a RoPE decoder. Knowing the key is worth at most ln(keys) nats per chunk.
 *   keyed-random  as keyed, but every key is uniform and independent: nothing before chunk c predicts
 *           it, so only the target memory (retrieval at inference) can help. Tests the fusion path alone.
 *
 * Deterministic: the same config gives the same bytes. In the keyed modes tokens and keys do not depend on K,
 * d or the noise (the memory side draws from its own stream), so corpora that differ only in their target
 * shape share one backbone; keyed and keyed-random corpora of one seed share the key sets.
 */
#ifndef DFM_TRAINER_SYNTH_H
#define DFM_TRAINER_SYNTH_H

#include <stddef.h>
#include <stdint.h>

typedef enum { SYNTH_TOPIC, SYNTH_KEYED, SYNTH_KEYED_RANDOM } SynthMode;

typedef struct {
    SynthMode mode;
    int vocab;       /* token ids [0, vocab) */
    int keys;        /* topics (topic mode) or keys */
    int seq_len;     /* T, a multiple of chunk_len */
    int chunk_len;   /* L */
    int seqs;        /* sequences (>= 2) */
    int slots;       /* K */
    int d_mem;       /* d */
    int key_tokens;  /* keyed: ids each key owns */
    float key_share; /* keyed: share of a chunk's tokens drawn from its key's ids */
    float follow;    /* keyed: probability that a key follows the chain */
    float noise;     /* keyed: relative noise of each slot around the key's embedding (slots are unit norm) */
    uint64_t seed;
} SynthConfig;

typedef struct {
    uint32_t *tokens; /* [n_tokens] */
    size_t n_tokens;
    uint64_t n_chunks;
    uint8_t *mask;    /* [n_chunks * K], all 1 */
    float *emb;       /* [n_chunks * K * d] */
    int32_t *keys;    /* [n_chunks] the hidden state z_c of each chunk */
} SynthData;

/* The defaults of a mode (the flags' defaults of `dfm-train synth`). */
void synth_config_defaults(SynthConfig *c, SynthMode mode);
/* Parse "topic", "keyed" or "keyed-random". DFM_EARG names the choices. */
int synth_mode_parse(const char *s, SynthMode *mode);
const char *synth_mode_name(SynthMode mode);

/* Check c's ranges (DFM_EARG naming the flag and the fix). */
int synth_config_check(const SynthConfig *c);
/* Generate the corpus of c into *out (free with synth_free). DFM_EARG (see synth_config_check),
 * DFM_ENOMEM. */
int synth_generate(const SynthConfig *c, SynthData *out);
void synth_free(SynthData *s);

/* Write DIR/tokens.bin (llm.c shard), DIR/targets.bin (simple targets file) and DIR/keys.bin (an llm.c
 * shard of the chunks' hidden states, one uint32 per chunk: for analysis, e.g. CE with the key known),
 * creating DIR. */
int synth_write(const char *dir, const SynthConfig *c, const SynthData *s);

#endif
