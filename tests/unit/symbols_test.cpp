// Symbols layer: loaded objects, symbol tables, "[MOD:]SYM" resolution, bounds.
#include "symbols/symbols.hpp"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <limits.h>
#include <stdlib.h>
#include <time.h>

#include <cerrno>
#include <chrono>
#include <exception>
#include <string>

// Functions of the test executable itself. noipa: no inlining, cloning or merging, so
// each keeps its own symbol and address.
extern "C" {
__attribute__((noipa)) int ukp_symtest_alpha(int x) {
    int sum = 0;
    for (int i = 0; i < x; ++i) sum += i * x;
    return sum;
}

__attribute__((noipa)) int ukp_symtest_beta(int x) { return x * 11 - 4; }

// Defined in symbols_test_lib.cpp too.
__attribute__((noipa)) int ukp_symtest_shared(int x) { return x * 3 - 2; }
}

// Aliases whose ranking only the "sized" and "global" rules decide (the unsized and
// the local names are shorter, so the later tie-breakers would pick them).
asm(R"(
    .pushsection .text
    .p2align 4
    .globl ukp_symtest_asm_sized
    .type ukp_symtest_asm_sized, @function
    .globl ukp_sym_u
    .type ukp_sym_u, @function
ukp_sym_u:
ukp_symtest_asm_sized:
    xorl %eax, %eax
    ret
    .size ukp_symtest_asm_sized, .-ukp_symtest_asm_sized

    .p2align 4
    .globl ukp_symtest_asm_global
    .type ukp_symtest_asm_global, @function
    .type ukp_sym_l, @function
ukp_sym_l:
ukp_symtest_asm_global:
    movl $1, %eax
    ret
    .size ukp_symtest_asm_global, .-ukp_symtest_asm_global
    .size ukp_sym_l, .-ukp_sym_l
    .popsection
)");
extern "C" int ukp_symtest_asm_sized();
extern "C" int ukp_symtest_asm_global();

namespace ukp_symtest {
__attribute__((noipa)) int scaled(int x) { return x * 5 + 3; }
__attribute__((noipa)) double scaled(double x) { return x * 2.5; }
__attribute__((noipa)) std::string label(int x) { return std::to_string(x) + "!"; }

template <typename T>
__attribute__((noipa)) T twice(T x) {
    return x + x;
}
template int twice<int>(int);

struct Counter {
    int n = 0;
    int get() const;
};
__attribute__((noipa)) int Counter::get() const { return n + 1; }
} // namespace ukp_symtest

