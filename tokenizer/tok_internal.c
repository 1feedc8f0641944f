/* tok_internal.c — what the tok_*.c parsers share while a tokenizer.json loads (failures naming the file, the
 * JSON member readers, a Replace component's pattern) and the encoder context's release (see tok_internal.h). */
#include "tokenizer/tok_internal.h"

#include "common/error.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

int dfm_tok_fail_in(const dfm_load_ctx *lc, const char *src, int line, int code, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return dfm_fail_at(src, line, code, "%s: %s", lc->file, msg);
}

const char *dfm_jstr(const void *obj, const char *key, size_t *len) {
    json_t *v = json_object_get((const json_t *)obj, key);
    if (!json_is_string(v)) return NULL;
    if (len) *len = json_string_length(v);
    return json_string_value(v);
}

int dfm_jbool(const dfm_load_ctx *lc, const void *obj, const char *key, int def, const char *where, int *out) {
    json_t *v = json_object_get((const json_t *)obj, key);
    if (!v || json_is_null(v)) *out = def;
    else if (json_is_boolean(v)) *out = json_is_true(v);
    else return DFM_LFAIL(lc, DFM_EFORMAT, "%s.%s: not true/false", where, key);
    return DFM_OK;
}

int dfm_jsequence(const dfm_load_ctx *lc, dfm_tokenizer *tok, json_t *seq, const char *key, const char *where, dfm_component_parser parse) {
    json_t *arr = json_object_get(seq, key);
    if (!json_is_array(arr)) return DFM_LFAIL(lc, DFM_EFORMAT, "%s.%s is not an array", where, key);
    for (size_t i = 0; i < json_array_size(arr); i++) {
        char sub[256];
        snprintf(sub, sizeof sub, "%s.%s[%zu]", where, key, i);
        json_t *x = json_array_get(arr, i);
        if (!json_is_object(x)) return DFM_LFAIL(lc, DFM_EFORMAT, "%s is not an object", sub);
        DFM_TRY(parse(lc, tok, x, sub));
    }
    return DFM_OK;
}

int dfm_jchar(const dfm_load_ctx *lc, const void *obj, const char *key, const char *where, uint32_t *out) {
    size_t n;
    const char *s = dfm_jstr(obj, key, &n);
    uint32_t cp = 0;
    if (!s || !n || (size_t)dfm_utf8_next((const uint8_t *)s, n, &cp) != n)
        return DFM_LFAIL(lc, DFM_EFORMAT, "%s.%s: missing or not a single character", where, key);
    *out = cp;
    return DFM_OK;
}

int dfm_jreplace(const dfm_load_ctx *lc, const void *obj, const char *where, char **a, size_t *alen, char **b, size_t *blen,
                 dfm_regex **re) {
    json_t *pat = json_object_get((const json_t *)obj, "pattern");
    size_t sl = 0, rl = 0, cl = 0;
    const char *s = dfm_jstr(pat, "String", &sl), *rx = dfm_jstr(pat, "Regex", &rl), *to = dfm_jstr(obj, "content", &cl);
    if ((!s && !rx) || !to)
        return DFM_LFAIL(lc, DFM_EFORMAT, "%s: Replace needs a pattern {\"String\": ...} or {\"Regex\": ...} and a "
                         "string \"content\"", where);
    if (!(*b = dfm_tok_dupn(to, cl))) return DFM_FAIL(DFM_ENOMEM, "no memory");
    *blen = cl;
    if (s && sl) { /* a literal: matched with memmem (what the escaped regex would match) */
        if (!(*a = dfm_tok_dupn(s, sl))) return DFM_FAIL(DFM_ENOMEM, "no memory");
        *alen = sl;
        return DFM_OK;
    }
    char w[300];
    snprintf(w, sizeof w, "%s.pattern", where);
    int rc = dfm_regex_compile(s ? s : rx, s ? sl : rl, s != NULL, w, re);
    if (rc) dfm_error_prefix("%s", lc->file);
    return rc;
}

void dfm_enc_ctx_free(dfm_enc_ctx *c) {
    dfm_regex_scratch_free(&c->rx);
    free(c->norm.p), free(c->tmp.p), free(c->tmp2.p), free(c->word.p), free(c->word2.p);
    for (int i = 0; i < DFM_TOK_PRE_MAX; i++) free(c->stage_in[i].p), free(c->stage_out[i].p);
    free(c->sym), free(c->heap), free(c->vscore), free(c->vstart), free(c->vid), free(c->tmp_ids);
}
