/* pack.h — the arithmetic of packing documents into sequences and chunks (pure functions).
 *
 * The corpus becomes one global token stream: each text document's tokens followed by EOS
 * (pretokenized input passes verbatim). With --doc-aligned, each document (including its EOS) is
 * padded with pad tokens to a multiple of L. Training sequence s covers stream positions
 * [sS, (s+1)S); chunk c covers [cL, (c+1)L). The last sequence is padded to S; padding is masked
 * (a chunk's n_valid counts its tokens before padding; padding only ever ends a chunk).
 *
 * Under MPI, rank r tokenizes a contiguous part [off_r, off_r + n_r) of the stream and owns the
 * sequences whose first position lies in that part. The tokens before its first sequence start
 * (its "head") belong to the sequence owned by an earlier rank and are sent there.
 *
 * In memory, stream tokens carry two flag bits above the id (ids must be < 2^30).
 */
#ifndef DFM_PACK_H
#define DFM_PACK_H

#include <stdint.h>

#define DFM_TOK_PAD 0x80000000u      /* padding position (masked) */
#define DFM_TOK_DOCSTART 0x40000000u /* first token of a document */
#define DFM_TOK_ID_MASK 0x3FFFFFFFu

static inline uint64_t dfm_ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

/* Sequence-aligned part [*begin, *end) of the stream owned by a rank holding [off, off+n): the
 * sequences whose first position is in that part. Empty (begin == end) if none starts there. */
static inline void dfm_pack_owned(uint64_t off, uint64_t n, uint64_t S, uint64_t *begin, uint64_t *end) {
    *begin = dfm_ceil_div(off, S) * S;
    *end = dfm_ceil_div(off + n, S) * S;
    if (*end < *begin) *end = *begin;
}

/* Length of the head of [off, off+n): positions before the first sequence start. */
static inline uint64_t dfm_pack_head(uint64_t off, uint64_t n, uint64_t S) {
    uint64_t first = dfm_ceil_div(off, S) * S;
    uint64_t h = first - off;
    return h < n ? h : n;
}

/* Index of the rank owning sequence s, given every rank's (off, n); -1 if none (a bug). */
int dfm_pack_owner(const uint64_t *off, const uint64_t *n, int size, uint64_t S, uint64_t seq);

/* Number of pad tokens needed after a document of len tokens (incl. EOS) in doc-aligned mode. */
static inline uint64_t dfm_pack_doc_pad(uint64_t len, uint64_t L) { return (L - len % L) % L; }

#endif