namespace {

using ukp::sym::load_object;
using ukp::sym::Object;
using ukp::sym::Registry;
using ukp::sym::Symbol;

template <typename F>
uint64_t addr_of(F *fn) {
    return reinterpret_cast<uint64_t>(fn);
}

std::string exe_path() {
    char buf[PATH_MAX];
    return realpath("/proc/self/exe", buf) ? std::string(buf) : std::string();
}

std::string exe_name() {
    std::string p = exe_path();
    return p.substr(p.rfind('/') + 1);
}

Registry &registry() {
    static Registry r;
    r.refresh();
    return r;
}

const Object *object_named(const Registry &r, std::string_view name) {
    for (const auto &o : r.objects()) {
        if (o->name == name) return o.get();
    }
    return nullptr;
}

uint64_t resolved(const Registry &r, std::string_view spec, uint64_t offset = 0) {
    uint64_t addr = 0;
    int rc = r.resolve(spec, offset, &addr);
    EXPECT_EQ(rc, 0) << spec;
    return rc == 0 ? addr : 0;
}

TEST(symbols, DemangleMangledAndPlainNames) {
    EXPECT_EQ(ukp::sym::demangle("_ZN2ns1fEi"), "ns::f(int)");
    EXPECT_EQ(ukp::sym::demangle("malloc"), "malloc");
    EXPECT_EQ(ukp::sym::demangle("i"), "i"); // a bare type encoding is no symbol
    EXPECT_EQ(ukp::sym::demangle("_Z"), "_Z");
    EXPECT_EQ(ukp::sym::demangle("_Zfoo!"), "_Zfoo!");
}

TEST(symbols, RegistryMainProgramComesFirst) {
    Registry &r = registry();
    ASSERT_FALSE(r.objects().empty());
    const Object &main = *r.objects().front();
    EXPECT_TRUE(main.main_program);
    EXPECT_EQ(main.load_index, 0u);
    EXPECT_EQ(main.path, exe_path());
    EXPECT_EQ(main.name, exe_name());
    EXPECT_TRUE(main.contains_exec(addr_of(&ukp_symtest_alpha)));
    EXPECT_EQ(r.object_at(addr_of(&ukp_symtest_alpha)), &main);
    for (size_t i = 1; i < r.objects().size(); ++i) {
        EXPECT_FALSE(r.objects()[i]->main_program);
        EXPECT_GT(r.objects()[i]->load_index, r.objects()[i - 1]->load_index);
    }
}

TEST(symbols, RegistryRefreshReusesParsedObjects) {
    Registry r;
    r.refresh();
    auto before = r.objects();
    r.refresh();
    ASSERT_EQ(r.objects().size(), before.size());
    for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(r.objects()[i].get(), before[i].get()) << before[i]->path;
}

// Two registries of one process (the core's and the tracer's) share the objects the first
// parsed, and only they hold them: once none does, an object goes.
TEST(symbols, RegistriesShareParsedObjects) {
    Registry &global = registry(); // this file's, parsed first
    Registry second;
    second.refresh();
    ASSERT_EQ(second.objects().size(), global.objects().size());
    for (size_t i = 0; i < global.objects().size(); ++i)
        EXPECT_EQ(second.objects()[i].get(), global.objects()[i].get()) << global.objects()[i]->path;
    EXPECT_EQ(global.objects().front().use_count(), 2) << "held by the two registries alone";
    second = Registry();
    EXPECT_EQ(global.objects().front().use_count(), 1);
}

TEST(symbols, ResolveOwnFunctions) {
    Registry &r = registry();
    EXPECT_EQ(resolved(r, "ukp_symtest_alpha"), addr_of(&ukp_symtest_alpha));
    EXPECT_EQ(resolved(r, "ukp_symtest_beta"), addr_of(&ukp_symtest_beta));
    EXPECT_EQ(resolved(r, "ukp_symtest_beta", 4), addr_of(&ukp_symtest_beta) + 4);
}

TEST(symbols, ResolveModuleIsNameOrPath) {
    Registry &r = registry();
    EXPECT_EQ(resolved(r, exe_name() + ":ukp_symtest_alpha"), addr_of(&ukp_symtest_alpha));
    EXPECT_EQ(resolved(r, exe_path() + ":ukp_symtest_beta"), addr_of(&ukp_symtest_beta));
}

TEST(symbols, ResolveLibcMallocMatchesDlsym) {
#if defined(__SANITIZE_ADDRESS__)
    GTEST_SKIP() << "malloc is AddressSanitizer's interceptor";
#endif
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    ASSERT_NE(libc, nullptr) << dlerror();
    uint64_t expected = reinterpret_cast<uint64_t>(dlsym(libc, "malloc"));
    dlclose(libc);
    ASSERT_NE(expected, 0u);

    Registry &r = registry();
    EXPECT_EQ(resolved(r, "libc.so.6:malloc"), expected);
    EXPECT_EQ(resolved(r, "malloc"), expected); // the test program defines none
    const Object *obj = object_named(r, "libc.so.6");
    ASSERT_NE(obj, nullptr);
    EXPECT_FALSE(obj->plt_ranges().empty());
    const Symbol *s = obj->function_at(expected);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->name, "malloc"); // preferred over its alias __libc_malloc
}

