// encoder_cuda_check.cu — the CUDA encoder (encoder/bert_cuda.cu) in fp32, bf16 and fp16 against the CPU encoder
// in fp32, on the same texts and the same weights.
//
// A separate program, built with -DDFM_ENCODER_CUDA_CHECK_MAIN (without it this file compiles to nothing). On a
// GPU: `make CUDA=1 BUILD=build-cuda build-cuda/checks/encoder_cuda_check`. Without one, through the host
// emulation of CUDA (tests/cuda/README.md; tests/py/cuda/test_encoder_cuda_emu.py), where cublasGemmEx is a naive
// loop that rounds bf16 / fp16 operands to nearest even, as the GPU's conversion kernels do — hence a few short
// texts.
//
// usage: encoder_cuda_check [MODEL_DIR [TEXTS_JSONL]]   (default model: $DFM_MODEL, else
//        /var/cache/dfm/models/all-MiniLM-L6-v2; default texts: a built-in set of short sentences)
// The CPU encoder (fp32, the reference) and one CUDA encoder per precision are loaded from MODEL_DIR; the CUDA
// one is the CPU handle switched to the device (the weights are the same bytes), so this runs whether or not
// the library was built with CUDA. Per precision, every row against the CPU row:
//   fp32  max abs error <= 1e-5            (fp32 GEMMs, fp32 kernels: only the summation order differs)
//   bf16  cosine >= 0.9999 every row       (bf16 operands, fp32 accumulation: 0.99997 here at the time of
//                                           writing, as the CPU bf16 path on real texts,
//                                           tests/py/encoder/test_encoder_precision.py)
//   fp16  cosine >= 0.99999 every row      (0.9999997 here)
// and a precision that computed nothing else (bf16 / fp16 identical to fp32) fails: the conversion must happen.
// Prints one line per precision and "RESULT: PASS|FAIL"; exit 0 pass, 1 a bound failed, 2 an error.
#ifdef DFM_ENCODER_CUDA_CHECK_MAIN

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

extern "C" {
#include "common/error.h"
#include "encoder/bert.h"
#include "encoder/encoder.h"
}

static const char *const DEFAULT_TEXTS[] = {
    "The quick brown fox jumps over the lazy dog.",
    "A dictionary defines words.",
    "Arrive, v. t. To bring to shore. [Obs.]",
    "",
    "Café crème brûlée à la façon de Zoë",
    "Neural networks learn representations of text from examples, one gradient step at a time.",
};

static int read_texts(const char *path, std::vector<std::string> *out) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        // {"text": "..."} lines with plain ASCII texts (no escapes): enough for the checker's own inputs
        const char *p = strstr(line, "\"text\"");
        const char *q = p ? strchr(p + 6, '"') : NULL;
        const char *e = q ? strchr(q + 1, '"') : NULL;
        if (!e) {
            free(line);
            fclose(f);
            return -1;
        }
        out->push_back(std::string(q + 1, e));
    }
    free(line);
    fclose(f);
    return 0;
}

// a fresh encoder handle: loaded for the CPU in fp32, then (device CUDA) moved to the GPU in `compute`
static dfm_encoder *open_enc(const char *model, int device, int compute) {
    dfm_encoder *enc = NULL;
    if (dfm_encoder_load(model, DFM_DEVICE_CPU, DFM_COMPUTE_F32, &enc)) {
        fprintf(stderr, "encoder_cuda_check: %s\n", dfm_last_error());
        return NULL;
    }
    if (device == DFM_DEVICE_CUDA) {
        enc->device = DFM_DEVICE_CUDA;
        enc->compute = compute;
        if (bert_cuda_init(enc)) {
            fprintf(stderr, "encoder_cuda_check: bert_cuda_init: %s\n", dfm_last_error());
            dfm_encoder_free(enc);
            return NULL;
        }
    }
    return enc;
}

