#include "trace/parse.hpp"

#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ukp::trace {

namespace {

// kstrtoull(s, base 0): the whole string, an optional leading '+'.
bool to_u64(std::string_view s, uint64_t *out, int base = 0) {
    if (!s.empty() && s[0] == '+') s.remove_prefix(1);
    if (s.empty() || !std::isxdigit(static_cast<unsigned char>(s[0]))) return false;
    std::string buf(s);
    char *end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(buf.c_str(), &end, base);
    if (errno != 0 || *end != '\0') return false;
    *out = v;
    return true;
}

// kstrtol(s, base 0).
bool to_s64(std::string_view s, int64_t *out) {
    bool neg = false;
    if (!s.empty() && s[0] == '-') {
        neg = true;
        s.remove_prefix(1);
    } else if (!s.empty() && s[0] == '+')
        s.remove_prefix(1);
    uint64_t v = 0;
    if (!to_u64(s, &v) || (s.size() > 0 && s[0] == '+')) return false;
    if (v > (neg ? uint64_t(INT64_MAX) + 1 : uint64_t(INT64_MAX))) return false;
    *out = neg ? static_cast<int64_t>(0 - v) : static_cast<int64_t>(v);
    return true;
}

bool is_good_system_name(std::string_view s) {
    for (char c : s)
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
    return true;
}

// Kernel-style event name sanitizing: anything but [A-Za-z0-9_] becomes '_'.
std::string sanitize(std::string s) {
    for (char &c : s)
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') c = '_';
    if (!s.empty() && std::isdigit(static_cast<unsigned char>(s[0]))) s[0] = '_';
    return s;
}

std::vector<std::string> split_words(std::string_view line, char separator) {
    std::vector<std::string> words;
    size_t i = 0;
    // The kernel reads a C string: a NUL ends the line.
    line = line.substr(0, line.find('\0'));
    // The boot-parameter form turns its commas into blanks, as the kernel does: both separate.
    // There "\\," is a comma of the word (an f: definition's list of functions).
    auto is_sep = [&](char c) { return c == ' ' || c == '\t' || c == separator; };
    const bool escapes = separator == ',';
    while (i < line.size()) {
        while (i < line.size() && is_sep(line[i])) ++i;
        std::string word;
        for (; i < line.size() && !is_sep(line[i]); ++i) {
            if (escapes && line[i] == '\\' && i + 1 < line.size() && line[i + 1] == ',') ++i;
            word += line[i];
        }
        if (!word.empty()) words.push_back(std::move(word));
    }
    return words;
}

const std::string_view kReservedFields[] = {"common_type", "common_flags", "common_preempt_count", "common_pid",
                                            "common_tgid", "__probe_ip",   "__probe_ret_ip",       "__probe_func"};

// An argument's ":TYPE[[N]]" (text after the colon) and where it starts in the word.
struct TypeText {
    std::string_view text; // the array suffix taken off once parsed
    bool given = false;
    int pos = 0; // 0 when not given
};

// FETCHARG[:TYPE[[N]]] split at its colon (an immediate string may hold ':' itself): the
// fetch argument into *arg, and the type; body_at: where body starts in the word.
TypeText split_type(std::string_view body, int body_at, std::string_view *arg) {
    *arg = body;
    TypeText tt;
    size_t colon = std::string_view::npos;
    if (body.size() > 1 && body[0] == '\\' && body[1] == '"') {
        const size_t q = body.rfind('"');
        if (q > 1) colon = body.find(':', q);
    } else {
        colon = body.find(':');
    }
    if (colon != std::string_view::npos) {
        *arg = body.substr(0, colon);
        tt.text = body.substr(colon + 1);
        tt.given = true;
        tt.pos = body_at + int(colon + 1); // offset + (t - arg)
    }
    return tt;
}

// The parse of one argument, as the kernel's traceprobe_parse_probe_arg.
class ArgParser {
public:
    ArgParser(ProbeDef &def, Resolver &res, ProbeError *err, bool fentry, int base)
        : def_(def), res_(res), err_(err), fentry_(fentry), base_(base) {}

    int parse(std::string_view word, int index);

private:
    int fail(Err e, int off) {
        err_->err = e;
        err_->pos = base_ + off;
        return -EINVAL;
    }
    int push(FetchOp op, int err_off) {
        if (ops_.size() >= size_t(kMaxFetchOps - 1)) return fail(Err::TOO_MANY_OPS, err_off);
        ops_.push_back(op);
        return 0;
    }
    // NAME= of the word, or argN (N: index + 1) without one, checked against the kernel's
    // rules and the names taken; *body: what follows it.
    int parse_name(std::string_view word, int index, std::string *name, std::string_view *body);
    // The type of tt, with its array suffix; $comm and an immediate string take only string.
    int parse_type(std::string_view arg, TypeText *tt, ArgType *type);
    // "[N]" at the end of tt: the array length, taken off tt's text.
    int parse_array_suffix(TypeText *tt, ArgType *type);
    // The fetch argument: operations in ops_ (an immediate string in data_).
    int parse_arg(std::string_view arg);
    int parse_vars(std::string_view arg);
    int parse_legacy(std::string_view arg, bool *matched);
    // An f: definition's argument by name (fprobetrace.rst's BTF arguments), from the
    // function's debug information: *fetch and tt->text become what the kprobe language
    // would say ("+8($arg1)", "u64"); *name the expression's last name unless `named`.
    int parse_by_name(std::string_view arg, TypeText *tt, std::string *fetch, std::string *name, bool named);
    int parse_typecast(std::string_view arg, TypeText *tt, std::string *fetch, std::string *name, bool named);
    int take_access(const sym::TypedAccess &a, TypeText *tt, std::string *fetch, std::string *name, bool named);
    int parse_memory(std::string_view at);     // @ADDR, @+FOFFS, @SYM[+|-offs]: what follows the '@'
    int parse_deref(std::string_view arg);     // [u]+|-OFFS(FETCHARG)
    int parse_immediate(std::string_view imm); // \IMM or \"STRING": what follows the backslash
    int entry_arg(uint16_t n, int err_off);
    // $argN of a t: definition: the site's Nth argument spec ("-4@-20(%rbp)") as operations.
    int sdt_arg(uint64_t n);
    // An e: definition's field of the event it is on (common ones aside); -ENOENT if none.
    int event_field(std::string_view name);
    bool find_type(std::string_view t, ArgType *type, bool *vfs);
    // How p stores the value, from the last operation and the type: a final dereference
    // moves into the store. -EINVAL when the type cannot take that value.
    int choose_store(const ArgType &type, int t_off, FetchProgram *p);
    // b<width>@<offset>/<container> (t): the bitfield's width and offset.
    int parse_bitfield(std::string_view t, int t_off, ArgType *type);

