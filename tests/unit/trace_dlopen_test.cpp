// Events on a library that comes and goes: an event enabled (or disabled) while
// its probe waits for the library keeps that state, and the probe is armed by
// it when dlopen() maps the library, as the kernel's trace_kprobe applies an
// event's state when the module of its probe loads. And again after dlclose()
// and dlopen().
#include <ukprobes/kprobes.h>

#include <gtest/gtest.h>

#include <dlfcn.h>

#include <cstdlib>
#include <sstream>
#include <string>

#include "trace/events.hpp"
#include "trace_files.hpp"

using namespace ukp::trace;
using namespace ukp::trace::test_files;

namespace {

// The kprobes/list line of the probe on ukp_dl_fn, or "" when there is none.
std::string list_line() {
    char *text = ukp_kprobes_list();
    std::istringstream in(text != nullptr ? text : "");
    std::free(text);
    std::string line;
    while (std::getline(in, line))
        if (line.find("ukp_dl_fn+0x0  libukp_dl_target.so") != std::string::npos) return line;
    return "";
}

// The trace lines of `event` that contain `value`.
size_t count_records(const std::string &event, const std::string &value) {
    std::istringstream in(read("trace"));
    std::string line;
    size_t n = 0;
    while (std::getline(in, line))
        if (!line.empty() && line[0] != '#' && line.find(" " + event + ": (") != std::string::npos &&
            line.find(value) != std::string::npos)
            ++n;
    return n;
}

bool loaded() { return dlopen(UKP_DL_TARGET, RTLD_NOW | RTLD_NOLOAD) != nullptr; }

class TraceDlopen : public ::testing::Test {
protected:
    void SetUp() override {
        ASSERT_FALSE(loaded()) << "the library must not be loaded yet";
        ASSERT_EQ(file_write("events/enable", "0"), 0);
        ASSERT_EQ(file_write("kprobe_events", ""), 0);
        ASSERT_EQ(file_write("trace", ""), 0);
        ASSERT_EQ(file_write("tracing_on", "1"), 0);
    }
    void TearDown() override {
        file_write("events/enable", "0");
        file_write("kprobe_events", "");
    }
};

TEST_F(TraceDlopen, EventEnabledWhilePendingIsRecordedOnceTheLibraryLoads) {
    ASSERT_EQ(file_write("kprobe_events", "p:dlev libukp_dl_target.so:ukp_dl_fn x=%di:s32"), 0);
    EXPECT_NE(list_line().find("[GONE]"), std::string::npos) << list_line();
    ASSERT_EQ(file_write("events/kprobes/dlev/enable", "1"), 0);
    EXPECT_EQ(read("events/kprobes/dlev/enable"), "1\n");

    // The constructor calls ukp_dl_fn(14) before dlopen() returns.
    void *lib = dlopen(UKP_DL_TARGET, RTLD_NOW);
    ASSERT_NE(lib, nullptr) << dlerror();
    EXPECT_EQ(list_line().find("[GONE]"), std::string::npos) << list_line();
    EXPECT_EQ(list_line().find("[DISABLED]"), std::string::npos) << list_line();
    EXPECT_EQ(count_records("dlev", "x=14"), 1u) << read("trace");
    auto fn = reinterpret_cast<int (*)(int)>(dlsym(lib, "ukp_dl_fn"));
    ASSERT_NE(fn, nullptr);
    EXPECT_EQ(fn(5), 15);
    EXPECT_EQ(count_records("dlev", "x=5"), 1u) << read("trace");

    // Unloaded, enabled all along, loaded again: armed and recorded again.
    ASSERT_EQ(dlclose(lib), 0);
    ASSERT_FALSE(loaded());
    EXPECT_NE(list_line().find("[GONE]"), std::string::npos) << list_line();
    lib = dlopen(UKP_DL_TARGET, RTLD_NOW);
    ASSERT_NE(lib, nullptr) << dlerror();
    EXPECT_EQ(list_line().find("[DISABLED]"), std::string::npos) << list_line();
    EXPECT_EQ(count_records("dlev", "x=14"), 2u) << read("trace");

    // Disabled while unloaded: loaded again disarmed, nothing recorded.
    ASSERT_EQ(dlclose(lib), 0);
    ASSERT_EQ(file_write("events/kprobes/dlev/enable", "0"), 0);
    lib = dlopen(UKP_DL_TARGET, RTLD_NOW);
    ASSERT_NE(lib, nullptr) << dlerror();
    EXPECT_NE(list_line().find("[DISABLED]"), std::string::npos) << list_line();
    EXPECT_EQ(count_records("dlev", "x=14"), 2u) << read("trace");

    // Enabled while unloaded after it was disabled loaded.
    ASSERT_EQ(dlclose(lib), 0);
    ASSERT_EQ(file_write("events/kprobes/dlev/enable", "1"), 0);
    lib = dlopen(UKP_DL_TARGET, RTLD_NOW);
    ASSERT_NE(lib, nullptr) << dlerror();
    EXPECT_EQ(list_line().find("[DISABLED]"), std::string::npos) << list_line();
    EXPECT_EQ(count_records("dlev", "x=14"), 3u) << read("trace");
    EXPECT_NE(read("kprobe_events").find("p:kprobes/dlev libukp_dl_target.so:ukp_dl_fn"), std::string::npos)
        << read("kprobe_events");

    ASSERT_EQ(file_write("events/kprobes/dlev/enable", "0"), 0);
    ASSERT_EQ(file_write("kprobe_events", ""), 0);
    EXPECT_EQ(list_line(), "");
    dlclose(lib);
}

// A return probe needs its library loaded to be defined; unloaded, it waits as
// [GONE] and keeps the state its event is given meanwhile.
TEST_F(TraceDlopen, ReturnEventEnabledWhileUnloadedIsRecordedOnceTheLibraryLoadsAgain) {
    void *lib = dlopen(UKP_DL_TARGET, RTLD_NOW);
    ASSERT_NE(lib, nullptr) << dlerror();
    ASSERT_EQ(file_write("kprobe_events", "r:dlret libukp_dl_target.so:ukp_dl_fn ret=$retval:s32"), 0);
    EXPECT_NE(list_line().find("[DISABLED]"), std::string::npos) << list_line();
    ASSERT_EQ(dlclose(lib), 0);
    ASSERT_FALSE(loaded());
    EXPECT_NE(list_line().find("[GONE]"), std::string::npos) << list_line();
    ASSERT_EQ(file_write("events/kprobes/dlret/enable", "1"), 0);

    lib = dlopen(UKP_DL_TARGET, RTLD_NOW);
    ASSERT_NE(lib, nullptr) << dlerror();
    EXPECT_EQ(list_line().find("[GONE]"), std::string::npos) << list_line();
    EXPECT_EQ(list_line().find("[DISABLED]"), std::string::npos) << list_line();
    EXPECT_EQ(count_records("dlret", "ret=42"), 1u) << read("trace"); // the constructor's 14 * 3

    ASSERT_EQ(dlclose(lib), 0);
    ASSERT_EQ(file_write("events/kprobes/dlret/enable", "0"), 0);
    lib = dlopen(UKP_DL_TARGET, RTLD_NOW);
    ASSERT_NE(lib, nullptr) << dlerror();
    EXPECT_NE(list_line().find("[DISABLED]"), std::string::npos) << list_line();
    EXPECT_EQ(count_records("dlret", "ret=42"), 1u) << read("trace");

    ASSERT_EQ(file_write("kprobe_events", ""), 0);
    dlclose(lib);
}

// As the kernel's trace_kprobe with a module not loaded yet: an r event can be defined
// before its library is loaded, and records the library's first call (its constructor's).
TEST_F(TraceDlopen, ReturnEventDefinedBeforeTheLibraryLoads) {
    ASSERT_FALSE(loaded());
    ASSERT_EQ(file_write("kprobe_events", "r:dlret libukp_dl_target.so:ukp_dl_fn ret=$retval:s32"), 0);
    EXPECT_NE(list_line().find("[GONE]"), std::string::npos) << list_line();
    ASSERT_EQ(file_write("events/kprobes/dlret/enable", "1"), 0);
    void *lib = dlopen(UKP_DL_TARGET, RTLD_NOW);
    ASSERT_NE(lib, nullptr) << dlerror();
    EXPECT_EQ(list_line().find("[GONE]"), std::string::npos) << list_line();
    EXPECT_EQ(count_records("dlret", "ret=42"), 1u) << read("trace"); // the constructor's 14 * 3
    ASSERT_EQ(file_write("events/kprobes/dlret/enable", "0"), 0);
    ASSERT_EQ(file_write("kprobe_events", ""), 0);
    dlclose(lib);
}

} // namespace
