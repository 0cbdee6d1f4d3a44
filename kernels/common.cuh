// Shared helpers of the gpuhost kernel suite: error checks, deterministic random data,
// event timing with medians, and a minimal JSON writer (the suite prints one JSON
// document on stdout; Python parses it, so nothing else may go to stdout).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace gh {

// A CUDA error aborts the benchmark that raised it (caught in main), not the whole run,
// so the results measured before it still reach the report.
struct CudaFailure : std::runtime_error {
    using std::runtime_error::runtime_error;
};

inline void check(cudaError_t status, const char* what, const char* file, int line) {
    if (status != cudaSuccess) {
        std::ostringstream message;
        message << what << " failed: " << cudaGetErrorName(status) << " (" << cudaGetErrorString(status)
                << ") at " << file << ":" << line;
        throw CudaFailure(message.str());
    }
}

#define GH_CHECK(call) ::gh::check((call), #call, __FILE__, __LINE__)
// Launches are asynchronous: check the launch itself, and let the next synchronizing
// call report faults inside the kernel.
#define GH_CHECK_LAUNCH() ::gh::check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

// ---------------------------------------------------------------- random data
// A counter-based hash: any element can be regenerated on host or device from (index,
// seed), so references never trust the buffer that the kernel under test read.
__host__ __device__ inline uint32_t hash32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

__host__ __device__ inline float uniform01(uint64_t index, uint32_t seed) {
    const uint32_t low = static_cast<uint32_t>(index);
    const uint32_t high = static_cast<uint32_t>(index >> 32);
    const uint32_t h = hash32(low ^ hash32(seed ^ (high * 0x9E3779B9U)));
    return static_cast<float>(h >> 8) * (1.0f / 16777216.0f);  // 24 random bits: exact in float
}

__host__ __device__ inline float uniform(uint64_t index, uint32_t seed, float lo, float hi) {
    return lo + (hi - lo) * uniform01(index, seed);
}

// Stream-ordering self-test (gpuhost-kernels --delay-streams MS): every poison, fill and counter
// reset first queues a spin kernel of MS milliseconds on its own stream. Work on a stream that
// does not order with that one then overtakes it, and its check sees the poison or the stale
// fill: a missing dependency turns into a reported wrong result instead of a rare one.
void set_stream_delay_ms(double ms);
void delay_stream(cudaStream_t stream);

__global__ void fill_uniform_kernel(float* data, size_t n, uint32_t seed, float lo, float hi);
void fill_uniform(float* data, size_t n, uint32_t seed, float lo, float hi, cudaStream_t stream = 0);
// NaN everywhere: an element the kernel under test fails to write stays NaN and fails the check.
void poison(void* data, size_t bytes, cudaStream_t stream = 0);

struct DeviceCounter {
    unsigned long long* ptr = nullptr;
    DeviceCounter();
    ~DeviceCounter();
    DeviceCounter(const DeviceCounter&) = delete;
    DeviceCounter& operator=(const DeviceCounter&) = delete;
    void reset(cudaStream_t stream = 0);
    unsigned long long read();
};

// ---------------------------------------------------------------- device memory
template <class T>
struct DeviceBuffer {
    T* ptr = nullptr;
    size_t count = 0;
    explicit DeviceBuffer(size_t n) : count(n) { GH_CHECK(cudaMalloc(&ptr, n * sizeof(T))); }
    ~DeviceBuffer() {
        if (ptr != nullptr) cudaFree(ptr);
    }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    size_t bytes() const { return count * sizeof(T); }
};

// ---------------------------------------------------------------- timing
struct Timing {
    std::vector<double> samples_ms;
    double median_ms() const;
    double min_ms() const;
    double max_ms() const;
};

// Times `op` with CUDA events around each repetition after `warmup` untimed calls; the
// median resists the odd slow repetition (clock ramp, a context switch on the host).
Timing time_events(const std::function<void(cudaStream_t)>& op, int warmup, int reps, cudaStream_t stream);

// ---------------------------------------------------------------- JSON
// Values are kept as already-serialised JSON text; enough for flat results and lists.
class Json {
   public:
    Json& num(const std::string& key, double value);
    Json& integer(const std::string& key, long long value);
    Json& str(const std::string& key, const std::string& value);
    Json& boolean(const std::string& key, bool value);
    Json& raw(const std::string& key, const std::string& json_text);
    std::string text() const;

   private:
    std::vector<std::pair<std::string, std::string>> fields_;
};

std::string json_quote(const std::string& text);
std::string json_number(double value);
std::string json_array(const std::vector<std::string>& items);

// ---------------------------------------------------------------- results
struct Result {
    std::string name;   // stable metric name, e.g. "copy", "cublas_bf16"
    std::string unit;   // "GB/s", "TFLOP/s", "us", "ratio"
    double value = 0.0;
    Timing timing;
    bool verified = false;
    double error = 0.0;        // the check's error measure (see check_detail)
    std::string check_detail;  // how correctness was established
    Json params;               // sizes, launch shapes
    Json extra;                // per-benchmark detail (variants, points)
};

struct Options {
    bool quick = false;
    uint32_t seed = 1;
    int device = 0;
    int sm_count = 0;
    size_t l2_bytes = 0;
    size_t total_mem = 0;
    double delay_ms = 0.0;  // --delay-streams: see set_stream_delay_ms
    std::vector<size_t> nccl_sizes;  // --nccl-bytes: the collectives' sizes instead of the default ladder
};

using Emit = std::function<void(Result&&)>;

// One entry per selectable benchmark; each may emit several results.
void bench_memory(const Options& options, const Emit& emit);      // copy, triad, fused vs unfused
void bench_roofline(const Options& options, const Emit& emit);    // FLOP/byte sweep
void bench_reduction(const Options& options, const Emit& emit);   // shared-memory dot product
void bench_sgemm(const Options& options, const Emit& emit);       // our tiled SGEMM
void bench_cublas(const Options& options, const Emit& emit);      // cuBLASLt FP32/TF32/FP16/BF16
void bench_softmax(const Options& options, const Emit& emit);     // three-pass vs online
void bench_transfer(const Options& options, const Emit& emit);    // host<->device copies
void prepare_transfer(const Options& options);                    // its host buffers, ahead of it (--then)
void bench_launch(const Options& options, const Emit& emit);      // launch latency
void bench_p2p(const Options& options, const Emit& emit);         // peer access and bandwidth
// Node-level (issue 30, node.cu): every GPU at once; run only when named with --bench.
void bench_p2p_matrix(const Options& options, const Emit& emit);  // every ordered pair, both ways, all-to-all
void bench_host_all(const Options& options, const Emit& emit);    // host <-> every GPU at once
void bench_nccl(const Options& options, const Emit& emit);        // NCCL collectives' bus bandwidth

// GEMM layouts, column-major as cuBLAS sees them; C is always M x N with leading dimension M.
//   NT: A stored M x K (ld M), B stored N x K (ld N), C = A * B^T  (our SGEMM and cuBLAS FP32)
//   TN: A stored K x M (ld K), B stored K x N (ld K), C = A^T * B  (K-major: tensor-core types)
enum class Layout { NT, TN };
enum class Element { F32, F16, BF16 };

// Relative error ||C - ref|| / ||ref|| over sampled entries, the reference recomputed on the
// host in double from the operands as stored on the device (after their rounding).
double gemm_sample_error(const void* a, const void* b, const void* c, Element element, Layout layout, int m,
                         int n, int k, uint32_t seed);
// Elements of C that are NaN or Inf (C is poisoned before the checked run).
unsigned long long count_nonfinite(const void* data, size_t count, Element element);

}  // namespace gh