    ProbeDef &def_;
    Resolver &res_;
    ProbeError *err_;
    bool fentry_;                  // the probe is at a function's entry
    int base_;                     // position of this word in the command
    int offset_ = 0;               // the kernel's ctx->offset, within the word
    const Field *field_ = nullptr; // an e: definition's $FIELD, for its default type
    std::vector<FetchOp> ops_;
    std::string data_;      // an immediate string
    std::string type_text_; // the type an argument by name takes from the debug information
};

int ArgParser::entry_arg(uint16_t n, int err_off) {
    for (size_t i = 0; i < def_.entry_args.size(); ++i)
        if (def_.entry_args[i] == n) return push({Op::kEntryArg, false, uint16_t(i), 0}, err_off);
    if (def_.entry_args.size() >= size_t(kMaxEntryArgs)) return fail(Err::TOO_MANY_EARGS, err_off);
    def_.entry_args.push_back(n);
    return push({Op::kEntryArg, false, uint16_t(def_.entry_args.size() - 1), 0}, err_off);
}

int ArgParser::event_field(std::string_view name) {
    for (const Field &f : def_.attach_fields) {
        if (f.common || f.name != name) continue;
        field_ = &f;
        const bool loc = f.print == Print::kString;
        // An array: where it lies in the record (eprobetrace.rst's +8($args) reads args[1]).
        const uint16_t how = f.array_len > 0 ? kFieldAddress : f.is_signed ? kFieldSigned : 0;
        const uint16_t size = loc ? 0 : uint16_t(f.size | how);
        return push({Op::kField, false, size, int64_t(f.offset)}, offset_);
    }
    return -ENOENT;
}

int ArgParser::parse_vars(std::string_view arg) {
    constexpr uint64_t kMaxStackParam = 4096 / 8 - 1; // PARAM_MAX_STACK
    Err e = Err::BAD_VAR;
    if (def_.is_eprobe) {
        // eprobetrace.rst: $FIELD and $comm; nothing of a probe's (registers, stack, arguments).
        if (const int r = event_field(arg); r != -ENOENT) return r;
        if (arg == "comm" || arg == "COMM") return push({Op::kComm}, offset_);
        return fail(Err::BAD_ATTACH_ARG, offset_);
    }
    if (arg == "retval") {
        if (def_.is_return) return push({Op::kRetval}, offset_);
        return fail(Err::RETVAL_ON_PROBE, offset_);
    }
    if (arg.substr(0, 5) == "stack") {
        std::string_view rest = arg.substr(5);
        if (rest.empty()) return push({Op::kStackAddr}, offset_);
        uint64_t n = 0;
        if (std::isdigit(static_cast<unsigned char>(rest[0])) && to_u64(rest, &n, 10)) {
            if (n > kMaxStackParam) return fail(Err::BAD_STACK_NUM, offset_);
            return push({Op::kStack, false, uint16_t(n), 0}, offset_);
        }
        return fail(e, offset_);
    }
    if (arg == "comm" || arg == "COMM") return push({Op::kComm}, offset_);
    if (def_.is_watch && arg == "addr") return push({Op::kWatchAddr}, offset_);
    if (def_.is_watch && arg == "value") {
        // +0($addr), as wprobetrace.rst defines it.
        if (int r = push({Op::kWatchAddr}, offset_)) return r;
        return push({Op::kDeref, false, 0, 0}, offset_);
    }
    if (arg.substr(0, 3) == "arg") {
        uint64_t n = 0;
        if (!to_u64(arg.substr(3), &n, 10)) return fail(e, offset_);
        if (n == 0 || n > kMaxStackParam) return fail(Err::BAD_ARG_NUM, offset_);
        if (def_.is_tracepoint) return sdt_arg(n);
        if (fentry_) return push({Op::kArg, false, uint16_t(n - 1), 0}, offset_);
        if (def_.is_return) return entry_arg(uint16_t(n - 1), offset_);
        return fail(Err::NOFENTRY_ARGS, offset_);
    }
    return fail(e, offset_);
}

// The register of an SDT operand's name: the 64-bit registers ("rax", "r8") and their
// narrower names ("eax", "ax", "al", "r8d", "r8w", "r8b"), as the low part of the whole.
int sdt_register(std::string_view r) {
    static constexpr struct {
        const char *name, *whole;
    } kNarrow[] = {{"eax", "ax"}, {"ebx", "bx"}, {"ecx", "cx"}, {"edx", "dx"}, {"esi", "si"}, {"edi", "di"},
                   {"ebp", "bp"}, {"esp", "sp"}, {"al", "ax"},  {"bl", "bx"},  {"cl", "cx"},  {"dl", "dx"},
                   {"sil", "si"}, {"dil", "di"}, {"bpl", "bp"}, {"spl", "sp"}, {"rip", "ip"}};
    if (r.size() == 3 && r[0] == 'r' && std::isalpha(static_cast<unsigned char>(r[1]))) r = r.substr(1); // rax -> ax
    for (const auto &n : kNarrow)
        if (r == n.name) r = n.whole;
    if (r.size() >= 3 && r[0] == 'r' && std::isdigit(static_cast<unsigned char>(r[1])) &&
        (r.back() == 'd' || r.back() == 'w' || r.back() == 'b'))
        r = r.substr(0, r.size() - 1); // r8d -> r8
    return register_index(r.data(), r.size());
}

int ArgParser::sdt_arg(uint64_t n) {
    if (n > def_.sdt_args.size()) return fail(Err::BAD_ARG_NUM, offset_);
    // "[-]SIZE@OPERAND": the operand as GNU as wrote it (AT&T syntax).
    std::string_view a = def_.sdt_args[n - 1];
    const size_t at = a.find('@');
    std::string_view op = at == std::string_view::npos ? a : a.substr(at + 1);
    if (!op.empty() && op[0] == '%') {
        const int r = sdt_register(op.substr(1));
        if (r < 0) return fail(Err::BAD_SDT_ARG, offset_);
        return push({Op::kReg, false, uint16_t(r), 0}, offset_);
    }
    if (!op.empty() && op[0] == '$') {
        int64_t v = 0;
        if (!to_s64(op.substr(1), &v)) return fail(Err::BAD_SDT_ARG, offset_);
        return push({Op::kImm, false, 0, v}, offset_);
    }
    // DISP(%REG), or SYM[+OFF](%rip): a memory operand.
    const size_t open = op.find('('), close = op.rfind(')');
    if (open == std::string_view::npos || close != op.size() - 1 || op.find(',') != std::string_view::npos)
        return fail(Err::BAD_SDT_ARG, offset_);
    const std::string_view disp = op.substr(0, open), base = op.substr(open + 1, close - open - 1);
    if (base.empty() || base[0] != '%') return fail(Err::BAD_SDT_ARG, offset_);
    int64_t d = 0;
    if (base == "%rip") {
        // The assembler kept the symbol: its address, then the memory there.
        std::string sym(disp);
        const size_t plus = sym.find_first_of("+-");
        int64_t off = 0;
        if (plus != std::string::npos && !to_s64(std::string_view(sym).substr(plus), &off))
            return fail(Err::BAD_SDT_ARG, offset_);
        if (plus != std::string::npos) sym.resize(plus);
        uint64_t addr = 0;
        if (res_.resolve_data(sym, &addr) != 0) return fail(Err::BAD_SDT_ARG, offset_);
        if (int r = push({Op::kImm, false, 0, int64_t(addr) + off}, offset_)) return r;
        return push({Op::kDeref, false, 0, 0}, offset_);
    }
    if (!disp.empty() && !to_s64(disp, &d)) return fail(Err::BAD_SDT_ARG, offset_);
    const int r = sdt_register(base.substr(1));
    if (r < 0) return fail(Err::BAD_SDT_ARG, offset_);
    if (int e = push({Op::kReg, false, uint16_t(r), 0}, offset_)) return e;
    return push({Op::kDeref, false, 0, d}, offset_);
}

// The type an SDT argument spec declares ("-4@..." is s32, "8@..." u64).
ArgType sdt_type(std::string_view spec) {
    ArgType t;
    const bool neg = !spec.empty() && spec[0] == '-';
    uint64_t size = 8;
    const size_t at = spec.find('@');
    if (at == std::string_view::npos || !to_u64(spec.substr(neg ? 1 : 0, at - (neg ? 1 : 0)), &size, 10) ||
        (size != 1 && size != 2 && size != 4 && size != 8))
        size = 8;
    t.kind = neg ? Kind::kSigned : Kind::kUnsigned;
    t.size = uint8_t(size);
    t.name = (neg ? "s" : "u") + std::to_string(size * 8);
    return t;
}

// kprobetrace.txt's first syntax (2.6.33): aN, rv, ra, sN, sa.
int ArgParser::parse_legacy(std::string_view arg, bool *matched) {
    *matched = true;
    uint64_t n = 0;
    if (arg == "rv") {
        if (!def_.is_return) return fail(Err::RETVAL_ON_PROBE, offset_);
        return push({Op::kRetval}, offset_);
    }
    if (arg == "ra") {
        if (!def_.is_return) return fail(Err::RETVAL_ON_PROBE, offset_);
        return push({Op::kRetAddr}, offset_);
    }
    if (arg == "sa") return push({Op::kStackAddr}, offset_);
    if (arg.size() > 1 && arg[0] == 's' && to_u64(arg.substr(1), &n, 10)) {
        if (n > 4096 / 8 - 1) return fail(Err::BAD_STACK_NUM, offset_);
        return push({Op::kStack, false, uint16_t(n), 0}, offset_);
    }
    if (arg.size() > 1 && arg[0] == 'a' && to_u64(arg.substr(1), &n, 10)) {
        if (n >= 4096 / 8 - 1) return fail(Err::BAD_ARG_NUM, offset_);
        if (def_.is_return) return entry_arg(uint16_t(n), offset_);
        return push({Op::kArg, false, uint16_t(n), 0}, offset_); // kprobetrace.txt: anywhere, best effort
    }
    *matched = false;
    return 0;
}

int ArgParser::parse_arg(std::string_view arg) {
    if (arg.empty()) return fail(Err::BAD_FETCH_ARG, offset_);
    switch (arg[0]) {
    case '$':
        return parse_vars(arg.substr(1));
    case '%': {
        if (def_.is_eprobe) return fail(Err::BAD_VAR, offset_); // an event has no registers
        const int r = register_index(arg.data() + 1, arg.size() - 1);
        if (r < 0) return fail(Err::BAD_REG_NAME, offset_);
        return push({Op::kReg, false, uint16_t(r), 0}, offset_);
    }
    case '@':
        return parse_memory(arg.substr(1));
    case '+':
    case '-':
        return parse_deref(arg);
    case '\\':
        return parse_immediate(arg.substr(1));
    default:
        if (std::isalpha(static_cast<unsigned char>(arg[0])) || arg[0] == '_') {
            if (def_.is_eprobe) { // a field without '$', as newer kernels take it
                const int r = event_field(arg);
                return r == -ENOENT ? fail(Err::NO_EVENT_FIELD, offset_) : r;
            }
            bool matched = false;
            if (int r = parse_legacy(arg, &matched)) return r;
            if (matched) return 0;
            return fail(Err::NOSUP_BTFARG, offset_);
        }
        return fail(Err::BAD_FETCH_ARG, offset_);
    }
}

// Whether an argument is read through the function's debug information: a parameter's
// name (one the function has: else the kprobe language's old names, "rv", "sa"...), a
// member of what $retval points to, or $retval without a type (its type is the function's).
bool names_debug_info(std::string_view arg, bool typed) {
    if (arg == "$retval") return !typed;
    if (arg.starts_with("$retval")) return arg.substr(7, 2) == "->" || arg.substr(7, 1) == ".";
    return !arg.empty() && (std::isalpha(static_cast<unsigned char>(arg[0])) || arg[0] == '_');
}

// The kernel's error for an access that cannot be read.
Err access_error(sym::AccessFail f) {
    switch (f) {
    case sym::AccessFail::kNone:
    case sym::AccessFail::kNoVariable:
        return Err::NO_BTFARG;
    case sym::AccessFail::kNotPointerToStruct:
        return Err::NO_PTR_STRCT;
    case sym::AccessFail::kNoField:
        return Err::NO_BTF_FIELD;
    case sym::AccessFail::kStructByValue:
        return Err::NOSUP_DAT_ARG;
    case sym::AccessFail::kVoid:
        return Err::NO_RETVAL;
    case sym::AccessFail::kBadHyphen:
        return Err::BAD_HYPHEN;
    case sym::AccessFail::kNotInRegister:
        return Err::ARG_NOT_IN_REG;
    case sym::AccessFail::kUnsupportedType:
    case sym::AccessFail::kNoType:
        return Err::BAD_BTF_TID;
    }
    return Err::BAD_BTF_TID;
}

int ArgParser::parse_by_name(std::string_view arg, TypeText *tt, std::string *fetch, std::string *name, bool named) {
    sym::TypedAccess a;
    size_t pos = 0;
    const sym::AccessFail f = def_.types->access(arg, &a, &pos);
    if (f == sym::AccessFail::kNoVariable && arg.find_first_of("-.") == std::string_view::npos) {
        bool matched = false; // not a parameter: one of the old names, or nothing
        const std::string old(arg);
        if (int r = parse_legacy(old, &matched); r != 0 || matched) {
            ops_.clear();
            if (r != 0) return r;
            *fetch = old;
            return 0;
        }
    }
    if (f != sym::AccessFail::kNone) return fail(access_error(f), offset_ + int(pos));
    return take_access(a, tt, fetch, name, named);
}

// eprobetrace.rst's (STRUCT)FIELD->MEMBER[->MEMBER]: the source's field FIELD (its '$'
// optional) taken as a pointer to STRUCT, found in the debug information of the objects
// the source event probes, then of the main program.
int ArgParser::parse_typecast(std::string_view arg, TypeText *tt, std::string *fetch, std::string *name, bool named) {
    const size_t close = arg.find(')');
    if (close == std::string_view::npos) return fail(Err::BAD_FETCH_ARG, offset_);
    const std::string_view type_name = arg.substr(1, close - 1);
    if (!is_good_name(type_name)) return fail(Err::BAD_BTF_TID, offset_ + 1);
    const size_t field_at = close + 1 + (arg.substr(close + 1, 1) == "$" ? 1 : 0);
    size_t n = 0;
    while (field_at + n < arg.size() &&
           (std::isalnum(static_cast<unsigned char>(arg[field_at + n])) != 0 || arg[field_at + n] == '_'))
        ++n;
    const std::string_view field = arg.substr(field_at, n);
    const Field *source = nullptr;
    for (const Field &f : def_.attach_fields)
        if (f.name == field) source = &f;
    if (source == nullptr) return fail(Err::BAD_ATTACH_ARG, offset_ + int(close + 1));
    if (source->print == Print::kString || source->size != 8 || source->array_len > 0)
        return fail(Err::NO_PTR_STRCT, offset_ + int(close + 1)); // no address
    if (def_.struct_types == nullptr) return fail(Err::NOSUP_BTFARG, offset_ + 1);
    sym::TypedAccess a;
    size_t pos = 0;
    const std::string_view expr = arg.substr(field_at + n);
    const sym::AccessFail f = def_.struct_types->access(type_name, "$" + std::string(field), expr, &a, &pos);
    if (f == sym::AccessFail::kNoType) return fail(Err::BAD_BTF_TID, offset_ + 1);
    // What the whole access reads (a struct, a float) is refused under its start.
    const bool whole = f == sym::AccessFail::kStructByValue || f == sym::AccessFail::kUnsupportedType;
    if (f != sym::AccessFail::kNone) return fail(access_error(f), offset_ + (whole ? 0 : int(field_at + n + pos)));
    return take_access(a, tt, fetch, name, named);
}

// What an access reads and its type: :string and :ustring read the characters of a char *
// or a char [], the dereference implied; other types read the value. Unless named, the
// argument takes the access's last name, if the kprobe_events line that shows it would
// parse again (a C name up to MAX_ARG_NAME_LEN); else it keeps argN.
int ArgParser::take_access(const sym::TypedAccess &a, TypeText *tt, std::string *fetch, std::string *name, bool named) {
    const bool str = tt->given && (tt->text == "string" || tt->text == "ustring");
    if (str && !a.stringable) return fail(Err::BAD_TYPE4STR, tt->pos);
    const bool as_string = str || (!tt->given && a.stringable);
    *fetch = as_string ? a.string_fetch : a.fetch;
    if (!tt->given) {
        type_text_ = as_string ? "string" : a.type;
        tt->text = type_text_;
        tt->given = true;
        tt->pos = offset_;
    }
    // $retval keeps the caller's argN, as does a name that would not parse again.
    if (named || a.name == "arg" || a.name.size() > kMaxArgNameLen || !is_good_name(a.name)) return 0;
    for (std::string_view r : kReservedFields)
        if (a.name == r) return fail(Err::USED_ARG_NAME, offset_);
    for (const ArgDef &o : def_.args)
        if (o.name == a.name) return fail(Err::USED_ARG_NAME, offset_);
    *name = a.name;
    return 0;
}

int ArgParser::parse_memory(std::string_view at) {
    uint64_t addr = 0;
    if (!at.empty() && std::isdigit(static_cast<unsigned char>(at[0]))) {
        if (!to_u64(at, &addr)) return fail(Err::BAD_MEM_ADDR, offset_);
    } else if (!at.empty() && at[0] == '+') {
        // A file offset in the probed file: only with the PATH:OFFSET form.
        if (def_.where != Where::kFile) return fail(Err::FILE_ON_KPROBE, offset_);
        int64_t off = 0;
        if (!to_s64(at.substr(1), &off) || off < 0) return fail(Err::BAD_FILE_OFFS, offset_);
        if (res_.resolve_file_offset(def_.path, uint64_t(off), &addr) != 0) return fail(Err::BAD_FILE_OFFS, offset_);
    } else {
        std::string sym(at);
        int64_t off = 0;
        const size_t colon = sym.rfind(':');
        const size_t pm = sym.find_first_of("+-", colon == std::string::npos ? 0 : colon + 1);
        if (pm != std::string::npos) {
            if (!to_s64(std::string_view(sym).substr(pm), &off)) return fail(Err::BAD_MEM_ADDR, offset_);
            sym.resize(pm);
        }
        if (sym.empty() || res_.resolve_data(sym, &addr) != 0) return fail(Err::BAD_MEM_ADDR, offset_);
        addr += static_cast<uint64_t>(off);
    }
    if (int r = push({Op::kImm, false, 0, static_cast<int64_t>(addr)}, offset_)) return r;
    return push({Op::kDeref, false, 0, 0}, offset_);
}

int ArgParser::parse_deref(std::string_view arg) {
    // Mirrors the kernel's in-place rewriting, so that carets land where its do.
    std::string a(arg);
    bool user = false;
    size_t p = 0;
    if (a.size() > 1 && a[1] == 'u') {
        user = true;
        a[1] = a[0];
        p = 1;
    }
    if (a[p] == '+') ++p;
    std::string_view s = std::string_view(a).substr(p);
    const size_t open = s.find('(');
    if (open == std::string_view::npos) return fail(Err::DEREF_NEED_BRACE, offset_);
    int64_t off = 0;
    if (!to_s64(s.substr(0, open), &off)) return fail(Err::BAD_DEREF_OFFS, offset_);
    offset_ += int(open + 1) + (s[0] != '-' ? 1 : 0);
    std::string_view inner = s.substr(open + 1);
    const size_t close = inner.rfind(')');
    if (close == std::string_view::npos) return fail(Err::DEREF_OPEN_BRACE, offset_ + int(inner.size()));
    const int cur = offset_;
    if (int r = parse_arg(inner.substr(0, close))) return r;
    offset_ = cur;
    if (ops_.back().op == Op::kComm || ops_.back().op == Op::kData) return fail(Err::COMM_CANT_DEREF, offset_);
    return push({Op::kDeref, user, 0, off}, offset_);
}

int ArgParser::parse_immediate(std::string_view imm) {
    if (!imm.empty() && imm[0] == '"') {
        std::string_view s = imm.substr(1);
        if (s.empty() || s.back() != '"') return fail(Err::IMMSTR_NO_CLOSE, offset_ + 2 + int(s.size()));
        data_ = std::string(s.substr(0, s.size() - 1));
        return push({Op::kData}, offset_);
    }
    uint64_t v = 0;
    int64_t sv = 0;
    bool ok = false;
    if (!imm.empty() && std::isdigit(static_cast<unsigned char>(imm[0])))
        ok = to_u64(imm, &v);
    else if (!imm.empty() && imm[0] == '-') {
        ok = to_s64(imm, &sv);
        v = uint64_t(sv);
    } else if (!imm.empty() && imm[0] == '+') {
        ok = to_s64(imm.substr(1), &sv);
        v = uint64_t(sv);
    }
    if (!ok) return fail(Err::BAD_IMM, offset_ + 1);
    return push({Op::kImm, false, 0, static_cast<int64_t>(v)}, offset_);
}

bool ArgParser::find_type(std::string_view t, ArgType *type, bool *vfs) {
    *vfs = false;
    type->name = std::string(t);
    if (t.empty()) return false;
    if (t == "%pd" || t == "%pD") {
        *vfs = true;
        return false;
    }
    auto bits_of = [](std::string_view s, uint8_t *size) {
        if (s == "8")
            *size = 1;
        else if (s == "16")
            *size = 2;
        else if (s == "32")
            *size = 4;
        else if (s == "64")
            *size = 8;
        else
            return false;
        return true;
    };
    if (t[0] == 'u' || t[0] == 's' || t[0] == 'x') {
        if (t == "string" || t == "symbol" || t == "symstr" || t == "ustring") {
            // handled below
        } else {
            type->kind = t[0] == 'u' ? Kind::kUnsigned : t[0] == 's' ? Kind::kSigned : Kind::kHex;
            return bits_of(t.substr(1), &type->size);
        }
    }
    if (t == "char") {
        type->kind = Kind::kChar;
        type->size = 1;
        return true;
    }
    if (t == "string" || t == "ustring") {
        type->kind = Kind::kString;
        type->size = 4;
        type->user = t[0] == 'u';
        return true;
    }
    if (t == "symbol") {
        type->kind = Kind::kSymbol;
        type->size = 8;
        return true;
    }
    if (t == "symstr") {
        type->kind = Kind::kSymStr;
        type->size = 4;
        return true;
    }
    if (t[0] == 'b') {
        const size_t slash = t.rfind('/');
        uint64_t c = 0;
        if (slash == std::string_view::npos || !to_u64(t.substr(slash + 1), &c)) return false;
        type->kind = Kind::kUnsigned;
        type->bitfield = true;
        return bits_of(std::to_string(c), &type->size);
    }
    return false;
}

int ArgParser::parse_name(std::string_view word, int index, std::string *name, std::string_view *body) {
    *body = word;
    const size_t eq = word.find('=');
    if (eq != std::string_view::npos) {
        if (eq > kMaxArgNameLen) return fail(Err::ARG_NAME_TOO_LONG, 0);
        if (eq == 0) return fail(Err::NO_ARG_NAME, 0);
        *name = std::string(word.substr(0, eq));
        *body = word.substr(eq + 1);
    } else {
        *name = "arg" + std::to_string(index + 1);
    }
    if (!is_good_name(*name)) return fail(Err::BAD_ARG_NAME, 0);
    for (std::string_view r : kReservedFields)
        if (*name == r) return fail(Err::USED_ARG_NAME, 0);
    for (const ArgDef &o : def_.args)
        if (o.name == *name) return fail(Err::USED_ARG_NAME, 0);
    return 0;
}

int ArgParser::parse_array_suffix(TypeText *tt, ArgType *type) {
    const size_t lb = tt->text.find('[');
    if (lb == std::string_view::npos) return 0;
    std::string_view n = tt->text.substr(lb + 1);
    const size_t rb = n.find(']');
    const int n_off = tt->pos + int(lb + 1);
    if (rb == std::string_view::npos) return fail(Err::ARRAY_NO_CLOSE, n_off + int(n.size()));
    if (rb + 1 != n.size()) return fail(Err::BAD_ARRAY_SUFFIX, n_off + int(rb + 1));
    uint64_t cnt = 0;
    if (!to_u64(n.substr(0, rb), &cnt) || cnt == 0) return fail(Err::BAD_ARRAY_NUM, n_off);
    if (cnt > uint64_t(kMaxArrayLen)) return fail(Err::ARRAY_TOO_BIG, n_off);
    type->array_len = uint8_t(cnt);
    tt->text = tt->text.substr(0, lb);
    return 0;
}

int ArgParser::parse_type(std::string_view arg, TypeText *tt, ArgType *type) {
    if (tt->given) {
        if (int r = parse_array_suffix(tt, type)) return r;
    }
    const bool special = arg == "$comm" || arg == "$COMM" || arg.substr(0, 2) == "\\\"";
    if (special) {
        if (type->array_len > 0 || (tt->given && tt->text != "string")) return fail(Err::NEED_STRING_TYPE, tt->pos);
        type->kind = Kind::kString;
        type->size = 4;
        type->name = tt->given ? "string" : "";
    } else if (tt->given) {
        const uint8_t cnt = type->array_len;
        bool vfs = false;
        if (!find_type(tt->text, type, &vfs)) return fail(vfs ? Err::NO_VFS_TYPE : Err::BAD_TYPE, tt->pos);
        type->array_len = cnt;
    }
    return 0;
}

int ArgParser::choose_store(const ArgType &type, int t_off, FetchProgram *p) {
    const Op last = ops_.back().op;
    const bool str = type.kind == Kind::kString || type.kind == Kind::kSymStr;
    if (str) {
        if (type.kind == Kind::kSymStr) {
            if (last != Op::kReg && last != Op::kStack && last != Op::kRetval && last != Op::kArg &&
                last != Op::kEntryArg && last != Op::kDeref && last != Op::kField)
                return fail(Err::BAD_SYMSTRING, t_off);
            p->store = Store::kSymStr;
        } else {
            // An event probe's string field: the value is where its bytes are in the record.
            const bool string_field = last == Op::kField && (ops_.back().param & 0xff) == 0;
            if (last != Op::kDeref && last != Op::kImm && last != Op::kComm && last != Op::kData && !string_field)
                return fail(Err::BAD_STRING, t_off);
            if (last == Op::kDeref) {
                p->mem_offset = ops_.back().imm;
                ops_.pop_back();
                p->deref_string = true;
            }
            p->store = type.array_len > 0 ? Store::kStringArray : Store::kString;
        }
    } else if (last == Op::kDeref) {
        p->mem_offset = ops_.back().imm;
        ops_.pop_back();
        p->store = Store::kMem;
    } else {
        p->store = Store::kRaw;
    }
    return 0;
}

int ArgParser::parse_bitfield(std::string_view t, int t_off, ArgType *type) {
    std::string_view b = t.substr(1);
    const size_t at = b.find('@'), slash = b.rfind('/');
    uint64_t bw = 0, bo = 0;
    if (at == std::string_view::npos || slash == std::string_view::npos || slash < at ||
        !to_u64(b.substr(0, at), &bw) || bw == 0 || !to_u64(b.substr(at + 1, slash - at - 1), &bo) ||
        bw + bo > uint64_t(type->size) * 8)
        return fail(Err::BAD_BITFIELD, t_off);
    type->bf_width = uint8_t(bw);
    type->bf_offset = uint8_t(bo);
    return 0;
}

int ArgParser::parse(std::string_view word, int index) {
    ArgDef ad;
    std::string_view body;
    if (int r = parse_name(word, index, &ad.name, &body)) return r;
    offset_ = int(body.data() - word.data());
    if (body.size() > kMaxArgStrLen) return fail(Err::ARG_TOO_LONG, offset_);
    if (body.empty()) return fail(Err::NO_ARG_BODY, offset_);
    ad.text = std::string(body);

    std::string_view arg;
    TypeText tt = split_type(body, offset_, &arg);
    std::string by_name; // what an argument by name reads, in the kprobe language
    if (def_.types != nullptr && names_debug_info(arg, tt.given)) {
        if (int r = parse_by_name(arg, &tt, &by_name, &ad.name, body.data() != word.data())) return r;
        arg = by_name;
    } else if (def_.is_eprobe && !arg.empty() && arg[0] == '(') {
        if (int r = parse_typecast(arg, &tt, &by_name, &ad.name, body.data() != word.data())) return r;
        arg = by_name;
    }
    ArgType type;
    if (int r = parse_type(arg, &tt, &type)) return r;
    if (int r = parse_arg(arg)) return r;
    // A t: definition's bare $argN takes the type its note declares (fprobetrace.rst's
    // tracepoint arguments take theirs from BTF).
    uint64_t argn = 0;
    if (def_.is_tracepoint && !tt.given && arg.substr(0, 4) == "$arg" && to_u64(arg.substr(4), &argn, 10) &&
        argn >= 1 && argn <= def_.sdt_args.size())
        type = sdt_type(def_.sdt_args[argn - 1]);
    // An e: definition's bare field: a string stays one, a number is shown in hex of its
    // size (eprobetrace.rst: "the values would default showing in hexadecimal").
    if (field_ != nullptr && !tt.given && ops_.size() == 1) {
        if (field_->array_len > 0) { // its address
            bool vfs = false;
            find_type("x64", &type, &vfs);
        } else if (field_->print == Print::kString) {
            bool vfs = false;
            find_type("string", &type, &vfs);
        } else if (field_->size == 1 || field_->size == 2 || field_->size == 4 || field_->size == 8) {
            bool vfs = false;
            find_type("x" + std::to_string(field_->size * 8), &type, &vfs);
        }
    }
    FetchProgram &p = ad.prog;
    if (int r = choose_store(type, tt.pos, &p)) return r;
    if (type.bitfield) {
        if (int r = parse_bitfield(tt.text, tt.pos, &type)) return r;
    }
    if (type.array_len > 0 && p.store != Store::kMem && p.store != Store::kString && p.store != Store::kStringArray)
        return fail(Err::BAD_STRING, tt.pos);
    if (type.array_len > 0 && p.store == Store::kString) {
        // string[N] on an immediate address: N pointers stored there.
        p.store = Store::kStringArray;
    }
    for (size_t i = 0; i < ops_.size(); ++i) p.ops[i] = ops_[i];
    p.nops = uint8_t(ops_.size());
    p.type = type;
    p.data = data_;
    def_.args.push_back(std::move(ad));
    return 0;
}

// Splits "GRP/EVENT" (or "GRP.EVENT"); offset: where it starts in the command.
int parse_event_name(std::string_view s, ProbeDef *def, bool *named, ProbeError *err, int offset) {
    auto fail = [&](Err e, int pos) {
        err->err = e;
        err->pos = pos;
        return -EINVAL;
    };
    size_t slash = s.find('/');
    if (slash == std::string_view::npos) slash = s.find('.');
    if (slash != std::string_view::npos) {
        if (slash == 0) return fail(Err::NO_GROUP_NAME, offset);
        if (slash + 1 > kMaxEventNameLen) return fail(Err::GROUP_TOO_LONG, offset);
        std::string_view g = s.substr(0, slash);
        if (!is_good_system_name(g)) return fail(Err::BAD_GROUP_NAME, offset);
        def->group = std::string(g);
        offset += int(slash + 1);
        s = s.substr(slash + 1);
    }
    if (s.empty()) {
        if (slash != std::string_view::npos) {
            *named = false;
            return 0;
        }
        return fail(Err::NO_EVENT_NAME, offset);
    }
    if (s.size() >= kMaxEventNameLen) return fail(Err::EVENT_TOO_LONG, offset);
    if (!is_good_name(s)) return fail(Err::BAD_EVENT_NAME, offset);
    def->event = std::string(s);
    *named = true;
    return 0;
}

// The words of a definition line, and where each starts in its command (the words joined by
// single spaces, as error_log shows it).
struct Words {
    std::vector<std::string> argv;
    std::vector<int> at;
};

// The line's words into *w; the command they make into *command.
void split_command(std::string_view line, char separator, Words *w, std::string *command) {
    w->argv = split_words(line, separator);
    for (size_t i = 0; i < w->argv.size(); ++i) *command += (i ? " " : "") + w->argv[i];
    w->at.assign(w->argv.size(), 0);
    for (size_t i = 1; i < w->argv.size(); ++i) w->at[i] = w->at[i - 1] + int(w->argv[i - 1].size()) + 1;
}

// Error e at offset off of word `word`, logged; -EINVAL.
int fail_at(ProbeError *err, const Words &w, Err e, size_t word, int off) {
    err->err = e;
    err->pos = w.at[word] + off;
    err->logged = true;
    return -EINVAL;
}

// "-:[GRP/]EVENT": the event to remove, which the caller looks up. -EINVAL, not logged, on a
// bad name.
int parse_removal(const std::string &a0, ProbeDef *def, ProbeError *err) {
    if (a0.size() < 2 || a0[1] != ':') return -EINVAL;
    bool named = false;
    def->remove = true;
    def->group.clear(); // "-:EVENT" names the event in whichever group holds it
    if (parse_event_name(std::string_view(a0).substr(2), def, &named, err, 2) != 0 || !named) {
        err->logged = false;
        return -EINVAL;
    }
    return 0;
}

// "p" or "r[MAXACTIVE]" of word 0: the probe's type and maxactive; *colon: where its
// ":[GRP/][EVENT]" starts (npos: none). -EINVAL, not logged, for a command the kernel does
// not know.
int parse_probe_type(const Words &w, ProbeDef *def, size_t *colon, ProbeError *err) {
    const std::string &a0 = w.argv[0];
    if (a0[0] != 'p' && a0[0] != 'r' && a0[0] != 'w' && a0[0] != 't' && a0[0] != 'f' && a0[0] != 'e') return -EINVAL;
    if (w.argv.size() < 2) return -EINVAL;
    if (a0[0] == 'w' || a0[0] == 't' || a0[0] == 'e') {
        // "w", "t", "e", "w:...", ...: no maxactive (the kernel's wprobe, tprobe and eprobe parsers).
        def->is_watch = a0[0] == 'w';
        def->is_tracepoint = a0[0] == 't';
        def->is_eprobe = a0[0] == 'e';
        def->group = def->is_watch        ? kDefaultWatchGroup
                     : def->is_tracepoint ? kDefaultTracepointGroup
                                          : kDefaultEprobeGroup;
        *colon = a0.size() > 1 ? 1 : std::string::npos;
        if (a0.size() > 1 && a0[1] != ':') return fail_at(err, w, Err::BAD_MAXACT_TYPE, 0, 1);
        return 0;
    }
    def->is_return = a0[0] == 'r';
    if (a0[0] == 'f') {
        // "f[MAXACTIVE]": whether it is an exit only shows in word 1 (parse_function_spec).
        def->is_function = true;
        def->group = kDefaultFunctionGroup;
    }
    *colon = a0.find(':', 1);
    if (a0.size() > 1 && std::isdigit(static_cast<unsigned char>(a0[1]))) {
        if (!def->is_return && !def->is_function) return fail_at(err, w, Err::BAD_MAXACT_TYPE, 0, 1);
        const std::string_view num =
            std::string_view(a0).substr(1, *colon == std::string::npos ? std::string::npos : *colon - 1);
        if (num.size() > kMaxEventNameLen - 1) return fail_at(err, w, Err::BAD_MAXACT, 0, 1);
        uint64_t n = 0;
        if (!to_u64(num, &n) || n == 0) return fail_at(err, w, Err::BAD_MAXACT, 0, 1);
        if (n > uint64_t(kMaxActive)) return fail_at(err, w, Err::MAXACT_TOO_BIG, 0, 1);
        def->maxactive = int(n);
    } else if (a0.size() > 1 && *colon != 1) {
        return -EINVAL; // "px ...": not a command the kernel knows
    }
    return 0;
}

// Whether a probe point is PATH:OFFSET: an offset starts with a digit, as the kernel's uprobe
// parser checks; "/usr/lib/.../libc.so.6:malloc" stays a MOD:sym spec with MOD as a path.
bool is_file_point(const std::string &a1) {
    const size_t c = a1.rfind(':');
    return a1.find('/') != std::string::npos && c != std::string::npos && c + 1 < a1.size() &&
           std::isdigit(static_cast<unsigned char>(a1[c + 1]));
}

// MEMADDR: the probe at that address; *fentry: whether it is a function's first instruction.
int parse_address_point(const Words &w, uint64_t addr, Resolver &resolver, ProbeDef *def, bool *fentry,
                        ProbeError *err) {
    def->where = Where::kAddress;
    def->addr = addr;
    *fentry = resolver.function_entry(addr);
    if (def->is_return && !*fentry) return fail_at(err, w, Err::BAD_RETPROBE, 1, 0);
    return 0;
}

// The kernel's uprobe_events form, PATH:OFFSET[%return][(REF_CTR_OFFSET)]: the address the
// offset is mapped at, and the SDT semaphore's; *fentry as parse_address_point's.
int parse_file_point(const Words &w, Resolver &resolver, ProbeDef *def, bool *fentry, ProbeError *err) {
    std::string spec = w.argv[1];
    const size_t open = spec.find('(');
    if (open != std::string::npos) {
        const size_t close = spec.find(')', open);
        if (close == std::string::npos) return fail_at(err, w, Err::REFCNT_OPEN_BRACE, 1, int(spec.size()));
        if (close + 1 != spec.size()) return fail_at(err, w, Err::BAD_REFCNT_SUFFIX, 1, int(close + 1));
        if (!to_u64(std::string_view(spec).substr(open + 1, close - open - 1), &def->ref_ctr_offset))
            return fail_at(err, w, Err::BAD_REFCNT, 1, int(open + 1));
        spec.resize(open);
    }
    const size_t pct = spec.find('%');
    if (pct != std::string::npos) {
        if (spec.substr(pct) != "%return") return fail_at(err, w, Err::BAD_ADDR_SUFFIX, 1, int(pct));
        def->is_return = true;
        spec.resize(pct);
    }
    const size_t c = spec.rfind(':');
    def->where = Where::kFile;
    def->group = kDefaultUprobeGroup; // so that uprobe_events lines and paths work unchanged
    def->path = spec.substr(0, c);
    uint64_t off = 0;
    if (!to_u64(std::string_view(spec).substr(c + 1), &off))
        return fail_at(err, w, Err::BAD_UPROBE_OFFS, 1, int(c + 1));
    def->offset = off;
    const int r = resolver.resolve_file_offset(def->path, off, &def->addr, 'x');
    if (r == -ENOENT) return fail_at(err, w, Err::FILE_NOT_FOUND, 1, 0);
    if (r != 0) return fail_at(err, w, Err::BAD_UPROBE_OFFS, 1, int(c + 1));
    *fentry = resolver.function_entry(def->addr);
    if (open != std::string::npos &&
        resolver.resolve_file_offset(def->path, def->ref_ctr_offset, &def->ref_ctr_addr, 'w') != 0)
        return fail_at(err, w, Err::BAD_REFCNT, 1, int(open + 1));
    return 0;
}

// [MOD:]SYM[+offs][%return]: the symbol's address (or a module still to load); *fentry:
// whether the offset is 0.
int parse_symbol_point(const Words &w, Resolver &resolver, ProbeDef *def, bool *fentry, ProbeError *err) {
    std::string sym = w.argv[1];
    const size_t pct = sym.find('%');
    if (pct != std::string::npos) {
        if (sym.substr(pct) != "%return") return fail_at(err, w, Err::BAD_ADDR_SUFFIX, 1, int(pct));
        sym.resize(pct);
        def->is_return = true;
    }
    // SYM+offs: the offset follows the module's ':' ("ld-linux-x86-64.so.2:f+4").
    const size_t mcolon = sym.find(':');
    const size_t pm = sym.find_first_of("+-", mcolon == std::string::npos ? 0 : mcolon + 1);
    int64_t off = 0;
    if (pm != std::string::npos) {
        if (!to_s64(std::string_view(sym).substr(pm), &off)) return fail_at(err, w, Err::BAD_PROBE_ADDR, 1, 0);
        sym.resize(pm);
    }
    if (off < 0 || off > int64_t(UINT32_MAX) || sym.empty()) return fail_at(err, w, Err::BAD_PROBE_ADDR, 1, 0);
    def->where = Where::kSymbol;
    def->symbol = sym;
    def->offset = uint64_t(off);
    if (resolver.resolve_code(sym, def->offset, &def->addr) != 0 && !resolver.module_pending(sym))
        return fail_at(err, w, Err::BAD_PROBE_ADDR, 1, 0);
    if (def->is_return && off != 0) return fail_at(err, w, Err::BAD_RETPROBE, 1, 0);
    *fentry = off == 0;
    return 0;
}

// The probe point of word 1; *fentry: whether $argN reads the arguments' registers there (a
// function's entry; never for a return probe, whose $argN are saved at entry).
int parse_probe_point(const Words &w, Resolver &resolver, ProbeDef *def, bool *fentry, ProbeError *err) {
    const std::string &a1 = w.argv[1];
    uint64_t addr = 0;
    int r;
    if (to_u64(a1, &addr) && a1[0] != '+')
        r = parse_address_point(w, addr, resolver, def, fentry, err);
    else if (is_file_point(a1))
        r = parse_file_point(w, resolver, def, fentry, err);
    else
        r = parse_symbol_point(w, resolver, def, fentry, err);
    if (def->is_return) *fentry = false;
    return r;
}

// Whether FUNCS of an f: definition is globs or a list rather than one name.
bool names_many(std::string_view funcs) { return funcs.find_first_of("*?,!") != std::string_view::npos; }

// The functions of an f: definition, word 1: [MOD:]FUNCS[%return]. One name is a point as
// p's (on an object still to load too); globs or a list, the functions they match in one
// object. A $retval among the arguments makes it an exit event, as fprobetrace's parser
// does. *fentry: whether $argN reads the arguments' registers there.
int parse_function_spec(const Words &w, Resolver &resolver, ProbeDef *def, bool *fentry, ProbeError *err) {
    std::string spec = w.argv[1];
    const size_t pct = spec.find('%');
    if (pct != std::string::npos) {
        if (spec.substr(pct) != "%return") return fail_at(err, w, Err::BAD_ADDR_SUFFIX, 1, int(pct));
        spec.resize(pct);
        def->is_return = true;
    }
    for (size_t i = 2; i < w.argv.size() && !def->is_return; ++i)
        for (size_t at = w.argv[i].find("$retval"); at != std::string::npos; at = w.argv[i].find("$retval", at + 1)) {
            const char next = at + 7 < w.argv[i].size() ? w.argv[i][at + 7] : '\0';
            if (!std::isalnum(static_cast<unsigned char>(next)) && next != '_') def->is_return = true;
        }
    if (def->maxactive > 0 && !def->is_return) return fail_at(err, w, Err::BAD_MAXACT_TYPE, 0, 1);
    def->where = Where::kSymbol;
    def->symbol = spec;
    *fentry = !def->is_return;
    if (spec.empty()) return fail_at(err, w, Err::BAD_PROBE_ADDR, 1, 0);
    if (!names_many(spec)) {
        if (resolver.resolve_code(spec, 0, &def->addr) != 0)
            return resolver.module_pending(spec) ? 0 : fail_at(err, w, Err::BAD_PROBE_ADDR, 1, 0);
        if (!resolver.function_entry(def->addr)) return fail_at(err, w, Err::BAD_PROBE_ADDR, 1, 0);
        def->types = resolver.function_types(def->addr);
        return 0;
    }
    if (resolver.resolve_functions(spec, &def->functions) != 0 || def->functions.empty())
        return fail_at(err, w, Err::BAD_PROBE_ADDR, 1, 0);
    def->where = Where::kAddress;
    def->addr = def->functions[0].addr;
    return 0;
}

// The breakpoint of a w: definition, word 1: [r|w|rw]@<ADDR|[MOD:]SYM[+|-OFFS]>[:LENGTH], the
// kernel's wprobe spec (its length after the last ':', so that MOD:SYM keeps its own).
int parse_watch_spec(const Words &w, Resolver &resolver, ProbeDef *def, ProbeError *err) {
    const std::string &spec = w.argv[1];
    const size_t at = spec.find('@');
    if (at == std::string::npos) return fail_at(err, w, Err::BAD_ACCESS_FMT, 1, 0);
    const std::string_view access = std::string_view(spec).substr(0, at);
    if (access == "r")
        def->watch.type = 1; // HW_BREAKPOINT_R
    else if (access == "w")
        def->watch.type = 2; // HW_BREAKPOINT_W
    else if (access == "rw" || access.empty())
        def->watch.type = 3; // HW_BREAKPOINT_RW
    else
        return fail_at(err, w, Err::BAD_ACCESS_TYPE, 1, 0);
    std::string where = spec.substr(at + 1);
    const size_t col = where.rfind(':');
    if (col != std::string::npos && col + 1 < where.size() &&
        std::isdigit(static_cast<unsigned char>(where[col + 1]))) {
        uint64_t len = 0;
        const int len_at = int(at + 1 + col + 1);
        if (!to_u64(std::string_view(where).substr(col + 1), &len) || (len != 1 && len != 2 && len != 4 && len != 8))
            return fail_at(err, w, Err::BAD_ACCESS_LEN, 1, len_at);
        def->watch.len = uint32_t(len);
        where.resize(col);
    }
    const int addr_at = int(at + 1);
    uint64_t addr = 0;
    int64_t dummy = 0;
    if (!where.empty() && std::isdigit(static_cast<unsigned char>(where[0])) && to_u64(where, &addr)) {
        def->where = Where::kAddress;
        def->addr = addr;
    } else if (where == "-1" && to_s64(where, &dummy)) {
        def->where = Where::kAddress; // nothing watched until a set_wprobe trigger says what
        def->addr = kNoWatchAddr;
        return 0;
    } else {
        const size_t mcolon = where.find(':');
        const size_t pm = where.find_first_of("+-", mcolon == std::string::npos ? 0 : mcolon + 1);
        if (pm != std::string::npos) {
            if (!to_s64(std::string_view(where).substr(pm), &def->watch.offset))
                return fail_at(err, w, Err::BAD_PROBE_ADDR, 1, addr_at + int(pm));
            where.resize(pm);
        }
        if (!where.empty() && resolver.resolve_data(where, &addr) != 0 && resolver.module_pending(where)) {
            // MOD:SYM of an object not loaded here (a shell that execs the program that
            // has it, under ukprobe run): accepted, watching nothing in this process.
            def->where = Where::kSymbol;
            def->symbol = where;
            def->addr = kNoWatchAddr;
            return 0;
        }
        if (where.empty() || resolver.resolve_data(where, &addr) != 0)
            return fail_at(err, w, Err::BAD_ACCESS_ADDR, 1, addr_at);
        def->where = Where::kSymbol;
        def->symbol = where;
        def->addr = addr + uint64_t(def->watch.offset);
    }
    // A user-space address, aligned to the length (the CPU's rule, which the kernel checks
    // when the breakpoint is registered).
    if (def->addr >= (uint64_t{1} << 47) || def->addr % def->watch.len != 0)
        return fail_at(err, w, Err::BAD_ACCESS_ADDR, 1, addr_at);
    return 0;
}

// The SDT probe of a t: definition, word 1: [MOD:]PROVIDER:NAME, and its sites.
int parse_tracepoint_spec(const Words &w, Resolver &resolver, ProbeDef *def, ProbeError *err) {
    const std::string &spec = w.argv[1];
    const size_t last = spec.rfind(':');
    if (last == std::string::npos || last == 0 || last + 1 == spec.size())
        return fail_at(err, w, Err::NO_TRACEPOINT, 1, 0);
    const size_t before = spec.rfind(':', last - 1);
    const std::string_view all(spec);
    const std::string_view module = before == std::string::npos ? std::string_view() : all.substr(0, before);
    const std::string_view provider =
        before == std::string::npos ? all.substr(0, last) : all.substr(before + 1, last - before - 1);
    if (provider.empty() || resolver.resolve_sdt(module, provider, all.substr(last + 1), &def->sites) != 0 ||
        def->sites.empty())
        return fail_at(err, w, Err::NO_TRACEPOINT, 1, 0);
    def->where = Where::kAddress;
    def->symbol = spec;
    def->addr = def->sites[0].addr;
    def->ref_ctr_addr = def->sites[0].semaphore;
    return 0;
}

// The event an e: definition is on, word 1: GRP.EVENT (or GRP/EVENT, as the kernel takes
// it too), and its fields.
int parse_eprobe_spec(const Words &w, Resolver &resolver, ProbeDef *def, ProbeError *err) {
    std::string spec = w.argv[1];
    const size_t dot = spec.find_first_of("./");
    if (dot == std::string::npos || dot == 0 || dot + 1 == spec.size())
        return fail_at(err, w, Err::NO_EVENT_INFO, 1, 0);
    const std::string_view s(spec);
    if (resolver.event_fields(s.substr(0, dot), s.substr(dot + 1), &def->attach_fields) != 0)
        return fail_at(err, w, Err::BAD_ATTACH_EVENT, 1, 0);
    def->struct_types = resolver.struct_types(s.substr(0, dot), s.substr(dot + 1));
    def->where = Where::kAddress;
    spec[dot] = '.';
    def->symbol = spec;
    return 0;
}

// A site's argument specs, split at blanks.
std::vector<std::string> split_blanks(const std::string &s) {
    std::vector<std::string> out;
    size_t i = 0;
    while (i < s.size()) {
        while (i < s.size() && s[i] == ' ') ++i;
        const size_t start = i;
        while (i < s.size() && s[i] != ' ') ++i;
        if (i > start) out.push_back(s.substr(start, i - start));
    }
    return out;
}

// The name the kernel gives an event defined without one: the probe type, then the symbol
// and offset, the address, or the file's base name (up to its first . - or _, as the
// kernel's uprobe tracer) and offset.
std::string default_event_name(const ProbeDef &def) {
    if (def.is_eprobe) return sanitize(def.symbol.substr(def.symbol.find('.') + 1)); // the event's own name
    if (def.is_tracepoint || def.is_watch) {
        // t: the tracepoint's name, "_NAME" when it starts with a digit (fprobetrace.rst);
        // w: the symbol, else "wprobe" (the kernel's wprobe parser). Without MOD or a C++
        // scope, and cut to an event name's length.
        if (def.is_watch && def.where != Where::kSymbol) return "wprobe";
        std::string name = def.symbol.substr(def.symbol.rfind(':') + 1);
        if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) name = "_" + name;
        return sanitize(name.substr(0, kMaxEventNameLen - 1));
    }
    if (def.is_function) {
        // fprobetrace.rst's SYM__entry and SYM__exit; globs and lists: their first pattern
        // up to its first wildcard ("ssl_*": ssl__entry), "fprobe" if nothing is left.
        std::string name = def.symbol.substr(def.symbol.rfind(':') + 1);
        if (names_many(name)) {
            name = name.substr(name.front() == '!' ? 1 : 0);
            name = name.substr(0, name.find_first_of("*?[,!"));
            while (!name.empty() && name.back() == '_') name.pop_back();
            if (name.empty()) name = "fprobe";
        }
        if (std::isdigit(static_cast<unsigned char>(name[0]))) name = "_" + name;
        const std::string suffix = def.is_return ? "__exit" : "__entry";
        return sanitize(name.substr(0, kMaxEventNameLen - 1 - suffix.size()) + suffix);
    }
    char buf[kMaxEventNameLen];
    const char t = def.is_return ? 'r' : 'p';
    if (def.where == Where::kSymbol) {
        std::snprintf(buf, sizeof buf, "%c_%s_%" PRIu64, t, def.symbol.c_str(), def.offset);
    } else if (def.where == Where::kAddress) {
        std::snprintf(buf, sizeof buf, "%c_0x%" PRIx64, t, def.addr);
    } else {
        std::string base = def.path.substr(def.path.rfind('/') + 1);
        base = base.substr(0, base.find_first_of(".-_"));
        std::snprintf(buf, sizeof buf, "%c_%s_0x%" PRIx64, t, base.c_str(), def.offset);
    }
    return sanitize(buf);
}

