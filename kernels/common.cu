#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common.cuh"

namespace gh {

namespace {
double g_stream_delay_ms = 0.0;

// One thread spinning on the global timer: holds its stream for a wall-clock time that does
// not depend on the clocks or on what else runs.
__global__ void spin_kernel(unsigned long long nanoseconds) {
    unsigned long long start = 0, now = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < nanoseconds);
}
}  // namespace

void set_stream_delay_ms(double ms) { g_stream_delay_ms = ms; }

void delay_stream(cudaStream_t stream) {
    if (g_stream_delay_ms <= 0.0) return;
    spin_kernel<<<1, 1, 0, stream>>>(static_cast<unsigned long long>(g_stream_delay_ms * 1e6));
    GH_CHECK_LAUNCH();
}

__global__ void fill_uniform_kernel(float* data, size_t n, uint32_t seed, float lo, float hi) {
    const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += stride) {
        data[i] = uniform(i, seed, lo, hi);
    }
}

void fill_uniform(float* data, size_t n, uint32_t seed, float lo, float hi, cudaStream_t stream) {
    delay_stream(stream);
    fill_uniform_kernel<<<4096, 256, 0, stream>>>(data, n, seed, lo, hi);
    GH_CHECK_LAUNCH();
}

void poison(void* data, size_t bytes, cudaStream_t stream) {
    // 0xFF bytes: a NaN in float, half and bfloat16 alike.
    delay_stream(stream);
    GH_CHECK(cudaMemsetAsync(data, 0xFF, bytes, stream));
}

DeviceCounter::DeviceCounter() { GH_CHECK(cudaMalloc(&ptr, sizeof(unsigned long long))); }
DeviceCounter::~DeviceCounter() {
    if (ptr != nullptr) cudaFree(ptr);
}
void DeviceCounter::reset(cudaStream_t stream) {
    delay_stream(stream);
    GH_CHECK(cudaMemsetAsync(ptr, 0, sizeof(unsigned long long), stream));
}
unsigned long long DeviceCounter::read() {
    unsigned long long value = 0;
    GH_CHECK(cudaMemcpy(&value, ptr, sizeof(value), cudaMemcpyDeviceToHost));
    return value;
}

// ---------------------------------------------------------------- timing
static double percentile_sorted(std::vector<double> values, double q) {
    if (values.empty()) return NAN;
    std::sort(values.begin(), values.end());
    const double position = q * static_cast<double>(values.size() - 1);
    const size_t below = static_cast<size_t>(position);
    const size_t above = std::min(below + 1, values.size() - 1);
    const double weight = position - static_cast<double>(below);
    return values[below] * (1.0 - weight) + values[above] * weight;
}

double Timing::median_ms() const { return percentile_sorted(samples_ms, 0.5); }
double Timing::min_ms() const { return percentile_sorted(samples_ms, 0.0); }
double Timing::max_ms() const { return percentile_sorted(samples_ms, 1.0); }

Timing time_events(const std::function<void(cudaStream_t)>& op, int warmup, int reps, cudaStream_t stream) {
    for (int i = 0; i < warmup; ++i) op(stream);
    GH_CHECK(cudaStreamSynchronize(stream));
    std::vector<cudaEvent_t> events(2 * static_cast<size_t>(reps));
    for (auto& event : events) GH_CHECK(cudaEventCreate(&event));
    for (int i = 0; i < reps; ++i) {
        GH_CHECK(cudaEventRecord(events[2 * i], stream));
        op(stream);
        GH_CHECK(cudaEventRecord(events[2 * i + 1], stream));
    }
    GH_CHECK(cudaStreamSynchronize(stream));
    Timing timing;
    for (int i = 0; i < reps; ++i) {
        float ms = 0.0f;
        GH_CHECK(cudaEventElapsedTime(&ms, events[2 * i], events[2 * i + 1]));
        timing.samples_ms.push_back(ms);
    }
    for (auto& event : events) cudaEventDestroy(event);
    return timing;
}

// ---------------------------------------------------------------- JSON
std::string json_quote(const std::string& text) {
    std::string out = "\"";
    for (const char c : text) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\t': out += "\\t"; break;
            default:
                if (static_cast<unsigned char>(c) < 0x20) {
                    char buffer[8];
                    std::snprintf(buffer, sizeof(buffer), "\\u%04x", c);
                    out += buffer;
                } else {
                    out += c;
                }
        }
    }
    return out + "\"";
}

std::string json_number(double value) {
    if (!std::isfinite(value)) return "null";  // JSON has no NaN; the parser treats null as missing
    char buffer[64];
    std::snprintf(buffer, sizeof(buffer), "%.9g", value);
    return buffer;
}

std::string json_array(const std::vector<std::string>& items) {
    std::string out = "[";
    for (size_t i = 0; i < items.size(); ++i) out += (i ? "," : "") + items[i];
    return out + "]";
}

