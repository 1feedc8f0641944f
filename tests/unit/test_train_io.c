/* Trainer I/O: a saved Hugging Face backbone reloads to bit-identical logits; DFM modules round-trip;
 * checkpoints and targets files round-trip and refuse corruption; configs of other architectures and
 * bad fusion layers are refused; the loader is deterministic. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "common/fsutil.h"
#include "trainer/model/checkpoint.h"
#include "trainer/data/data.h"
#include "trainer/lm/hf_model.h"
#include "trainer/model/model_config.h"
#include "trainer/kernels/rng.h"

static char tmpdir[256];

static int setup(void **state) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dfm-test-train-io-XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    return 0;
}
static int teardown(void **state) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd);
}

static void tiny(BackboneConfig *bc, DfmConfig *dc, int tie, const char *arch) {
    memset(bc, 0, sizeof *bc);
    snprintf(bc->arch, sizeof bc->arch, "%s", arch);
    bc->vocab_size = 61;
    bc->max_seq = 16;
    bc->tie_embeddings = tie;
    bc->dec = (StackConfig){.n_layers = 2, .hidden = 16, .n_heads = 4, .n_kv_heads = 2, .head_dim = 4, .ffn = 24,
                            .qk_norm = !strcmp(arch, "Qwen3ForCausalLM"), .eps = 1e-6f, .rope_theta = 10000.0f};
    dfm_config_defaults(dc, bc);
    dc->chunk_len = 4;
    dc->n_slots = 2;
    dc->d_mem = 8;
    dc->pred = (StackConfig){.n_layers = 1, .hidden = 8, .n_heads = 2, .n_kv_heads = 2, .head_dim = 4, .ffn = 16,
                             .eps = 1e-6f, .rope_theta = 10000.0f};
    dc->proj_hidden = 12;
    dc->n_fusion = 1;
    dc->fusion_layers[0] = 1;
    dc->xattn_heads = 2;
}

static void test_backbone_roundtrip_logits(void **state) {
    for (int variant = 0; variant < 2; variant++) {
        BackboneConfig bc;
        DfmConfig dc;
        tiny(&bc, &dc, variant == 0, variant == 0 ? "Qwen3ForCausalLM" : "LlamaForCausalLM");
        dc.enabled = 0;
        DfmModel *a, *b;
        assert_int_equal(model_create(&bc, &dc, 2, 16, &a), 0);
        model_init_backbone_random(a, 3 + variant);
        char dir[300];
        snprintf(dir, sizeof dir, "%s/model%d", tmpdir, variant);
        assert_int_equal(hf_save_backbone(a, dir), 0);
        BackboneConfig bc2;
        memset(&bc2, 0, sizeof bc2);
        bc2.max_seq = 16;
        assert_int_equal(hf_read_config(dir, &bc2), 0);
        assert_string_equal(bc2.arch, bc.arch);
        assert_int_equal(bc2.tie_embeddings, bc.tie_embeddings);
        assert_int_equal(bc2.dec.qk_norm, bc.dec.qk_norm);
        assert_int_equal(model_create(&bc2, &dc, 2, 16, &b), 0);
        assert_int_equal(hf_load_backbone(b, dir), 0);
        int tok[32], tgt[32];
        for (int i = 0; i < 32; i++) tok[i] = (i * 7) % 61, tgt[i] = (i * 5 + 1) % 61;
        assert_int_equal(model_forward(a, tok, tgt, NULL, NULL, 2, 16, MEM_NONE, 0, 1.0f), 0);
        assert_int_equal(model_forward(b, tok, tgt, NULL, NULL, 2, 16, MEM_NONE, 0, 1.0f), 0);
        float la[61], lb[61];
        for (int r = 0; r < 32; r++) {
            model_logits_row(a, r, la);
            model_logits_row(b, r, lb);
            assert_memory_equal(la, lb, sizeof la); /* bit-identical */
        }
        assert_true(a->ce == b->ce);
        model_free(a);
        model_free(b);
    }
}