// The group and event of the ":[GRP/][EVENT]" at a0's colon (npos: none), the event named by
// default_event_name when it gives none.
int name_event(const std::string &a0, size_t colon, ProbeDef *def, ProbeError *err) {
    bool named = false;
    if (colon != std::string::npos) {
        if (parse_event_name(std::string_view(a0).substr(colon + 1), def, &named, err, int(colon + 1)) != 0) {
            err->logged = true;
            return -EINVAL;
        }
    }
    if (!named) def->event = default_event_name(*def);
    return 0;
}

// The fetch arguments, words 2 on, into def->args; -EINVAL, logged, on a bad one.
int parse_args(const Words &w, Resolver &resolver, bool fentry, ProbeDef *def, ProbeError *err);

// A t: definition's arguments, once per site: "$arg*" first stands for every argument of the
// probe (arg1=$arg1 ...). Every site must give each argument the same type.
int parse_site_args(Words w, Resolver &resolver, ProbeDef *def, ProbeError *err) {
    def->sdt_args = split_blanks(def->sites[0].args);
    for (size_t i = 2; i < w.argv.size(); ++i) {
        if (w.argv[i] != "$arg*") continue;
        const int at = w.at[i];
        w.argv.erase(w.argv.begin() + long(i));
        w.at.erase(w.at.begin() + long(i));
        for (size_t k = 0; k < def->sdt_args.size(); ++k) {
            w.argv.insert(w.argv.begin() + long(i + k),
                          "arg" + std::to_string(k + 1) + "=$arg" + std::to_string(k + 1));
            w.at.insert(w.at.begin() + long(i + k), at);
        }
        break;
    }
    if (int r = parse_args(w, resolver, false, def, err)) return r;
    std::vector<ArgDef> first = std::move(def->args);
    for (size_t s = 1; s < def->sites.size(); ++s) {
        def->args.clear();
        def->sdt_args = split_blanks(def->sites[s].args);
        if (int r = parse_args(w, resolver, false, def, err)) return r;
        for (size_t i = 0; i < first.size(); ++i)
            if (first[i].prog.type.kind != def->args[i].prog.type.kind ||
                first[i].prog.type.size != def->args[i].prog.type.size)
                return fail_at(err, w, Err::DIFF_ARG_TYPE, int(i) + 2, 0);
        def->site_args.push_back(std::move(def->args));
    }
    def->args = std::move(first);
    def->sdt_args.clear();
    return 0;
}

