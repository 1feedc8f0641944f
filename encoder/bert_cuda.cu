// bert_cuda.cu — the encoder's forward pass on an NVIDIA GPU: the same packed layout, the same
// function names and the same math as bert_cpu.c (in the manner of llm.c's train_gpt2.c / .cu).
//
// GEMMs: cuBLAS cublasGemmEx with fp16 or bf16 inputs (weights converted once at load, activations
// converted per GEMM) and fp32 accumulation and output, or fp32 throughout (CUBLAS_COMPUTE_32F, no
// TF32). Everything else — embeddings, LayerNorm, GELU, masked softmax attention, pooling and L2
// normalisation — runs in fp32 kernels below.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "common/error.h"
#include "common/log.h"
#include "encoder/bert.h"
}

#include "common/cuda_check.h"
#include "common/cuda_warp.cuh"

struct dfm_bert_cuda {
    cublasHandle_t cublas;
    cudaStream_t stream;
    float *params;            // every fp32 parameter, the host block copied as is (same carving)
    void *gemm_w;             // linear weights in the compute dtype (NULL when fp32)
    size_t layer_gemm_elems;  // per layer: qkv_w, ao_w, fc_w, proj_w
    // activations (fp32) and GEMM inputs in the compute dtype, grown on demand
    float *x, *qkv, *att, *tmp, *fc, *pooled;
    void *gin;                // converted GEMM input, M * max(H, I) elements
    int32_t *ids, *pos, *seq, *off;
    size_t cap_tok, cap_seq;
    int32_t *h_pos, *h_seq;   // host staging
};

// ---- kernels ---------------------------------------------------------------------------------------
__global__ void embed_kernel(float *x, const int32_t *ids, const int32_t *pos, const float *wte, const float *wpe,
                             const float *wtt, int M, int H) {
    int t = blockIdx.x;
    if (t >= M) return;
    const float *a = wte + (size_t)ids[t] * H, *p = wpe + (size_t)pos[t] * H;
    for (int i = threadIdx.x; i < H; i += blockDim.x) x[(size_t)t * H + i] = a[i] + p[i] + wtt[i];
}


// one warp per row, two-pass mean / variance as on the CPU
__global__ void layernorm_kernel(float *out, const float *inp, const float *w, const float *b, int M, int C, float eps) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= M) return;
    const float *x = inp + (size_t)row * C;
    float m = 0;
    for (int i = lane; i < C; i += 32) m += x[i];
    m = warp_sum(m) / C;
    float v = 0;
    for (int i = lane; i < C; i += 32) v += (x[i] - m) * (x[i] - m);
    v = warp_sum(v) / C;
    float rstd = rsqrtf(v + eps);
    float *o = out + (size_t)row * C;
    for (int i = lane; i < C; i += 32) o[i] = (x[i] - m) * rstd * w[i] + b[i];
}

__global__ void residual_kernel(float *a, const float *b, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] += b[i];
}

__global__ void gelu_kernel(float *x, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        x[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    }
}

__global__ void bias_fill_kernel(float *out, const float *bias, int M, int N) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)M * N) out[i] = bias[i % N];
}

__global__ void to_half_kernel(__half *o, const float *x, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) o[i] = __float2half_rn(x[i]);
}
__global__ void to_bf16_kernel(__nv_bfloat16 *o, const float *x, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) o[i] = __float2bfloat16_rn(x[i]);
}

// Masked attention: one warp per (query token, head); the keys are the tokens of the query's own
// sequence only (off[seq[t]] .. off[seq[t]+1]), exactly a padding mask. Scores live in shared memory
// (max_len floats per warp).
__global__ void attention_kernel(float *out, const float *qkv, const int32_t *seq, const int32_t *off, int M, int NH,
                                 int HS, int max_len, float scale) {
    extern __shared__ float smem[];
    int warps = blockDim.x / 32, wid = threadIdx.x / 32, lane = threadIdx.x % 32;
    int item = blockIdx.x * warps + wid;
    if (item >= M * NH) return;
    int t = item / NH, h = item % NH;
    int H = NH * HS, C3 = 3 * H;
    int s = seq[t], t0 = off[s], T = off[s + 1] - t0;
    float *sc = smem + (size_t)wid * max_len;
    const float *q = qkv + (size_t)t * C3 + h * HS;
    float mx = -INFINITY;
    for (int j = lane; j < T; j += 32) {
        const float *k = qkv + (size_t)(t0 + j) * C3 + H + h * HS;
        float d = 0;
        for (int e = 0; e < HS; e++) d += q[e] * k[e];
        d *= scale;
        sc[j] = d;
        mx = fmaxf(mx, d);
    }
    mx = warp_max(mx);
    float sum = 0;
    for (int j = lane; j < T; j += 32) {
        float p = __expf(sc[j] - mx);
        sc[j] = p;
        sum += p;
    }
    sum = warp_sum(sum);
    __syncwarp();
    float inv = 1.0f / sum;
    for (int e = lane; e < HS; e += 32) {
        float acc = 0;
        for (int j = 0; j < T; j++) acc += sc[j] * qkv[(size_t)(t0 + j) * C3 + 2 * H + h * HS + e];
        out[(size_t)t * H + h * HS + e] = acc * inv;
    }
}

