// The cost of recording: ring_reserve + ring_commit of one record (steady state, the
// buffer wrapping in overwrite mode), on one thread and on several at once (per-thread
// buffers: no shared cache line), against its system-call-free parts: the TSC read
// (the vDSO's clock_gettime for comparison, which an older version used) and sched_getcpu.
#include <benchmark/benchmark.h>

#include <sched.h>
#include <x86intrin.h>
#include <time.h>

#include <cstring>

#include "trace/ring.hpp"

namespace {

using namespace ukp::trace;

void BM_ReserveCommit(benchmark::State &state) {
    if (state.thread_index() == 0) {
        ring_init();
        set_tracing_on(true);
    }
    const auto size = static_cast<uint32_t>(state.range(0));
    uint64_t seq = 0;
    for (auto _ : state) {
        uint8_t *rec = ring_reserve(size);
        if (rec != nullptr) {
            CommonHeader c{1, 0, 0, 1};
            std::memcpy(rec, &c, sizeof c);
            std::memcpy(rec + sizeof c, &seq, sizeof seq);
            ring_commit(rec, size);
        }
        ++seq;
    }
    state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_ReserveCommit)->Arg(16)->Arg(48)->Arg(128)->Arg(512);
BENCHMARK(BM_ReserveCommit)->Arg(48)->Threads(2)->UseRealTime();

void BM_ReserveDiscard(benchmark::State &state) {
    ring_init();
    for (auto _ : state) {
        uint8_t *rec = ring_reserve(48);
        benchmark::DoNotOptimize(rec);
        if (rec != nullptr) ring_commit(rec, 0); // a filter said no
    }
}
BENCHMARK(BM_ReserveDiscard);

void BM_TracingOff(benchmark::State &state) {
    ring_init();
    set_tracing_on(false);
    for (auto _ : state) benchmark::DoNotOptimize(ring_reserve(48));
    set_tracing_on(true);
}
BENCHMARK(BM_TracingOff);

void BM_ClockGettimeMonotonic(benchmark::State &state) {
    timespec ts;
    for (auto _ : state) {
        clock_gettime(CLOCK_MONOTONIC, &ts);
        benchmark::DoNotOptimize(ts);
    }
}
BENCHMARK(BM_ClockGettimeMonotonic);

void BM_Rdtsc(benchmark::State &state) {
    for (auto _ : state) benchmark::DoNotOptimize(__rdtsc());
}
BENCHMARK(BM_Rdtsc);

void BM_SchedGetcpu(benchmark::State &state) {
    for (auto _ : state) benchmark::DoNotOptimize(sched_getcpu());
}
BENCHMARK(BM_SchedGetcpu);

} // namespace

BENCHMARK_MAIN();
