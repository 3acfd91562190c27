#include "trace/filter.hpp"
#include "trace/bytes.hpp"
#include "platform/this_cpu.hpp"

#include <sched.h>

#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>

namespace ukp::trace {

namespace {

// The kernel's parse_error texts (kernel/trace/trace_events_filter.c).
constexpr const char *kInvalidOp = "Invalid operator";
constexpr const char *kTooManyOpen = "Too many '('";
constexpr const char *kTooManyClose = "Too few '('";
constexpr const char *kMissingQuote = "Missing matching quote";
constexpr const char *kOperandTooLong = "Operand too long";
constexpr const char *kExpectString = "Expecting string field";
constexpr const char *kExpectDigit = "Expecting numeric field";
constexpr const char *kIllegalFieldOp = "Illegal operation for field type";
constexpr const char *kFieldNotFound = "Field not found";
constexpr const char *kIllegalIntval = "Illegal integer value";
constexpr const char *kTooManyPreds = "Too many terms in predicate expression";
constexpr const char *kInvalidValue = "Invalid value (did you forget quotes)?";

constexpr int kMaxPreds = 16384;   // the kernel's MAX_FILTER_PRED
constexpr int kMaxNesting = 512;   // bounds the compiler's recursion on '(' (kernel: none)
constexpr size_t kMaxString = 256; // the kernel's MAX_FILTER_STR_VAL
constexpr int32_t kFalse = -1, kTrue = -2;

enum class Op : uint8_t { kEq, kNe, kLe, kLt, kGe, kGt, kBand, kGlob };
// Longest first where one is a prefix of another, as the kernel matches them.
constexpr struct {
    const char *text;
    Op op;
} kOps[] = {
    {"==", Op::kEq}, {"!=", Op::kNe}, {"<=", Op::kLe},  {"<", Op::kLt},
    {">=", Op::kGe}, {">", Op::kGt},  {"&", Op::kBand}, {"~", Op::kGlob},
};

// kNever: an integer field of a size the kernel has no comparison for (an array of 3
// bytes): accepted, and never matches, whatever the operator.
enum class Src : uint8_t { kInt, kString, kComm, kCpu, kNever };

} // namespace

struct FilterPred {
    Src src;
    Op op;
    bool is_signed;  // compare as signed (the field's signedness)
    bool negate;     // != on strings, or a ~ pattern starting with '!'
    uint32_t offset; // of the field in the record
    uint32_t size;   // bytes loaded: 1, 2, 4 or 8 (4 for a __data_loc word)
    uint64_t val;    // the constant, truncated to the field's size
    std::string pat; // string constant or glob pattern
};

struct FilterInsn {
    uint32_t pred;             // index in Program::preds
    int32_t on_true, on_false; // next insn, or kTrue / kFalse; always forward
};

struct Filter::Program {
    std::vector<FilterPred> preds;
    std::vector<FilterInsn> insns;
};

Filter::Filter(std::string text, std::unique_ptr<const Program> prog)
    : text_(std::move(text)), prog_(std::move(prog)) {}
Filter::~Filter() = default;

bool glob_match(const char *pat, size_t pn, const char *str, size_t sn) noexcept {
    // The kernel's glob_match(), over lengths instead of NULs: *, ?, [a-z], [!...], \x.
    size_t p = 0, s = 0, back_p = SIZE_MAX, back_s = 0;
    for (;;) {
        const int c = s < sn ? (unsigned char)str[s] : -1;
        if (p == pn) {
            if (c < 0) return true;
            goto backtrack;
        }
        {
            unsigned char d = (unsigned char)pat[p++];
            switch (d) {
            case '?':
                if (c < 0) return false;
                s++;
                continue;
            case '*':
                if (p == pn) return true;
                back_p = p;
                back_s = s;
                continue;
            case '[': {
                const bool inverted = p < pn && pat[p] == '!';
                size_t q = p + inverted;
                bool match = false, closed = false;
                if (q < pn) {
                    unsigned char a = (unsigned char)pat[q++];
                    for (;;) {
                        unsigned char b = a;
                        if (q + 1 < pn && pat[q] == '-' && pat[q + 1] != ']') {
                            b = (unsigned char)pat[q + 1];
                            q += 2;
                        }
                        if (c >= 0 && a <= c && c <= b) match = true;
                        if (q >= pn) break;
                        a = (unsigned char)pat[q++];
                        if (a == ']') {
                            closed = true;
                            break;
                        }
                    }
                }
                if (!closed) goto literal_bracket; // no closing ']': '[' is an ordinary char
                if (c < 0 || match == inverted) goto backtrack;
                p = q;
                s++;
                continue;
            literal_bracket:
                if (c == '[') {
                    s++;
                    continue;
                }
                goto backtrack;
            }
            case '\\':
                if (p < pn) d = (unsigned char)pat[p++];
                [[fallthrough]];
            default:
                if (c == d) {
                    s++;
                    continue;
                }
                goto backtrack;
            }
        }
    backtrack:
        if (c < 0 || back_p == SIZE_MAX) return false;
        p = back_p;
        s = ++back_s;
    }
}

namespace {

template <typename T>
bool compare(Op op, T a, T b) {
    switch (op) {
    case Op::kEq:
        return a == b;
    case Op::kNe:
        return a != b;
    case Op::kLt:
        return a < b;
    case Op::kLe:
        return a <= b;
    case Op::kGt:
        return a > b;
    case Op::kGe:
        return a >= b;
    case Op::kBand:
        return (a & b) != 0;
    default:
        return false;
    }
}

uint64_t truncate(uint64_t v, uint32_t size, bool is_signed) {
    if (size >= 8) return v;
    const uint64_t mask = (uint64_t(1) << (size * 8)) - 1;
    v &= mask;
    if (is_signed && (v >> (size * 8 - 1)) & 1) v |= ~mask;
    return v;
}

bool eval(const FilterPred &p, const uint8_t *rec, uint32_t size, const char *comm) noexcept {
    const char *s = "";
    size_t n = 0;
    switch (p.src) {
    case Src::kInt: {
        if (uint64_t(p.offset) + p.size > size) return false;
        const uint64_t v = load_widened(rec + p.offset, p.size, p.is_signed);
        return p.is_signed ? compare<int64_t>(p.op, int64_t(v), int64_t(p.val)) : compare<uint64_t>(p.op, v, p.val);
    }
    case Src::kNever:
        return false;
    case Src::kCpu: {
        const int cpu = platform::this_cpu(); // from rseq: no system call
        return compare<int64_t>(p.op, cpu, int64_t(p.val));
    }
    case Src::kComm:
        if (comm) {
            s = comm;
            n = bounded_strlen(comm, 16);
        }
        break;
    case Src::kString: {
        if (uint64_t(p.offset) + 4 > size) return false;
        uint32_t loc, len;
        std::memcpy(&loc, rec + p.offset, 4);
        const uint32_t off = loc & 0xffff, ln = loc >> 16;
        if (ln != 0 && off + ln <= size) {
            len = ln - 1;
            s = reinterpret_cast<const char *>(rec + off);
            n = bounded_strlen(s, len); // the stored length counts the NUL; stop at an early one too
        }
        break;
    }
    }
    bool r = p.op == Op::kGlob ? glob_match(p.pat.data(), p.pat.size(), s, n)
                               : (n == p.pat.size() && same_bytes(s, p.pat.data(), n));
    return r != p.negate;
}

// The AST: n-ary AND/OR so chains do not deepen the compiler's recursion.
struct Node {
    enum Kind : uint8_t { kPred, kAnd, kOr } kind;
    bool invert = false;
    uint32_t pred = 0;          // kPred
    std::vector<uint32_t> kids; // kAnd, kOr
};

struct ParseFail {};

class Parser {
public:
    Parser(std::string_view t, const std::vector<Field> &fields, Filter::Program *prog)
        : t_(t), fields_(fields), prog_(prog) {}

