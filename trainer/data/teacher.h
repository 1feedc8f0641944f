/* teacher.h — the in-context teacher: the frozen LM with the retrieved neighbours' text pasted before the
 * context (schemas/teacher_file.h), computed once per run by `dfm-train teacher`, and its rows handed to
 * training as soft targets (`dfm-train train --teacher FILE --distill-weight W --gain-weighting F`).
 *
 * What the teacher sees. Sequence s of the token run (T tokens, chunks of L) is what training reads (data.h).
 * Its chunk c >= 1 is predicted by rows cL-1 .. cL+L-2 (row r predicts token r+1), and those rows read chunk
 * c's memory (MEM_ALIGN_NEXT, model.h): the target record of chunk s*NC + c, whose slots are the neighbours
 * (or continuations) retrieved for chunk c's preceding context. The teacher for those rows runs
 *     [text of slot P-1] ... [text of slot 1] [text of slot 0] [tokens 0 .. cL+L-2 of the sequence]
 * through the same frozen backbone: the first P valid slots in rank order (P = --paste), each slot's chunk
 * text without its padding, the best-ranked nearest the context; with slots "both" (a neighbour, then its
 * continuation) the pair of rank j is pasted as neighbour then continuation. Rows cL-1 .. cL+L-2 of the
 * window are read at their positions after the pasted text. Rows of chunk 0 (no memory) and row T-1 (its
 * token belongs to the next sequence's chunk 0) get no teacher. Every row with a target also gets the LM
 * alone's log-probability of it (the window without pasted text), so the teacher's gain per token,
 * lp_teacher - lp_alone, is known: the gain-weighted CE reads it.
 *
 * Cost: one backbone forward of T tokens per sequence and one of P*L + cL + L - 1 tokens per chunk c >= 1,
 * plus an LM head over L rows per chunk. */
#ifndef DFM_TRAINER_TEACHER_H
#define DFM_TRAINER_TEACHER_H

#include <stddef.h>
#include <stdint.h>

#include "schemas/teacher_file.h"
#include "trainer/data/data.h"
#include "trainer/model/model.h"

typedef struct dfm_target_reader dfm_target_reader;

typedef struct {
    int paste, top; /* P valid slots pasted; S ids kept per row */
    int max_seq;    /* sequences to run (0: all of the data's); fewer give a file for the first ones only */
} TeacherBuildOptions;

typedef struct {
    uint64_t rows_teacher;        /* rows with pasted text and a target */
    double lp_teacher, lp_alone;  /* their summed log-probabilities of the target */
    uint64_t pasted_tokens;       /* pasted text, all chunks */
    uint64_t forward_tokens;      /* tokens through the backbone, all forwards */
} TeacherStats;

/* The teacher rows of ds (tokens with T and L as the model's; n_seq sequences) into OUT. m: the backbone
 * alone (DfmConfig disabled) created for one sequence of at least P*L + T tokens. tr: the targets run's
 * reader (its ids name chunks of store); store: the datastore's tokens opened with T = L (chunk c = tokens
 * [cL, cL+L)). Writes OUT atomically; DFM_E* with a message naming the sequence and chunk on error. */
int teacher_build(DfmModel *m, const DataSet *ds, dfm_target_reader *tr, const DataSet *store, int L,
                  const TeacherBuildOptions *o, uint64_t backbone_hash, const char *out, TeacherStats *st);

/* XXH3-64 of ds's token ids over the n_seq * T + 1 positions training reads (the teacher file's tokens_hash). */
uint64_t teacher_tokens_hash(const DataSet *ds, uint64_t n_seq);

/* ---- the rows as soft targets ------------------------------------------------------------------ */
typedef struct {
    dfm_teacher_file *f;
    int S, T;
    float gain_floor;  /* --gain-weighting F (< 0: off): row weight F + (1 - F) * gain / mean_gain */
    float ce_weight;   /* --ce-weight X: every row's weight times X (0: the teacher's KL alone) */
    double mean_gain;  /* mean of max(0, lp_teacher - lp_alone) over the training sequences' rows with a target */
} TeacherSoft;

/* Open PATH for training on ds (n_seq sequences of T tokens, chunk length L) with a model of vocab V: the
 * file's shape, tokens hash and token generation must be ds's (DFM_EMISMATCH, naming the field, with a
 * hint to write it again). ntrain: the training sequences (for mean_gain). */
int teacher_soft_open(const char *path, const DataSet *ds, int L, int V, size_t ntrain, float gain_floor,
                      TeacherSoft *ts);
void teacher_soft_close(TeacherSoft *ts);
/* Soft targets of the B sequences idx (rows b*T + r): ids [B*T*S], p [B*T*S] (the teacher's top-S
 * probabilities, their rest of 1 the tail bucket of ops.h's CeSoft), has [B*T] (F_TEACHER), row_w [B*T] (ce_weight times the gain weight, 1 when
 * gain weighting is off). */
void teacher_soft_fill(const TeacherSoft *ts, const size_t *idx, int B, int *ids, float *p, uint8_t *has, float *row_w);

#endif