static void test_modules_roundtrip(void **state) {
    BackboneConfig bc;
    DfmConfig dc;
    tiny(&bc, &dc, 1, "Qwen3ForCausalLM");
    DfmModel *a, *b;
    assert_int_equal(model_create(&bc, &dc, 1, 16, &a), 0);
    assert_int_equal(model_create(&bc, &dc, 1, 16, &b), 0);
    model_init_dfm_random(a, 9);
    char path[300];
    snprintf(path, sizeof path, "%s/mods.safetensors", tmpdir);
    assert_int_equal(dfm_modules_save(a, path), 0);
    assert_int_equal(dfm_modules_load(b, path), 0);
    assert_memory_equal(a->dfm_memory, b->dfm_memory, a->dfm_num * sizeof(float));
    /* gate starts at zero weight, bias = gate_bias */
    for (size_t i = 0; i < (size_t)dc.xattn_heads * 16; i++) assert_true(a->dp.fu_wg[i] == 0.0f);
    model_free(b);
    dc.d_mem = 6; /* another shape is refused */
    assert_int_equal(model_create(&bc, &dc, 1, 16, &b), 0);
    assert_int_equal(dfm_modules_load(b, path), DFM_EMISMATCH);
    model_free(a);
    model_free(b);
}

static void test_checkpoint(void **state) {
    float p[10], m[10], v[10], p2[10], m2[10], v2[10];
    for (int i = 0; i < 10; i++) p[i] = i * 0.5f, m[i] = -i, v[i] = i * i;
    CkptInfo ci = {.mode = 1, .step = 42, .epoch = 3, .pos = 7, .n_params = 10};
    char path[300];
    snprintf(path, sizeof path, "%s/ck.bin", tmpdir);
    json_t *cfg = json_pack("{s:i}", "x", 1);
    assert_int_equal(ckpt_save(path, &ci, cfg, p, m, v), 0);
    json_decref(cfg);
    CkptInfo c2;
    json_t *back = NULL;
    assert_int_equal(ckpt_load(path, &c2, &back, p2, m2, v2, 10), 0);
    assert_int_equal(c2.step, 42);
    assert_int_equal(c2.epoch, 3);
    assert_int_equal(c2.pos, 7);
    assert_int_equal(json_integer_value(json_object_get(back, "x")), 1);
    json_decref(back);
    assert_memory_equal(p, p2, sizeof p);
    assert_memory_equal(v, v2, sizeof v);
    assert_int_equal(ckpt_load(path, &c2, NULL, p2, m2, v2, 9), DFM_EMISMATCH);
    /* flip one byte of the payload */
    FILE *f = fopen(path, "r+b");
    fseek(f, 70, SEEK_SET);
    int c = fgetc(f);
    fseek(f, 70, SEEK_SET);
    fputc(c ^ 1, f);
    fclose(f);
    assert_int_equal(ckpt_load(path, &c2, NULL, p2, m2, v2, 10), DFM_ECHECKSUM);
    assert_non_null(strstr(dfm_last_error(), "ck.bin"));
}

