// ggml_moe_bench: times ggml's CPU MoE expert matmuls (ggml_mul_mat_id) with
// the shapes of `moekit bench`, so moekit's CPU path can be compared with
// ggml on the same machine in the same run. See bench/peers/README.md.
//
// One call = the expert part of llama.cpp's build_moe_ffn:
//   g = mul_mat_id(W_gate[E, I, H], x, ids)      (or one fused [E, 2I, H])
//   u = mul_mat_id(W_up  [E, I, H], x, ids)
//   a = swiglu_split(g, u)                        (silu(g) * u)
//   d = mul_mat_id(W_down[E, H, I], a, ids)
//   out = sum_j weights[j] * d[j]                 (ggml_mul + k-1 view adds)
// mode "ids":    routing ids / weights are graph inputs (random, seeded).
// mode "router": the graph also runs the f32 router as build_moe_ffn does
//                (mul_mat, soft_max, argsort_top_k, get_rows, renormalise),
//                which is what one `moekit bench` call covers.
//
// Weights live in a backend buffer. With --repack auto (default) a weight
// goes into the CPU backend's "extra" buffer type CPU_REPACK when that buffer
// type supports the op (exactly the test llama.cpp uses), so ggml runs its
// repacked (interleaved) kernels as llama.cpp does by default; --repack off
// keeps every weight in the plain CPU buffer.

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <sys/resource.h>
#include <unistd.h>

#ifndef GGML_COMMIT
#define GGML_COMMIT "unknown"
#endif

namespace {

struct Args {
    std::string preset = "qwen3-30b-a3b";
    int E = 128, K = 8, H = 2048, I = 768;
    std::vector<std::string> types = {"q4_0", "q4_k", "q8_0"};
    std::vector<int> tokens = {1, 8};
    std::vector<int> threads = {1, 2};
    std::vector<std::string> modes = {"ids"};
    std::string repack = "auto";  // auto | off | both
    double min_time = 0.5;
    int warmup = 3;
    int id_sets = 16;
    int distinct = 4;
    int max_repeats = 100000;
    double busy_pct = 10.0;  // retry a case when other processes took more CPU than this
    int busy_retries = 5;
    uint64_t seed = 0;
    bool fused = false;
    bool check = true;
    std::string json;
};

[[noreturn]] void die(const std::string & msg) {
    fprintf(stderr, "error: %s\n", msg.c_str());
    exit(2);
}

std::vector<std::string> split(const std::string & s) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        if (!item.empty()) out.push_back(item);
    }
    return out;
}

std::vector<int> split_ints(const std::string & s) {
    std::vector<int> out;
    for (auto & v : split(s)) {
        int n = atoi(v.c_str());
        if (n <= 0) die("expected positive integers, got " + s);
        out.push_back(n);
    }
    return out;
}

std::string lower(std::string s) {
    for (auto & c : s) c = (char) tolower((unsigned char) c);
    return s;
}

void usage() {
    printf(
        "usage: ggml_moe_bench [options]\n"
        "  --preset NAME      qwen3-30b-a3b (default), mixtral-8x7b, gpt-oss-20b\n"
        "  --experts E --top-k K --hidden H --inter I   override the preset's shape\n"
        "  --types LIST       weight types, e.g. q4_0,q4_k,q8_0 (default), or 'all' =\n"
        "                     q4_0,q4_1,q8_0,q4_k,q5_k,q6_k,iq4_xs\n"
        "  --tokens LIST      tokens T per call (default 1,8)\n"
        "  --threads LIST     CPU threads (default 1,2)\n"
        "  --modes LIST       ids (routing given, default) and/or router (f32 router in the graph)\n"
        "  --repack MODE      auto (CPU_REPACK buffer where ggml supports it, as llama.cpp; default),\n"
        "                     off (plain CPU buffer), both\n"
        "  --fused            one fused gate|up tensor [E, 2I, H] + ggml_swiglu (default: separate)\n"
        "  --min-time S       measuring time per case after warm-up (default 0.5)\n"
        "  --warmup N         warm-up calls (default 3)\n"
        "  --id-sets N        routing/input sets rotated across calls (default 16, >= 4)\n"
        "  --distinct N       distinct random experts per matrix, cycled over E (default 4)\n"
        "  --seed N           seed (default 0)\n"
        "  --no-check         skip the f32 reference check (NMSE)\n"
        "  --busy-pct P       other processes' share of all CPUs (/proc/stat) above which a case is\n"
        "                     re-measured after a pause (default 10; 100 = never)\n"
        "  --busy-retries N   re-measurements per case at most (default 5)\n"
        "  --json PATH        also write the results as JSON\n");
}