// An f: definition's "$arg*": every parameter of the function by name (NAME=NAME), as
// fprobetrace.rst expands it; those $argN cannot read (a struct passed by value, a float)
// are left out. Once, alone, and only with the function's debug information.
int expand_function_args(Words *w, const ProbeDef &def, ProbeError *err) {
    size_t star = 0;
    for (size_t i = 2; i < w->argv.size(); ++i) {
        const std::string &a = w->argv[i];
        const size_t at = a.find("$arg*");
        if (at == std::string::npos) continue;
        if (at != 0 || a.size() != 5) return fail_at(err, *w, Err::BAD_VAR_ARGS, i, int(at));
        if (star != 0) return fail_at(err, *w, Err::DOUBLE_ARGS, i, 0);
        if (def.types == nullptr) return fail_at(err, *w, Err::NOSUP_BTFARG, i, 0);
        star = i;
    }
    if (star == 0) return 0;
    const int at = w->at[star];
    w->argv.erase(w->argv.begin() + long(star));
    w->at.erase(w->at.begin() + long(star));
    size_t k = star;
    for (const std::string &p : def.types->parameters()) {
        sym::TypedAccess a;
        size_t pos = 0;
        if (p.empty() || def.types->access(p, &a, &pos) != sym::AccessFail::kNone) continue;
        w->argv.insert(w->argv.begin() + long(k), p + "=" + p);
        w->at.insert(w->at.begin() + long(k), at);
        ++k;
    }
    return 0;
}