TEST(symbols, ResolveCppByMangledDemangledAndBaseName) {
    Registry &r = registry();
    uint64_t as_int = addr_of(static_cast<int (*)(int)>(&ukp_symtest::scaled));
    uint64_t as_double = addr_of(static_cast<double (*)(double)>(&ukp_symtest::scaled));
    EXPECT_EQ(resolved(r, "_ZN11ukp_symtest6scaledEi"), as_int);
    EXPECT_EQ(resolved(r, "ukp_symtest::scaled(int)"), as_int);
    EXPECT_EQ(resolved(r, "ukp_symtest::scaled(double)"), as_double);
    // Overloads: the base name answers with the first one in address order.
    EXPECT_EQ(resolved(r, "ukp_symtest::scaled"), std::min(as_int, as_double));
}

TEST(symbols, ResolveCppTemplatesConstMembersAndAbiTags) {
    Registry &r = registry();
    EXPECT_EQ(resolved(r, "ukp_symtest::twice<int>"), addr_of(&ukp_symtest::twice<int>));
    EXPECT_EQ(resolved(r, "int ukp_symtest::twice<int>(int)"), addr_of(&ukp_symtest::twice<int>));

    uint64_t get = resolved(r, "_ZNK11ukp_symtest7Counter3getEv");
    EXPECT_NE(get, 0u);
    EXPECT_EQ(resolved(r, "ukp_symtest::Counter::get() const"), get);
    EXPECT_EQ(resolved(r, "ukp_symtest::Counter::get"), get);

    uint64_t label = addr_of(&ukp_symtest::label);
    EXPECT_EQ(resolved(r, "ukp_symtest::label[abi:cxx11](int)"), label);
    EXPECT_EQ(resolved(r, "ukp_symtest::label[abi:cxx11]"), label);
    EXPECT_EQ(resolved(r, "ukp_symtest::label"), label);
}

TEST(symbols, ResolveDoubleColonIsNoModuleSeparator) {
    Registry &r = registry();
    uint64_t as_int = addr_of(static_cast<int (*)(int)>(&ukp_symtest::scaled));
    // No object is named "ukp_symtest": a split at "::" would fail.
    EXPECT_EQ(resolved(r, "ukp_symtest::scaled(int)"), as_int);
    EXPECT_EQ(resolved(r, exe_name() + ":ukp_symtest::scaled(int)"), as_int);
    EXPECT_EQ(resolved(r, exe_name() + ":ukp_symtest::label[abi:cxx11](int)"), addr_of(&ukp_symtest::label));
}

TEST(symbols, ResolveUnknownSymbolOrModule) {
    Registry &r = registry();
    uint64_t addr = 12345;
    EXPECT_EQ(r.resolve("ukp_symtest_no_such_function", 0, &addr), -ENOENT);
    EXPECT_EQ(r.resolve("no_such_object.so:malloc", 0, &addr), -ENOENT);
    EXPECT_EQ(r.resolve("libc.so.6:ukp_symtest_alpha", 0, &addr), -ENOENT);
    EXPECT_EQ(r.resolve("libc:malloc", 0, &addr), -ENOENT); // names match exactly
    EXPECT_EQ(r.resolve("ukp_symtest::no_such(int)", 0, &addr), -ENOENT);
    EXPECT_EQ(addr, 12345u);
    EXPECT_EQ(r.resolve("", 0, &addr), -EINVAL);
    EXPECT_EQ(r.resolve(":malloc", 0, &addr), -EINVAL);
    EXPECT_EQ(r.resolve("libc.so.6:", 0, &addr), -EINVAL);
    EXPECT_EQ(r.resolve("malloc", 0, nullptr), -EINVAL);
}

