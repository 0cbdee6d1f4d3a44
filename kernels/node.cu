// Node-level measurements (issue 30): every GPU of the guest at once.
//
//   p2p_matrix  every ordered pair one direction, every pair both directions at once, all-to-all
//   host_all    host -> all GPUs and all GPUs -> host at once, pinned: the aggregate and each GPU's share
//   nccl        all_reduce, all_gather, reduce_scatter through the guest's NCCL (dlopen'ed, never
//               re-implemented), bus bandwidth by nccl-tests' definitions
//
// Transfers that run at once on several GPUs are timed with the host clock around launches that
// all start before any is waited for; each GPU's own share is timed with events on its stream.
#include <dlfcn.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "common.cuh"

namespace gh {
namespace {

__host__ __device__ inline uint32_t node_pattern(size_t i, uint32_t seed) {
    return hash32(static_cast<uint32_t>(i) ^ hash32(seed ^ static_cast<uint32_t>(i >> 32)));
}

__global__ void node_fill_kernel(uint32_t* data, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<size_t>(gridDim.x) * blockDim.x) {
        data[i] = node_pattern(i, seed);
    }
}

// Counts words of data[0..n) that differ from node_pattern(first + i, seed).
__global__ void node_check_kernel(const uint32_t* data, size_t n, size_t first, uint32_t seed,
                                  unsigned long long* bad) {
    unsigned long long local = 0;
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<size_t>(gridDim.x) * blockDim.x) {
        if (data[i] != node_pattern(first + i, seed)) ++local;
    }
    if (local) atomicAdd(bad, local);
}

unsigned long long node_mismatches(int device, const uint32_t* data, size_t n, size_t first, uint32_t seed) {
    GH_CHECK(cudaSetDevice(device));
    unsigned long long* bad = nullptr;
    GH_CHECK(cudaMalloc(&bad, sizeof(unsigned long long)));
    GH_CHECK(cudaMemset(bad, 0, sizeof(unsigned long long)));
    node_check_kernel<<<1024, 256>>>(data, n, first, seed, bad);
    GH_CHECK_LAUNCH();
    unsigned long long count = 0;
    GH_CHECK(cudaMemcpy(&count, bad, sizeof(count), cudaMemcpyDeviceToHost));
    cudaFree(bad);
    return count;
}

int device_count() {
    int count = 0;
    GH_CHECK(cudaGetDeviceCount(&count));
    return count;
}

// Peer pairs the run must treat as blocked (GPUHOST_DENY_PEER="0:1,2:3"): the fault a hypervisor or
// ACS causes, made on demand so that its finding can be shown on a node where P2P works.
bool peer_denied(int src, int dst) {
    const char* text = std::getenv("GPUHOST_DENY_PEER");
    if (text == nullptr) return false;
    const std::string wanted = std::to_string(src) + ":" + std::to_string(dst);
    std::string list = std::string(",") + text + ",";
    return list.find("," + wanted + ",") != std::string::npos;
}

struct Streams {
    std::vector<cudaStream_t> streams;
    std::vector<int> devices;
    cudaStream_t add(int device) {
        GH_CHECK(cudaSetDevice(device));
        cudaStream_t s;
        GH_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        streams.push_back(s);
        devices.push_back(device);
        return s;
    }
    void sync() {
        for (size_t i = 0; i < streams.size(); ++i) {
            GH_CHECK(cudaSetDevice(devices[i]));
            GH_CHECK(cudaStreamSynchronize(streams[i]));
        }
    }
    ~Streams() {
        for (size_t i = 0; i < streams.size(); ++i) {
            cudaSetDevice(devices[i]);
            cudaStreamDestroy(streams[i]);
        }
    }
};

struct DeviceArray {
    int device = 0;
    uint32_t* ptr = nullptr;
    DeviceArray(int d, size_t bytes) : device(d) {
        GH_CHECK(cudaSetDevice(d));
        GH_CHECK(cudaMalloc(&ptr, bytes));
    }
    ~DeviceArray() {
        cudaSetDevice(device);
        cudaFree(ptr);
    }
    DeviceArray(const DeviceArray&) = delete;
    DeviceArray& operator=(const DeviceArray&) = delete;
};