Args parse_args(int argc, char ** argv) {
    Args a;
    bool shape_override[4] = {false, false, false, false};
    int shape[4] = {0, 0, 0, 0};
    for (int i = 1; i < argc; i++) {
        std::string k = argv[i];
        auto val = [&]() -> std::string {
            if (i + 1 >= argc) die("missing value for " + k);
            return argv[++i];
        };
        if (k == "-h" || k == "--help") {
            usage();
            exit(0);
        } else if (k == "--preset") {
            a.preset = val();
        } else if (k == "--experts") {
            shape[0] = atoi(val().c_str());
            shape_override[0] = true;
        } else if (k == "--top-k") {
            shape[1] = atoi(val().c_str());
            shape_override[1] = true;
        } else if (k == "--hidden") {
            shape[2] = atoi(val().c_str());
            shape_override[2] = true;
        } else if (k == "--inter") {
            shape[3] = atoi(val().c_str());
            shape_override[3] = true;
        } else if (k == "--types" || k == "--type" || k == "--format") {
            std::string v = lower(val());
            a.types = v == "all" ? std::vector<std::string>{"q4_0", "q4_1", "q8_0", "q4_k", "q5_k", "q6_k", "iq4_xs"}
                                 : split(v);
        } else if (k == "--tokens") {
            a.tokens = split_ints(val());
        } else if (k == "--threads") {
            a.threads = split_ints(val());
        } else if (k == "--modes" || k == "--mode") {
            a.modes = split(lower(val()));
            for (auto & m : a.modes) {
                if (m != "ids" && m != "router") die("--modes: ids or router, got " + m);
            }
        } else if (k == "--repack") {
            a.repack = lower(val());
            if (a.repack != "auto" && a.repack != "off" && a.repack != "both") die("--repack: auto, off or both");
        } else if (k == "--fused") {
            a.fused = true;
        } else if (k == "--min-time") {
            a.min_time = atof(val().c_str());
        } else if (k == "--warmup") {
            a.warmup = atoi(val().c_str());
        } else if (k == "--id-sets") {
            a.id_sets = atoi(val().c_str());
        } else if (k == "--distinct") {
            a.distinct = atoi(val().c_str());
        } else if (k == "--max-repeats") {
            a.max_repeats = atoi(val().c_str());
        } else if (k == "--seed") {
            a.seed = strtoull(val().c_str(), nullptr, 10);
        } else if (k == "--busy-pct") {
            a.busy_pct = atof(val().c_str());
        } else if (k == "--busy-retries") {
            a.busy_retries = atoi(val().c_str());
        } else if (k == "--no-check") {
            a.check = false;
        } else if (k == "--json") {
            a.json = val();
        } else {
            usage();
            die("unknown option " + k);
        }
    }
    if (a.preset == "qwen3-30b-a3b") {
        a.E = 128; a.K = 8; a.H = 2048; a.I = 768;
    } else if (a.preset == "mixtral-8x7b") {
        a.E = 8; a.K = 2; a.H = 4096; a.I = 14336;
    } else if (a.preset == "gpt-oss-20b") {
        a.E = 32; a.K = 4; a.H = 2880; a.I = 2880;
    } else if (a.preset != "custom") {
        die("unknown preset " + a.preset + " (qwen3-30b-a3b, mixtral-8x7b, gpt-oss-20b, custom)");
    }
    int * dst[4] = {&a.E, &a.K, &a.H, &a.I};
    for (int j = 0; j < 4; j++) {
        if (shape_override[j]) *dst[j] = shape[j];
    }
    if (a.E <= 0 || a.K <= 0 || a.K > a.E || a.H <= 0 || a.I <= 0) die("bad shape");
    if (a.id_sets < 1) die("--id-sets must be >= 1");
    if (a.distinct < 1) die("--distinct must be >= 1");
    if (a.warmup < 0) die("--warmup must be >= 0");
    return a;
}

ggml_type parse_type(const std::string & name) {
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        const char * n = ggml_type_name((ggml_type) t);
        if (n && lower(n) == lower(name) && ggml_blck_size((ggml_type) t) > 0) return (ggml_type) t;
    }
    die("unknown ggml type " + name);
}

std::string cpu_model() {
    std::ifstream f("/proc/cpuinfo");
    std::string line;
    while (std::getline(f, line)) {
        if (line.rfind("model name", 0) == 0) {
            auto p = line.find(':');
            if (p != std::string::npos) {
                std::string s = line.substr(p + 1);
                s.erase(0, s.find_first_not_of(" \t"));
                return s;
            }
        }
    }
    return "unknown";
}