static void test_targets_file_and_loader(void **state) {
    char tp[300], kp[300];
    snprintf(tp, sizeof tp, "%s/tok.bin", tmpdir);
    snprintf(kp, sizeof kp, "%s/tgt.bin", tmpdir);
    uint32_t tok[8 * 5 + 4];
    for (int i = 0; i < 44; i++) tok[i] = i % 13;
    assert_int_equal(tokens_bin_write(tp, tok, 44), 0);
    uint8_t mask[11 * 2];
    float emb[11 * 2 * 3];
    for (int i = 0; i < 22; i++) mask[i] = i % 3 != 0;
    for (int i = 0; i < 66; i++) emb[i] = (float)i;
    assert_int_equal(targets_file_write(kp, 2, 3, 4, 11, mask, emb), 0);
    DataSet ds;
    assert_int_equal(data_open(tp, 8, &ds), 0);
    assert_int_equal(ds.n_seq, 5);
    assert_int_equal(data_open_targets(&ds, kp, NULL, 8, 0, 0), DFM_EMISMATCH); /* wrong chunk length */
    data_close(&ds);
    assert_int_equal(data_open(tp, 8, &ds), 0);
    assert_int_equal(data_open_targets(&ds, kp, NULL, 4, 2, 3), 0);
    size_t idx[2] = {1, 3};
    int in[16], tg[16];
    float tm[2 * 2 * 2 * 3];
    uint8_t mk[8];
    assert_int_equal(data_batch(&ds, idx, 2, 4, in, tg, tm, mk), 0);
    assert_int_equal(in[0], 8);
    assert_int_equal(tg[0], 9);
    assert_int_equal(mk[0] + mk[1], 0);             /* chunk 0 of a sequence: no target */
    assert_int_equal(mk[2], mask[(1 * 2 + 1) * 2]); /* sequence 1, chunk 1 = chunk 3 */
    assert_true(tm[2 * 3] == emb[(1 * 2 + 1) * 2 * 3]);
    data_close(&ds);
    /* corrupt the targets payload */
    FILE *f = fopen(kp, "r+b");
    fseek(f, 80, SEEK_SET);
    fputc(0x7f, f);
    fclose(f);
    assert_int_equal(data_open(tp, 8, &ds), 0);
    assert_int_equal(data_open_targets(&ds, kp, NULL, 4, 0, 0), DFM_ECHECKSUM);
    data_close(&ds);
    /* a non-finite target vector (with a valid checksum) is refused, naming the chunk */
    emb[(5 * 2 + 1) * 3 + 2] = NAN;
    assert_int_equal(targets_file_write(kp, 2, 3, 4, 11, mask, emb), 0);
    assert_int_equal(data_open(tp, 8, &ds), 0);
    assert_int_equal(data_open_targets(&ds, kp, NULL, 4, 0, 0), DFM_EFORMAT);
    assert_non_null(strstr(dfm_last_error(), "chunk 5 (slot 1)"));
    data_close(&ds);
    /* a chunk count whose payload wraps around 2^64 is refused, not trusted */
    emb[(5 * 2 + 1) * 3 + 2] = 1.0f;
    assert_int_equal(targets_file_write(kp, 2, 3, 4, 11, mask, emb), 0);
    f = fopen(kp, "r+b");
    uint64_t huge = (1ull << 63) / 13 * 2 + 11; /* n * 2 * (1 + 4*3) wraps to a small number */
    fseek(f, 24, SEEK_SET);
    fwrite(&huge, 8, 1, f);
    fclose(f);
    assert_int_equal(data_open(tp, 8, &ds), 0);
    assert_int_equal(data_open_targets(&ds, kp, NULL, 4, 0, 0), DFM_ETRUNCATED);
    data_close(&ds);
    /* loader: same seed, same order; seek reproduces the stream */
    Loader a, b;
    assert_int_equal(loader_init(&a, 0, 7, 5, 1), 0);
    assert_int_equal(loader_init(&b, 0, 7, 5, 1), 0);
    size_t x[10], y[10];
    loader_next(&a, 10, x);
    loader_seek(&b, 0, 3);
    loader_next(&b, 7, y);
    assert_memory_equal(x + 10 - 7, y, 7 * sizeof(size_t));
    loader_free(&a);
    loader_free(&b);
}

