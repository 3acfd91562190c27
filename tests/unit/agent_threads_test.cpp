// The agent's own work is not the program's, wherever it runs: its threads are the
// agent's from their first instruction (a probe hit in libc's code that starts them,
// before their function marks its work, runs no handler and leaves no record, while the
// same code in the program's threads is traced), and the calls the tracer's hit path
// makes into libc for itself count no miss.
#include "platform/agent_threads.hpp"

#include <gtest/gtest.h>
#include <ukprobes/kprobes.h>

#include <atomic>
#include <sstream>
#include <pthread.h>
#include <string>
#include <thread>
#include <unistd.h>

#include "trace_files.hpp"

using namespace ukp::trace;
using namespace ukp::trace::test_files;

extern "C" __attribute__((noinline)) long uat_called(long v) {
    asm volatile("" ::: "memory");
    return v + 1;
}

namespace {

long (*volatile g_called)(long) = uat_called;
std::atomic<int> g_hits{0};

int count_hit(kprobe *, pt_regs *) {
    g_hits.fetch_add(1);
    return 0;
}

void *call_it(void *) {
    g_called(1); // no AgentWork here: only where the thread's TLS lies tells it
    return nullptr;
}

TEST(AgentThreads, AreQuietFromTheirFirstInstruction) {
    kprobe kp{};
    kp.symbol_name = "uat_called";
    kp.pre_handler = count_hit;
    ASSERT_EQ(register_kprobe(&kp), 0);

    pthread_t t;
    ASSERT_EQ(ukp::platform::start_agent_thread(&t, call_it, nullptr), 0);
    // Its control block, and so its TLS, lies in the stack the agent noted.
    EXPECT_TRUE(ukp::platform::in_agent_thread(reinterpret_cast<uint64_t>(t)));
    ASSERT_EQ(pthread_join(t, nullptr), 0);
    ukp::platform::release_agent_thread(t);
    EXPECT_EQ(g_hits.load(), 0) << "the agent's thread ran a handler";
    EXPECT_EQ(kp.nmissed, 0u) << "nor is its hit a miss";
    // Its stack is kept, still noted (what points into its TLS finds memory), and the next
    // thread of the agent's runs on it.
    EXPECT_TRUE(ukp::platform::in_agent_thread(reinterpret_cast<uint64_t>(t)));
    pthread_t again;
    ASSERT_EQ(ukp::platform::start_agent_thread(&again, call_it, nullptr), 0);
    ASSERT_EQ(pthread_join(again, nullptr), 0);
    ukp::platform::release_agent_thread(again);
    EXPECT_TRUE(pthread_equal(again, t)) << "the kept stack's control block is where the first one's was";
    EXPECT_EQ(g_hits.load(), 0);

    // The program's threads, made as the program makes them, are traced.
    std::thread([] { g_called(2); }).join();
    EXPECT_EQ(g_hits.load(), 1);
    EXPECT_FALSE(ukp::platform::in_agent_thread(reinterpret_cast<uint64_t>(__builtin_thread_pointer())));
    unregister_kprobe(&kp);
}

// A thread started from outside the agent on a stack it gave (`ukprobe attach`'s loader
// when the agent is already loaded) is the agent's too; its stack is given out again only
// once the thread has ended.
std::atomic<bool> g_loader_go{false};

void *loader_like(void *) {
    ukp::platform::note_loader_thread(); // as ukp_control_start() does
    g_called(4);
    while (!g_loader_go.load()) usleep(1000);
    return nullptr;
}

// Starts loader_like on the stack [lo, lo + size).
bool start_on(pthread_t *t, uint64_t lo, uint64_t size) {
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) != 0) return false;
    const bool ok = pthread_attr_setstack(&attr, reinterpret_cast<void *>(lo), size) == 0 &&
                    pthread_create(t, &attr, loader_like, nullptr) == 0;
    pthread_attr_destroy(&attr);
    return ok;
}

