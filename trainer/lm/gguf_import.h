/* gguf_import.h — a GGUF model (llama.cpp's format) as a Hugging Face model folder that dfm-train, dfm
 * chunk and transformers load: `dfm-train import-gguf`.
 *
 * The folder holds config.json (LlamaForCausalLM or Qwen3ForCausalLM), model.safetensors (every tensor
 * dequantized to F32 exactly: schemas/gguf.h), tokenizer.json and tokenizer_config.json (built from the
 * file's tokenizer metadata, or copied from a given tokenizer.json). Llama's q_proj and k_proj rows are
 * put back in Hugging Face's order (llama.cpp's converter interleaves the two halves of each head for
 * its RoPE). The folder is written under OUT.partial and renamed onto OUT when complete: a killed
 * import leaves no half folder under the final name.
 *
 * Refused, each naming what and where: architectures other than llama and qwen3; rope scaling
 * (rope_freqs tensor or a scaling type), mixtures of experts, per-layer head counts, attention biases
 * and any tensor the decoder does not have; tensor types dfm cannot dequantize; non-finite weights.
 * Memory: the whole model in fp32 (4 bytes per weight) plus the mapped file.
 */
#ifndef DFM_TRAINER_GGUF_IMPORT_H
#define DFM_TRAINER_GGUF_IMPORT_H

#include <stdint.h>

typedef struct {
    const char *tokenizer; /* NULL: build tokenizer.json from the file; else copy this tokenizer.json */
    int force;             /* replace an existing OUT: a file, or a folder of files (one holding a folder is
                              refused before anything is read: import-gguf never wrote it) */
} GgufImportOpts;

typedef struct {
    char arch[40];          /* config.json's architecture */
    int n_layers, hidden, vocab;
    uint64_t n_params;      /* weights written */
    uint64_t type_counts[64]; /* tensors per ggml type in the source */
    int permuted;           /* q/k rows were put back in Hugging Face order */
    int tokenizer_built;    /* 1: from the file's metadata; 0: copied */
} GgufImportReport;

/* Convert the GGUF file at path into the folder out. rep may be NULL. DFM_EMISMATCH when out exists and
 * !o->force, or holds a folder; the errors of schemas/gguf.h and the refusals above otherwise. Once the new
 * folder is in place the import has succeeded: an old OUT that cannot be removed is a warning. */
int gguf_import(const char *path, const char *out, const GgufImportOpts *o, GgufImportReport *rep);

#endif
