// Host<->device copies (pinned and pageable, each direction and both at once), kernel
// launch latency, and peer-to-peer access and bandwidth between GPUs.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>

#include "common.cuh"

namespace gh {
namespace {

// A cheap pattern the host can write and check at memory speed (the hash would make the
// host side, not the link, the bottleneck of the check).
__host__ __device__ inline uint32_t pattern(size_t index, uint32_t seed) {
    return static_cast<uint32_t>(index) * 2654435761U ^ seed;
}

__global__ void pattern_fill_kernel(uint32_t* data, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<size_t>(gridDim.x) * blockDim.x) {
        data[i] = pattern(i, seed);
    }
}

__global__ void pattern_check_kernel(const uint32_t* data, size_t n, uint32_t seed, unsigned long long* bad) {
    unsigned long long local = 0;
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<size_t>(gridDim.x) * blockDim.x) {
        if (data[i] != pattern(i, seed)) ++local;
    }
    if (local) atomicAdd(bad, local);
}

void host_fill(uint32_t* data, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; ++i) data[i] = pattern(i, seed);
}

size_t host_mismatches(const uint32_t* data, size_t n, uint32_t seed) {
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) bad += data[i] != pattern(i, seed);
    return bad;
}

unsigned long long device_mismatches(const uint32_t* data, size_t n, uint32_t seed) {
    DeviceCounter bad;
    bad.reset();
    pattern_check_kernel<<<2048, 256>>>(data, n, seed, bad.ptr);
    GH_CHECK_LAUNCH();
    return bad.read();
}

struct PinnedBuffer {
    uint32_t* ptr = nullptr;
    explicit PinnedBuffer(size_t bytes) { GH_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&ptr), bytes, cudaHostAllocDefault)); }
    ~PinnedBuffer() {
        if (ptr != nullptr) cudaFreeHost(ptr);
    }
    PinnedBuffer(const PinnedBuffer&) = delete;
    PinnedBuffer& operator=(const PinnedBuffer&) = delete;
};

Result link_result(const std::string& name, double bytes, const Timing& timing, bool verified, double bad,
                   const std::string& detail, const std::string& memory, const std::string& direction) {
    Result r;
    r.name = name;
    r.unit = "GB/s";
    r.value = bytes / (timing.median_ms() * 1e6);
    r.timing = timing;
    r.verified = verified;
    r.error = bad;
    r.check_detail = detail;
    r.params.integer("bytes", static_cast<long long>(bytes)).str("host_memory", memory).str("direction", direction);
    return r;
}

// The host side of bench_transfer: pinned and pageable buffers, the upload patterns written. Making
// them (pinning 2 x 256 MiB, writing and touching 1 GiB) takes about as long as the copies they
// time, so under --then prepare_transfer makes them with the first set, while every GPU measures
// locally, and not in this GPU's turn on the link, where the GPUs wait for each other.
struct TransferHost {
    size_t bytes;
    uint32_t seed_up;
    bool pageable;
    PinnedBuffer up, down;
    std::vector<uint32_t> pageable_up, pageable_down;
    TransferHost(size_t bytes_, uint32_t seed_up_, bool pageable_)
        : bytes(bytes_), seed_up(seed_up_), pageable(pageable_), up(bytes_), down(bytes_) {
        const size_t n = bytes / sizeof(uint32_t);
        host_fill(up.ptr, n, seed_up);
        if (pageable) {
            pageable_up.resize(n);  // resize writes every element: the pages are the process's now
            pageable_down.resize(n);
            host_fill(pageable_up.data(), n, seed_up);
        }
    }
};

size_t transfer_bytes(const Options& options) {
    // 256 MiB per copy: long enough that the ~10 us setup of a copy is noise.
    return options.quick ? (size_t{128} << 20) : (size_t{256} << 20);
}

uint32_t transfer_seed_up(const Options& options) { return options.seed * 29 + 1; }

std::unique_ptr<TransferHost>& prepared_transfer() {
    static std::unique_ptr<TransferHost> prepared;
    return prepared;
}

}  // namespace

void prepare_transfer(const Options& options) {
    prepared_transfer() = std::make_unique<TransferHost>(transfer_bytes(options), transfer_seed_up(options), !options.quick);
}

