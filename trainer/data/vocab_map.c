/* vocab_map.c — compact vocabularies (see vocab_map.h). */
#include "trainer/data/vocab_map.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"

#define VMAP_MAGIC "DFMVMAP1"
#define VMAP_HEADER 32
#define VMAP_FILE "vocab_map.bin"

void vocab_map_free(VocabMap *vm) {
    if (!vm) return;
    free(vm->to_source);
    free(vm->to_compact);
    memset(vm, 0, sizeof *vm);
}

/* to_compact from to_source[0, n) */
static int invert(VocabMap *vm) {
    vm->to_compact = malloc((size_t)(vm->source_vocab ? vm->source_vocab : 1) * sizeof(int32_t));
    if (!vm->to_compact) return DFM_FAIL(DFM_ENOMEM, "compact vocabulary of %u ids", vm->source_vocab);
    memset(vm->to_compact, 0xff, (size_t)vm->source_vocab * sizeof(int32_t));
    for (uint32_t i = 0; i < vm->n; i++) vm->to_compact[vm->to_source[i]] = (int32_t)i;
    return DFM_OK;
}

int vocab_map_build(const int *tokens, size_t n, VocabMap *vm) {
    memset(vm, 0, sizeof *vm);
    for (size_t i = 0; i < n; i++)
        if ((uint32_t)tokens[i] + 1 > vm->source_vocab) vm->source_vocab = (uint32_t)tokens[i] + 1;
    uint8_t *used = calloc(vm->source_vocab ? vm->source_vocab : 1, 1);
    if (!used) return DFM_FAIL(DFM_ENOMEM, "compact vocabulary of %u ids", vm->source_vocab);
    for (size_t i = 0; i < n; i++) used[tokens[i]] = 1;
    for (uint32_t t = 0; t < vm->source_vocab; t++) vm->n += used[t];
    vm->to_source = malloc((size_t)(vm->n ? vm->n : 1) * sizeof(uint32_t));
    int rc = vm->to_source ? DFM_OK : DFM_FAIL(DFM_ENOMEM, "compact vocabulary of %u ids", vm->n);
    if (!rc) {
        uint32_t k = 0;
        for (uint32_t t = 0; t < vm->source_vocab; t++)
            if (used[t]) vm->to_source[k++] = t;
        rc = invert(vm);
    }
    free(used);
    if (rc) vocab_map_free(vm);
    return rc;
}

int vocab_map_to_compact(const VocabMap *vm, int *ids, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++) {
        int32_t c = ids[i] >= 0 && (uint32_t)ids[i] < vm->source_vocab ? vm->to_compact[ids[i]] : -1;
        if (c < 0)
            return DFM_FAIL(DFM_EMISMATCH, "%s: token id %d (position %zu) is not in the backbone's compact vocabulary "
                            "of %u ids. HINT: pretrain the backbone on data that holds these tokens, or without "
                            "--compact-vocab", what, ids[i], i, vm->n);
        ids[i] = c;
    }
    return DFM_OK;
}

void vocab_map_to_source(const VocabMap *vm, int *ids, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0 && (uint32_t)ids[i] < vm->n) ids[i] = (int)vm->to_source[ids[i]];
}

/* config.json gains "dfm_vocab_map" */
static int note_in_config(const VocabMap *vm, const char *model_dir) {
    char *cp = dfm_path_join(model_dir, "config.json");
    json_error_t err;
    json_t *cfg = json_load_file(cp, 0, &err);
    int rc = DFM_OK;
    if (!cfg) rc = DFM_FAIL(DFM_EFORMAT, "%s: %s (line %d)", cp, err.text, err.line);
    if (!rc) {
        json_object_set_new(cfg, "dfm_vocab_map",
                            json_pack("{s:s, s:I, s:I, s:s}", "file", VMAP_FILE, "compact_ids", (json_int_t)vm->n,
                                      "source_vocab", (json_int_t)vm->source_vocab, "note",
                                      "token ids are compact: id i is tokenizer id vocab_map.bin[i] (u32 list after a "
                                      "32-byte header); map prompts in and outputs back"));
        char *text = json_dumps(cfg, JSON_INDENT(2) | JSON_SORT_KEYS);
        rc = text ? dfm_write_file_atomic(cp, text, strlen(text)) : DFM_FAIL(DFM_ENOMEM, "%s", cp);
        free(text);
    }
    json_decref(cfg);
    free(cp);
    return rc;
}