int parse_args(const Words &w, Resolver &resolver, bool fentry, ProbeDef *def, ProbeError *err) {
    const size_t nargs = w.argv.size() - 2;
    if (nargs > size_t(kMaxArgs)) return fail_at(err, w, Err::TOO_MANY_ARGS, 2, 0);
    for (size_t i = 0; i < nargs; ++i) {
        ArgParser ap(*def, resolver, err, fentry, w.at[i + 2]);
        if (ap.parse(w.argv[i + 2], int(i)) != 0) {
            err->logged = true;
            return -EINVAL;
        }
    }
    return 0;
}

// Whether a symbol reads as a number ("8" of "8+0"): shown, it keeps its offset, or the
// text would read back as that address.
bool reads_as_number(const std::string &symbol) {
    uint64_t number = 0;
    return to_u64(symbol, &number);
}

} // namespace

bool is_good_name(std::string_view s) {
    if (s.empty() || (!std::isalpha(static_cast<unsigned char>(s[0])) && s[0] != '_')) return false;
    for (char c : s)
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
    return true;
}

std::string ProbeDef::location_text() const {
    char buf[64];
    switch (where) {
    case Where::kAddress:
        std::snprintf(buf, sizeof buf, "0x%" PRIx64, addr);
        return buf;
    case Where::kFile:
        std::snprintf(buf, sizeof buf, ":0x%016" PRIx64, offset);
        if (ref_ctr_addr != 0)
            return path + buf + "(0x" + [&] {
                char r[24];
                std::snprintf(r, sizeof r, "%" PRIx64, ref_ctr_offset);
                return std::string(r);
            }() + ")";
        return path + buf;
    case Where::kSymbol:
        break;
    }
    if (offset != 0 || reads_as_number(symbol)) return symbol + "+" + std::to_string(offset);
    return symbol;
}