Json& Json::num(const std::string& key, double value) { return raw(key, json_number(value)); }
Json& Json::integer(const std::string& key, long long value) { return raw(key, std::to_string(value)); }
Json& Json::str(const std::string& key, const std::string& value) { return raw(key, json_quote(value)); }
Json& Json::boolean(const std::string& key, bool value) { return raw(key, value ? "true" : "false"); }
Json& Json::raw(const std::string& key, const std::string& json_text) {
    for (auto& field : fields_) {
        if (field.first == key) {
            field.second = json_text;
            return *this;
        }
    }
    fields_.emplace_back(key, json_text);
    return *this;
}
std::string Json::text() const {
    std::string out = "{";
    for (size_t i = 0; i < fields_.size(); ++i) {
        out += (i ? "," : "") + json_quote(fields_[i].first) + ":" + fields_[i].second;
    }
    return out + "}";
}

// ---------------------------------------------------------------- GEMM checks
static double element_to_double(const unsigned char* base, size_t index, Element element) {
    switch (element) {
        case Element::F32: return reinterpret_cast<const float*>(base)[index];
        case Element::F16: return __half2float(reinterpret_cast<const __half*>(base)[index]);
        case Element::BF16: return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(base)[index]);
    }
    return NAN;
}

static size_t element_size(Element element) { return element == Element::F32 ? 4 : 2; }

// Copies `count` elements spaced `stride` elements apart, starting at `first`.
static std::vector<double> gather(const void* device, size_t first, size_t stride, int count, Element element) {
    const size_t size = element_size(element);
    std::vector<unsigned char> host(size * count);
    const auto* src = static_cast<const unsigned char*>(device) + first * size;
    GH_CHECK(cudaMemcpy2D(host.data(), size, src, stride * size, size, count, cudaMemcpyDeviceToHost));
    std::vector<double> out(count);
    for (int i = 0; i < count; ++i) out[i] = element_to_double(host.data(), i, element);
    return out;
}

double gemm_sample_error(const void* a, const void* b, const void* c, Element element, Layout layout, int m,
                         int n, int k, uint32_t seed) {
    constexpr int kRows = 16;
    constexpr int kCols = 8;
    double error_sq = 0.0;
    double ref_sq = 0.0;
    std::vector<std::vector<double>> columns;
    std::vector<int> column_index;
    for (int s = 0; s < kCols; ++s) {
        const int j = static_cast<int>(hash32(seed * 31U + 7U * s + 1U) % static_cast<uint32_t>(n));
        column_index.push_back(j);
        // B(kk, j): NT stores B as N x K (ld N); TN stores it as K x N (ld K).
        columns.push_back(layout == Layout::NT ? gather(b, j, n, k, element)
                                               : gather(b, static_cast<size_t>(j) * k, 1, k, element));
    }
    for (int r = 0; r < kRows; ++r) {
        const int i = static_cast<int>(hash32(seed * 17U + 13U * r + 5U) % static_cast<uint32_t>(m));
        const std::vector<double> row = layout == Layout::NT
                                            ? gather(a, i, m, k, element)
                                            : gather(a, static_cast<size_t>(i) * k, 1, k, element);
        for (int s = 0; s < kCols; ++s) {
            double ref = 0.0;
            for (int kk = 0; kk < k; ++kk) ref += row[kk] * columns[s][kk];
            const double got =
                gather(c, static_cast<size_t>(i) + static_cast<size_t>(column_index[s]) * m, 1, 1, element)[0];
            error_sq += (got - ref) * (got - ref);
            ref_sq += ref * ref;
        }
    }
    const double error = std::sqrt(error_sq / ref_sq);
    return std::isfinite(error) ? error : INFINITY;
}

template <class T>
__global__ void count_nonfinite_kernel(const T* data, size_t count, unsigned long long* bad) {
    const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    unsigned long long local = 0;
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count; i += stride) {
        const float v = static_cast<float>(data[i]);
        if (!isfinite(v)) ++local;
    }
    if (local) atomicAdd(bad, local);
}

unsigned long long count_nonfinite(const void* data, size_t count, Element element) {
    DeviceCounter bad;
    bad.reset();
    switch (element) {
        case Element::F32:
            count_nonfinite_kernel<<<2048, 256>>>(static_cast<const float*>(data), count, bad.ptr);
            break;
        case Element::F16:
            count_nonfinite_kernel<<<2048, 256>>>(static_cast<const __half*>(data), count, bad.ptr);
            break;
        case Element::BF16:
            count_nonfinite_kernel<<<2048, 256>>>(static_cast<const __nv_bfloat16*>(data), count, bad.ptr);
            break;
    }
    GH_CHECK_LAUNCH();
    return bad.read();
}

}  // namespace gh