std::string json_escape(const std::string & s) {
    std::string o;
    for (char c : s) {
        if (c == '"' || c == '\\') {
            o += '\\';
            o += c;
        } else if ((unsigned char) c < 0x20) {
            char b[8];
            snprintf(b, sizeof b, "\\u%04x", c);
            o += b;
        } else {
            o += c;
        }
    }
    return o;
}

std::string nmse_s(double v) {
    if (std::isnan(v)) return "null";
    char b[32];
    snprintf(b, sizeof b, "%.4e", v);
    return b;
}

// Busy jiffies of all CPUs (/proc/stat) and this process's CPU seconds: their
// difference over an interval is what other processes took.
double busy_cpu_s() {
    std::ifstream f("/proc/stat");
    std::string cpu;
    unsigned long long v[10] = {0};
    f >> cpu;
    for (auto & x : v) f >> x;
    // user nice system idle iowait irq softirq steal guest guest_nice
    return (double) (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / (double) sysconf(_SC_CLK_TCK);
}

double self_cpu_s() {
    rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// ---------------------------------------------------------------------------
// Weights

// One expert weight stack [E, rows, cols] in its own context and buffer.
struct ExpertMatrix {
    ggml_context * ctx = nullptr;
    ggml_backend_buffer_t buf = nullptr;
    ggml_tensor * t = nullptr;
    bool repacked = false;
    size_t expert_bytes = 0;
    int rows = 0, cols = 0;
    std::vector<std::vector<float>> deq;  // dequantized distinct experts (for the check)

    void free_all() {
        if (buf) ggml_backend_buffer_free(buf);
        if (ctx) ggml_free(ctx);
        buf = nullptr;
        ctx = nullptr;
        t = nullptr;
    }
};

// The test llama.cpp uses (weight_buft_supported): does the CPU device run
// mul_mat_id with src0 in buffer type `buft`?
bool buft_supports_mul_mat_id(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft, ggml_type type, int rows,
                              int cols, int E, int K) {
    ggml_init_params p = {ggml_tensor_overhead() * 8, nullptr, true};
    ggml_context * ctx = ggml_init(p);
    ggml_tensor * w = ggml_new_tensor_3d(ctx, type, cols, rows, E);
    ggml_tensor * x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, cols, K, 1);
    ggml_tensor * ids = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, K, 1);
    ggml_tensor * op = ggml_mul_mat_id(ctx, w, x, ids);
    ggml_backend_buffer_t b = ggml_backend_buft_alloc_buffer(buft, 0);
    w->buffer = b;
    bool ok = ggml_backend_dev_supports_op(dev, op);
    ggml_backend_buffer_free(b);
    ggml_free(ctx);
    return ok;
}

ExpertMatrix make_matrix(const char * name, ggml_type type, int E, int rows, int cols, int distinct, uint64_t seed,
                         ggml_backend_buffer_type_t plain, ggml_backend_buffer_type_t repack_buft,
                         ggml_backend_dev_t dev, int K, bool want_check) {
    ExpertMatrix m;
    m.rows = rows;
    m.cols = cols;
    ggml_init_params p = {ggml_tensor_overhead() * 2, nullptr, true};
    m.ctx = ggml_init(p);
    m.t = ggml_new_tensor_3d(m.ctx, type, cols, rows, E);
    ggml_set_name(m.t, name);
    ggml_backend_buffer_type_t buft = plain;
    if (repack_buft && buft_supports_mul_mat_id(dev, repack_buft, type, rows, cols, E, K)) {
        buft = repack_buft;
        m.repacked = true;
    }
    m.buf = ggml_backend_alloc_ctx_tensors_from_buft(m.ctx, buft);
    if (!m.buf) die(std::string("allocating ") + name);
    ggml_backend_buffer_set_usage(m.buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);

    const size_t row_bytes = ggml_row_size(type, cols);
    m.expert_bytes = row_bytes * rows;
    const size_t n = (size_t) rows * cols;
    const int D = std::min(distinct, E);
    std::vector<uint8_t> q((size_t) D * m.expert_bytes);
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, 0.02f);
    std::vector<float> f(n);
    const auto * tt = ggml_get_type_traits(type);
    for (int d = 0; d < D; d++) {
        for (auto & v : f) v = nd(rng);
        size_t wrote = ggml_quantize_chunk(type, f.data(), q.data() + d * m.expert_bytes, 0, rows, cols, nullptr);
        if (wrote != m.expert_bytes) die("quantize size mismatch");
        if (want_check) {
            std::vector<float> dq(n);
            if (type == GGML_TYPE_F32) {
                memcpy(dq.data(), q.data() + d * m.expert_bytes, n * 4);
            } else {
                tt->to_float(q.data() + d * m.expert_bytes, dq.data(), (int64_t) n);
            }
            m.deq.push_back(std::move(dq));
        }
    }
    // The whole tensor in one set_tensor (CPU_REPACK requires offset 0, full size).
    std::vector<uint8_t> all((size_t) E * m.expert_bytes);
    for (int e = 0; e < E; e++) {
        memcpy(all.data() + (size_t) e * m.expert_bytes, q.data() + (size_t) (e % D) * m.expert_bytes,
               m.expert_bytes);
    }
    ggml_backend_tensor_set(m.t, all.data(), 0, all.size());
    return m;
}

