/* generate.c — greedy decoding with memory predicted from the prompt (see generate.h). */
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "trainer/run/generate.h"

int generate_greedy(DfmModel *m, int *seq, int n, int total, int T, int no_memory) {
    int L = m->dc.chunk_len, NC = T / L, K = m->dc.n_slots, d = m->dc.d_mem;
    int *tg = calloc(T, sizeof(int));
    float *mem = calloc((size_t)NC * K * d, sizeof(float));
    uint8_t *mask = calloc((size_t)NC * K, 1);
    float *logits = malloc((size_t)m->bc.vocab_size * sizeof(float));
    /* memory from the prompt: chunk c <= np is predicted from the prompt's chunk c-1; later chunks keep
     * the prediction of chunk np */
    int npc = n / L;
    int rc = model_forward(m, seq, tg, NULL, NULL, 1, T, MEM_PREDICTED, 0, 1.0f);
    for (int c = 0; c < NC && !rc; c++) {
        int src = c <= npc ? c : npc;
        memcpy(mem + (size_t)c * K * d, m->slots + (size_t)src * K * d, (size_t)K * d * sizeof(float));
        memset(mask + (size_t)c * K, (c > 0 || m->dc.fuse_first_chunk) ? 1 : 0, K);
    }
    for (int i = n; i < total && !rc; i++) {
        rc = model_forward(m, seq, tg, mem, mask, 1, T, no_memory ? MEM_NONE : MEM_TARGET, 0, 1.0f);
        if (rc) break;
        model_logits_row(m, i - 1, logits);
        int best = 0;
        for (int v = 1; v < m->bc.vocab_size; v++)
            if (logits[v] > logits[best]) best = v;
        seq[i] = best;
    }
    free(tg), free(mem), free(mask), free(logits);
    return rc;
}