void bench_transfer(const Options& options, const Emit& emit) {
    const size_t bytes = transfer_bytes(options);
    const size_t n = bytes / sizeof(uint32_t);
    const int reps = options.quick ? 5 : 10;
    const uint32_t seed_up = transfer_seed_up(options), seed_down = options.seed * 29 + 2;
    // Taken, not shared: the buffers are freed when this benchmark ends, as if it had made them.
    std::unique_ptr<TransferHost> host = std::move(prepared_transfer());
    if (!host || host->bytes != bytes || host->seed_up != seed_up || host->pageable != !options.quick) {
        host = std::make_unique<TransferHost>(bytes, seed_up, !options.quick);
    }
    DeviceBuffer<uint32_t> up(n), down(n);
    PinnedBuffer& host_up = host->up;
    PinnedBuffer& host_down = host->down;
    cudaStream_t s1, s2;
    GH_CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    GH_CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    delay_stream(0);
    pattern_fill_kernel<<<2048, 256>>>(down.ptr, n, seed_down);
    GH_CHECK_LAUNCH();
    GH_CHECK(cudaDeviceSynchronize());

    auto h2d = [&](cudaStream_t stream) {
        GH_CHECK(cudaMemcpyAsync(up.ptr, host_up.ptr, bytes, cudaMemcpyHostToDevice, stream));
    };
    auto d2h = [&](cudaStream_t stream) {
        GH_CHECK(cudaMemcpyAsync(host_down.ptr, down.ptr, bytes, cudaMemcpyDeviceToHost, stream));
    };

    // ---- pinned, one direction at a time
    {
        // The poison goes on the copy's own stream: s1 is non-blocking, so it does not wait for
        // the legacy default stream, and a poison queued there could land after the copy (a
        // false "wrong result" whenever the legacy stream is held up, e.g. by another process).
        poison(up.ptr, bytes, s1);
        h2d(s1);
        GH_CHECK(cudaStreamSynchronize(s1));
        const unsigned long long bad = device_mismatches(up.ptr, n, seed_up);
        const Timing timing = time_events(h2d, 2, reps, s1);
        emit(link_result("h2d_pinned", static_cast<double>(bytes), timing, bad == 0, static_cast<double>(bad),
                         "device copy equals the host pattern word for word", "pinned", "host to device"));
    }
    {
        std::memset(host_down.ptr, 0xFF, bytes);
        d2h(s1);
        GH_CHECK(cudaStreamSynchronize(s1));
        const size_t bad = host_mismatches(host_down.ptr, n, seed_down);
        const Timing timing = time_events(d2h, 2, reps, s1);
        emit(link_result("d2h_pinned", static_cast<double>(bytes), timing, bad == 0, static_cast<double>(bad),
                         "host copy equals the device pattern word for word", "pinned", "device to host"));
    }
    // ---- pinned, both directions at once on two streams
    {
        cudaEvent_t start, down_done;
        GH_CHECK(cudaEventCreate(&start));
        GH_CHECK(cudaEventCreate(&down_done));
        auto both = [&](cudaStream_t) {
            GH_CHECK(cudaEventRecord(start, s1));
            GH_CHECK(cudaStreamWaitEvent(s2, start, 0));
            h2d(s1);
            d2h(s2);
            GH_CHECK(cudaEventRecord(down_done, s2));
            GH_CHECK(cudaStreamWaitEvent(s1, down_done, 0));
        };
        // On s1, before `both` records its start event there, which s2 waits for: both copies
        // come after the poison (on the legacy stream it could land after the H2D copy).
        poison(up.ptr, bytes, s1);
        std::memset(host_down.ptr, 0xFF, bytes);
        both(s1);
        GH_CHECK(cudaDeviceSynchronize());
        const unsigned long long bad = device_mismatches(up.ptr, n, seed_up) + host_mismatches(host_down.ptr, n, seed_down);
        // time_events brackets the work with events on s1, which waits for s2's copy.
        const Timing timing = time_events(both, 2, reps, s1);
        Result r = link_result("bidir_pinned", 2.0 * static_cast<double>(bytes), timing, bad == 0,
                               static_cast<double>(bad), "both copies equal their patterns word for word", "pinned",
                               "both at once (bytes of both directions counted)");
        emit(std::move(r));
        cudaEventDestroy(start);
        cudaEventDestroy(down_done);
    }
    // ---- pageable (malloc'd) memory: the driver stages it through its own pinned buffers
    if (!options.quick) {
        std::vector<uint32_t>& pageable_up = host->pageable_up;
        std::vector<uint32_t>& pageable_down = host->pageable_down;
        auto host_clock_ms = [](const std::function<void()>& op, int count) {
            Timing t;
            for (int i = 0; i < count; ++i) {
                const auto begin = std::chrono::steady_clock::now();
                op();
                const auto end = std::chrono::steady_clock::now();
                t.samples_ms.push_back(std::chrono::duration<double, std::milli>(end - begin).count());
            }
            return t;
        };
        // cudaMemcpy from pageable memory returns once the source may be reused, so a host
        // clock around it plus a device synchronisation brackets the whole copy.
        auto up_op = [&] {
            GH_CHECK(cudaMemcpy(up.ptr, pageable_up.data(), bytes, cudaMemcpyHostToDevice));
            GH_CHECK(cudaDeviceSynchronize());
        };
        auto down_op = [&] { GH_CHECK(cudaMemcpy(pageable_down.data(), down.ptr, bytes, cudaMemcpyDeviceToHost)); };
        poison(up.ptr, bytes);
        up_op();
        const unsigned long long bad_up = device_mismatches(up.ptr, n, seed_up);
        up_op();
        emit(link_result("h2d_pageable", static_cast<double>(bytes), host_clock_ms(up_op, 5), bad_up == 0,
                         static_cast<double>(bad_up), "device copy equals the host pattern word for word", "pageable",
                         "host to device"));
        down_op();
        const size_t bad_down = host_mismatches(pageable_down.data(), n, seed_down);
        down_op();
        emit(link_result("d2h_pageable", static_cast<double>(bytes), host_clock_ms(down_op, 5), bad_down == 0,
                         static_cast<double>(bad_down), "host copy equals the device pattern word for word", "pageable",
                         "device to host"));
    }
    cudaStreamDestroy(s1);
    cudaStreamDestroy(s2);
}

