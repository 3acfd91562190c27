// f: arguments by name (fprobetrace.rst's BTF arguments, from DWARF here): parameters by
// name with the types their debug information gives, "->" and "." into what they point
// to, :string on char * and char [], $arg*, the type of $retval; the kernel's errors.
#include <gtest/gtest.h>

#include <iterator>
#include <span>
#include <string>
#include <vector>

#include "trace/events.hpp"
#include "trace_files.hpp"

using namespace ukp::trace;
using namespace ukp::trace::test_files;

extern "C" {
struct ukd_inner {
    int depth;
    const char *label;
};
struct ukd_request {
    long size;
    char name[16];
    struct ukd_inner in;
    union {
        int signed_view;
        unsigned unsigned_view;
    };
    struct ukd_request *next;
};
enum ukd_mode { kUkdRead = 1, kUkdWrite = 2 };

__attribute__((noinline)) int ukd_handle(struct ukd_request *req, const char *tag, unsigned short flags, double ratio,
                                         long count, enum ukd_mode mode, bool urgent) {
    asm volatile("" : : "r"(tag) : "memory");
    return int(req->size + flags + count + long(ratio) + mode + urgent);
}
__attribute__((noinline)) struct ukd_request *ukd_pick(struct ukd_request *a, struct ukd_request *b) {
    asm volatile("" ::: "memory");
    return a->size > b->size ? a : b;
}
__attribute__((noinline)) void ukd_nothing(int v) { asm volatile("" : : "r"(v) : "memory"); }
__attribute__((noinline)) long ukd_by_value(struct ukd_inner in, long after) {
    asm volatile("" ::: "memory");
    return in.depth + after;
}
long ukd_nodebug(long count); // nodebug_function.c
}