// one block per sequence: pool its rows, then L2-normalise
__global__ void pool_kernel(float *out, const float *x, const int32_t *off, int H, int mode) {
    int s = blockIdx.x, t0 = off[s], T = off[s + 1] - t0;
    extern __shared__ float red[];
    float *o = out + (size_t)s * H;
    float part = 0;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        float v;
        if (mode == DFM_POOL_CLS) {
            v = x[(size_t)t0 * H + i];
        } else if (mode == DFM_POOL_MAX) {
            v = -INFINITY;
            for (int t = 0; t < T; t++) v = fmaxf(v, x[(size_t)(t0 + t) * H + i]);
        } else {
            double acc = 0;
            for (int t = 0; t < T; t++) acc += x[(size_t)(t0 + t) * H + i];
            v = (float)(acc / T);
        }
        o[i] = v;
        part += v * v;
    }
    red[threadIdx.x] = part;
    __syncthreads();
    for (int st = blockDim.x / 2; st > 0; st >>= 1) {
        if (threadIdx.x < st) red[threadIdx.x] += red[threadIdx.x + st];
        __syncthreads();
    }
    float inv = 1.0f / fmaxf(sqrtf(red[0]), 1e-12f);
    for (int i = threadIdx.x; i < H; i += blockDim.x) o[i] *= inv;
}

// ---- host wrappers (names as in bert_cpu.c) --------------------------------------------------------------