int vocab_map_save(const VocabMap *vm, const char *model_dir) {
    size_t pl = (size_t)vm->n * 4;
    uint8_t h[VMAP_HEADER] = {0};
    uint32_t ver = 1;
    uint64_t ck = dfm_checksum64(vm->to_source, pl);
    memcpy(h, VMAP_MAGIC, 8);
    memcpy(h + 8, &ver, 4);
    memcpy(h + 12, &vm->n, 4);
    memcpy(h + 16, &vm->source_vocab, 4);
    memcpy(h + 24, &ck, 8);
    char *p = dfm_path_join(model_dir, VMAP_FILE);
    dfm_atomic_file f = {0};
    int rc = dfm_atomic_open(&f, p);
    if (!rc) rc = dfm_atomic_write(&f, h, sizeof h);
    if (!rc) rc = dfm_atomic_write(&f, vm->to_source, pl);
    if (!rc) rc = dfm_atomic_commit(&f);
    else dfm_atomic_abort(&f);
    free(p);
    return rc ? rc : note_in_config(vm, model_dir);
}

int vocab_map_load(const char *model_dir, VocabMap *vm, int *found) {
    memset(vm, 0, sizeof *vm);
    *found = 0;
    char *p = dfm_path_join(model_dir, VMAP_FILE);
    if (!dfm_path_exists(p)) {
        free(p);
        return DFM_OK;
    }
    char *buf = NULL;
    size_t len = 0;
    int rc = dfm_read_file(p, &buf, &len);
    uint32_t ver = 0;
    uint64_t ck = 0;
    if (!rc && (len < VMAP_HEADER || memcmp(buf, VMAP_MAGIC, 8)))
        rc = DFM_FAIL(DFM_EFORMAT, "%s is not a vocabulary map (magic %s)", p, VMAP_MAGIC);
    if (!rc) {
        memcpy(&ver, buf + 8, 4);
        memcpy(&vm->n, buf + 12, 4);
        memcpy(&vm->source_vocab, buf + 16, 4);
        memcpy(&ck, buf + 24, 8);
        if (ver != 1) rc = DFM_FAIL(DFM_EVERSION, "%s: version %u (1 known)", p, ver);
    }
    if (!rc && len != VMAP_HEADER + (size_t)vm->n * 4)
        rc = DFM_FAIL(DFM_ETRUNCATED, "%s: %zu bytes, the header says %zu", p, len, VMAP_HEADER + (size_t)vm->n * 4);
    if (!rc && dfm_checksum64(buf + VMAP_HEADER, (size_t)vm->n * 4) != ck)
        rc = DFM_FAIL(DFM_ECHECKSUM, "%s: payload checksum mismatch (file corrupt)", p);
    if (!rc && !(vm->to_source = malloc((size_t)(vm->n ? vm->n : 1) * 4))) rc = DFM_FAIL(DFM_ENOMEM, "%s", p);
    if (!rc) {
        memcpy(vm->to_source, buf + VMAP_HEADER, (size_t)vm->n * 4);
        for (uint32_t i = 0; i < vm->n && !rc; i++)
            if (vm->to_source[i] >= vm->source_vocab || (i && vm->to_source[i] <= vm->to_source[i - 1]))
                rc = DFM_FAIL(DFM_EFORMAT, "%s: ids must increase strictly below %u (entry %u)", p, vm->source_vocab, i);
    }
    if (!rc) rc = invert(vm);
    free(buf);
    free(p);
    if (rc) vocab_map_free(vm);
    else *found = 1;
    return rc;
}

int vocab_map_compact_data(DataSet *ds, VocabMap *vm) {
    DFM_TRY(vocab_map_build(ds->tokens, ds->n_tokens, vm));
    int rc = vocab_map_to_compact(vm, ds->tokens, ds->n_tokens, "data");
    if (rc) return rc;
    DFM_LOG_I("compact vocabulary: %u distinct ids of %u (largest id + 1)", vm->n, vm->source_vocab);
    ds->max_token = vm->n ? vm->n - 1 : 0;
    return DFM_OK;
}

int vocab_map_apply_backbone(const char *model_dir, DataSet *ds) {
    VocabMap vm;
    int found;
    DFM_TRY(vocab_map_load(model_dir, &vm, &found));
    if (!found) return DFM_OK;
    int rc = vocab_map_to_compact(&vm, ds->tokens, ds->n_tokens, "data");
    if (!rc) {
        DFM_LOG_I("tokens mapped to the backbone's compact vocabulary of %u ids", vm.n);
        ds->max_token = 0;
        for (size_t i = 0; i < ds->n_tokens; i++)
            if ((uint32_t)ds->tokens[i] > ds->max_token) ds->max_token = (uint32_t)ds->tokens[i];
    }
    vocab_map_free(&vm);
    return rc;
}