namespace {

int (*volatile g_handle)(struct ukd_request *, const char *, unsigned short, double, long, enum ukd_mode,
                         bool) = ukd_handle;
struct ukd_request *(*volatile g_pick)(struct ukd_request *, struct ukd_request *) = ukd_pick;
long (*volatile g_nodebug)(long) = ukd_nodebug;

class ArgumentsByName : public CleanTracer {
protected:
    ukd_request second_{7, "second", {2, "deep"}, {-3}, nullptr};
    ukd_request first_{42, "first", {1, "shallow"}, {5}, &second_};
};

TEST_F(ArgumentsByName, ParametersMembersAndStrings) {
    ASSERT_EQ(file_append("dynamic_events", "f:ev ukd_handle req->size req->name:string req->in.depth "
                                            "req->in.label tag flags count mode urgent nsize=req->next->size "
                                            "req->signed_view"),
              0)
        << read("error_log");
    // The arguments as written, each named by its last name.
    EXPECT_EQ(read("dynamic_events"),
              "f:fprobes/ev ukd_handle size=req->size name=req->name:string depth=req->in.depth "
              "label=req->in.label tag=tag flags=flags count=count mode=mode urgent=urgent nsize=req->next->size "
              "signed_view=req->signed_view\n");
    const std::string format = read("events/fprobes/ev/format");
    EXPECT_NE(format.find("field:s64 size;"), std::string::npos) << format;
    EXPECT_NE(format.find("field:u16 flags;"), std::string::npos) << format;
    EXPECT_NE(format.find("field:u32 mode;"), std::string::npos) << format;
    EXPECT_NE(format.find("field:u8 urgent;"), std::string::npos) << format;
    EXPECT_NE(format.find("field:__data_loc char[] tag;"), std::string::npos) << format;
    ASSERT_EQ(file_write("events/fprobes/ev/enable", "1"), 0);
    EXPECT_EQ(g_handle(&first_, "tagged", 9, 1.5, 11, kUkdWrite, true), 42 + 9 + 11 + 1 + 2 + 1);
    ASSERT_EQ(file_write("events/fprobes/ev/enable", "0"), 0);
    const auto lines = trace_lines("ev");
    ASSERT_EQ(lines.size(), 1u) << read("trace");
    // count is the fifth parameter but in the fourth integer register: the double went
    // to %xmm0.
    EXPECT_NE(lines[0].find(" size=42 name=\"first\" depth=1 label=\"shallow\" tag=\"tagged\" flags=9 count=11 "
                            "mode=2 urgent=1 nsize=7 signed_view=5"),
              std::string::npos)
        << lines[0];
}

// $arg* stands for every parameter $argN can read (the double is passed over); a pointer
// is shown in hex, as the kernel shows one from BTF.
TEST_F(ArgumentsByName, AllArgumentsAndTheReturnValue) {
    ASSERT_EQ(file_append("dynamic_events", "f:all ukd_handle $arg*"), 0) << read("error_log");
    EXPECT_EQ(read("dynamic_events"), "f:fprobes/all ukd_handle req=req tag=tag flags=flags count=count mode=mode "
                                      "urgent=urgent\n");
    ASSERT_EQ(file_append("dynamic_events", "f:ret ukd_pick%return $retval $retval->name:string"), 0)
        << read("error_log");
    ASSERT_EQ(file_append("dynamic_events", "f:pick ukd_pick%return a->size b->name"), 0) << read("error_log");
    ASSERT_EQ(file_write("events/fprobes/enable", "1"), 0);
    g_handle(&second_, "t", 1, 0.0, 2, kUkdRead, false);
    EXPECT_EQ(g_pick(&first_, &second_), &first_);
    ASSERT_EQ(file_write("events/fprobes/enable", "0"), 0);
    const auto all = trace_lines("all"), ret = trace_lines("ret"), pick = trace_lines("pick");
    ASSERT_EQ(all.size(), 1u) << read("trace");
    char req[64];
    snprintf(req, sizeof req, " req=%p tag=\"t\" flags=1 count=2 mode=1 urgent=0", static_cast<void *>(&second_));
    EXPECT_NE(all[0].find(req), std::string::npos) << all[0] << " wanted " << req;
    ASSERT_EQ(ret.size(), 1u) << read("trace");
    char r[64];
    snprintf(r, sizeof r, " arg1=%p name=\"first\"", static_cast<void *>(&first_));
    EXPECT_NE(ret[0].find(r), std::string::npos) << ret[0] << " wanted " << r;
    // In the exit form, parameters are their values at the entry.
    ASSERT_EQ(pick.size(), 1u) << read("trace");
    EXPECT_NE(pick[0].find(" size=42 name=\"second\""), std::string::npos) << pick[0];
}

struct Refusal {
    const char *definition;
    const char *message; // the kernel's
    const char *at;      // where the caret points: the last place the command has this; " ": its end
};

// Each definition refused with its message, logged by `tracer`, the caret under its part;
// the definitions already there (`before`) unchanged.
void expect_refusals(const Refusal *refusals, size_t n, const std::string &tracer, const std::string &before) {
    for (const Refusal &r : std::span(refusals, n)) {
        SCOPED_TRACE(r.definition);
        ASSERT_EQ(file_write("error_log", ""), 0);
        EXPECT_EQ(file_append("dynamic_events", r.definition), -EINVAL);
        const std::string log = read("error_log");
        EXPECT_NE(log.find(tracer + ": error: " + r.message), std::string::npos) << log;
        const std::string command = r.definition;
        const size_t at = std::string(r.at) == " " ? command.size() : command.rfind(r.at);
        const size_t col = at + std::string("  Command: ").size();
        EXPECT_NE(log.find("\n" + std::string(col, ' ') + "^"), std::string::npos) << log;
        EXPECT_EQ(read("dynamic_events"), before);
    }
}

TEST_F(ArgumentsByName, TheKernelsErrors) {
    const Refusal refusals[] = {
        {"f:e ukd_handle nosuch", "This variable is not found at this probe point", "nosuch"},
        {"f:e ukd_handle flags->x", "This is not a pointer to union/structure.", "->x"},
        {"f:e ukd_handle req->nosuch", "This field is not found.", "nosuch"},
        {"f:e ukd_handle req-size", "Failed to parse single hyphen. Forgot '>'?", "-size"},
        {"f:e ukd_handle req->in", "Non pointer structure/union argument is not supported.", "req->in"},
        {"f:e ukd_by_value in", "Non pointer structure/union argument is not supported.", "in"},
        {"f:e ukd_by_value after", "This argument is not passed where $argN reads it", "after"},
        {"f:e ukd_handle ratio", "Failed to get BTF type info.", "ratio"},
        {"f:e ukd_handle flags:string", "This type does not fit for string.", "string"},
        {"f:e ukd_nothing%return $retval", "This function returns 'void' type", "$retval"},
        {"f:e ukd_handle $arg* $arg*", "$arg* can be used only once in the parameters", "$arg*"},
        {"f:e ukd_handle x=$arg*", "$arg* must be an independent parameter without name etc.", "$arg*"},
        {"f:e ukd_handle size=req->size req->size", "This argument name is already used", "req->size"},
        {"f:e ukd_nodebug count", "BTF is not available or not supported", "count"},
        {"f:e ukd_nodebug $arg*", "BTF is not available or not supported", "$arg*"},
        {"f:e ukd_handl* req", "BTF is not available or not supported", "req"},
    };
    expect_refusals(refusals, std::size(refusals), "trace_fprobe", "");
}

// eprobetrace.rst's typecast: an e: event reads through an address its source records,
// (STRUCT)FIELD->MEMBER, the struct found in the debug information of the object the
// source probes; the members' types and names as an f: event's by name.
TEST_F(ArgumentsByName, EventProbeTypecasts) {
    ASSERT_EQ(file_append("dynamic_events", "f:src ukd_handle p=$arg1 f=$arg3:u16"), 0) << read("error_log");
    ASSERT_EQ(file_append("dynamic_events", "e:cast fprobes.src (ukd_request)p->size (ukd_request)p->name "
                                            "(ukd_request)$p->in.label n=(ukd_request)p->next->size "
                                            "(ukd_request)p->signed_view:x32"),
              0)
        << read("error_log");
    EXPECT_NE(read("dynamic_events")
                  .find("e:eprobes/cast fprobes.src size=(ukd_request)p->size "
                        "name=(ukd_request)p->name label=(ukd_request)$p->in.label "
                        "n=(ukd_request)p->next->size signed_view=(ukd_request)p->signed_view:x32\n"),
              std::string::npos)
        << read("dynamic_events");
    const std::string format = read("events/eprobes/cast/format");
    EXPECT_NE(format.find("field:s64 size;"), std::string::npos) << format;
    EXPECT_NE(format.find("field:__data_loc char[] name;"), std::string::npos) << format;
    EXPECT_NE(format.find("field:u32 signed_view;"), std::string::npos) << format;
    ASSERT_EQ(file_write("events/eprobes/cast/enable", "1"), 0);
    g_handle(&first_, "x", 1, 0.0, 2, kUkdRead, false);
    ASSERT_EQ(file_write("events/eprobes/cast/enable", "0"), 0);
    const auto lines = trace_lines("cast");
    ASSERT_EQ(lines.size(), 1u) << read("trace");
    EXPECT_NE(lines[0].find(" size=42 name=\"first\" label=\"shallow\" n=7 signed_view=0x5"), std::string::npos)
        << lines[0];

    const Refusal refusals[] = {
        {"e:e fprobes.src (nosuch)p->size", "Failed to get BTF type info.", "nosuch"},
        {"e:e fprobes.src (ukd_request)p->nosuch", "This field is not found.", "nosuch"},
        {"e:e fprobes.src (ukd_request)p->size->x", "This is not a pointer to union/structure.", "->x"},
        {"e:e fprobes.src (ukd_request)p->in", "Non pointer structure/union argument is not supported.",
         "(ukd_request)p->in"},
        {"e:e fprobes.src (ukd_request)p", "This field is not found.", " "},
        {"e:e fprobes.src (ukd_request)q->size", "Attached event does not have this field", "q->size"},
        {"e:e fprobes.src (ukd_request)f->size", "This is not a pointer to union/structure.", "f->size"},
        {"e:e fprobes.src (ukd_request)p->size:string", "This type does not fit for string.", "string"},
        {"e:e fprobes.src (ukd_request p->size", "Invalid fetch argument", "(ukd_request"},
    };
    expect_refusals(refusals, std::size(refusals), "event_probe", read("dynamic_events"));
}

// Without debug information $argN still works, and the old names of the kprobe language
// ("rv" and the rest) keep their meaning where no parameter has that name.
TEST_F(ArgumentsByName, WithoutDebugInformation) {
    ASSERT_EQ(file_append("dynamic_events", "f:nd ukd_nodebug c=$arg1"), 0) << read("error_log");
    ASSERT_EQ(file_append("dynamic_events", "f:old ukd_handle%return rv"), 0) << read("error_log");
    ASSERT_EQ(file_write("events/fprobes/enable", "1"), 0);
    EXPECT_EQ(g_nodebug(4), 5);
    ASSERT_EQ(file_write("events/fprobes/enable", "0"), 0);
    const auto nd = trace_lines("nd");
    ASSERT_EQ(nd.size(), 1u) << read("trace");
    EXPECT_NE(nd[0].find(" c=0x4"), std::string::npos) << nd[0];
}

} // namespace
