/* tok_ids.c — the growable id buffer of the tokenizer's interface (see tok_ids.h). */
#include "tokenizer/tok_ids.h"

#include "common/error.h"

#include <stdlib.h>

void dfm_ids_free(dfm_ids *v) {
    if (!v) return;
    free(v->ids);
    v->ids = NULL;
    v->n = v->cap = 0;
}

int dfm_ids_push(dfm_ids *v, uint32_t id) {
    if (v->n == v->cap) {
        size_t c = v->cap ? v->cap * 2 : 64;
        uint32_t *p = realloc(v->ids, c * sizeof *p);
        if (!p) return DFM_FAIL(DFM_ENOMEM, "no memory for %zu token ids", c);
        v->ids = p;
        v->cap = c;
    }
    v->ids[v->n++] = id;
    return DFM_OK;
}