// ---------------------------------------------------------------------------
// Inputs and reference

struct InputSet {
    std::vector<float> x;        // [T, H]
    std::vector<int32_t> ids;    // [T, K]   (router mode: filled from the graph)
    std::vector<float> weights;  // [T, K]   (router mode: filled from the reference router)
    int hit = 0;                 // distinct experts
};

int count_hit(const std::vector<int32_t> & ids, int E) {
    std::vector<char> used(E, 0);
    int n = 0;
    for (int e : ids) {
        if (e >= 0 && e < E && !used[e]) {
            used[e] = 1;
            n++;
        }
    }
    return n;
}

float silu(float v) { return v / (1.0f + std::exp(-v)); }

// out[T, H] for the given routing, in double from the dequantized weights.
std::vector<double> reference(const Args & a, const ExpertMatrix * gate, const ExpertMatrix * up,
                              const ExpertMatrix * gu_fused, const ExpertMatrix & down, const InputSet & in,
                              int T, int D) {
    const int H = a.H, I = a.I, K = a.K;
    std::vector<double> out((size_t) T * H, 0.0);
    std::vector<double> act(I);
    for (int t = 0; t < T; t++) {
        const float * x = &in.x[(size_t) t * H];
        for (int j = 0; j < K; j++) {
            int e = in.ids[(size_t) t * K + j];
            double w = in.weights[(size_t) t * K + j];
            for (int r = 0; r < I; r++) {
                const float * wg;
                const float * wu;
                if (gu_fused) {
                    wg = &gu_fused->deq[e % D][(size_t) r * H];
                    wu = &gu_fused->deq[e % D][(size_t) (r + I) * H];
                } else {
                    wg = &gate->deq[e % D][(size_t) r * H];
                    wu = &up->deq[e % D][(size_t) r * H];
                }
                double g = 0, u = 0;
                for (int c = 0; c < H; c++) {
                    g += (double) wg[c] * x[c];
                    u += (double) wu[c] * x[c];
                }
                act[r] = (g / (1.0 + std::exp(-g))) * u;
            }
            for (int r = 0; r < H; r++) {
                const float * wd = &down.deq[e % D][(size_t) r * I];
                double s = 0;
                for (int c = 0; c < I; c++) s += (double) wd[c] * act[c];
                out[(size_t) t * H + r] += w * s;
            }
        }
    }
    return out;
}

// ---------------------------------------------------------------------------

struct Result {
    std::string type, mode, layout;
    int tokens, threads, repeats, attempts;
    double median_ms, min_ms, weight_bytes, gb_per_s, hit, nmse, other_pct;
};

}  // namespace