// Host-clock samples of `op` (which must leave all its work waited for), after `warmup` untimed calls.
Timing host_timed(const std::function<void()>& op, int warmup, int reps) {
    for (int i = 0; i < warmup; ++i) op();
    Timing t;
    for (int i = 0; i < reps; ++i) {
        const auto begin = std::chrono::steady_clock::now();
        op();
        t.samples_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count());
    }
    return t;
}

Result bandwidth(const std::string& name, double bytes, const Timing& timing, bool verified, double bad,
                 const std::string& detail) {
    Result r;
    r.name = name;
    r.unit = "GB/s";
    r.value = bytes / (timing.median_ms() * 1e6);
    r.timing = timing;
    r.verified = verified;
    r.error = bad;
    r.check_detail = detail;
    r.params.integer("bytes", static_cast<long long>(bytes));
    return r;
}

}  // namespace

// ---------------------------------------------------------------- the P2P matrix
void bench_p2p_matrix(const Options& options, const Emit& emit) {
    const int n = device_count();
    if (n < 2) throw std::runtime_error("one GPU visible: no pair to measure");
    const size_t bytes = options.quick ? (size_t{256} << 20) : (size_t{1} << 30);
    const size_t words = bytes / sizeof(uint32_t);
    const int reps = options.quick ? 5 : 10;
    std::vector<std::unique_ptr<DeviceArray>> src, dst;
    std::vector<std::vector<int>> peer(n, std::vector<int>(n, 0));
    for (int g = 0; g < n; ++g) {
        src.emplace_back(new DeviceArray(g, bytes));
        dst.emplace_back(new DeviceArray(g, bytes));
        node_fill_kernel<<<2048, 256>>>(src[g]->ptr, words, options.seed + 101 * g);
        GH_CHECK_LAUNCH();
    }
    for (int a = 0; a < n; ++a) {
        for (int b = 0; b < n; ++b) {
            if (a == b) continue;
            int can = 0;
            GH_CHECK(cudaDeviceCanAccessPeer(&can, a, b));
            if (peer_denied(a, b)) can = 0;
            peer[a][b] = can;
            if (can) {
                GH_CHECK(cudaSetDevice(a));
                const cudaError_t status = cudaDeviceEnablePeerAccess(b, 0);
                if (status != cudaErrorPeerAccessAlreadyEnabled) GH_CHECK(status);
                cudaGetLastError();
            }
        }
    }
    for (int g = 0; g < n; ++g) {
        GH_CHECK(cudaSetDevice(g));
        GH_CHECK(cudaDeviceSynchronize());
    }
    // A pair the run treats as blocked is copied through host memory, as the driver does when
    // peer access is off: cudaMemcpyPeer would still take the direct path where it exists.
    auto copy = [&](int a, int b, void* to, const void* from, size_t count, cudaStream_t s, uint32_t* bounce) {
        if (peer[a][b] || bounce == nullptr) {
            GH_CHECK(cudaMemcpyPeerAsync(to, b, from, a, count, s));
        } else {
            GH_CHECK(cudaMemcpyAsync(bounce, from, count, cudaMemcpyDeviceToHost, s));
            GH_CHECK(cudaMemcpyAsync(to, bounce, count, cudaMemcpyHostToDevice, s));
        }
    };
    uint32_t* bounce = nullptr;
    bool any_denied = false;
    for (int a = 0; a < n; ++a)
        for (int b = 0; b < n; ++b) any_denied = any_denied || (a != b && peer_denied(a, b));
    if (any_denied) GH_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&bounce), 2 * bytes, cudaHostAllocPortable));

    // One direction, each ordered pair alone.
    for (int a = 0; a < n; ++a) {
        for (int b = 0; b < n; ++b) {
            if (a == b) continue;
            GH_CHECK(cudaSetDevice(b));
            GH_CHECK(cudaMemset(dst[b]->ptr, 0xFF, bytes));
            GH_CHECK(cudaDeviceSynchronize());
            Streams streams;
            cudaStream_t s = streams.add(a);
            auto op = [&](cudaStream_t st) { copy(a, b, dst[b]->ptr, src[a]->ptr, bytes, st, bounce); };
            op(s);
            GH_CHECK(cudaStreamSynchronize(s));
            const unsigned long long bad = node_mismatches(b, dst[b]->ptr, words, 0, options.seed + 101 * a);
            GH_CHECK(cudaSetDevice(a));
            const Timing timing = time_events(op, 1, reps, s);
            Result r = bandwidth("p2p_pair_" + std::to_string(a) + "_to_" + std::to_string(b), static_cast<double>(bytes),
                                 timing, bad == 0, static_cast<double>(bad),
                                 "destination equals the source pattern word for word");
            r.params.integer("src", a).integer("dst", b).boolean("peer_access", peer[a][b] != 0)
                .str("direction", "one direction").str("path", peer[a][b] ? "direct peer copy" : "staged through host memory");
            emit(std::move(r));
        }
    }
    // Both directions of each pair at once, on a stream of each GPU.
    for (int a = 0; a < n; ++a) {
        for (int b = a + 1; b < n; ++b) {
            Streams streams;
            cudaStream_t sa = streams.add(a), sb = streams.add(b);
            for (int g : {a, b}) {
                GH_CHECK(cudaSetDevice(g));
                GH_CHECK(cudaMemset(dst[g]->ptr, 0xFF, bytes));
                GH_CHECK(cudaDeviceSynchronize());
            }
            auto both = [&] {
                GH_CHECK(cudaSetDevice(a));
                copy(a, b, dst[b]->ptr, src[a]->ptr, bytes, sa, bounce);
                GH_CHECK(cudaSetDevice(b));
                copy(b, a, dst[a]->ptr, src[b]->ptr, bytes, sb, bounce == nullptr ? nullptr : bounce + words);
                streams.sync();
            };
            both();
            const unsigned long long bad = node_mismatches(b, dst[b]->ptr, words, 0, options.seed + 101 * a) +
                                           node_mismatches(a, dst[a]->ptr, words, 0, options.seed + 101 * b);
            const Timing timing = host_timed(both, 1, reps);
            Result r = bandwidth("p2p_bidir_" + std::to_string(a) + "_" + std::to_string(b),
                                 2.0 * static_cast<double>(bytes), timing, bad == 0, static_cast<double>(bad),
                                 "both destinations equal their sources word for word");
            r.params.integer("src", a).integer("dst", b).boolean("peer_access", peer[a][b] && peer[b][a])
                .str("direction", "both at once (bytes of both directions counted)");
            emit(std::move(r));
        }
    }
    // All to all: every GPU sends a slice to every other GPU, all at once.
    {
        const size_t slice_words = words / static_cast<size_t>(n);
        const size_t slice = slice_words * sizeof(uint32_t);
        Streams streams;
        std::vector<cudaStream_t> pair_stream(static_cast<size_t>(n) * n);
        for (int a = 0; a < n; ++a)
            for (int b = 0; b < n; ++b)
                if (a != b) pair_stream[a * n + b] = streams.add(a);
        for (int g = 0; g < n; ++g) {
            GH_CHECK(cudaSetDevice(g));
            GH_CHECK(cudaMemset(dst[g]->ptr, 0xFF, bytes));
            GH_CHECK(cudaDeviceSynchronize());
        }
        auto all = [&] {
            for (int a = 0; a < n; ++a) {
                GH_CHECK(cudaSetDevice(a));
                for (int b = 0; b < n; ++b) {
                    if (a == b) continue;
                    // Source slice b of GPU a lands in slot a of GPU b.
                    copy(a, b, dst[b]->ptr + a * slice_words, src[a]->ptr + b * slice_words, slice,
                         pair_stream[a * n + b], nullptr);
                }
            }
            streams.sync();
        };
        all();
        unsigned long long bad = 0;
        for (int b = 0; b < n; ++b)
            for (int a = 0; a < n; ++a)
                if (a != b)
                    bad += node_mismatches(b, dst[b]->ptr + a * slice_words, slice_words, b * slice_words,
                                           options.seed + 101 * a);
        const Timing timing = host_timed(all, 1, reps);
        Result r = bandwidth("p2p_all_to_all", static_cast<double>(slice) * n * (n - 1), timing, bad == 0,
                             static_cast<double>(bad), "every slot of every GPU equals its source slice");
        r.params.integer("gpus", n).integer("slice_bytes", static_cast<long long>(slice))
            .str("direction", "every ordered pair at once (bytes of all pairs counted)");
        emit(std::move(r));
    }
    if (bounce != nullptr) cudaFreeHost(bounce);
    GH_CHECK(cudaSetDevice(options.device));
}