TEST(symbols, ResolveMainProgramBeforeLibraryUnlessModuleGiven) {
#ifndef UKP_SYMBOLS_FIXTURE
    GTEST_SKIP() << "symbols_fixtures.cmake is not included by tests/unit/CMakeLists.txt";
#else
    void *lib = dlopen(UKP_SYMBOLS_FIXTURE, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(lib, nullptr) << dlerror();
    uint64_t in_lib = reinterpret_cast<uint64_t>(dlsym(lib, "ukp_symtest_shared"));
    ASSERT_NE(in_lib, 0u);
    ASSERT_NE(in_lib, addr_of(&ukp_symtest_shared));

    Registry r;
    r.refresh();
    std::string path = UKP_SYMBOLS_FIXTURE;
    std::string name = path.substr(path.rfind('/') + 1);
    EXPECT_EQ(resolved(r, "ukp_symtest_shared"), addr_of(&ukp_symtest_shared));
    EXPECT_EQ(resolved(r, exe_name() + ":ukp_symtest_shared"), addr_of(&ukp_symtest_shared));
    EXPECT_EQ(resolved(r, name + ":ukp_symtest_shared"), in_lib);
    EXPECT_EQ(resolved(r, path + ":ukp_symtest_shared"), in_lib);
    // Only the library has this one: found without MOD too.
    uint64_t only = reinterpret_cast<uint64_t>(dlsym(lib, "ukp_symtest_lib_only"));
    EXPECT_EQ(resolved(r, "ukp_symtest_lib_only"), only);
    dlclose(lib);
#endif
}

TEST(symbols, BoundsFunctionAtOwnFunction) {
    Registry &r = registry();
    const Object *main = r.object_at(addr_of(&ukp_symtest_alpha));
    ASSERT_NE(main, nullptr);
    uint64_t start = addr_of(&ukp_symtest_alpha);
    const Symbol *s = main->function_at(start);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->name, "ukp_symtest_alpha");
    EXPECT_EQ(s->value, start);
    ASSERT_GT(s->size, 1u);
    EXPECT_EQ(main->function_at(start + s->size - 1), s);
    EXPECT_NE(main->function_at(start + s->size), s);
    EXPECT_EQ(main->find("ukp_symtest_alpha"), s);
}

TEST(symbols, BoundsAliasesPreferSizedThenGlobal) {
    Registry &r = registry();
    uint64_t sized = addr_of(&ukp_symtest_asm_sized);
    uint64_t global = addr_of(&ukp_symtest_asm_global);
    const Object *main = r.object_at(sized);
    ASSERT_NE(main, nullptr);
    ASSERT_NE(main->function_at(sized), nullptr);
    EXPECT_EQ(main->function_at(sized)->name, "ukp_symtest_asm_sized");
    EXPECT_EQ(main->function_at(sized + 1)->name, "ukp_symtest_asm_sized");
    ASSERT_NE(main->function_at(global), nullptr);
    EXPECT_EQ(main->function_at(global)->name, "ukp_symtest_asm_global");
    // The other names still resolve.
    EXPECT_EQ(resolved(r, "ukp_sym_u"), sized);
    EXPECT_EQ(resolved(r, "ukp_sym_l"), global);
    ASSERT_NE(main->find("ukp_sym_u"), nullptr);
    EXPECT_EQ(main->find("ukp_sym_u")->size, 0u);
}

// A hand-made table: aliases, a size-0 function, data, nested functions.
Object synthetic() {
    Object o;
    o.name = "synthetic";
    o.set_symbols({
        {"alpha", 0x1000, 0x10, true},
        {"alpha_alias", 0x1000, 0x10, true},
        {"zero", 0x1020, 0, true},
        {"datum", 0x1030, 8, false},
        {"outer", 0x2000, 0x100, true},
        {"inner", 0x2010, 0x10, true},
        {"twin", 0x3000, 4, false},
        {"twin", 0x3010, 4, true},
        {"_ZN2ns1fEi", 0x4000, 4, true},
        {"_ZN2ns1fEd", 0x4010, 4, true},
        {"_ZN2ns3varE", 0x4020, 4, false},
    });
    return o;
}

