/* `dfm chunk-dump RUN` — print a run's chunks in id order, for people and for rank-count checks.
 *
 *   <chunk id> seq=<sequence> docs=<first>-<last> valid=<n_valid> flags=<S|D> : <token ids>
 * With --text, the decoded text of the valid tokens follows on the next line (JSON-escaped). */
#include "common/error.h"
#include "common/manifest.h"
#include "common/opts.h"
#include "schemas/chunk_shard.h"
#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int dfm_cmd_chunk_dump(int argc, char **argv) {
    char *tokpath = NULL;
    int text = 0;
    int64_t first = 0, count = -1;
    dfm_opt table[] = {
        {"text", DFM_OPT_FLAG, &text, NULL, NULL, "also print each chunk's decoded text", 0},
        {"tokenizer", DFM_OPT_STR, &tokpath, NULL, "FILE", "tokenizer for --text (default: the one the run used)", 0},
        {"first", DFM_OPT_INT, &first, "0", "ID", "first chunk to print", 0, .min = "0"},
        {"count", DFM_OPT_INT, &count, "-1", "N", "number of chunks (-1: all)", 0, .min = "-1"},
        {0},
    };
    char **pos = NULL;
    int npos = 0;
    int rc = dfm_opts_parse("chunk-dump", "RUN", "Print the chunks of RUN in chunk-id order.", table, argc, argv, &pos, &npos, NULL);
    if (rc == DFM_OPTS_HELP) return 0;
    dfm_chunk_set *set = NULL;
    dfm_tokenizer *tok = NULL;
    if (!rc && npos != 1) rc = DFM_FAIL(DFM_EARG, "usage: dfm chunk-dump RUN");
    if (!rc) rc = dfm_chunk_set_open(pos[0], &set);
    if (!rc && text) {
        if (!tokpath) { /* the tokenizer recorded by the chunk stage */
            json_t *m = NULL;
            rc = dfm_manifest_load(pos[0], 0, &m);
            const char *p = rc ? NULL : json_string_value(json_object_get(json_object_get(dfm_manifest_stage(m, "chunk"), "tokenizer"), "path"));
            if (!rc && p) tokpath = strdup(p);
            json_decref(m);
        }
        if (!rc) rc = tokpath ? dfm_tokenizer_load(tokpath, &tok) : DFM_FAIL(DFM_EARG, "--text needs --tokenizer");
    }
    uint64_t end = set ? set->n_chunks : 0;
    if (count >= 0 && (uint64_t)(first + count) < end) end = (uint64_t)(first + count);
    uint32_t per_seq = set ? set->seq_len / set->chunk_len : 1;
    for (uint64_t id = (uint64_t)first; !rc && id < end; id++) {
        const dfm_chunk_meta *mt;
        const uint32_t *t;
        rc = dfm_chunk_set_get(set, id, &mt, &t);
        if (rc) break;
        printf("%llu seq=%llu docs=%llu-%llu valid=%u flags=%s%s :", (unsigned long long)id, (unsigned long long)(id / per_seq),
               (unsigned long long)mt->doc_first, (unsigned long long)mt->doc_last, mt->n_valid,
               (mt->flags & DFM_CHUNK_SEQ_START) ? "S" : "-", (mt->flags & DFM_CHUNK_DOC_START) ? "D" : "-");
        for (uint32_t j = 0; j < set->chunk_len; j++) printf(" %u", t[j]);
        printf("\n");
        if (tok) {
            char *s = NULL;
            size_t n = 0;
            rc = dfm_tokenizer_decode(tok, t, mt->n_valid, 0, &s, &n);
            if (!rc) {
                json_t *js = json_stringn(s, n);
                char *esc = json_dumps(js, JSON_ENCODE_ANY);
                printf("  %s\n", esc ? esc : "\"\"");
                free(esc);
                json_decref(js);
            }
            free(s);
        }
    }
    dfm_chunk_set_close(set);
    dfm_tokenizer_free(tok);
    free(pos);
    dfm_opts_free(table);
    return rc;
}