// ---------------------------------------------------------------- host <-> all GPUs at once
void bench_host_all(const Options& options, const Emit& emit) {
    const int n = device_count();
    const size_t bytes = options.quick ? (size_t{128} << 20) : (size_t{256} << 20);
    const size_t words = bytes / sizeof(uint32_t);
    const int reps = options.quick ? 5 : 10;
    std::vector<std::unique_ptr<DeviceArray>> up, down;
    std::vector<uint32_t*> host_up(n, nullptr), host_down(n, nullptr);
    struct FreeHost {
        std::vector<uint32_t*>* a;
        std::vector<uint32_t*>* b;
        ~FreeHost() {
            for (auto* list : {a, b})
                for (uint32_t* p : *list)
                    if (p != nullptr) cudaFreeHost(p);
        }
    } free_host{&host_up, &host_down};
    Streams streams;
    std::vector<cudaStream_t> s(n);
    for (int g = 0; g < n; ++g) {
        up.emplace_back(new DeviceArray(g, bytes));
        down.emplace_back(new DeviceArray(g, bytes));
        GH_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host_up[g]), bytes, cudaHostAllocDefault));
        GH_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host_down[g]), bytes, cudaHostAllocDefault));
        for (size_t i = 0; i < words; ++i) host_up[g][i] = node_pattern(i, options.seed + 7 * g);
        s[g] = streams.add(g);
        node_fill_kernel<<<2048, 256, 0, s[g]>>>(down[g]->ptr, words, options.seed + 7 * g + 3);
        GH_CHECK_LAUNCH();
    }
    streams.sync();
    for (int direction = 0; direction < 2; ++direction) {
        const bool to_device = direction == 0;
        std::vector<Timing> share(n);
        std::vector<cudaEvent_t> begin(n), end(n);
        for (int g = 0; g < n; ++g) {
            GH_CHECK(cudaSetDevice(g));
            GH_CHECK(cudaEventCreate(&begin[g]));
            GH_CHECK(cudaEventCreate(&end[g]));
        }
        auto all = [&](bool record) {
            for (int g = 0; g < n; ++g) {
                GH_CHECK(cudaSetDevice(g));
                if (record) GH_CHECK(cudaEventRecord(begin[g], s[g]));
                if (to_device) {
                    GH_CHECK(cudaMemcpyAsync(up[g]->ptr, host_up[g], bytes, cudaMemcpyHostToDevice, s[g]));
                } else {
                    GH_CHECK(cudaMemcpyAsync(host_down[g], down[g]->ptr, bytes, cudaMemcpyDeviceToHost, s[g]));
                }
                if (record) GH_CHECK(cudaEventRecord(end[g], s[g]));
            }
            streams.sync();
            if (record) {
                for (int g = 0; g < n; ++g) {
                    float ms = 0.0f;
                    GH_CHECK(cudaEventElapsedTime(&ms, begin[g], end[g]));
                    share[g].samples_ms.push_back(ms);
                }
            }
        };
        for (int g = 0; g < n; ++g) {
            GH_CHECK(cudaSetDevice(g));
            if (to_device) {
                poison(up[g]->ptr, bytes, s[g]);
            } else {
                std::memset(host_down[g], 0xFF, bytes);
            }
        }
        streams.sync();
        all(false);
        unsigned long long bad = 0;
        for (int g = 0; g < n; ++g) {
            if (to_device) {
                bad += node_mismatches(g, up[g]->ptr, words, 0, options.seed + 7 * g);
            } else {
                for (size_t i = 0; i < words; ++i) bad += host_down[g][i] != node_pattern(i, options.seed + 7 * g + 3);
            }
        }
        const Timing timing = host_timed([&] { all(true); }, 1, reps);
        std::vector<std::string> per_gpu;
        // The warm-up call recorded no events; every timed call recorded one sample per GPU.
        for (int g = 0; g < n; ++g) {
            per_gpu.push_back(Json().integer("gpu", g)
                                  .num("GBps", static_cast<double>(bytes) / (share[g].median_ms() * 1e6))
                                  .num("median_ms", share[g].median_ms())
                                  .text());
            GH_CHECK(cudaSetDevice(g));
            cudaEventDestroy(begin[g]);
            cudaEventDestroy(end[g]);
        }
        Result r = bandwidth(to_device ? "h2d_all" : "d2h_all", static_cast<double>(bytes) * n, timing, bad == 0,
                             static_cast<double>(bad),
                             to_device ? "every GPU's copy equals its host pattern word for word"
                                       : "every host copy equals its GPU's pattern word for word");
        r.params.integer("gpus", n).integer("bytes_per_gpu", static_cast<long long>(bytes)).str("host_memory", "pinned")
            .str("direction", to_device ? "host to every GPU at once" : "every GPU to host at once");
        r.extra.raw("per_gpu", json_array(per_gpu));
        emit(std::move(r));
    }
    GH_CHECK(cudaSetDevice(options.device));
}

