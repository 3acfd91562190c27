// Event filters: the cases of tests/data/filter/filter.txt (checked against the kernel),
// plus the kernel's glob and the compiled program's bounds.
#include "trace/filter.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

namespace ukp::trace {
namespace {

// The fields of the kernel uprobe event the data file was checked on, laid out as its format.
std::vector<Field> test_fields() {
    std::vector<Field> f = common_fields();
    f.push_back({"__probe_ip", "unsigned long", 8, 8, false, Print::kHex});
    f.push_back({"a", "s64", 16, 8, true, Print::kSigned});
    f.push_back({"b", "u32", 24, 4, false, Print::kUnsigned});
    f.push_back({"s", "__data_loc char[]", 28, 4, true, Print::kString});
    f.push_back({"x", "u16", 32, 2, false, Print::kHex});
    f.push_back({"arr", "u8", 34, 1, false, Print::kUnsigned, 4});
    f.push_back({"c", "u8", 38, 1, false, Print::kChar});
    f.push_back({"cm", "__data_loc char[]", 39, 4, true, Print::kString});
    f.push_back({"arr3", "u8", 43, 1, false, Print::kUnsigned, 3});
    return f;
}
constexpr uint32_t kFixedSize = 46;

struct Record {
    std::vector<uint8_t> bytes;
    std::string comm;
};

void put(std::vector<uint8_t> &b, uint32_t off, uint64_t v, uint32_t size) { std::memcpy(b.data() + off, &v, size); }

// "a=1 s="x" comm="t" pid=4 ..." -> a record of test_fields().
Record build(const std::string &spec) {
    std::map<std::string, std::string> kv;
    std::istringstream in(spec);
    std::string tok;
    while (in >> tok) {
        const size_t eq = tok.find('=');
        EXPECT_NE(eq, std::string::npos) << tok;
        kv[tok.substr(0, eq)] = tok.substr(eq + 1);
    }
    auto str = [&](const char *k) {
        std::string v = kv.at(k);
        EXPECT_TRUE(v.size() >= 2 && v.front() == '"' && v.back() == '"') << k;
        return v.substr(1, v.size() - 2);
    };
    auto num = [&](const char *k) { return uint64_t(std::strtoull(kv.at(k).c_str(), nullptr, 0)); };
    Record r;
    r.bytes.assign(kFixedSize, 0);
    put(r.bytes, 4, num("pid"), 4);
    put(r.bytes, 8, 0x401000, 8);
    put(r.bytes, 16, uint64_t(std::strtoll(kv.at("a").c_str(), nullptr, 0)), 8);
    put(r.bytes, 24, num("b"), 4);
    put(r.bytes, 32, num("x"), 2);
    put(r.bytes, 34, num("arr"), 4);
    put(r.bytes, 38, num("c"), 1);
    put(r.bytes, 43, 0, 3);
    for (auto [name, off] : {std::pair{"s", 28u}, std::pair{"cm", 39u}}) {
        const std::string v = str(name);
        const uint32_t loc = uint32_t(r.bytes.size()) | uint32_t(v.size() + 1) << 16;
        put(r.bytes, off, loc, 4);
        r.bytes.insert(r.bytes.end(), v.begin(), v.end());
        r.bytes.push_back(0);
    }
    r.comm = str("comm");
    return r;
}

TEST(Filter, DataFile) {
    const std::string path = std::string(UKP_FILTER_DATA) + "/filter.txt";
    std::ifstream in(path);
    ASSERT_TRUE(in) << path;
    const std::vector<Field> fields = test_fields();
    Record rec;
    bool have_rec = false;
    std::string line;
    int lineno = 0, cases = 0;
    while (std::getline(in, line)) {
        lineno++;
        if (line.empty() || line[0] == '#') continue;
        const std::string where = path + ":" + std::to_string(lineno) + ": " + line;
        if (line.starts_with("record ")) {
            rec = build(line.substr(7));
            have_rec = true;
            continue;
        }
        ASSERT_TRUE(line.size() >= 5 && line[4] == '|') << "unknown line " << where;
        const std::string tag = line.substr(0, 4);
        const std::string text = line.size() > 6 ? line.substr(6) : "";
        FilterError err{"unset", -7};
        auto f = compile_filter(text, fields, &err);
        cases++;
        if (tag == "yes " || tag == "no  ") {
            ASSERT_TRUE(have_rec) << where;
            ASSERT_NE(f, nullptr) << where << " -> " << err.message << " at " << err.pos;
            EXPECT_EQ(f->match(rec.bytes.data(), uint32_t(rec.bytes.size()), rec.comm.c_str()), tag == "yes ") << where;
            std::string shown = text;
            while (!shown.empty() && shown.back() == ' ') shown.pop_back();
            EXPECT_EQ(f->text(), shown) << where;
        } else if (tag == "err ") {
            std::string want;
            ASSERT_TRUE(std::getline(in, want)) << where;
            lineno++;
            ASSERT_TRUE(want.starts_with("    | ")) << "expected an error line after " << where;
            want = want.substr(6);
            EXPECT_EQ(f, nullptr) << where;
            if (want == "Error: (0)") {
                EXPECT_EQ(err.message, "") << where;
                EXPECT_EQ(filter_error_text(text, err),
                          text.substr(0, text.find_last_not_of(' ') + 1) + "\nError: (0)\n")
                    << where;
            } else {
                const size_t caret = want.find("^ ");
                ASSERT_NE(caret, std::string::npos) << where;
                EXPECT_EQ(err.message, want.substr(caret + 2)) << where;
                EXPECT_EQ(err.pos, int(caret)) << where;
                EXPECT_EQ(filter_error_text(text, err),
                          text + "\n" + std::string(caret, ' ') + "^\nparse_error: " + want.substr(caret + 2) + "\n")
                    << where;
            }
        } else {
            FAIL() << "unknown tag " << where;
        }
    }
    EXPECT_GT(cases, 100);
}

TEST(Filter, KernelGlob) {
    struct Case {
        const char *pat, *str;
        bool match;
    };
    const Case cases[] = {
        {"", "", true},
        {"", "a", false},
        {"*", "", true},
        {"a*b*c", "axxbyyc", true},
        {"a*b*c", "axxbyy", false},
        {"*a", "bba", true},
        {"?", "", false},
        {"??", "ab", true},
        {"[abc]", "b", true},
        {"[!abc]", "b", false},
        {"[a-c]x", "cx", true},
        {"[]]", "]", true},
        {"[a-]", "-", true},
        {"[", "[", true},
        {"[ab", "[ab", true},
        {"\\*", "*", true},
        {"\\*", "a", false},
        {"a*", "a", true},
        {"*ab*ab", "xabyabab", true},
        {"[^a]", "^", true},
        {"[^a]", "b", false},
    };
    for (const Case &c : cases)
        EXPECT_EQ(glob_match(c.pat, strlen(c.pat), c.str, strlen(c.str)), c.match) << c.pat << " ~ " << c.str;
}

TEST(Filter, RecordTooShortDoesNotMatchOrRead) {
    const std::vector<Field> fields = test_fields();
    FilterError err;
    auto f = compile_filter("a == 0 || s == \"\"", fields, &err);
    ASSERT_NE(f, nullptr) << err.message;
    std::vector<uint8_t> rec(16, 0); // ends before a and s
    EXPECT_FALSE(f->match(rec.data(), uint32_t(rec.size()), "t"));
}

TEST(Filter, ManyTermsCompileToABoundedProgram) {
    const std::vector<Field> fields = test_fields();
    std::string text = "a == 0";
    for (int i = 1; i < 5000; i++)
        text += (i % 2 ? " || a == " : " && !(a == ") + std::to_string(i) + (i % 2 ? "" : ")");
    FilterError err;
    auto f = compile_filter(text, fields, &err);
    ASSERT_NE(f, nullptr) << err.message << " at " << err.pos;
    Record r = build("a=4999 b=0 s=\"\" x=0 arr=0 c=0 cm=\"\" comm=\"\" pid=0");
    // 4999 is odd: "|| a == 4999" is the last term.
    EXPECT_TRUE(f->match(r.bytes.data(), uint32_t(r.bytes.size()), ""));
    std::string deep(600, '(');
    deep += "a == 1" + std::string(600, ')');
    EXPECT_EQ(compile_filter(deep, fields, &err), nullptr);
    EXPECT_EQ(err.message, "Too many '('");
}

} // namespace
} // namespace ukp::trace