int main(int argc, char **argv) {
    const char *model = argc > 1 ? argv[1] : getenv("DFM_MODEL");
    if (!model || !*model) model = "/var/cache/dfm/models/all-MiniLM-L6-v2";
    if (bert_cuda_device_count() <= 0) {
        printf("RESULT: NO GPU\n");
        return 2;
    }
    std::vector<std::string> texts;
    if (argc > 2) {
        if (read_texts(argv[2], &texts) || texts.empty()) {
            fprintf(stderr, "encoder_cuda_check: cannot read {\"text\": ...} lines from %s\n", argv[2]);
            return 2;
        }
    } else {
        texts.assign(DEFAULT_TEXTS, DEFAULT_TEXTS + sizeof DEFAULT_TEXTS / sizeof *DEFAULT_TEXTS);
    }
    int n = (int)texts.size();
    std::vector<const char *> tp(n);
    std::vector<size_t> tl(n);
    for (int i = 0; i < n; i++) tp[i] = texts[i].c_str(), tl[i] = texts[i].size();

    dfm_encoder *cpu = open_enc(model, DFM_DEVICE_CPU, DFM_COMPUTE_F32);
    if (!cpu) return 2;
    int dim = dfm_encoder_dim(cpu);
    std::vector<float> ref((size_t)n * dim), got((size_t)n * dim);
    if (dfm_encoder_encode(cpu, tp.data(), tl.data(), n, ref.data())) {
        fprintf(stderr, "encoder_cuda_check: CPU encode: %s\n", dfm_last_error());
        return 2;
    }
    dfm_encoder_free(cpu);

    struct { const char *name; int compute; double max_abs, min_cos; } cases[] = {
        {"fp32", DFM_COMPUTE_F32, 1e-5, 0.0}, {"bf16", DFM_COMPUTE_BF16, 0.0, 0.9999}, {"fp16", DFM_COMPUTE_F16, 0.0, 0.99999}};
    int fail = 0;
    for (auto &c : cases) {
        dfm_encoder *g = open_enc(model, DFM_DEVICE_CUDA, c.compute);
        if (!g) return 2;
        int rc = dfm_encoder_encode(g, tp.data(), tl.data(), n, got.data());
        dfm_encoder_free(g);
        if (rc) {
            fprintf(stderr, "encoder_cuda_check: CUDA %s encode: %s\n", c.name, dfm_last_error());
            printf("RESULT: ERROR (CUDA %s)\n", c.name);
            return 2;
        }
        double max_abs = 0, min_cos = 2;
        int finite = 1;
        for (int r = 0; r < n; r++) {
            double dot = 0, na = 0, nb = 0;
            for (int i = 0; i < dim; i++) {
                double a = ref[(size_t)r * dim + i], b = got[(size_t)r * dim + i];
                if (!isfinite(b)) finite = 0;
                double d = fabs(a - b);
                if (!(d <= max_abs)) max_abs = d;  // NaN propagates: a NaN difference fails below
                dot += a * b, na += a * a, nb += b * b;
            }
            double cs = dot / sqrt(na * nb);
            if (!(cs >= min_cos)) min_cos = cs;
        }
        int ok = finite && (c.max_abs > 0 ? max_abs <= c.max_abs : min_cos >= c.min_cos && max_abs > 1e-6);
        printf("cuda %s vs cpu fp32, %d texts: max abs error %.3g, min cosine %.7f (bound: %s %g%s) -> %s\n", c.name, n,
               max_abs, min_cos, c.max_abs > 0 ? "max abs error <=" : "cosine >=", c.max_abs > 0 ? c.max_abs : c.min_cos,
               c.max_abs > 0 ? "" : ", and not identical to fp32", ok ? "ok" : "FAIL");
        fail |= !ok;
    }
    printf("RESULT: %s\n", fail ? "FAIL" : "PASS");
    return fail ? 1 : 0;
}

#endif