// ---------------------------------------------------------------- NCCL collectives
namespace {

// The few NCCL entry points used, declared as nccl.h does (stable since NCCL 2.0): the library is
// loaded at run time so that the suite builds and runs where NCCL is absent.
using NcclComm = void*;
using NcclResult = int;
constexpr int kNcclFloat32 = 7;
constexpr int kNcclSum = 0;

struct Nccl {
    void* handle = nullptr;
    NcclResult (*get_version)(int*) = nullptr;
    NcclResult (*comm_init_all)(NcclComm*, int, const int*) = nullptr;
    NcclResult (*comm_destroy)(NcclComm) = nullptr;
    NcclResult (*group_start)() = nullptr;
    NcclResult (*group_end)() = nullptr;
    NcclResult (*all_reduce)(const void*, void*, size_t, int, int, NcclComm, cudaStream_t) = nullptr;
    NcclResult (*all_gather)(const void*, void*, size_t, int, NcclComm, cudaStream_t) = nullptr;
    NcclResult (*reduce_scatter)(const void*, void*, size_t, int, int, NcclComm, cudaStream_t) = nullptr;
    const char* (*error_string)(NcclResult) = nullptr;

    explicit Nccl(const std::string& path) {
        handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (handle == nullptr) throw std::runtime_error(std::string("NCCL could not be loaded: ") + dlerror());
        load(get_version, "ncclGetVersion");
        load(comm_init_all, "ncclCommInitAll");
        load(comm_destroy, "ncclCommDestroy");
        load(group_start, "ncclGroupStart");
        load(group_end, "ncclGroupEnd");
        load(all_reduce, "ncclAllReduce");
        load(all_gather, "ncclAllGather");
        load(reduce_scatter, "ncclReduceScatter");
        load(error_string, "ncclGetErrorString");
    }
    template <class F>
    void load(F& slot, const char* name) {
        slot = reinterpret_cast<F>(dlsym(handle, name));
        if (slot == nullptr) throw std::runtime_error(std::string("NCCL has no ") + name);
    }
    void check(NcclResult status, const char* what) const {
        if (status != 0) throw std::runtime_error(std::string("NCCL ") + what + " failed: " + error_string(status));
    }
};

// Inputs whose sums are exact in float32: small integers.
__global__ void nccl_fill_kernel(float* data, size_t n, size_t first, float scale) {
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<size_t>(gridDim.x) * blockDim.x) {
        data[i] = scale * static_cast<float>((first + i) % 7 + 1);
    }
}

