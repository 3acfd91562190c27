// The probe-definition errors: one table of identifiers and messages (the kernel's
// trace_probe.h ERRORS, with the texts this kernel prints), and the error_log file.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace ukp::trace {

#define UKP_TRACE_ERRORS                                                                                               \
    C(FILE_NOT_FOUND, "Failed to find the given file")                                                                 \
    C(BAD_REFCNT, "Invalid reference counter offset")                                                                  \
    C(REFCNT_OPEN_BRACE, "Reference counter brace is not closed")                                                      \
    C(BAD_REFCNT_SUFFIX, "Reference counter has wrong suffix")                                                         \
    C(BAD_UPROBE_OFFS, "Invalid uprobe offset")                                                                        \
    C(BAD_MAXACT_TYPE, "Maxactive is only for function exit")                                                          \
    C(BAD_MAXACT, "Invalid maxactive number")                                                                          \
    C(MAXACT_TOO_BIG, "Maxactive is too big")                                                                          \
    C(BAD_PROBE_ADDR, "Invalid probed address or symbol")                                                              \
    C(NON_UNIQ_SYMBOL, "The symbol is not unique")                                                                     \
    C(BAD_RETPROBE, "Retprobe address must be an function entry")                                                      \
    C(BAD_ADDR_SUFFIX, "Invalid probed address suffix")                                                                \
    C(NO_GROUP_NAME, "Group name is not specified")                                                                    \
    C(GROUP_TOO_LONG, "Group name is too long")                                                                        \
    C(BAD_GROUP_NAME, "Group name must follow the same rules as C identifiers")                                        \
    C(NO_EVENT_NAME, "Event name is not specified")                                                                    \
    C(EVENT_TOO_LONG, "Event name is too long")                                                                        \
    C(BAD_EVENT_NAME, "Event name must follow the same rules as C identifiers")                                        \
    C(EVENT_EXIST, "Given group/event name is already used by another event")                                          \
    C(RETVAL_ON_PROBE, "$retval is not available on probe")                                                            \
    C(BAD_STACK_NUM, "Invalid stack number")                                                                           \
    C(BAD_ARG_NUM, "Invalid argument number")                                                                          \
    C(BAD_VAR, "Invalid $-variable specified")                                                                         \
    C(BAD_REG_NAME, "Invalid register name")                                                                           \
    C(BAD_MEM_ADDR, "Invalid memory address")                                                                          \
    C(BAD_IMM, "Invalid immediate value")                                                                              \
    C(IMMSTR_NO_CLOSE, "String is not closed with '\"'")                                                               \
    C(FILE_ON_KPROBE, "File offset is not available with kprobe")                                                      \
    C(BAD_FILE_OFFS, "Invalid file offset value")                                                                      \
    C(TOO_MANY_OPS, "Dereference is too much nested")                                                                  \
    C(DEREF_NEED_BRACE, "Dereference needs a brace")                                                                   \
    C(BAD_DEREF_OFFS, "Invalid dereference offset")                                                                    \
    C(DEREF_OPEN_BRACE, "Dereference brace is not closed")                                                             \
    C(COMM_CANT_DEREF, "$comm can not be dereferenced")                                                                \
    C(BAD_FETCH_ARG, "Invalid fetch argument")                                                                         \
    C(ARRAY_NO_CLOSE, "Array is not closed")                                                                           \
    C(BAD_ARRAY_SUFFIX, "Array has wrong suffix")                                                                      \
    C(BAD_ARRAY_NUM, "Invalid array size")                                                                             \
    C(ARRAY_TOO_BIG, "Array number is too big")                                                                        \
    C(BAD_TYPE, "Unknown type is specified")                                                                           \
    C(BAD_STRING, "String accepts only memory argument")                                                               \
    C(BAD_SYMSTRING, "Symbol String doesn't accept data/userdata")                                                     \
    C(BAD_BITFIELD, "Invalid bitfield")                                                                                \
    C(ARG_NAME_TOO_LONG, "Argument name is too long")                                                                  \
    C(NO_ARG_NAME, "Argument name is not specified")                                                                   \
    C(BAD_ARG_NAME, "Argument name must follow the same rules as C identifiers")                                       \
    C(USED_ARG_NAME, "This argument name is already used")                                                             \
    C(ARG_TOO_LONG, "Argument expression is too long")                                                                 \
    C(NO_ARG_BODY, "No argument expression")                                                                           \
    C(BAD_INSN_BNDRY, "Probe point is not an instruction boundary")                                                    \
    C(FAIL_REG_PROBE, "Failed to register probe event")                                                                \
    C(DIFF_PROBE_TYPE, "Probe type is different from existing probe")                                                  \
    C(DIFF_ARG_TYPE, "Argument type or name is different from existing probe")                                         \
    C(SAME_PROBE, "There is already the exact same probe event")                                                       \
    C(NOSUP_BTFARG, "BTF is not available or not supported")                                                           \
    C(NO_BTFARG, "This variable is not found at this probe point")                                                     \
    C(NO_PTR_STRCT, "This is not a pointer to union/structure.")                                                       \
    C(NOSUP_DAT_ARG, "Non pointer structure/union argument is not supported.")                                         \
    C(BAD_HYPHEN, "Failed to parse single hyphen. Forgot '>'?")                                                        \
    C(NO_BTF_FIELD, "This field is not found.")                                                                        \
    C(BAD_BTF_TID, "Failed to get BTF type info.")                                                                     \
    C(NO_RETVAL, "This function returns 'void' type")                                                                  \
    C(BAD_VAR_ARGS, "$arg* must be an independent parameter without name etc.")                                        \
    C(DOUBLE_ARGS, "$arg* can be used only once in the parameters")                                                    \
    C(ARG_NOT_IN_REG, "This argument is not passed where $argN reads it")                                              \
    C(NOFENTRY_ARGS, "$arg* can be used only on function entry or exit")                                               \
    C(BAD_TYPE4STR, "This type does not fit for string.")                                                              \
    C(NEED_STRING_TYPE, "$comm and immediate-string only accepts string type")                                         \
    C(TOO_MANY_ARGS, "Too many arguments are specified")                                                               \
    C(TOO_MANY_EARGS, "Too many entry arguments specified")                                                            \
    C(EVENT_TOO_BIG, "Event too big (too many fields?)")                                                               \
    C(BAD_ACCESS_FMT, "Access memory address requires @")                                                              \
    C(BAD_ACCESS_TYPE, "Bad memory access type")                                                                       \
    C(BAD_ACCESS_LEN, "This memory access length is not supported")                                                    \
    C(BAD_ACCESS_ADDR, "Invalid access memory address")                                                                \
    C(NO_TRACEPOINT, "Tracepoint is not found")                                                                        \
    C(NO_EVENT_INFO, "This requires both group and event name to attach")                                              \
    C(BAD_ATTACH_EVENT, "Attached event does not exist")                                                               \
    C(BAD_ATTACH_ARG, "Attached event does not have this field")                                                       \
    C(NO_EVENT_FIELD, "This event field is not found.")                                                                \
    /* ukprobes: why a w: event's breakpoint could not be had */                                                       \
    C(NO_DEBUG_REG, "A thread has no debug register left (four each: the program's or a debugger's hold them)")        \
    C(WATCH_TRACED, "A debugger is attached: it takes the breakpoints' SIGTRAPs")                                      \
    C(NO_HW_BREAKPOINT, "This machine gives no hardware breakpoints (no debug registers)")                             \
    /* ukprobes: an SDT probe's argument in a form no fetch program reads (an indexed address) */                      \
    C(BAD_SDT_ARG, "This SDT probe argument's operand is not supported")                                               \
    /* ukprobes: VFS types name kernel objects that user space does not have */                                        \
    C(NO_VFS_TYPE, "%pd/%pD (dentry/file names) are not available in user space")

