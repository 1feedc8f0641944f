/* train_cmd.c — `dfm-train pretrain` (a small decoder from scratch, saved as a Hugging Face folder) and
 * `dfm-train train` (the DFM modules on a frozen backbone): flags, data and model set-up, then the
 * training loop of train_loop.h. */
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/opts.h"
#include "trainer/cmd/commands.h"
#include "trainer/lm/hf_model.h"
#include "trainer/run/model_setup.h"
#include "trainer/run/train_loop.h"
#include "trainer/data/vocab_map.h"

int cmd_pretrain(int argc, char **argv) {
    TrainOpts o;
    memset(&o, 0, sizeof o);
    int compact = 0;
    dfm_opt opts[] = {
        TRAIN_OPTS_COMMON(&o),
        {"compact-vocab", DFM_OPT_FLAG, &compact, NULL, NULL, "train on the ids the data uses, numbered densely; the map is saved as OUT/model/vocab_map.bin (trainer/data/vocab_map.h)", 0},
        {"arch", DFM_OPT_STR, &o.arch, "qwen3", "NAME", "qwen3 (QK-norm) or llama", 0, .choices = "qwen3|llama"},
        {"layers", DFM_OPT_INT, &o.layers, "4", "N", "decoder layers", 0},
        {"hidden", DFM_OPT_INT, &o.hidden, "128", "C", "hidden size", 0},
        {"heads", DFM_OPT_INT, &o.heads, "4", "N", "attention heads", 0},
        {"kv-heads", DFM_OPT_INT, &o.kv_heads, "2", "N", "key/value heads (grouped-query)", 0},
        {"head-dim", DFM_OPT_INT, &o.head_dim, "0", "N", "head size (0 = hidden / heads)", 0},
        {"ffn", DFM_OPT_INT, &o.ffn, "0", "F", "SwiGLU width (0 = 3 * hidden)", 0},
        {"vocab", DFM_OPT_INT, &o.vocab, "0", "V", "vocabulary (0 = largest token id + 1, rounded up to 64)", 0},
        {"untied", DFM_OPT_FLAG, &o.untied, NULL, NULL, "separate LM head (default: tied to the embedding)", 0},
        {0},
    };
    int rc = dfm_opts_parse("pretrain", "--data TOKENS --out DIR [options]",
                            "Trains a small Llama/Qwen3-family decoder from scratch and saves it as a Hugging Face "
                            "folder OUT/model (config.json + model.safetensors) to serve as DFM's frozen backbone.",
                            opts, argc, argv, NULL, NULL, NULL);
    if (rc == DFM_OPTS_HELP) return 0; /* the parser freed the options */
    DataSet ds;
    memset(&ds, 0, sizeof ds);
    DfmModel *m = NULL;
    BackboneConfig bc;
    VocabMap vm = {0};
    int rank = 0;
    if (!rc && !o.data) rc = DFM_FAIL(DFM_EARG, "--data is required");
    if (!rc) train_set_threads(o.threads);
    if (!rc) rc = dfm_mkdir_p(o.out);
    if (!rc) rc = data_open(o.data, (int)o.seq_len, &ds);
    if (!rc && compact) rc = vocab_map_compact_data(&ds, &vm);
    if (!rc && compact && !o.vocab) o.vocab = vm.n; /* exactly the ids used: no row that maps back to nothing */
    if (!rc) rc = setup_pretrain_config(&o, &ds, &bc);
    if (!rc) {
        DfmConfig dc;
        memset(&dc, 0, sizeof dc);
        rc = model_create_ex(&bc, &dc, (int)o.batch, (int)o.seq_len, strcmp(o.device, "cuda") != 0, &m);
    }
    if (!rc) {
        model_init_backbone_random(m, (uint64_t)o.seed);
        DFM_LOG_I("backbone %s: %d layers, hidden %d, heads %d/%d, ffn %d, vocab %d, %zu parameters", bc.arch,
                  bc.dec.n_layers, bc.dec.hidden, bc.dec.n_heads, bc.dec.n_kv_heads, bc.dec.ffn, bc.vocab_size,
                  m->bb_num);
        rc = train_loop(m, &ds, &o, &rank);
    }
    if (!rc && rank == 0) {
        char *dir = dfm_path_join(o.out, "model");
        rc = hf_save_backbone(m, dir);
        if (!rc && compact) rc = vocab_map_save(&vm, dir);
        if (!rc) DFM_LOG_I("saved the backbone as a Hugging Face folder: %s", dir);
        free(dir);
    }
    model_free(m);
    vocab_map_free(&vm);
    data_close(&ds);
    dfm_opts_free(opts);
    return rc;
}