    bool run(uint32_t *root) {
        if (!check_stack()) return false;
        uint32_t r;
        if (!parse_or(0, &r)) return false;
        skip();
        if (i_ < t_.size()) return fail(kTooManyPreds, int(i_));
        *root = r;
        return true;
    }

    std::vector<Node> nodes;
    FilterError err;

private:
    bool fail(const char *msg, int pos) {
        err = {msg, pos};
        return false;
    }
    // The kernel answers some malformed expressions with a bare -EINVAL ("Error: (0)").
    bool fail_bare() { return fail("", -1); }
    // Errors inside a predicate: the kernel reports them one column right of the offence.
    bool fail_pred(const char *msg, size_t at) { return fail(msg, int(at + 1)); }
    void skip() {
        while (i_ < t_.size() && isspace((unsigned char)t_[i_])) i_++;
    }
    char peek(size_t k = 0) const { return i_ + k < t_.size() ? t_[i_ + k] : '\0'; }

    // Quotes and parentheses over the whole text first, as the kernel's calc_stack().
    bool check_stack() {
        std::vector<size_t> open;
        char quote = 0;
        size_t last_quote = 0;
        for (size_t k = 0; k < t_.size(); k++) {
            const char c = t_[k];
            if (quote) {
                if (c == quote) quote = 0;
                continue;
            }
            if (c == '"' || c == '\'') {
                quote = c;
                last_quote = k;
            } else if (c == '(') {
                open.push_back(k);
                if (open.size() > size_t(kMaxNesting)) return fail(kTooManyOpen, int(k));
            } else if (c == ')') {
                if (open.empty()) return fail(kTooManyClose, int(k));
                open.pop_back();
            }
        }
        if (quote) return fail(kMissingQuote, int(last_quote));
        if (!open.empty()) return fail(kTooManyOpen, int(open.front()));
        return true;
    }