static void test_config_refusals(void **state) {
    json_t *j = json_pack("{s:[s], s:i, s:i, s:i, s:i, s:i}", "architectures", "GPT2LMHeadModel", "vocab_size", 10,
                          "hidden_size", 8, "intermediate_size", 8, "num_hidden_layers", 1, "num_attention_heads", 2);
    BackboneConfig bc;
    memset(&bc, 0, sizeof bc);
    assert_int_equal(backbone_config_from_hf(j, &bc), DFM_EUNSUPPORTED);
    assert_non_null(strstr(dfm_last_error(), "GPT2LMHeadModel"));
    json_decref(j);
    /* numbers are range-checked before they are narrowed: hidden_size 2^32+32 is not read as 32 */
    j = json_pack("{s:[s], s:i, s:I, s:i, s:i, s:i}", "architectures", "LlamaForCausalLM", "vocab_size", 10,
                  "hidden_size", (json_int_t)4294967328LL, "intermediate_size", 8, "num_hidden_layers", 1,
                  "num_attention_heads", 2);
    assert_int_equal(backbone_config_from_hf(j, &bc), DFM_ERANGE);
    assert_non_null(strstr(dfm_last_error(), "hidden_size"));
    assert_non_null(strstr(dfm_last_error(), "4294967328"));
    json_object_set_new(j, "hidden_size", json_integer(8));
    json_object_set_new(j, "rms_norm_eps", json_real(-1));
    assert_int_equal(backbone_config_from_hf(j, &bc), DFM_ERANGE);
    assert_non_null(strstr(dfm_last_error(), "rms_norm_eps"));
    json_object_set_new(j, "rms_norm_eps", json_real(1e-6));
    json_object_set_new(j, "num_key_value_heads", json_integer(3));
    assert_int_not_equal(backbone_config_from_hf(j, &bc), DFM_OK);
    json_decref(j);
    /* a vocabulary that the folder's weights cannot hold is refused before any allocation, with the right hint */
    char src[300], dir[300], cmd[900];
    snprintf(src, sizeof src, "%s/model0", tmpdir);
    snprintf(dir, sizeof dir, "%s/bigvocab", tmpdir);
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/model.safetensors %s/", dir, src, dir);
    assert_int_equal(system(cmd), 0);
    char cfgp[400];
    snprintf(cfgp, sizeof cfgp, "%s/config.json", src);
    json_error_t je;
    j = json_load_file(cfgp, 0, &je);
    assert_non_null(j);
    json_object_set_new(j, "vocab_size", json_integer(1 << 24));
    snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
    assert_int_equal(json_dump_file(j, cfgp, 0), 0);
    json_decref(j);
    memset(&bc, 0, sizeof bc);
    bc.max_seq = 16;
    assert_int_equal(hf_read_config(dir, &bc), DFM_EFORMAT);
    assert_non_null(strstr(dfm_last_error(), "do not belong together"));
    DfmConfig dc;
    BackboneConfig b2;
    tiny(&b2, &dc, 1, "Qwen3ForCausalLM");
    assert_int_equal(dfm_parse_fusion_layers("1,x", &dc), DFM_EARG);
    assert_int_equal(dfm_parse_fusion_layers("1,0", &dc), 0);
    assert_int_equal(model_config_check(&b2, &dc), DFM_EARG); /* not ascending */
    assert_int_equal(dfm_parse_fusion_layers("5", &dc), 0);
    assert_int_equal(model_config_check(&b2, &dc), DFM_EARG); /* beyond the last layer */
    /* DFM config JSON round trip */
    tiny(&b2, &dc, 1, "Qwen3ForCausalLM");
    json_t *dj = dfm_config_to_json(&dc);
    DfmConfig d2;
    assert_int_equal(dfm_config_from_json(dj, &d2), 0);
    json_decref(dj);
    assert_int_equal(d2.n_slots, dc.n_slots);
    assert_int_equal(d2.fusion_layers[0], dc.fusion_layers[0]);
    assert_int_equal(d2.pred.n_layers, dc.pred.n_layers);
    assert_int_equal(d2.mem_align, dc.mem_align);
    assert_int_equal(d2.fusion_memory, dc.fusion_memory);
    assert_true(d2.tf_prob == dc.tf_prob);
    assert_int_equal(d2.pred_loss, dc.pred_loss);
    /* the training choices: parsed from the flag; a configuration written before they existed loads as the old
     * alignment, predicted memory and the per-element MSE */
    assert_int_equal(dfm_parse_fusion_memory("mixed:0.25:decay", &d2), 0);
    assert_true(d2.fusion_memory == FUSION_MEM_MIXED && d2.tf_prob == 0.25f && d2.tf_decay == 1);
    assert_int_equal(dfm_parse_fusion_memory("mixed:1.5", &d2), DFM_EARG);
    assert_int_equal(dfm_parse_fusion_memory("mixed:", &d2), DFM_EARG);
    assert_int_equal(dfm_parse_fusion_memory("target", &d2), 0);
    assert_int_equal(d2.fusion_memory, FUSION_MEM_TARGET);
    dj = dfm_config_to_json(&dc);
    json_object_del(dj, "memory_align");
    json_object_del(dj, "fusion_memory");
    json_object_del(dj, "pred_loss");
    assert_int_equal(dfm_config_from_json(dj, &d2), 0);
    json_decref(dj);
    assert_int_equal(d2.mem_align, MEM_ALIGN_SAME);
    assert_int_equal(d2.fusion_memory, FUSION_MEM_PREDICTED);
    assert_int_equal(d2.pred_loss, PRED_LOSS_MSE_ELEM);
    /* default fusion layers of a 32-layer model are the paper's 9,16,24,31 */
    b2.dec.n_layers = 32;
    dfm_config_defaults(&dc, &b2);
    assert_int_equal(dc.n_fusion, 4);
    assert_int_equal(dc.fusion_layers[0], 9);
    assert_int_equal(dc.fusion_layers[1], 16);
    assert_int_equal(dc.fusion_layers[2], 24);
    assert_int_equal(dc.fusion_layers[3], 31);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backbone_roundtrip_logits), cmocka_unit_test(test_modules_roundtrip),
        cmocka_unit_test(test_checkpoint),                cmocka_unit_test(test_targets_file_and_loader),
        cmocka_unit_test(test_config_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