enum class Err : uint8_t {
#define C(id, msg) id,
    UKP_TRACE_ERRORS
#undef C
};

// The identifier ("BAD_REG_NAME") and the message of an error.
std::string_view error_id(Err e);
std::string_view error_message(Err e);

// A rejected definition: why, and where. `pos` is the offset in the command as error_log
// prints it (the words of the definition joined by single spaces).
struct ProbeError {
    Err err = Err::BAD_FETCH_ARG;
    int pos = 0;
    bool logged = true; // false: rejected as the kernel does without an error_log entry
};

// The error_log file: the last kMaxEntries errors, each as the kernel prints them:
//   "[ seconds.micros] trace_kprobe: error: MESSAGE\n  Command: COMMAND\n" + caret line.
class ErrorLog {
public:
    static constexpr size_t kMaxEntries = 16; // the kernel's TRACING_LOG_ERRS_MAX
    void add(std::string_view subsystem, std::string_view command, const ProbeError &e);
    void add_text(std::string_view subsystem, std::string_view command, std::string_view message, int pos);
    std::string text() const;
    void clear();

private:
    mutable std::mutex mu_;
    std::vector<std::string> entries_; // oldest first, each a complete entry
};

// The entry alone, without the timestamp prefix ("trace_kprobe: error: ...").
std::string format_error(std::string_view subsystem, std::string_view command, std::string_view message, int pos);

} // namespace ukp::trace