    bool at_end_after_conj() {
        size_t k = i_;
        while (k < t_.size() && isspace((unsigned char)t_[k])) k++;
        return k == t_.size();
    }

    bool parse_or(int depth, uint32_t *out) {
        uint32_t first;
        if (!parse_and(depth, &first)) return false;
        std::vector<uint32_t> kids{first};
        for (;;) {
            skip();
            if (!(peek() == '|' && peek(1) == '|')) break;
            i_ += 2;
            if (at_end_after_conj()) break; // the kernel ignores a trailing "||"
            uint32_t k;
            if (!parse_and(depth, &k)) return false;
            kids.push_back(k);
        }
        *out = wrap(Node::kOr, std::move(kids));
        return true;
    }

    bool parse_and(int depth, uint32_t *out) {
        uint32_t first;
        if (!parse_unary(depth, &first)) return false;
        std::vector<uint32_t> kids{first};
        for (;;) {
            skip();
            if (!(peek() == '&' && peek(1) == '&')) break;
            i_ += 2;
            if (at_end_after_conj()) break; // the kernel ignores a trailing "&&"
            uint32_t k;
            if (!parse_unary(depth, &k)) return false;
            kids.push_back(k);
        }
        *out = wrap(Node::kAnd, std::move(kids));
        return true;
    }

    uint32_t wrap(Node::Kind kind, std::vector<uint32_t> kids) {
        if (kids.size() == 1) return kids[0];
        nodes.push_back({kind, false, 0, std::move(kids)});
        return uint32_t(nodes.size() - 1);
    }

    bool parse_unary(int depth, uint32_t *out) {
        bool invert = false;
        for (;;) {
            skip();
            if (peek() != '!') break;
            invert = !invert;
            i_++;
        }
        uint32_t n;
        if (peek() == '(') {
            i_++;
            if (!parse_or(depth + 1, &n)) return false;
            skip();
            if (peek() != ')') {
                if (i_ >= t_.size()) return fail_bare();
                return fail(kTooManyPreds, int(i_));
            }
            i_++;
        } else {
            const char c = peek();
            if (c == '\0' || c == '&' || c == '|' || c == ')') return fail_bare();
            if (!parse_pred(&n)) return false;
        }
        if (invert) nodes[n].invert = !nodes[n].invert;
        // After an operand only a conjunction, ')' or the end may follow.
        skip();
        const char c = peek();
        if (!(c == '\0' || c == ')' || (c == '&' && peek(1) == '&') || (c == '|' && peek(1) == '|')))
            return fail(kTooManyPreds, int(i_));
        *out = n;
        return true;
    }