// ---------------------------------------------------------------- launch latency
namespace {
__global__ void empty_kernel(int* flag) {
    if (flag != nullptr && threadIdx.x == 0 && blockIdx.x == 0) *flag += 1;
}
}  // namespace

void bench_launch(const Options& options, const Emit& emit) {
    DeviceBuffer<int> counter(1);
    cudaStream_t stream;
    GH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    // Zeroed on the launches' own stream: cudaMemset on device memory does not wait on the host
    // and the legacy stream does not order with a non-blocking one, so a late zeroing would
    // erase counted launches and report launches as lost.
    delay_stream(stream);
    GH_CHECK(cudaMemsetAsync(counter.ptr, 0, sizeof(int), stream));
    for (int i = 0; i < 100; ++i) empty_kernel<<<1, 32, 0, stream>>>(counter.ptr);  // warm-up: module load
    GH_CHECK(cudaStreamSynchronize(stream));
    const int batch = options.quick ? 2000 : 10000;
    const int trials = options.quick ? 5 : 11;
    // Back-to-back launches: the cost per launch once the queue is full (the rate a
    // framework's stream of small kernels sees).
    Timing queued;
    for (int t = 0; t < trials; ++t) {
        const auto begin = std::chrono::steady_clock::now();
        for (int i = 0; i < batch; ++i) empty_kernel<<<1, 32, 0, stream>>>(counter.ptr);
        GH_CHECK(cudaStreamSynchronize(stream));
        const auto end = std::chrono::steady_clock::now();
        queued.samples_ms.push_back(std::chrono::duration<double, std::milli>(end - begin).count() / batch);
    }
    // Launch then wait, one at a time: the round trip host -> GPU -> host.
    Timing round_trip;
    const int singles = options.quick ? 500 : 2000;
    for (int i = 0; i < singles; ++i) {
        const auto begin = std::chrono::steady_clock::now();
        empty_kernel<<<1, 32, 0, stream>>>(counter.ptr);
        GH_CHECK(cudaStreamSynchronize(stream));
        const auto end = std::chrono::steady_clock::now();
        round_trip.samples_ms.push_back(std::chrono::duration<double, std::milli>(end - begin).count());
    }
    GH_CHECK_LAUNCH();
    int count = 0;
    GH_CHECK(cudaMemcpy(&count, counter.ptr, sizeof(int), cudaMemcpyDeviceToHost));
    const int expected = 100 + batch * trials + singles;
    for (int which = 0; which < 2; ++which) {
        Result r;
        r.name = which == 0 ? "launch_queued" : "launch_roundtrip";
        r.unit = "us";
        r.timing = which == 0 ? queued : round_trip;
        r.value = r.timing.median_ms() * 1000.0;
        r.verified = count == expected;
        r.error = std::abs(count - expected);
        r.check_detail = "every launch ran: the kernel's counter reached " + std::to_string(count) + " of " +
                         std::to_string(expected);
        r.params.str("kernel", "empty, 1 block of 32 threads")
            .str("measure", which == 0 ? "host time per launch over batches of back-to-back launches"
                                       : "host time of launch + cudaStreamSynchronize");
        emit(std::move(r));
    }
    cudaStreamDestroy(stream);
}

