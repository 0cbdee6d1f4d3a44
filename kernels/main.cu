// gpuhost-kernels: runs the selected benchmarks and prints one JSON document on stdout.
//
//   gpuhost-kernels [--bench NAME[,NAME...]] [--then NAME[,NAME...]] [--quick] [--seed N] [--device N]
//                   [--delay-streams MS] [--nccl-bytes N[,N...]] [--list]
//
// --then NAME[,NAME...] runs a second set in the same process, once told to: after the first
// document the suite reads a line on stdin, and on "go" runs these and prints a second document
// (its own benchmarks, results, errors and elapsed_s; nothing else read: it exits with the first's
// status). smoke-test --all runs each GPU's own benchmarks at once, then that GPU's host copies in
// its turn, without a second process's start (about 1.3 s a GPU on the four-H200 guest).
//
// --nccl-bytes N[,N...] measures the NCCL collectives at these sizes (bytes, ascending, each a multiple
// of 4) instead of 8 MiB to 1 GiB: benchmarks/node_vs_torch.py asks for 1 and 4 GiB.
//
// --delay-streams MS is the stream-ordering self-test: each poison, fill and counter reset waits
// MS ms on its own stream first (common.cuh), so any check that does not wait for them fails.
//
// Progress and diagnostics go to stderr. Exit status: 0 when every selected benchmark ran
// (its results carry their own verification flags), 3 when one or more raised an error
// (listed under "errors"), 2 on bad arguments or when no GPU can be used.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "common.cuh"

#ifndef GPUHOST_NO_CUBLAS
#include <cublasLt.h>
#endif

namespace {

struct Bench {
    const char* name;
    void (*run)(const gh::Options&, const gh::Emit&);
    bool in_quick;
    const char* what;
    bool node = false;  // measures every GPU at once: only when named with --bench (gpuhost smoke-test --all)
    // Host-side set-up that --then makes at the end of the first set, before its document: the
    // second set then runs in a GPU's link turn without it. A failure here is left for the
    // benchmark itself to meet and report.
    void (*prepare)(const gh::Options&) = nullptr;
};

const Bench kBenches[] = {
    {"memory", gh::bench_memory, true, "copy and triad bandwidth, fused vs unfused A*B+C"},
    {"roofline", gh::bench_roofline, false, "FLOP/byte sweep of an FMA kernel"},
    {"reduction", gh::bench_reduction, false, "shared-memory dot-product reduction"},
    {"sgemm", gh::bench_sgemm, false, "our tiled SGEMM"},
    {"cublas", gh::bench_cublas, true, "cuBLASLt GEMM in BF16, FP16, TF32, FP32 (BF16 only with --quick)"},
    {"softmax", gh::bench_softmax, false, "three-pass vs online softmax"},
    {"transfer", gh::bench_transfer, true, "host<->device copies, pinned and pageable", false, gh::prepare_transfer},
    {"launch", gh::bench_launch, true, "kernel launch latency"},
    {"p2p", gh::bench_p2p, true, "peer access and P2P bandwidth between GPUs"},
    {"p2p_matrix", gh::bench_p2p_matrix, true, "every ordered GPU pair, one way and both ways, and all-to-all", true},
    {"host_all", gh::bench_host_all, true, "pinned copies between the host and every GPU at once", true},
    {"nccl", gh::bench_nccl, true, "NCCL all_reduce/all_gather/reduce_scatter bus bandwidth (GPUHOST_NCCL)", true},
};

std::string result_json(const gh::Result& r, const char* benchmark) {
    std::vector<std::string> samples;
    for (const double s : r.timing.samples_ms) samples.push_back(gh::json_number(s));
    const bool timed = !r.timing.samples_ms.empty();
    return gh::Json()
        .str("name", r.name)
        .str("benchmark", benchmark)
        .str("unit", r.unit)
        .num("value", r.value)
        .num("median_ms", timed ? r.timing.median_ms() : NAN)
        .num("min_ms", timed ? r.timing.min_ms() : NAN)
        .num("max_ms", timed ? r.timing.max_ms() : NAN)
        .integer("reps", static_cast<long long>(r.timing.samples_ms.size()))
        .raw("samples_ms", gh::json_array(samples))
        .boolean("verified", r.verified)
        .num("error", r.error)
        .str("check", r.check_detail)
        .raw("params", r.params.text())
        .raw("extra", r.extra.text())
        .text();
}

int usage(const char* message) {
    std::cerr << "gpuhost-kernels: " << message
              << "\nusage: gpuhost-kernels [--bench NAME[,NAME...]] [--then NAME[,NAME...]] [--quick] [--seed N] "
                 "[--device N] [--delay-streams MS] [--nccl-bytes N[,N...]] [--list]\n";
    return 2;
}

}  // namespace