std::string ProbeDef::show() const {
    if (is_tracepoint) {
        std::string s = "t:" + group + "/" + event + " " + symbol;
        for (const ArgDef &a : args) s += " " + a.name + "=" + a.text;
        return s;
    }
    if (is_eprobe) {
        std::string s = "e:" + group + "/" + event + " " + symbol;
        for (const ArgDef &a : args) s += " " + a.name + "=" + a.text;
        return s;
    }
    if (is_function) {
        std::string s = "f";
        if (is_return && maxactive > 0) s += std::to_string(maxactive);
        s += ":" + group + "/" + event + " " + symbol + (is_return ? "%return" : "");
        for (const ArgDef &a : args) s += " " + a.name + "=" + a.text;
        return s;
    }
    if (is_watch) {
        static constexpr const char *kAccess[] = {"", "r", "w", "rw"};
        std::string s = "w:" + group + "/" + event + " " + kAccess[watch.type & 3] + "@";
        if (where == Where::kSymbol) {
            s += symbol;
            if (watch.offset != 0 || reads_as_number(symbol))
                s += (watch.offset >= 0 ? "+" : "") + std::to_string(watch.offset);
        } else if (addr == kNoWatchAddr) {
            s += "-1";
        } else {
            char buf[24];
            std::snprintf(buf, sizeof buf, "0x%" PRIx64, addr);
            s += buf;
        }
        s += ":" + std::to_string(watch.len);
        for (const ArgDef &a : args) s += " " + a.name + "=" + a.text;
        return s;
    }
    std::string s(1, is_return ? 'r' : 'p');
    if (is_return && maxactive > 0) s += std::to_string(maxactive);
    s += ":" + group + "/" + event + " " + location_text();
    for (const ArgDef &a : args) s += " " + a.name + "=" + a.text;
    return s;
}