TEST(symbols, BoundsFunctionAtSyntheticTable) {
    Object o = synthetic();
    EXPECT_EQ(o.function_at(0xfff), nullptr);
    ASSERT_NE(o.function_at(0x1000), nullptr);
    EXPECT_EQ(o.function_at(0x1000)->name, "alpha"); // first of the aliases
    EXPECT_EQ(o.function_at(0x100f)->name, "alpha");
    EXPECT_EQ(o.function_at(0x1010), nullptr);
    ASSERT_NE(o.function_at(0x1020), nullptr);
    EXPECT_EQ(o.function_at(0x1020)->name, "zero");
    EXPECT_EQ(o.function_at(0x1021), nullptr);
    EXPECT_EQ(o.function_at(0x1030), nullptr); // data is no function
    EXPECT_EQ(o.function_at(0x2000)->name, "outer");
    EXPECT_EQ(o.function_at(0x2015)->name, "inner");
    EXPECT_EQ(o.function_at(0x2020)->name, "outer");
    EXPECT_EQ(o.function_at(0x20ff)->name, "outer");
    EXPECT_EQ(o.function_at(0x2100), nullptr);

    ASSERT_NE(o.function_at_or_before(0x1010), nullptr);
    EXPECT_EQ(o.function_at_or_before(0x1010)->name, "alpha");
    EXPECT_EQ(o.function_at_or_before(0x1038)->name, "zero");
    EXPECT_EQ(o.function_at_or_before(0xfff), nullptr);
}

TEST(symbols, FindSyntheticTable) {
    Object o = synthetic();
    ASSERT_NE(o.find("twin"), nullptr);
    EXPECT_EQ(o.find("twin")->value, 0x3010u); // the function, though data comes first
    EXPECT_EQ(o.find("datum")->value, 0x1030u);
    EXPECT_EQ(o.find("ns::f(double)")->value, 0x4010u);
    EXPECT_EQ(o.find("ns::f")->value, 0x4000u);
    EXPECT_EQ(o.find("ns::var")->value, 0x4020u);
    EXPECT_EQ(o.find("ns::g"), nullptr);
    EXPECT_EQ(o.find(""), nullptr);

    // A copy builds its own tables from its own symbols.
    Object copy = o;
    std::vector<Symbol> fewer = copy.symbols();
    fewer.erase(fewer.begin() + 8);
    copy.set_symbols(std::move(fewer));
    EXPECT_EQ(copy.find("ns::f")->value, 0x4010u);
    EXPECT_EQ(o.find("ns::f")->value, 0x4000u);
}

TEST(symbols, LocateSymbolAndOffset) {
    Registry &r = registry();
    auto loc = r.locate(addr_of(&ukp_symtest_alpha) + 3);
    ASSERT_NE(loc.object, nullptr);
    EXPECT_TRUE(loc.object->main_program);
    ASSERT_NE(loc.symbol, nullptr);
    EXPECT_EQ(loc.symbol->name, "ukp_symtest_alpha");
    EXPECT_EQ(loc.offset, 3u);

    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    ASSERT_NE(libc, nullptr);
    uint64_t getpid_addr = reinterpret_cast<uint64_t>(dlsym(libc, "getpid"));
    dlclose(libc);
    loc = r.locate(getpid_addr + 1);
    ASSERT_NE(loc.object, nullptr);
    EXPECT_EQ(loc.object->name, "libc.so.6");
    ASSERT_NE(loc.symbol, nullptr);
    EXPECT_EQ(loc.symbol->value, getpid_addr);
    EXPECT_EQ(loc.offset, 1u);

    int on_stack = 0;
    loc = r.locate(reinterpret_cast<uint64_t>(&on_stack));
    EXPECT_EQ(loc.object, nullptr);
    EXPECT_EQ(loc.symbol, nullptr);
}