int main(int argc, char** argv) {
    gh::Options options;
    options.seed = static_cast<uint32_t>(std::chrono::steady_clock::now().time_since_epoch().count() & 0x7fffffff);
    std::vector<std::string> selected;
    std::vector<std::string> then;  // --then: run once "go" is read on stdin
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--quick") {
            options.quick = true;
        } else if (arg == "--list") {
            std::vector<std::string> items;
            for (const auto& b : kBenches) {
                items.push_back(gh::Json()
                                    .str("name", b.name)
                                    .boolean("quick", b.in_quick)
                                    .boolean("node", b.node)
                                    .str("what", b.what)
                                    .text());
            }
            std::cout << gh::json_array(items) << std::endl;
            return 0;
        } else if ((arg == "--bench" || arg == "--then" || arg == "--seed" || arg == "--device" ||
                    arg == "--delay-streams" || arg == "--nccl-bytes") &&
                   i + 1 < argc) {
            const std::string value = argv[++i];
            if (arg == "--nccl-bytes") {
                size_t start = 0;
                while (start <= value.size()) {
                    const size_t comma = value.find(',', start);
                    const std::string item = value.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
                    char* end = nullptr;
                    const unsigned long long bytes = std::strtoull(item.c_str(), &end, 10);
                    if (item.empty() || *end != '\0' || bytes == 0 || bytes % 4 != 0 ||
                        (!options.nccl_sizes.empty() && bytes <= options.nccl_sizes.back())) {
                        return usage(("--nccl-bytes takes ascending byte counts, each a multiple of 4, not '" + value + "'")
                                         .c_str());
                    }
                    options.nccl_sizes.push_back(static_cast<size_t>(bytes));
                    if (comma == std::string::npos) break;
                    start = comma + 1;
                }
            } else if (arg == "--delay-streams") {
                char* end = nullptr;
                options.delay_ms = std::strtod(value.c_str(), &end);
                if (end == value.c_str() || *end != '\0' || !(options.delay_ms > 0.0) || options.delay_ms > 10000.0) {
                    return usage(("--delay-streams takes milliseconds in (0, 10000], not '" + value + "'").c_str());
                }
                gh::set_stream_delay_ms(options.delay_ms);
            } else if (arg == "--seed") {
                options.seed = static_cast<uint32_t>(std::stoul(value));
            } else if (arg == "--device") {
                options.device = std::stoi(value);
            } else {
                size_t start = 0;
                while (start <= value.size()) {
                    const size_t comma = value.find(',', start);
                    const std::string name = value.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
                    bool known = false;
                    for (const auto& b : kBenches) known = known || name == b.name;
                    if (!known) return usage(("unknown benchmark '" + name + "'").c_str());
                    (arg == "--then" ? then : selected).push_back(name);
                    if (comma == std::string::npos) break;
                    start = comma + 1;
                }
            }
        } else {
            return usage(("unknown argument '" + arg + "'").c_str());
        }
    }
    if (!then.empty() && selected.empty()) return usage("--then needs --bench for the first set");
    if (selected.empty()) {
        for (const auto& b : kBenches) {
            if (!b.node && (!options.quick || b.in_quick)) selected.push_back(b.name);
        }
    }

    const auto started = std::chrono::steady_clock::now();
    cudaDeviceProp prop{};
    int driver = 0, runtime = 0, device_count = 0;
    const cudaError_t count_status = cudaGetDeviceCount(&device_count);
    if (count_status != cudaSuccess || device_count == 0) {
        std::cerr << "gpuhost-kernels: no usable CUDA device: "
                  << (count_status != cudaSuccess ? cudaGetErrorString(count_status) : "0 devices") << "\n";
        return 2;
    }
    try {
        GH_CHECK(cudaSetDevice(options.device));
        GH_CHECK(cudaGetDeviceProperties(&prop, options.device));
        GH_CHECK(cudaDriverGetVersion(&driver));
        GH_CHECK(cudaRuntimeGetVersion(&runtime));
        GH_CHECK(cudaFree(nullptr));  // create the context before anything is timed
    } catch (const gh::CudaFailure& error) {
        std::cerr << "gpuhost-kernels: " << error.what() << "\n";
        return 2;
    }
    options.sm_count = prop.multiProcessorCount;
    options.l2_bytes = static_cast<size_t>(prop.l2CacheSize);
    options.total_mem = prop.totalGlobalMem;
    int clock_khz = 0, memory_clock_khz = 0, bus_width = 0;
    cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, options.device);
    cudaDeviceGetAttribute(&memory_clock_khz, cudaDevAttrMemoryClockRate, options.device);
    cudaDeviceGetAttribute(&bus_width, cudaDevAttrGlobalMemoryBusWidth, options.device);
    char bus_id[32] = {};
    cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), options.device);

    long long cublaslt_version = 0;