    bool parse_pred(uint32_t *out) {
        skip();
        const size_t ns = i_;
        while (i_ < t_.size() && (isalnum((unsigned char)t_[i_]) || t_[i_] == '_')) i_++;
        if (i_ == ns) return fail_bare();
        const std::string_view name = t_.substr(ns, i_ - ns);

        FilterPred p{};
        const Field *field = nullptr;
        for (const Field &f : fields_)
            if (f.name == name) {
                field = &f;
                break;
            }
        bool string_field;
        if (field) {
            string_field = field->print == Print::kString;
            p.src = string_field ? Src::kString : Src::kInt;
            p.offset = field->offset;
            p.is_signed = field->is_signed;
            p.size = string_field ? 4 : field->size * (field->array_len ? field->array_len : 1);
        } else if (name == "common_comm" || name == "comm" || name == "COMM") {
            string_field = true;
            p.src = Src::kComm;
        } else if (name == "common_cpu" || name == "cpu" || name == "CPU") {
            string_field = false;
            p.src = Src::kCpu;
            p.size = 4;
            p.is_signed = true;
        } else {
            return fail_pred(kFieldNotFound, i_);
        }
        skip();
        size_t k = 0;
        for (; k < std::size(kOps); k++)
            if (t_.substr(i_).starts_with(kOps[k].text)) break;
        if (k == std::size(kOps)) return fail_pred(kInvalidOp, i_);
        p.op = kOps[k].op;
        i_ += strlen(kOps[k].text);
        skip();

        const size_t vs = i_;
        const char c = peek();
        if (c == '"' || c == '\'') {
            if (!(p.op == Op::kEq || p.op == Op::kNe || p.op == Op::kGlob)) return fail_pred(kIllegalFieldOp, vs);
            if (!string_field) return fail_pred(kExpectDigit, vs);
            const size_t close = t_.find(c, vs + 1); // present: check_stack() saw it
            std::string pat(t_.substr(vs + 1, close - vs - 1));
            if (pat.size() >= kMaxString) return fail_pred(kOperandTooLong, vs);
            i_ = close + 1;
            p.negate = p.op == Op::kNe;
            if (p.op == Op::kGlob && !pat.empty() && pat[0] == '!') { // as the kernel's filter_parse_regex
                p.negate = true;
                pat.erase(0, 1);
            }
            if (p.op == Op::kNe) p.op = Op::kEq;
            p.pat = std::move(pat);
        } else if (isdigit((unsigned char)c) || c == '-') {
            if (string_field) return fail_pred(kExpectString, vs);
            if (p.op == Op::kGlob) return fail_pred(kIllegalFieldOp, vs);
            if (c == '-') i_++;
            while (i_ < t_.size() && isalnum((unsigned char)t_[i_])) i_++;
            const std::string num(t_.substr(vs, i_ - vs));
            if (num.size() >= 24) return fail_pred(kOperandTooLong, i_);
            if (!parse_number(num, p.is_signed, &p.val)) return fail_pred(kIllegalIntval, vs);
            if (p.src == Src::kInt) {
                if (p.size != 1 && p.size != 2 && p.size != 4 && p.size != 8)
                    p.src = Src::kNever;
                else
                    p.val = truncate(p.val, p.size, p.is_signed);
            }
        } else {
            return fail_pred(kInvalidValue, vs);
        }
        if (prog_->preds.size() >= size_t(kMaxPreds)) return fail(kTooManyPreds, int(ns));
        prog_->preds.push_back(std::move(p));
        nodes.push_back({Node::kPred, false, uint32_t(prog_->preds.size() - 1), {}});
        *out = uint32_t(nodes.size() - 1);
        return true;
    }

    // kstrtoll / kstrtoull with base 0: 0x hex, 0 octal, decimal; '-' only when signed.
    static bool parse_number(const std::string &s, bool is_signed, uint64_t *out) {
        const char *p = s.c_str();
        bool neg = false;
        if (*p == '-') {
            if (!is_signed) return false;
            neg = true;
            p++;
        }
        int base = 10;
        if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) {
            base = 16;
            p += 2;
        } else if (p[0] == '0')
            base = 8;
        if (!*p) return false;
        uint64_t v = 0;
        for (; *p; p++) {
            int d;
            if (isdigit((unsigned char)*p))
                d = *p - '0';
            else if (isalpha((unsigned char)*p))
                d = tolower((unsigned char)*p) - 'a' + 10;
            else
                return false;
            if (d >= base) return false;
            if (v > (UINT64_MAX - uint64_t(d)) / uint64_t(base)) return false;
            v = v * uint64_t(base) + uint64_t(d);
        }
        if (is_signed) {
            if (neg ? v > uint64_t(INT64_MAX) + 1 : v > uint64_t(INT64_MAX)) return false;
            v = neg ? uint64_t(0) - v : v;
        }
        *out = v;
        return true;
    }