int cmd_train(int argc, char **argv) {
    TrainOpts o;
    memset(&o, 0, sizeof o);
    dfm_opt opts[] = {
        TRAIN_OPTS_COMMON(&o),
        TRAIN_OPTS_DFM(&o),
        {"backbone", DFM_OPT_STR, &o.backbone, NULL, "DIR", "frozen backbone: Hugging Face folder", 0},
        {"targets", DFM_OPT_STR, &o.targets, NULL, "PATH", "target memory: targets file or a run with targets", 0},
        {"tokens-run", DFM_OPT_STR, &o.tokens_run, NULL, "DIR", "token run the targets must match (default --data when it is a run)", 0},
        {"objective", DFM_OPT_STR, &o.objective, "dfm", "OBJ", "dfm: next-token CE + MSE on --data with --targets; reconstruct: reading pretraining, each chunk of the run --data regenerated from its own embedding as the only memory after a constant prompt (trainer/data/reading.h; no --targets); continue with --objective dfm --init-modules", 0, .choices = "dfm|reconstruct"},
        {"reading-prompt", DFM_OPT_STR, &o.reading_prompt, "Text:", "TEXT", "reconstruct and --reconstruct-weight: the constant context before each chunk (at most one chunk of tokens)", 0},
        {"reading-slots", DFM_OPT_STR, &o.reading_slots, NULL, "FILE", "reconstruct and --reconstruct-weight: each chunk's own memory slots from this targets file (`dfm-train slots --own` over --data: the LM-state slots of trainer/data/lm_slots.h) instead of the encode stage's embedding", 0},
        {"reconstruct-weight", DFM_OPT_DOUBLE, &o.reconstruct_weight, "0", "W", "the reading objective kept alive during DFM training: loss + W * the CE of regenerating chunks of --data's training sequences from their own slot after --reading-prompt, one such micro-batch after each DFM micro-batch (trainer/run/reconstruct_mix.h; each evaluation also reports it on the held-out sequences' chunks; 0 = off; costs one more forward and backward per micro-batch)", 0, .min = "0"},
        {"reconstruct-context", DFM_OPT_FLAG, &o.reconstruct_context, NULL, NULL, "with --reconstruct-weight: the reading pass regenerates chunks after their real preceding context instead of after --reading-prompt: the DFM run's own sequences, each chunk's memory its own slot (trainer/data/reading.h), so reading is learnt where the context already names what the memory holds, as a question does", 0},
        {"reconstruct-memory", DFM_OPT_STR, &o.reconstruct_memory, "own", "KIND", "with --reconstruct-weight: the slot each reading chunk reads: own, or shuffled (the memory of another sequence of the same reading micro-batch, the evaluation's partner rule): the same extra passes over the corpus' text with nothing to read, the control that tells reading from more training on the text", 0, .choices = "own|shuffled"},
        {"reconstruct-batch", DFM_OPT_INT, &o.reconstruct_batch, "0", "R", "with --reconstruct-weight: sequences per reading micro-batch (0 = B * T / 2L chunks after the prompt, or B sequences with --reconstruct-context: the tokens of a DFM micro-batch; at most that)", 0, .min = "0"},
        {"init-modules", DFM_OPT_STR, &o.init_modules, NULL, "FILE", "start the DFM modules from trained ones (dfm_modules.safetensors or a checkpoint; same backbone and shape), with a fresh optimizer", 0},
        {"margin-weight", DFM_OPT_DOUBLE, &o.margin_weight, "0", "W", "margin against shuffled memory: loss + W * relu(M + CE(own memory) - CE(another sequence's target memory)), so that CE falls only through the memory's content (trainer/run/margin.h; 0 = off; costs 2-3 more forwards per micro-batch)", 0, .min = "0"},
        {"margin", DFM_OPT_DOUBLE, &o.margin, "0.5", "M", "with --margin-weight: the nats per token by which own memory must beat the partner's", 0, .min = "0"},
        {"teacher", DFM_OPT_STR, &o.teacher, NULL, "FILE", "the in-context teacher's rows for --data (`dfm-train teacher`: the frozen LM with the retrieved neighbours' text pasted before the context; trainer/data/teacher.h), for --distill-weight and --gain-weighting", 0},
        {"distill-weight", DFM_OPT_DOUBLE, &o.distill_weight, "0", "W", "with --teacher: loss + W * KL(teacher || model) on every row the teacher covers (its top ids and one bucket for the rest of the vocabulary), so the fusion learns to make memory act as the pasted text does (0: the KL is only logged)", 0, .min = "0"},
        {"gain-weighting", DFM_OPT_DOUBLE, &o.gain_weighting, "-1", "F", "with --teacher: each row's CE weighted by F + (1 - F) * gain / mean gain, gain = max(0, the teacher's log-prob of the target - the LM alone's): the loss where memory can help (-1 = off; 0 = only such rows)", 0, .min = "-1", .max = "1"},
        {"ce-weight", DFM_OPT_DOUBLE, &o.ce_weight, "1", "X", "with --teacher: the weight of the hard next-token CE beside the KL (0: the teacher's distribution alone is the objective, so the modules cannot gain by memorising the corpus' tokens beyond what the pasted text supports)", 0, .min = "0"},
        {"centre-memory", DFM_OPT_FLAG, &o.centre_memory, NULL, NULL, "every slot enters the projector minus the training targets' mean slot (of the first 4096 training sequences; stored with the modules), so what all memories share is no constant the fusion can use; with --content-only-fusion a slot equal to that mean adds exactly nothing", 0},
        {"memory-ablation", DFM_OPT_STR, &o.memory_ablation, "none", "KIND", "zero: train with every target slot set to 0 (masks kept; the predictor learns 0): the matched-capacity control, the same modules and steps with no memory content; its predicted-memory CE is what the modules' capacity alone gives; random: every valid target slot replaced by a fixed random direction of the same norm per (chunk, slot), so the targets name chunks but say nothing about their text: the value of the real targets, evaluated predicted", 0, .choices = "none|zero|random"},
        {"cache-frozen", DFM_OPT_FLAG, &o.cache_frozen, NULL, NULL, "keep each training sequence's frozen layers (up to the first fusion layer) and the predictor's input after its first forward: later epochs start at the first fusion layer (same bytes; CPU; (T+T/L) x C floats per sequence)", 1},
        {0},
    };
    int rc = dfm_opts_parse("train", "--backbone DIR --data TOKENS --targets PATH --out DIR [options]",
                            "Trains DFM's memory predictor, memory projector and gated cross-attention fusion on top "
                            "of a frozen decoder with next-token CE + mse-weight * MSE(predicted, target slots), or, "
                            "with --objective reconstruct, teaches the fusion to read its memory first. "
                            "Writes OUT/ckpt_final.bin, OUT/dfm_modules.safetensors and OUT/log.jsonl.",
                            opts, argc, argv, NULL, NULL, NULL);
    if (rc == DFM_OPTS_HELP) return 0; /* the parser freed the options */
    DataSet ds;
    memset(&ds, 0, sizeof ds);
    DfmModel *m = NULL;
    int rank = 0;
    int reading = o.objective && !strcmp(o.objective, "reconstruct");
    if (!rc && (!o.data || !o.backbone || (!o.targets && !reading)))
        rc = DFM_FAIL(DFM_EARG, "--backbone, --data and --targets are required (--targets not with --objective reconstruct)");
    if (!rc && reading && o.reconstruct_weight > 0)
        rc = DFM_FAIL(DFM_EARG, "--reconstruct-weight adds the reading objective to DFM training; --objective reconstruct "
                      "is that objective alone. HINT: drop one of them");
    if (!rc && reading && o.targets)
        rc = DFM_FAIL(DFM_EARG, "--objective reconstruct builds its targets from the run --data: leave out --targets");
    if (!rc) train_set_threads(o.threads);
    if (!rc) rc = dfm_mkdir_p(o.out);
    if (!rc && reading) rc = train_open_reading(&o, &ds);
    if (!rc && !reading) rc = data_open(o.data, (int)o.seq_len, &ds);
    if (!rc) rc = vocab_map_apply_backbone(o.backbone, &ds);
    if (!rc && !reading) rc = train_open_targets(&o, &ds);
    if (!rc) rc = setup_dfm_model(&o, (int)o.seq_len, (int)o.batch, ds.K, ds.d, &m);
    if (!rc && o.init_modules) rc = setup_init_modules(m, o.init_modules);
    if (!rc && o.centre_memory) rc = setup_memory_centre(m, &ds, ds.n_seq - train_held_out(&o, &ds), (int)o.batch);
    if (!rc && (uint32_t)m->bc.vocab_size <= ds.max_token)
        rc = DFM_FAIL(DFM_EMISMATCH, "token id %u is outside the backbone's vocabulary of %d", ds.max_token,
                      m->bc.vocab_size);
    if (!rc) rc = train_loop(m, &ds, &o, &rank);
    if (!rc && rank == 0) {
        char *p = dfm_path_join(o.out, "dfm_modules.safetensors");
        rc = dfm_modules_save(m, p);
        if (!rc) DFM_LOG_I("exported the trained modules: %s", p);
        free(p);
    }
    model_free(m);
    data_close(&ds);
    dfm_opts_free(opts);
    return rc;
}