int main(int argc, char ** argv) {
    Args a = parse_args(argc, argv);

    ggml_backend_t backend = ggml_backend_cpu_init();
    if (!backend) die("ggml_backend_cpu_init failed");
    ggml_backend_dev_t dev = ggml_backend_get_device(backend);
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    ggml_backend_buffer_type_t plain = ggml_backend_cpu_buffer_type();
    ggml_backend_buffer_type_t repack_buft = nullptr;
    {
        auto get_extra = (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(
            reg, "ggml_backend_dev_get_extra_bufts");
        std::string names;
        if (get_extra) {
            for (ggml_backend_buffer_type_t * b = get_extra(dev); b && *b; b++) {
                names += std::string(names.empty() ? "" : ",") + ggml_backend_buft_name(*b);
                if (strcmp(ggml_backend_buft_name(*b), "CPU_REPACK") == 0) repack_buft = *b;
            }
        }
        printf("ggml commit %s, CPU %s\n", GGML_COMMIT, cpu_model().c_str());
        printf("ggml CPU features: AVX2=%d AVX512=%d AVX512_VNNI=%d AVX512_BF16=%d AVX_VNNI=%d F16C=%d FMA=%d "
               "llamafile=%d; extra buffer types: %s\n",
               ggml_cpu_has_avx2(), ggml_cpu_has_avx512(), ggml_cpu_has_avx512_vnni(), ggml_cpu_has_avx512_bf16(),
               ggml_cpu_has_avx_vnni(), ggml_cpu_has_f16c(), ggml_cpu_has_fma(), ggml_cpu_has_llamafile(),
               names.empty() ? "none" : names.c_str());
    }
    printf("preset %s: E=%d k=%d H=%d I=%d, gate/up %s, %d id sets, %d distinct experts per matrix, min time %.2f s, "
           "%d warm-up\n",
           a.preset.c_str(), a.E, a.K, a.H, a.I, a.fused ? "fused [E,2I,H]" : "separate", a.id_sets, a.distinct,
           a.min_time, a.warmup);

    std::vector<bool> layouts;  // true = try CPU_REPACK
    if (a.repack == "auto" || a.repack == "both") layouts.push_back(true);
    if (a.repack == "off" || a.repack == "both") layouts.push_back(false);

    printf("\n%-7s %5s %3s %-6s %-8s %10s %10s %6s %6s %10s %8s %9s %5s\n", "type", "T", "thr", "mode", "layout",
           "median ms", "min ms", "reps", "hit", "weight MB", "GB/s", "nmse", "oth%");
    fflush(stdout);

    std::vector<Result> results;
    const int E = a.E, K = a.K, H = a.H, I = a.I;

    for (const auto & tname : a.types) {
        ggml_type type = parse_type(tname);
        const int64_t blck = ggml_blck_size(type);
        if (H % blck != 0 || I % blck != 0) {
            printf("%-7s skipped: H=%d and I=%d must be multiples of the block size %lld\n", tname.c_str(), H, I,
                   (long long) blck);
            continue;
        }
        if (ggml_quantize_requires_imatrix(type)) {
            printf("%-7s skipped: needs an importance matrix\n", tname.c_str());
            continue;
        }
        for (bool try_repack : layouts) {
            const uint64_t ws = a.seed * 1000003ull + (uint64_t) type * 7919ull;
            ExpertMatrix gate, up, gu, down;
            ggml_backend_buffer_type_t rb = try_repack ? repack_buft : nullptr;
            if (a.fused) {
                gu = make_matrix("ffn_gate_up_exps", type, E, 2 * I, H, a.distinct, ws + 1, plain, rb, dev, K, a.check);
            } else {
                gate = make_matrix("ffn_gate_exps", type, E, I, H, a.distinct, ws + 1, plain, rb, dev, K, a.check);
                up = make_matrix("ffn_up_exps", type, E, I, H, a.distinct, ws + 2, plain, rb, dev, K, a.check);
            }
            down = make_matrix("ffn_down_exps", type, E, H, I, a.distinct, ws + 3, plain, rb, dev, K, a.check);
            int n_rep = (a.fused ? (int) gu.repacked : (int) gate.repacked + (int) up.repacked) + (int) down.repacked;
            int n_mat = a.fused ? 2 : 3;
            std::string layout = n_rep == 0 ? "CPU" : n_rep == n_mat ? "REPACK" : "mixed";
            if (!try_repack && a.repack == "both") layout = "CPU";
            if (try_repack && a.repack == "both" && n_rep == 0) {
                // nothing repackable: "auto" is the same as "off", measured below
                if (a.fused) gu.free_all(); else { gate.free_all(); up.free_all(); }
                down.free_all();
                printf("%-7s REPACK: CPU_REPACK does not take this type here; same as CPU layout\n", tname.c_str());
                continue;
            }
            const size_t per_expert =
                (a.fused ? gu.expert_bytes : gate.expert_bytes + up.expert_bytes) + down.expert_bytes;

            // Router weights (f32 [E, H]) in the plain buffer, used by mode "router".
            ggml_init_params rp = {ggml_tensor_overhead() * 2, nullptr, true};
            ggml_context * rctx = ggml_init(rp);
            ggml_tensor * Wr = ggml_new_tensor_2d(rctx, GGML_TYPE_F32, H, E);
            ggml_set_name(Wr, "ffn_gate_inp");
            ggml_backend_buffer_t rbuf = ggml_backend_alloc_ctx_tensors_from_buft(rctx, plain);
            std::vector<float> wr((size_t) E * H);
            {
                std::mt19937_64 rng(a.seed + 17);
                std::normal_distribution<float> nd(0.0f, 0.02f);
                for (auto & v : wr) v = nd(rng);
                ggml_backend_tensor_set(Wr, wr.data(), 0, wr.size() * sizeof(float));
            }

            for (int T : a.tokens) {
                for (const auto & mode : a.modes) {
                    const bool router = mode == "router";
                    // Inputs: id_sets different x / routing sets.
                    std::vector<InputSet> sets(a.id_sets);
                    std::mt19937_64 rng(a.seed ^ (0x9e3779b97f4a7c15ull * (uint64_t) T));
                    std::uniform_real_distribution<float> ux(-1.0f, 1.0f);
                    std::normal_distribution<float> nl(0.0f, 1.0f);
                    std::vector<int32_t> perm(E);
                    for (auto & s : sets) {
                        s.x.resize((size_t) T * H);
                        for (auto & v : s.x) v = ux(rng);
                        s.ids.resize((size_t) T * K);
                        s.weights.resize((size_t) T * K);
                        for (int t = 0; t < T; t++) {
                            for (int e = 0; e < E; e++) perm[e] = e;
                            double sum = 0;
                            for (int j = 0; j < K; j++) {  // partial Fisher-Yates: K distinct experts
                                int r = j + (int) (rng() % (uint64_t) (E - j));
                                std::swap(perm[j], perm[r]);
                                s.ids[(size_t) t * K + j] = perm[j];
                                double w = std::exp(nl(rng));
                                s.weights[(size_t) t * K + j] = (float) w;
                                sum += w;
                            }
                            for (int j = 0; j < K; j++) s.weights[(size_t) t * K + j] /= (float) sum;
                        }
                    }

                    // Graph.
                    ggml_init_params gp = {ggml_tensor_overhead() * (64 + 2 * K) + ggml_graph_overhead(), nullptr,
                                           true};
                    ggml_context * gctx = ggml_init(gp);
                    ggml_tensor * x = ggml_new_tensor_2d(gctx, GGML_TYPE_F32, H, T);
                    ggml_set_name(x, "x");
                    ggml_set_input(x);
                    ggml_tensor * sel = nullptr;
                    ggml_tensor * sel_src = nullptr;  // what to read back in router mode
                    ggml_tensor * wts = nullptr;
                    ggml_tensor * ids_in = nullptr;
                    ggml_tensor * w_in = nullptr;
                    if (router) {
                        ggml_tensor * logits = ggml_mul_mat(gctx, Wr, x);  // [E, T]
                        ggml_tensor * probs = ggml_soft_max(gctx, logits);
                        sel = ggml_argsort_top_k(gctx, probs, K);            // [K, T] view of an argsort
                        sel_src = sel->view_src ? sel->view_src : sel;
                        ggml_set_output(sel_src);
                        wts = ggml_get_rows(gctx, ggml_reshape_3d(gctx, probs, 1, E, T), sel);  // [1, K, T]
                        ggml_tensor * w2 = ggml_reshape_2d(gctx, wts, K, T);
                        ggml_tensor * wsum = ggml_sum_rows(gctx, w2);
                        w2 = ggml_div(gctx, w2, wsum);
                        wts = ggml_reshape_3d(gctx, w2, 1, K, T);
                    } else {
                        ids_in = ggml_new_tensor_2d(gctx, GGML_TYPE_I32, K, T);
                        ggml_set_name(ids_in, "ids");
                        ggml_set_input(ids_in);
                        w_in = ggml_new_tensor_3d(gctx, GGML_TYPE_F32, 1, K, T);
                        ggml_set_name(w_in, "weights");
                        ggml_set_input(w_in);
                        sel = ids_in;
                        wts = w_in;
                    }
                    ggml_tensor * cur = ggml_reshape_3d(gctx, x, H, 1, T);
                    ggml_tensor * act;
                    if (a.fused) {
                        ggml_tensor * g_u = ggml_mul_mat_id(gctx, gu.t, cur, sel);  // [2I, K, T]
                        act = ggml_swiglu(gctx, g_u);                                // [I, K, T]
                    } else {
                        ggml_tensor * g = ggml_mul_mat_id(gctx, gate.t, cur, sel);  // [I, K, T]
                        ggml_tensor * u = ggml_mul_mat_id(gctx, up.t, cur, sel);
                        act = ggml_swiglu_split(gctx, g, u);
                    }
                    ggml_tensor * d = ggml_mul_mat_id(gctx, down.t, act, sel);  // [H, K, T]
                    d = ggml_mul(gctx, d, wts);
                    ggml_tensor * out = ggml_view_2d(gctx, d, H, T, d->nb[2], 0);
                    for (int j = 1; j < K; j++) {
                        out = ggml_add(gctx, out, ggml_view_2d(gctx, d, H, T, d->nb[2], (size_t) j * d->nb[1]));
                    }
                    ggml_set_name(out, "moe_out");
                    ggml_set_output(out);
                    ggml_cgraph * gf = ggml_new_graph(gctx);
                    ggml_build_forward_expand(gf, out);
                    if (router) ggml_build_forward_expand(gf, sel_src);

                    ggml_gallocr_t galloc = ggml_gallocr_new(plain);
                    if (!ggml_gallocr_alloc_graph(galloc, gf)) die("ggml_gallocr_alloc_graph failed");

                    auto set_inputs = [&](const InputSet & s) {
                        ggml_backend_tensor_set(x, s.x.data(), 0, s.x.size() * sizeof(float));
                        if (!router) {
                            ggml_backend_tensor_set(ids_in, s.ids.data(), 0, s.ids.size() * sizeof(int32_t));
                            ggml_backend_tensor_set(w_in, s.weights.data(), 0, s.weights.size() * sizeof(float));
                        }
                    };

                    // Router mode: one pass to learn which experts each set selects.
                    ggml_backend_cpu_set_n_threads(backend, a.threads[0]);
                    if (router) {
                        std::vector<int32_t> full((size_t) E * T);
                        for (auto & s : sets) {
                            set_inputs(s);
                            if (ggml_backend_graph_compute(backend, gf) != GGML_STATUS_SUCCESS) die("compute failed");
                            ggml_backend_tensor_get(sel_src, full.data(), 0, full.size() * sizeof(int32_t));
                            for (int t = 0; t < T; t++) {
                                // reference routing weights: softmax over E, the K selected, renormalised
                                std::vector<double> logit(E);
                                double mx = -1e300;
                                for (int e = 0; e < E; e++) {
                                    double v = 0;
                                    for (int c = 0; c < H; c++)
                                        v += (double) wr[(size_t) e * H + c] * s.x[(size_t) t * H + c];
                                    logit[e] = v;
                                    mx = std::max(mx, v);
                                }
                                double sum = 0;
                                for (int j = 0; j < K; j++) {
                                    int e = full[(size_t) t * E + j];
                                    s.ids[(size_t) t * K + j] = e;
                                    sum += std::exp(logit[e] - mx);
                                }
                                for (int j = 0; j < K; j++) {
                                    int e = s.ids[(size_t) t * K + j];
                                    s.weights[(size_t) t * K + j] = (float) (std::exp(logit[e] - mx) / sum);
                                }
                            }
                        }
                    }
                    double hit = 0;
                    for (auto & s : sets) {
                        s.hit = count_hit(s.ids, E);
                        hit += s.hit;
                    }
                    hit /= (double) sets.size();
                    double bytes = hit * (double) per_expert + (router ? (double) E * H * sizeof(float) : 0.0);

                    // Numerics: set 0 against the f32/double reference of the dequantized weights.
                    double nmse = NAN;
                    if (a.check) {
                        set_inputs(sets[0]);
                        if (ggml_backend_graph_compute(backend, gf) != GGML_STATUS_SUCCESS) die("compute failed");
                        std::vector<float> got((size_t) T * H);
                        ggml_backend_tensor_get(out, got.data(), 0, got.size() * sizeof(float));
                        auto ref = reference(a, a.fused ? nullptr : &gate, a.fused ? nullptr : &up,
                                             a.fused ? &gu : nullptr, down, sets[0], T, std::min(a.distinct, E));
                        double num = 0, den = 0;
                        for (size_t i = 0; i < ref.size(); i++) {
                            num += (got[i] - ref[i]) * (got[i] - ref[i]);
                            den += ref[i] * ref[i];
                        }
                        nmse = den > 0 ? num / den : NAN;
                    }

                    const long ncpu = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
                    for (int nt : a.threads) {
                        ggml_backend_cpu_set_n_threads(backend, nt);
                        std::vector<double> times;
                        double other_pct = 0;
                        int attempt = 0;
                        for (;; attempt++) {
                            size_t r = 0;
                            for (int w = 0; w < a.warmup; w++) {
                                set_inputs(sets[r++ % sets.size()]);
                                if (ggml_backend_graph_compute(backend, gf) != GGML_STATUS_SUCCESS) die("compute failed");
                            }
                            times.clear();
                            const double busy0 = busy_cpu_s(), self0 = self_cpu_s();
                            const double start = now_s();
                            while ((times.size() < 5 || now_s() - start < a.min_time) &&
                                   (int) times.size() < a.max_repeats) {
                                set_inputs(sets[r++ % sets.size()]);  // not timed
                                const double t0 = now_s();
                                if (ggml_backend_graph_compute(backend, gf) != GGML_STATUS_SUCCESS) die("compute failed");
                                times.push_back(now_s() - t0);
                            }
                            const double wall = now_s() - start;
                            const double other = (busy_cpu_s() - busy0) - (self_cpu_s() - self0);
                            other_pct = std::max(0.0, 100.0 * other / (wall * (double) ncpu));
                            if (other_pct <= a.busy_pct || attempt >= a.busy_retries) break;
                            fprintf(stderr, "%s T=%d threads=%d %s: other processes took %.0f%% of the CPUs, "
                                    "re-measuring in 5 s\n", ggml_type_name(type), T, nt, mode.c_str(), other_pct);
                            sleep(5);
                        }
                        std::sort(times.begin(), times.end());
                        Result res;
                        res.type = ggml_type_name(type);
                        res.mode = mode;
                        res.layout = layout;
                        res.tokens = T;
                        res.threads = nt;
                        res.repeats = (int) times.size();
                        res.median_ms = times[times.size() / 2] * 1e3;
                        res.min_ms = times[0] * 1e3;
                        res.weight_bytes = bytes;
                        res.gb_per_s = bytes / (res.median_ms * 1e-3) / 1e9;
                        res.hit = hit;
                        res.nmse = nmse;
                        res.other_pct = other_pct;
                        res.attempts = attempt + 1;
                        printf("%-7s %5d %3d %-6s %-8s %10.3f %10.3f %6d %6.1f %10.2f %8.2f %9.2e %5.0f\n",
                               res.type.c_str(), T, nt, mode.c_str(), layout.c_str(), res.median_ms, res.min_ms,
                               res.repeats, hit, bytes / 1e6, res.gb_per_s, nmse, other_pct);
                        fflush(stdout);
                        results.push_back(res);
                    }
                    ggml_gallocr_free(galloc);
                    ggml_free(gctx);
                }
            }
            ggml_backend_buffer_free(rbuf);
            ggml_free(rctx);
            if (a.fused) gu.free_all(); else { gate.free_all(); up.free_all(); }
            down.free_all();
        }
    }

    if (!a.json.empty()) {
        FILE * f = fopen(a.json.c_str(), "w");
        if (!f) die("cannot write " + a.json);
        const std::string cpu = json_escape(cpu_model());
        fprintf(f, "[\n");
        for (size_t i = 0; i < results.size(); i++) {
            const Result & r = results[i];
            fprintf(f,
                    "  {\"peer\": \"ggml\", \"ggml_commit\": \"%s\", \"cpu_model\": \"%s\", \"preset\": \"%s\", "
                    "\"experts\": %d, \"top_k\": %d, \"hidden\": %d, \"intermediate\": %d, \"gate_up\": \"%s\", "
                    "\"type\": \"%s\", \"tokens\": %d, \"threads\": %d, \"mode\": \"%s\", \"layout\": \"%s\", "
                    "\"median_ms\": %.6f, \"min_ms\": %.6f, \"repeats\": %d, \"id_sets\": %d, "
                    "\"experts_hit_avg\": %.3f, \"weight_bytes\": %.1f, \"weight_mb\": %.4f, \"gb_per_s\": %.4f, "
                    "\"nmse\": %s, \"other_cpu_pct\": %.1f, \"attempts\": %d}%s\n",
                    GGML_COMMIT, cpu.c_str(), a.preset.c_str(), a.E, a.K, a.H, a.I, a.fused ? "fused" : "separate",
                    r.type.c_str(), r.tokens, r.threads, r.mode.c_str(), r.layout.c_str(), r.median_ms, r.min_ms,
                    r.repeats, a.id_sets, r.hit, r.weight_bytes, r.weight_bytes / 1e6, r.gb_per_s,
                    nmse_s(r.nmse).c_str(), r.other_pct, r.attempts,
                    i + 1 < results.size() ? "," : "");
        }
        fprintf(f, "]\n");
        fclose(f);
    }
    ggml_backend_free(backend);
    return 0;
}
