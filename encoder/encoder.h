/* encoder.h — the frozen sentence encoder: a BERT-family model from a Hugging Face / sentence-transformers
 * folder, run on the CPU (packed AVX-512/AVX2 GEMM + OpenMP) or on an NVIDIA GPU (cuBLAS), giving one pooled,
 * L2-normalised vector per text.
 *
 * A model folder holds:
 *   config.json                 architectures / model_type of the BERT family (BertModel, BertFor*),
 *                               hidden_size, num_hidden_layers, num_attention_heads, intermediate_size,
 *                               vocab_size, max_position_embeddings, type_vocab_size, layer_norm_eps,
 *                               hidden_act "gelu" (erf), position_embedding_type "absolute"
 *   model.safetensors           weights (F32 / F16 / BF16; an optional "bert." prefix), every shape
 *                               checked against config.json
 *   tokenizer.json | vocab.txt  WordPiece (encoder/wordpiece.h)
 *   sentence_bert_config.json   max_seq_length (optional; else min(512, max_position_embeddings))
 *   modules.json, 1_Pooling/config.json   pooling mean | cls | max (optional; default mean)
 * Output vectors are always L2-normalised (DFM's targets are unit vectors); a model whose modules.json
 * has no Normalize module is normalised anyway and the log says so.
 *
 *   dfm_encoder *enc;
 *   DFM_TRY(dfm_encoder_load("/var/cache/dfm/models/all-MiniLM-L6-v2", DFM_DEVICE_CPU, DFM_COMPUTE_F32, &enc));
 *   float *out = malloc(n * dfm_encoder_dim(enc) * sizeof(float));
 *   rc = dfm_encoder_encode(enc, texts, lens, n, out);
 *   dfm_encoder_free(enc);
 *
 * Inside one dfm_encoder_encode call, texts are tokenised (in parallel), sorted by token count and run
 * in batches of similar length (up to `batch` texts and about 8192 tokens on the CPU, 65536 on CUDA);
 * tokens are packed without padding (the attention of each sequence sees only its own tokens, the
 * exact equivalent of a padding mask). Memory per call: n * max_len * 4 bytes of token ids plus one
 * batch of activations, so callers pass windows of texts (dfm encode: --window 4096). Results do not
 * depend on the number of OpenMP threads. An encoder handle is not thread-safe (it owns its work
 * buffers); use one per thread.
 */
#ifndef DFM_ENCODER_H
#define DFM_ENCODER_H

#include <stddef.h>
#include <stdint.h>

typedef struct dfm_encoder dfm_encoder;

enum { DFM_DEVICE_CPU = 0, DFM_DEVICE_CUDA = 1 };
/* Compute precision of the linear layers (dfm encode --precision). CPU: fp32; bf16 (AVX-512 avx512_bf16:
 * bf16 weights and inputs, fp32 accumulation); int8 (AVX-512 VNNI: per-channel s8 weights, per-row dynamic
 * u8 inputs, int32 accumulation; encoder/bert_gemm.h). CUDA: fp32, fp16 or bf16 GEMMs with fp32
 * accumulation. Attention, LayerNorm, softmax, GELU, pooling and normalisation are always fp32. A
 * precision the device or CPU cannot run is refused at load (DFM_EUNSUPPORTED with a HINT), never
 * approximated by another. */
enum { DFM_COMPUTE_F32 = 0, DFM_COMPUTE_F16 = 1, DFM_COMPUTE_BF16 = 2, DFM_COMPUTE_INT8 = 3 };
/* "fp32" / "fp16" / "bf16" / "int8" -> DFM_COMPUTE_*, or -1 */
int dfm_encoder_precision_parse(const char *s);
/* DFM_COMPUTE_* -> its name ("?" if none) */
const char *dfm_encoder_precision_name(int compute);

typedef struct {
    uint64_t texts;       /* texts encoded since load */
    uint64_t empty;       /* texts with no piece at all ([CLS][SEP] only) */
    uint64_t truncated;   /* texts cut to max_seq_length */
    uint64_t tokens;      /* WordPiece tokens run through the model, [CLS]/[SEP] included */
    double flops;         /* model FLOPs spent (2 per multiply-add, GEMMs and attention) */
    double tokenize_s;    /* seconds in tokenisation */
    double forward_s;     /* seconds in the model */
} dfm_encoder_stats;

/* Load a model folder for a device. DFM_ENOTFOUND / DFM_EFORMAT / DFM_EMISMATCH / DFM_EUNSUPPORTED name
 * the file and field (unsupported architecture, shapes that disagree with config.json, a missing
 * tensor). device CUDA in a build without CUDA, or with no usable GPU: DFM_ECUDA with a HINT.
 * CPU threads: OpenMP's (OMP_NUM_THREADS); the OpenBLAS fallback runs single-threaded inside them. */
int dfm_encoder_load(const char *model_dir, int device, int compute, dfm_encoder **out);

/* Encode n texts (UTF-8, texts[i] of lens[i] bytes; lens may be NULL for NUL-terminated texts) into
 * out[n * dim], row i for text i. Thread-unsafe per handle. */
int dfm_encoder_encode(dfm_encoder *enc, const char *const *texts, const size_t *lens, int n, float *out);

/* Free; NULL is a no-op. */
void dfm_encoder_free(dfm_encoder *enc);

int dfm_encoder_dim(const dfm_encoder *enc);
/* Token limit per text ([CLS] and [SEP] included). */
int dfm_encoder_max_len(const dfm_encoder *enc);
/* Override the token limit (1 < max_len <= max_position_embeddings), for tests and experiments. */
int dfm_encoder_set_max_len(dfm_encoder *enc, int max_len);
/* Sequences per forward batch (default 64 on the CPU, 1024 on CUDA). */
int dfm_encoder_set_batch(dfm_encoder *enc, int batch);
/* XXH3-64 of the weights file: identifies the model in embedding headers. */
uint64_t dfm_encoder_model_hash(const dfm_encoder *enc);
/* Tokenise one text as the encoder will: returns the id count or a negative code (see
 * dfm_wordpiece_encode). */
int dfm_encoder_tokenize(const dfm_encoder *enc, const char *text, size_t len, int32_t *ids, int cap,
                         int *truncated);
void dfm_encoder_get_stats(const dfm_encoder *enc, dfm_encoder_stats *st);
/* "BertModel 6 layers, hidden 384, 12 heads, mean pooling, max 256 tokens, cpu fp32" */
const char *dfm_encoder_describe(const dfm_encoder *enc);

/* 1 if this build has CUDA and a GPU is visible, else 0 (never fails). */
int dfm_encoder_cuda_available(void);

#endif