// ---------------------------------------------------------------- peer to peer
void bench_p2p(const Options& options, const Emit& emit) {
    int count = 0;
    GH_CHECK(cudaGetDeviceCount(&count));
    Result summary;
    summary.name = "p2p_access";
    summary.unit = "pairs";
    summary.verified = true;
    summary.check_detail = "cudaDeviceCanAccessPeer for every ordered pair";
    summary.params.integer("gpus", count);
    if (count < 2) {
        // Reported, not skipped: the verdict says why there is nothing to judge.
        summary.value = 0;
        summary.extra.str("note", "one GPU visible: no peer path to test");
        emit(std::move(summary));
        return;
    }
    const size_t bytes = options.quick ? (size_t{256} << 20) : (size_t{1} << 30);
    const size_t n = bytes / sizeof(uint32_t);
    std::vector<std::string> pairs;
    int capable = 0;
    for (int src = 0; src < count; ++src) {
        for (int dst = 0; dst < count; ++dst) {
            if (src == dst) continue;
            int can = 0;
            GH_CHECK(cudaDeviceCanAccessPeer(&can, src, dst));
            capable += can;
            pairs.push_back(Json().integer("src", src).integer("dst", dst).boolean("peer_access", can != 0).text());
            // Bandwidth only for neighbouring pairs (0->1, 1->0, 1->2, ...) to bound the run time
            // on 8-GPU machines; access is reported for all pairs above.
            if (!(dst == src + 1 || (src == dst + 1))) continue;
            GH_CHECK(cudaSetDevice(src));
            if (can) {
                const cudaError_t status = cudaDeviceEnablePeerAccess(dst, 0);
                if (status != cudaErrorPeerAccessAlreadyEnabled) GH_CHECK(status);
                cudaGetLastError();
            }
            uint32_t* src_buffer = nullptr;
            uint32_t* dst_buffer = nullptr;
            GH_CHECK(cudaMalloc(&src_buffer, bytes));
            pattern_fill_kernel<<<2048, 256>>>(src_buffer, n, options.seed + src);
            GH_CHECK_LAUNCH();
            GH_CHECK(cudaDeviceSynchronize());
            GH_CHECK(cudaSetDevice(dst));
            GH_CHECK(cudaMalloc(&dst_buffer, bytes));
            GH_CHECK(cudaMemset(dst_buffer, 0xFF, bytes));
            GH_CHECK(cudaDeviceSynchronize());
            GH_CHECK(cudaSetDevice(src));
            cudaStream_t stream;
            GH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
            auto copy = [&](cudaStream_t s) { GH_CHECK(cudaMemcpyPeerAsync(dst_buffer, dst, src_buffer, src, bytes, s)); };
            copy(stream);
            GH_CHECK(cudaStreamSynchronize(stream));
            GH_CHECK(cudaSetDevice(dst));
            const unsigned long long bad = device_mismatches(dst_buffer, n, options.seed + src);
            GH_CHECK(cudaSetDevice(src));
            const Timing timing = time_events(copy, 2, options.quick ? 5 : 10, stream);
            Result r;
            r.name = "p2p_" + std::to_string(src) + "_to_" + std::to_string(dst);
            r.unit = "GB/s";
            r.value = static_cast<double>(bytes) / (timing.median_ms() * 1e6);
            r.timing = timing;
            r.verified = bad == 0;
            r.error = static_cast<double>(bad);
            r.check_detail = "destination equals the source pattern word for word";
            r.params.integer("bytes", static_cast<long long>(bytes)).boolean("peer_access", can != 0)
                .str("path", can ? "direct peer copy" : "staged through host memory by the driver");
            emit(std::move(r));
            cudaStreamDestroy(stream);
            cudaFree(src_buffer);
            GH_CHECK(cudaSetDevice(dst));
            cudaFree(dst_buffer);
        }
    }
    GH_CHECK(cudaSetDevice(options.device));
    summary.value = capable;
    summary.params.integer("ordered_pairs", count * (count - 1));
    summary.extra.raw("pairs", json_array(pairs));
    emit(std::move(summary));
}

}  // namespace gh
