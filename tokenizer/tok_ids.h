/* tok_ids.h — the growable id buffer that dfm_tokenizer_encode appends to (part of tokenizer.h's interface;
 * tok_ids.c). */
#ifndef DFM_TOK_IDS_H
#define DFM_TOK_IDS_H

#include <stddef.h>
#include <stdint.h>

/* Growable id buffer; zero-initialise, free with dfm_ids_free. */
typedef struct {
    uint32_t *ids;
    size_t n, cap;
} dfm_ids;

void dfm_ids_free(dfm_ids *v);
int dfm_ids_push(dfm_ids *v, uint32_t id);

#endif