TEST(AgentThreads, ALoadersStackComesBackOnceItsThreadEnded) {
    kprobe kp{};
    kp.symbol_name = "uat_called";
    kp.pre_handler = count_hit;
    ASSERT_EQ(register_kprobe(&kp), 0);
    g_hits = 0;
    uint64_t lo = 0, size = 0;
    ASSERT_EQ(ukp::platform::take_loader_stack(&lo, &size), 0);
    EXPECT_TRUE(ukp::platform::in_agent_thread(lo + size / 2));
    pthread_t t;
    ASSERT_TRUE(start_on(&t, lo, size));
    // While it runs, its stack is not given out again.
    uint64_t lo2 = 0, size2 = 0;
    ASSERT_EQ(ukp::platform::take_loader_stack(&lo2, &size2), 0);
    EXPECT_NE(lo2, lo);
    pthread_t t2;
    ASSERT_TRUE(start_on(&t2, lo2, size2));
    g_loader_go = true;
    ASSERT_EQ(pthread_join(t, nullptr), 0); // returns once the kernel cleared its tid word
    ASSERT_EQ(pthread_join(t2, nullptr), 0);
    EXPECT_EQ(g_hits.load(), 0) << "a loader's thread ran a handler";
    // Both ended: the next loader gets one of their stacks back.
    uint64_t lo3 = 0, size3 = 0;
    ASSERT_EQ(ukp::platform::take_loader_stack(&lo3, &size3), 0);
    EXPECT_TRUE(lo3 == lo || lo3 == lo2) << std::hex << lo3 << " is neither " << lo << " nor " << lo2;
    g_loader_go = false;
    ASSERT_TRUE(start_on(&t, lo3, size3));
    g_loader_go = true;
    ASSERT_EQ(pthread_join(t, nullptr), 0);
    EXPECT_EQ(g_hits.load(), 0);
    unregister_kprobe(&kp);
}

// The thread that decides jump verdicts beside the defining one (an event over many
// functions): its start in libc leaves no record in an event on that code.
class AgentThreadsTraced : public CleanTracer {};

TEST_F(AgentThreadsTraced, ThePlannersHelperLeavesNoRecord) {
    ASSERT_EQ(file_append("dynamic_events", "f:starts libc.so.6:start_thread"), 0) << read("error_log");
    ASSERT_EQ(file_write("events/fprobes/starts/enable", "1"), 0);
    std::thread([] {}).join(); // the program's own: one record
    ASSERT_EQ(trace_lines("starts").size(), 1u) << read("trace");
    // A definition over many functions plans their jumps on a second thread, where there
    // is a second core.
    ASSERT_EQ(file_append("dynamic_events", "f:many libc.so.6:str*"), 0) << read("error_log");
    EXPECT_EQ(trace_lines("starts").size(), 1u) << read("trace");
    ASSERT_EQ(file_write("events/fprobes/starts/enable", "0"), 0);
}

// The misses of kprobe_profile's line for `event`, or -1.
long misses_of(const std::string &event) {
    std::istringstream in(read("kprobe_profile"));
    std::string name;
    long hits = 0, misses = 0;
    while (in >> name >> hits >> misses)
        if (name == event) return misses;
    return -1;
}

// A thread's first record takes its name and id (prctl, syscall) and hooks its exit
// (pthread_setspecific): calls of the tracer's, inside its handler, which an event on
// those functions meets. The kernel's kprobe_profile counts a miss for a probe hit inside
// a handler; these hits are not the program's and count none.
TEST_F(AgentThreadsTraced, TheTracersOwnCallsFromAHitCountNoMiss) {
    ASSERT_EQ(file_append("dynamic_events", "f:its libc.so.6:prctl,syscall,pthread_setspecific"), 0)
        << read("error_log");
    ASSERT_EQ(file_append("dynamic_events", "p:mine uat_called"), 0) << read("error_log");
    ASSERT_EQ(file_write("events/fprobes/its/enable", "1"), 0);
    ASSERT_EQ(file_write("events/kprobes/mine/enable", "1"), 0);
    std::thread([] { g_called(3); }).join();
    ASSERT_EQ(file_write("events/enable", "0"), 0);
    ASSERT_EQ(trace_lines("mine").size(), 1u) << read("trace");
    EXPECT_EQ(misses_of("its"), 0) << read("kprobe_profile");
}

} // namespace