int parse_definition(std::string_view line, Resolver &resolver, ProbeDef *def, ProbeError *err, char separator) {
    *def = ProbeDef{};
    Words w;
    split_command(line, separator, &w, &def->command);
    err->logged = false; // a line that is no definition at all leaves no log entry
    if (w.argv.empty()) return -EINVAL;
    if (w.argv[0][0] == '-') return parse_removal(w.argv[0], def, err);
    size_t colon = std::string::npos;
    if (int r = parse_probe_type(w, def, &colon, err)) return r;
    bool fentry = false;
    int r = def->is_watch        ? parse_watch_spec(w, resolver, def, err)
            : def->is_tracepoint ? parse_tracepoint_spec(w, resolver, def, err)
            : def->is_function   ? parse_function_spec(w, resolver, def, &fentry, err)
            : def->is_eprobe     ? parse_eprobe_spec(w, resolver, def, err)
                                 : parse_probe_point(w, resolver, def, &fentry, err);
    if (r != 0) return r;
    if ((r = name_event(w.argv[0], colon, def, err)) != 0) return r;
    if (def->is_tracepoint) return parse_site_args(w, resolver, def, err);
    if (def->is_function)
        if ((r = expand_function_args(&w, *def, err)) != 0) return r;
    return parse_args(w, resolver, fentry, def, err);
}

} // namespace ukp::trace