#ifndef GPUHOST_NO_CUBLAS
    cublaslt_version = static_cast<long long>(cublasLtGetVersion());
#endif
    // One document: `names` run in order, then the set-up of `ahead` (the --then set), timed from
    // `since` (the first includes the context's start).
    auto run_and_print = [&](const std::vector<std::string>& names, const std::vector<std::string>& ahead,
                             std::chrono::steady_clock::time_point since) {
        std::vector<std::string> results;
        std::vector<std::string> errors;
        std::vector<std::string> ran;
        for (const auto& name : names) {
            for (const auto& b : kBenches) {
                if (name != b.name) continue;
                const auto t0 = std::chrono::steady_clock::now();
                std::cerr << "gpuhost-kernels: running " << b.name << "\n";
                try {
                    b.run(options, [&](gh::Result&& r) { results.push_back(result_json(r, b.name)); });
                    GH_CHECK(cudaDeviceSynchronize());
                } catch (const std::exception& error) {
                    errors.push_back(gh::Json().str("benchmark", b.name).str("message", error.what()).text());
                    cudaGetLastError();  // clear a non-sticky error so later benchmarks can run
                }
                const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                ran.push_back(gh::Json().str("name", b.name).num("seconds", seconds).text());
            }
        }
        for (const auto& name : ahead) {
            for (const auto& b : kBenches) {
                if (name != b.name || b.prepare == nullptr) continue;
                try {
                    b.prepare(options);
                } catch (const std::exception& error) {
                    std::cerr << "gpuhost-kernels: preparing " << b.name << " failed (" << error.what()
                              << "); it will try again when it runs\n";
                    cudaGetLastError();
                }
            }
        }
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
        const std::string device = gh::Json()
                                       .integer("index", options.device)
                                       .integer("count", device_count)
                                       .str("name", prop.name)
                                       .str("compute_capability", std::to_string(prop.major) + "." + std::to_string(prop.minor))
                                       .integer("sm_count", prop.multiProcessorCount)
                                       .integer("l2_bytes", prop.l2CacheSize)
                                       .integer("memory_bytes", static_cast<long long>(prop.totalGlobalMem))
                                       .integer("sm_clock_khz", clock_khz)
                                       .integer("memory_clock_khz", memory_clock_khz)
                                       .integer("memory_bus_bits", bus_width)
                                       .str("pci_bus_id", bus_id)
                                       .integer("pci_device_id", prop.pciDeviceID)
                                       .text();
        const std::string versions = gh::Json()
                                         .integer("cuda_driver", driver)
                                         .integer("cuda_runtime", runtime)
                                         .integer("cublaslt", cublaslt_version)
                                         .text();
        std::cout << gh::Json()
                         .str("suite", "gpuhost-kernels")
                         .integer("format", 1)
                         .boolean("quick", options.quick)
                         .integer("seed", options.seed)
                         .num("stream_delay_ms", options.delay_ms)
                         .raw("device", device)
                         .raw("versions", versions)
                         .raw("benchmarks", gh::json_array(ran))
                         .raw("results", gh::json_array(results))
                         .raw("errors", gh::json_array(errors))
                         .num("elapsed_s", elapsed)
                         .text()
                  << std::endl;
        return errors.empty() ? 0 : 3;
    };
    const int status = run_and_print(selected, then, started);
    if (then.empty()) return status;
    std::string line;
    if (!std::getline(std::cin, line) || line != "go") return status;
    const int then_status = run_and_print(then, {}, std::chrono::steady_clock::now());
    return status != 0 ? status : then_status;
}