    std::string_view t_;
    size_t i_ = 0;
    const std::vector<Field> &fields_;
    Filter::Program *prog_;
};

class Emitter {
public:
    Emitter(const std::vector<Node> &nodes, Filter::Program *prog) : nodes_(nodes), prog_(prog) {}

    void emit(uint32_t n, int32_t on_true, int32_t on_false) {
        const Node &node = nodes_[n];
        if (node.invert) std::swap(on_true, on_false);
        if (node.kind == Node::kPred) {
            prog_->insns.push_back({node.pred, on_true, on_false});
            return;
        }
        for (size_t k = 0; k < node.kids.size(); k++) {
            if (k + 1 == node.kids.size()) {
                emit(node.kids[k], on_true, on_false);
                break;
            }
            const int32_t next = new_label();
            if (node.kind == Node::kAnd)
                emit(node.kids[k], next, on_false);
            else
                emit(node.kids[k], on_true, next);
            labels_[size_t(-(next + 3))] = int32_t(prog_->insns.size());
        }
    }

    // Labels are encoded below kTrue until resolved; every label is bound after its uses,
    // so every jump goes forward and match() terminates in at most insns.size() steps.
    void resolve() {
        for (FilterInsn &in : prog_->insns) {
            if (in.on_true <= -3) in.on_true = labels_[size_t(-(in.on_true + 3))];
            if (in.on_false <= -3) in.on_false = labels_[size_t(-(in.on_false + 3))];
        }
    }

private:
    int32_t new_label() {
        labels_.push_back(0);
        return -int32_t(labels_.size()) - 2;
    }
    const std::vector<Node> &nodes_;
    Filter::Program *prog_;
    std::vector<int32_t> labels_;
};

} // namespace

bool Filter::match(const uint8_t *rec, uint32_t size, const char *comm) const noexcept {
    const FilterInsn *insns = prog_->insns.data();
    const FilterPred *preds = prog_->preds.data();
    int32_t i = 0;
    while (i >= 0) {
        const FilterInsn &in = insns[i];
        i = eval(preds[in.pred], rec, size, comm) ? in.on_true : in.on_false;
    }
    return i == kTrue;
}

std::unique_ptr<Filter> compile_filter(std::string_view text, const std::vector<Field> &fields, FilterError *err) {
    // The kernel strips surrounding whitespace (and the newline echo adds) first.
    while (!text.empty() && isspace((unsigned char)text.back())) text.remove_suffix(1);
    size_t lead = 0;
    while (lead < text.size() && isspace((unsigned char)text[lead])) lead++;
    auto prog = std::make_unique<Filter::Program>();
    Parser parser(text, fields, prog.get());
    uint32_t root = 0;
    if (lead == text.size() || !parser.run(&root)) {
        FilterError e = lead == text.size() ? FilterError{"", -1} : parser.err;
        if (e.pos > int(text.size())) e.pos = int(text.size()); // where the kernel puts the caret
        if (err) *err = e;
        return nullptr;
    }
    Emitter em(parser.nodes, prog.get());
    em.emit(root, kTrue, kFalse);
    em.resolve();
    return std::make_unique<Filter>(std::string(text), std::move(prog));
}

std::string filter_error_text(std::string_view text, const FilterError &err) {
    while (!text.empty() && isspace((unsigned char)text.back())) text.remove_suffix(1);
    std::string out(text);
    out += '\n';
    if (err.message.empty()) return out + "Error: (0)\n";
    out.append(size_t(err.pos < 0 ? 0 : err.pos), ' ');
    out += "^\nparse_error: " + err.message + "\n";
    return out;
}

} // namespace ukp::trace