TEST(symbols, RegistryRefreshSeesDlopen) {
    // A library nothing in this process has loaded yet.
    const char *candidates[] = {"libcrypt.so.1", "libbz2.so.1.0", "liblzma.so.5", "libz.so.1"};
    const char *chosen = nullptr;
    for (const char *c : candidates) {
        void *h = dlopen(c, RTLD_NOW | RTLD_NOLOAD);
        if (!h) {
            chosen = c;
            break;
        }
        dlclose(h);
    }
    if (!chosen) GTEST_SKIP() << "every candidate library is loaded already";

    Registry r;
    r.refresh();
    EXPECT_EQ(object_named(r, chosen), nullptr);
    void *h = dlopen(chosen, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(h, nullptr) << dlerror();
    r.refresh();
    const Object *obj = object_named(r, chosen);
    ASSERT_NE(obj, nullptr);
    EXPECT_FALSE(obj->exec_ranges.empty());
    EXPECT_FALSE(obj->symbols().empty());
    EXPECT_GT(obj->load_index, 0u);
    EXPECT_EQ(r.objects().front()->name, exe_name());
    dlclose(h);
}

TEST(symbols, RegistryVdsoSymbolsWork) {
    Registry &r = registry();
    const Object *vdso = nullptr;
    for (const auto &o : r.objects()) {
        if (o->name.starts_with("linux-vdso")) vdso = o.get();
    }
    ASSERT_NE(vdso, nullptr);
    EXPECT_FALSE(vdso->symbols().empty());
    uint64_t addr = resolved(r, vdso->name + ":__vdso_clock_gettime");
    ASSERT_TRUE(vdso->contains_exec(addr));
    const Symbol *s = vdso->function_at(addr);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->value, addr);
    // The address is the real thing: calling it reads the clock.
    auto fn = reinterpret_cast<int (*)(clockid_t, timespec *)>(addr);
    timespec ts{};
    EXPECT_EQ(fn(CLOCK_MONOTONIC, &ts), 0);
    EXPECT_TRUE(ts.tv_sec != 0 || ts.tv_nsec != 0);
}

TEST(symbols, LibstdcxxLoadsAndFindsDemangledNames) {
    const Object *reg_obj = object_named(registry(), "libstdc++.so.6");
    ASSERT_NE(reg_obj, nullptr);
    auto start = std::chrono::steady_clock::now();
    auto obj = load_object(reg_obj->path, reg_obj->bias);
    ASSERT_NE(obj, nullptr);
    EXPECT_GT(obj->symbols().size(), 1000u);
    const Symbol *s = obj->find("std::terminate");
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
    ASSERT_NE(s, nullptr);
    EXPECT_TRUE(s->function);
    EXPECT_EQ(s->value, addr_of(&std::terminate));
    EXPECT_EQ(obj->find("std::terminate()"), s);
    EXPECT_EQ(obj->find("_ZSt9terminatev"), s);
    EXPECT_LT(ms, 5000) << "parsing and demangling libstdc++ took " << ms << " ms";
    RecordProperty("libstdcxx_load_and_demangle_ms", static_cast<int>(ms));

    uint64_t addr = 0;
    EXPECT_EQ(registry().resolve("libstdc++.so.6:std::terminate", 0, &addr), 0);
    EXPECT_EQ(addr, s->value);
}

TEST(symbols, LoadObjectFilesThatAreNoElf) {
    EXPECT_EQ(load_object("/nonexistent/ukp_symtest.so", 0), nullptr);
    EXPECT_EQ(load_object("/etc/passwd", 0), nullptr);
}

TEST(symbols, LoadObjectAppliesBiasAndSorts) {
    const Object &main = *registry().objects().front();
    auto a = load_object("/proc/self/exe", main.bias);
    auto b = load_object("/proc/self/exe", main.bias + 0x1000);
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(a->name, "exe");
    ASSERT_EQ(a->symbols().size(), b->symbols().size());
    ASSERT_NE(a->find("ukp_symtest_beta"), nullptr);
    EXPECT_EQ(a->find("ukp_symtest_beta")->value, addr_of(&ukp_symtest_beta));
    EXPECT_EQ(b->find("ukp_symtest_beta")->value, addr_of(&ukp_symtest_beta) + 0x1000);
    EXPECT_EQ(a->exec_ranges, main.exec_ranges);
    for (size_t i = 1; i < a->symbols().size(); ++i) ASSERT_LE(a->symbols()[i - 1].value, a->symbols()[i].value);
    for (const Symbol &s : a->symbols()) ASSERT_NE(s.value, main.bias) << s.name; // zero-valued symbols are skipped
}

} // namespace
