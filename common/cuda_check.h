/* cuda_check.h — for CUDA host code (*.cu: the encoder and the trainer): error checks, each returning DFM_ECUDA from the
 * enclosing function with the failing call, CUDA's or cuBLAS's message and file:line (common/error.h;
 * none exits), and the block count of a launch. Include after common/error.h and the CUDA headers. */
#ifndef DFM_COMMON_CUDA_CHECK_H
#define DFM_COMMON_CUDA_CHECK_H

#define CUDA_CHECK(call)                                                                                        \
    do {                                                                                                        \
        cudaError_t e_ = (call);                                                                                \
        if (e_ != cudaSuccess)                                                                                  \
            return DFM_FAIL(DFM_ECUDA, "%s failed: %s. HINT: check the GPU with nvidia-smi", #call,           \
                            cudaGetErrorString(e_));                                                            \
    } while (0)
// after a kernel launch: launch-configuration errors are reported here, execution errors by a later sync
#define LAUNCH_CHECK(what)                                                                                      \
    do {                                                                                                        \
        cudaError_t e_ = cudaGetLastError();                                                                    \
        if (e_ != cudaSuccess)                                                                                  \
            return DFM_FAIL(DFM_ECUDA, "launching %s failed: %s. HINT: check the sizes and the GPU (nvidia-smi)", \
                            what, cudaGetErrorString(e_));                                                      \
    } while (0)
#define CUBLAS_CHECK(call)                                                                                      \
    do {                                                                                                        \
        cublasStatus_t s_ = (call);                                                                             \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                                        \
            return DFM_FAIL(DFM_ECUDA, "%s failed: cuBLAS status %d (%s)", #call, (int)s_,                    \
                            cublasGetStatusString(s_));                                                         \
    } while (0)

// the status of a CUDA call as a dfm code (DFM_OK, or DFM_ECUDA with the message set), for code that
// cannot return at once (cleanup paths)
#define DFM_CUDA_STATUS(call) dfm_cuda_status_at((call), #call, __FILE__, __LINE__)
static inline int dfm_cuda_status_at(cudaError_t e, const char *what, const char *file, int line) {
    if (e == cudaSuccess) return DFM_OK;
    return dfm_fail_at(file, line, DFM_ECUDA, "%s failed: %s. HINT: check the GPU with nvidia-smi", what,
                       cudaGetErrorString(e));
}

/* blocks of `threads` covering n items: at least 1, at most the grid's x limit */
static inline unsigned blocks_for(size_t n, int threads) {
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b > 2147483647u ? 2147483647u : (b ? b : 1));
}

#endif