static cudaDataType_t gemm_type(int compute) {
    return compute == DFM_COMPUTE_F16 ? CUDA_R_16F : compute == DFM_COMPUTE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

// out[M, N] = inp[M, K] · W[N, K]^T + bias[N]; W given in the compute dtype (w_lp) or fp32 (w32)
static int matmul_forward(dfm_encoder *enc, float *out, const float *inp, const void *w_lp, const float *w32,
                          const float *bias, int M, int K, int N) {
    dfm_bert_cuda *g = enc->cuda;
    bias_fill_kernel<<<blocks_for((size_t)M * N, 256), 256, 0, g->stream>>>(out, bias, M, N);
    const void *A = w32, *B = inp;
    if (enc->compute == DFM_COMPUTE_F16) {
        to_half_kernel<<<blocks_for((size_t)M * K, 256), 256, 0, g->stream>>>((__half *)g->gin, inp, (size_t)M * K);
        A = w_lp, B = g->gin;
    } else if (enc->compute == DFM_COMPUTE_BF16) {
        to_bf16_kernel<<<blocks_for((size_t)M * K, 256), 256, 0, g->stream>>>((__nv_bfloat16 *)g->gin, inp, (size_t)M * K);
        A = w_lp, B = g->gin;
    }
    const float one = 1.0f;
    cudaDataType_t t = gemm_type(enc->compute);
    // column-major view: out^T (N x M) = W (K x N)^T · inp^T (K x M)
    CUBLAS_CHECK(cublasGemmEx(g->cublas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, A, t, K, B, t, K, &one, out, CUDA_R_32F,
                              N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return DFM_OK;
}

static void layernorm_forward(cudaStream_t st, float *out, const float *inp, const float *w, const float *b, int M, int C,
                              float eps) {
    layernorm_kernel<<<blocks_for(M, 8), 256, 0, st>>>(out, inp, w, b, M, C, eps);
}
static void residual_forward(cudaStream_t st, float *a, const float *b, size_t n) {
    residual_kernel<<<blocks_for(n, 256), 256, 0, st>>>(a, b, n);
}
static void gelu_forward(cudaStream_t st, float *x, size_t n) { gelu_kernel<<<blocks_for(n, 256), 256, 0, st>>>(x, n); }

// device pointer of a host parameter pointer: same offset inside the one block
static inline float *dev(const dfm_encoder *enc, const float *host) { return enc->cuda->params + (host - enc->w.mem); }

extern "C" int bert_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

static int grow(dfm_encoder *enc, int M, int n_seq) {
    dfm_bert_cuda *g = enc->cuda;
    int H = enc->cfg.hidden, FF = enc->cfg.inter;
    if ((size_t)M > g->cap_tok) {
        size_t cap = (size_t)M + M / 2;
        cudaFree(g->x), cudaFree(g->gin), cudaFree(g->ids), cudaFree(g->pos), cudaFree(g->seq);
        free(g->h_pos), free(g->h_seq);
        g->x = NULL;
        CUDA_CHECK(cudaMalloc(&g->x, cap * (size_t)(6 * H + FF) * sizeof(float)));
        g->qkv = g->x + cap * H, g->att = g->qkv + cap * 3 * H, g->tmp = g->att + cap * H, g->fc = g->tmp + cap * H;
        CUDA_CHECK(cudaMalloc(&g->gin, cap * (size_t)(FF > H ? FF : H) * sizeof(float)));
        CUDA_CHECK(cudaMalloc(&g->ids, cap * sizeof(int32_t)));
        CUDA_CHECK(cudaMalloc(&g->pos, cap * sizeof(int32_t)));
        CUDA_CHECK(cudaMalloc(&g->seq, cap * sizeof(int32_t)));
        g->h_pos = (int32_t *)malloc(cap * sizeof(int32_t));
        g->h_seq = (int32_t *)malloc(cap * sizeof(int32_t));
        if (!g->h_pos || !g->h_seq) return DFM_FAIL(DFM_ENOMEM, "no memory");
        g->cap_tok = cap;
    }
    if ((size_t)n_seq > g->cap_seq) {
        size_t cap = (size_t)n_seq + n_seq / 2 + 1;
        cudaFree(g->off), cudaFree(g->pooled);
        CUDA_CHECK(cudaMalloc(&g->off, (cap + 1) * sizeof(int32_t)));
        CUDA_CHECK(cudaMalloc(&g->pooled, cap * H * sizeof(float)));
        g->cap_seq = cap;
    }
    return DFM_OK;
}

extern "C" void bert_cuda_free(dfm_encoder *enc) {
    dfm_bert_cuda *g = enc->cuda;
    if (!g) return;
    cudaFree(g->params), cudaFree(g->gemm_w), cudaFree(g->x), cudaFree(g->gin), cudaFree(g->ids), cudaFree(g->pos),
        cudaFree(g->seq), cudaFree(g->off), cudaFree(g->pooled);
    free(g->h_pos), free(g->h_seq);
    if (g->cublas) cublasDestroy(g->cublas);
    if (g->stream) cudaStreamDestroy(g->stream);
    free(g);
    enc->cuda = NULL;
}

extern "C" int bert_cuda_init(dfm_encoder *enc) {
    dfm_bert_cuda *g = (dfm_bert_cuda *)calloc(1, sizeof *g);
    if (!g) return DFM_FAIL(DFM_ENOMEM, "no memory");
    enc->cuda = g;
    const dfm_bert_config *c = &enc->cfg;
    size_t H = c->hidden, FF = c->inter;
    CUDA_CHECK(cudaStreamCreate(&g->stream));
    CUBLAS_CHECK(cublasCreate(&g->cublas));
    CUBLAS_CHECK(cublasSetStream(g->cublas, g->stream));
    CUBLAS_CHECK(cublasSetMathMode(g->cublas, CUBLAS_DEFAULT_MATH)); // no TF32 in the fp32 path
    CUDA_CHECK(cudaMalloc(&g->params, enc->w.n_floats * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(g->params, enc->w.mem, enc->w.n_floats * sizeof(float), cudaMemcpyHostToDevice));
    if (enc->compute != DFM_COMPUTE_F32) {
        g->layer_gemm_elems = 3 * H * H + H * H + FF * H + H * FF;
        size_t n = g->layer_gemm_elems * c->layers;
        CUDA_CHECK(cudaMalloc(&g->gemm_w, n * 2));
        for (int l = 0; l < c->layers; l++) {
            const struct dfm_bert_weights::bert_layer *L = &enc->w.layer[l];
            const float *src[4] = {L->qkv_w, L->ao_w, L->fc_w, L->proj_w};
            size_t cnt[4] = {3 * H * H, H * H, FF * H, H * FF}, o = g->layer_gemm_elems * l;
            for (int k = 0; k < 4; k++) {
                char *dst = (char *)g->gemm_w + 2 * o;
                if (enc->compute == DFM_COMPUTE_F16)
                    to_half_kernel<<<blocks_for(cnt[k], 256), 256, 0, g->stream>>>((__half *)dst, dev(enc, src[k]), cnt[k]);
                else
                    to_bf16_kernel<<<blocks_for(cnt[k], 256), 256, 0, g->stream>>>((__nv_bfloat16 *)dst, dev(enc, src[k]), cnt[k]);
                o += cnt[k];
            }
        }
    }
    CUDA_CHECK(cudaStreamSynchronize(g->stream));
    CUDA_CHECK(cudaGetLastError());
    return DFM_OK;
}

extern "C" int bert_forward_cuda(dfm_encoder *enc, const dfm_bert_batch *b, float *out) {
    const dfm_bert_config *c = &enc->cfg;
    const dfm_bert_weights *w = &enc->w;
    int M = b->n_tok, H = c->hidden, FF = c->inter, NH = c->heads, HS = H / NH;
    DFM_TRY(grow(enc, M, b->n_seq));
    dfm_bert_cuda *g = enc->cuda;
    cudaStream_t st = g->stream;
    for (int s = 0; s < b->n_seq; s++)
        for (int t = b->off[s]; t < b->off[s + 1]; t++) g->h_pos[t] = t - b->off[s], g->h_seq[t] = s;
    CUDA_CHECK(cudaMemcpyAsync(g->ids, b->ids, M * sizeof(int32_t), cudaMemcpyHostToDevice, st));
    CUDA_CHECK(cudaMemcpyAsync(g->pos, g->h_pos, M * sizeof(int32_t), cudaMemcpyHostToDevice, st));
    CUDA_CHECK(cudaMemcpyAsync(g->seq, g->h_seq, M * sizeof(int32_t), cudaMemcpyHostToDevice, st));
    CUDA_CHECK(cudaMemcpyAsync(g->off, b->off, (b->n_seq + 1) * sizeof(int32_t), cudaMemcpyHostToDevice, st));
    float *x = g->x, *qkv = g->qkv, *att = g->att, *tmp = g->tmp, *fc = g->fc;
    embed_kernel<<<M, 128, 0, st>>>(x, g->ids, g->pos, dev(enc, w->wte), dev(enc, w->wpe), dev(enc, w->wtt), M, H);
    layernorm_forward(st, x, x, dev(enc, w->emb_ln_w), dev(enc, w->emb_ln_b), M, H, c->ln_eps);
    int warps = 4;
    size_t smem = (size_t)warps * b->max_seq_len * sizeof(float);
    for (int l = 0; l < c->layers; l++) {
        const struct dfm_bert_weights::bert_layer *L = &w->layer[l];
        const char *lw = g->gemm_w ? (const char *)g->gemm_w + 2 * g->layer_gemm_elems * l : NULL;
        size_t o_ao = 3 * (size_t)H * H, o_fc = o_ao + (size_t)H * H, o_pr = o_fc + (size_t)FF * H;
        DFM_TRY(matmul_forward(enc, qkv, x, lw, dev(enc, L->qkv_w), dev(enc, L->qkv_b), M, H, 3 * H));
        attention_kernel<<<blocks_for((size_t)M * NH, warps), 32 * warps, smem, st>>>(att, qkv, g->seq, g->off, M, NH, HS,
                                                                                      b->max_seq_len, 1.0f / sqrtf((float)HS));
        DFM_TRY(matmul_forward(enc, tmp, att, lw ? lw + 2 * o_ao : NULL, dev(enc, L->ao_w), dev(enc, L->ao_b), M, H, H));
        residual_forward(st, tmp, x, (size_t)M * H);
        layernorm_forward(st, x, tmp, dev(enc, L->ln1_w), dev(enc, L->ln1_b), M, H, c->ln_eps);
        DFM_TRY(matmul_forward(enc, fc, x, lw ? lw + 2 * o_fc : NULL, dev(enc, L->fc_w), dev(enc, L->fc_b), M, H, FF));
        gelu_forward(st, fc, (size_t)M * FF);
        DFM_TRY(matmul_forward(enc, tmp, fc, lw ? lw + 2 * o_pr : NULL, dev(enc, L->proj_w), dev(enc, L->proj_b), M, FF, H));
        residual_forward(st, tmp, x, (size_t)M * H);
        layernorm_forward(st, x, tmp, dev(enc, L->ln2_w), dev(enc, L->ln2_b), M, H, c->ln_eps);
    }
    pool_kernel<<<b->n_seq, 128, 128 * sizeof(float), st>>>(g->pooled, x, g->off, H, c->pooling);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaMemcpyAsync(out, g->pooled, (size_t)b->n_seq * H * sizeof(float), cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    return DFM_OK;
}