__global__ void nccl_check_kernel(const float* data, size_t n, size_t first, float scale, unsigned long long* bad) {
    unsigned long long local = 0;
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<size_t>(gridDim.x) * blockDim.x) {
        if (data[i] != scale * static_cast<float>((first + i) % 7 + 1)) ++local;
    }
    if (local) atomicAdd(bad, local);
}

unsigned long long nccl_mismatches(int device, const float* data, size_t n, size_t first, float scale) {
    GH_CHECK(cudaSetDevice(device));
    unsigned long long* bad = nullptr;
    GH_CHECK(cudaMalloc(&bad, sizeof(unsigned long long)));
    GH_CHECK(cudaMemset(bad, 0, sizeof(unsigned long long)));
    nccl_check_kernel<<<1024, 256>>>(data, n, first, scale, bad);
    GH_CHECK_LAUNCH();
    unsigned long long count = 0;
    GH_CHECK(cudaMemcpy(&count, bad, sizeof(count), cudaMemcpyDeviceToHost));
    cudaFree(bad);
    return count;
}

}  // namespace

void bench_nccl(const Options& options, const Emit& emit) {
    const char* path = std::getenv("GPUHOST_NCCL");
    if (path == nullptr || *path == '\0') throw std::runtime_error("no NCCL library named (GPUHOST_NCCL)");
    Nccl nccl(path);
    int version = 0;
    nccl.check(nccl.get_version(&version), "ncclGetVersion");
    const int n = device_count();
    std::vector<int> devices(n);
    for (int g = 0; g < n; ++g) devices[g] = g;
    std::vector<NcclComm> comms(n, nullptr);
    nccl.check(nccl.comm_init_all(comms.data(), n, devices.data()), "ncclCommInitAll");
    struct Destroy {
        Nccl* nccl;
        std::vector<NcclComm>* comms;
        ~Destroy() {
            for (NcclComm c : *comms)
                if (c != nullptr) nccl->comm_destroy(c);
        }
    } destroy{&nccl, &comms};

    std::vector<size_t> sizes;
    if (!options.nccl_sizes.empty()) {
        sizes = options.nccl_sizes;  // ascending (main.cu checks): the largest is judged
    } else if (options.quick) {
        sizes = {size_t{8} << 20, size_t{64} << 20, size_t{1} << 30};
    } else {
        sizes = {size_t{8} << 20, size_t{32} << 20, size_t{128} << 20, size_t{512} << 20, size_t{1} << 30};
    }
    const size_t largest = sizes.back();
    std::vector<std::unique_ptr<DeviceArray>> send, recv;
    Streams streams;
    std::vector<cudaStream_t> s(n);
    for (int g = 0; g < n; ++g) {
        send.emplace_back(new DeviceArray(g, largest));
        recv.emplace_back(new DeviceArray(g, largest));
        s[g] = streams.add(g);
    }
    const int samples = options.quick ? 3 : 5;
    const int per_sample = 5;  // back-to-back collectives per timed sample, as nccl-tests' -n
    const double ranks = n;
    enum Op { kAllReduce, kAllGather, kReduceScatter };
    const char* names[] = {"nccl_all_reduce", "nccl_all_gather", "nccl_reduce_scatter"};
    // nccl-tests' bus bandwidth: algbw times the fraction of the data each rank's link carries.
    const double bus_factor[] = {2.0 * (ranks - 1) / ranks, (ranks - 1) / ranks, (ranks - 1) / ranks};
    for (int op = kAllReduce; op <= kReduceScatter; ++op) {
        std::vector<std::string> points;
        Timing largest_timing;
        unsigned long long bad_total = 0;
        for (const size_t size : sizes) {
            const size_t count = size / sizeof(float);      // elements of the whole buffer (nccl-tests' size)
            const size_t chunk = count / static_cast<size_t>(n);  // one rank's part, for gather/scatter
            for (int g = 0; g < n; ++g) {
                GH_CHECK(cudaSetDevice(g));
                float* in = reinterpret_cast<float*>(send[g]->ptr);
                if (op == kAllGather) {
                    nccl_fill_kernel<<<2048, 256, 0, s[g]>>>(in, chunk, g * chunk, 1.0f);
                } else {
                    nccl_fill_kernel<<<2048, 256, 0, s[g]>>>(in, count, 0, static_cast<float>(g + 1));
                }
                GH_CHECK_LAUNCH();
                GH_CHECK(cudaMemsetAsync(recv[g]->ptr, 0xFF, size, s[g]));
            }
            streams.sync();
            auto once = [&] {
                nccl.check(nccl.group_start(), "ncclGroupStart");
                for (int g = 0; g < n; ++g) {
                    const void* in = send[g]->ptr;
                    void* out = recv[g]->ptr;
                    if (op == kAllReduce) {
                        nccl.check(nccl.all_reduce(in, out, count, kNcclFloat32, kNcclSum, comms[g], s[g]), "ncclAllReduce");
                    } else if (op == kAllGather) {
                        nccl.check(nccl.all_gather(in, out, chunk, kNcclFloat32, comms[g], s[g]), "ncclAllGather");
                    } else {
                        nccl.check(nccl.reduce_scatter(in, out, chunk, kNcclFloat32, kNcclSum, comms[g], s[g]),
                                   "ncclReduceScatter");
                    }
                }
                nccl.check(nccl.group_end(), "ncclGroupEnd");
            };
            once();
            streams.sync();
            // Every rank's output against what the collective must produce: sums of (g + 1) are
            // n(n+1)/2 times the pattern; a gather is the pattern itself.
            const float sum_scale = static_cast<float>(n * (n + 1) / 2);
            unsigned long long bad = 0;
            for (int g = 0; g < n; ++g) {
                const float* out = reinterpret_cast<const float*>(recv[g]->ptr);
                if (op == kAllReduce) bad += nccl_mismatches(g, out, count, 0, sum_scale);
                if (op == kAllGather) bad += nccl_mismatches(g, out, chunk * n, 0, 1.0f);
                if (op == kReduceScatter) bad += nccl_mismatches(g, out, chunk, g * chunk, sum_scale);
            }
            bad_total += bad;
            const Timing batch = host_timed(
                [&] {
                    for (int i = 0; i < per_sample; ++i) once();
                    streams.sync();
                },
                1, samples);
            Timing timing;
            for (const double ms : batch.samples_ms) timing.samples_ms.push_back(ms / per_sample);
            const double bytes = static_cast<double>(chunk * n * sizeof(float));
            const double algbw = bytes / (timing.median_ms() * 1e6);
            points.push_back(Json().integer("bytes", static_cast<long long>(bytes))
                                 .num("median_ms", timing.median_ms())
                                 .num("algbw_GBps", algbw)
                                 .num("busbw_GBps", algbw * bus_factor[op])
                                 .boolean("verified", bad == 0)
                                 .text());
            if (size == largest) largest_timing = timing;
        }
        const double largest_bytes = static_cast<double>(largest / sizeof(float) / n * n * sizeof(float));
        Result r = bandwidth(names[op], largest_bytes * bus_factor[op], largest_timing, bad_total == 0,
                             static_cast<double>(bad_total),
                             "every rank's output equals the collective of the known inputs, element for element");
        r.params.integer("ranks", n).str("datatype", "float32").str("measure", "bus bandwidth (nccl-tests) at the largest size")
            .num("bus_factor", bus_factor[op]).integer("nccl_version", version);
        r.extra.raw("points", json_array(points));
        emit(std::move(r));
    }
    GH_CHECK(cudaSetDevice(options.device));
}

}  // namespace gh
