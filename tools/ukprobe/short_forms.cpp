#include "short_forms.hpp"

#include "platform/maps.hpp"
#include "symbols/symbols.hpp"

#include <fmt/core.h>

#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

namespace ukprobe {
namespace {

constexpr char kGroup[] = "ukprobe"; // the questions' events: apart from the program's own

// Whether a bare name is an object's: a path, a name with ".so", or a name with a version
// after its first dot ("python3.11", "perl5.36"), which no compiler gives a function
// (theirs are "f.cold", "f.part.0", "f.constprop.0", and "f@@VERSION" for versioned ones).
bool names_an_object(const std::string &name) {
    if (name.find('/') != std::string::npos || name.find(".so") != std::string::npos) return true;
    const size_t dot = name.find('.');
    return dot != std::string::npos && dot > 0 && dot + 1 < name.size() &&
           std::isdigit(static_cast<unsigned char>(name[dot + 1])) != 0 &&
           name.find_first_of("@*?[,!") == std::string::npos;
}

// `spec` as an f: event's [MOD:]FUNCS: a bare MOD stands for all of its functions.
std::string functions_of(const std::string &spec) {
    if (spec.empty()) throw std::runtime_error("which functions? give [MOD:]FUNCS or MOD");
    if (spec.find(':') == std::string::npos && names_an_object(spec)) return spec + ":*";
    return spec;
}

// A function's name as an event's (the kernel's names are C identifiers): anything else
// becomes '_' ("memcpy@@GLIBC_2.14" -> "memcpy__GLIBC_2_14").
std::string event_name(std::string_view func) {
    std::string s;
    for (char c : func) s += std::isalnum(static_cast<unsigned char>(c)) != 0 ? c : '_';
    if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0])) != 0) s.insert(0, "_");
    return s;
}

std::string hist_path(const std::string &group, const std::string &event) {
    return "events/" + group + "/" + event + "/hist";
}

std::string trigger_path(const std::string &group, const std::string &event) {
    return "events/" + group + "/" + event + "/trigger";
}

// A shell word in single quotes.
std::string quoted(const std::string &s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

// The note's argument size ("-4@%eax": -4) as the type a t: event gives $argN.
std::string sdt_type(std::string_view arg) {
    const size_t at = arg.find('@');
    if (at == std::string_view::npos) return "u64"; // no size: the kernel's default
    const std::string_view size = arg.substr(0, at);
    const bool sign = size.starts_with('-');
    const std::string_view bytes = size.substr(sign ? 1 : 0);
    for (std::string_view n : {"1", "2", "4", "8"})
        if (bytes == n) return fmt::format("{}{}", sign ? 's' : 'u', std::stoi(std::string(n)) * 8);
    return "u64";
}

// "[7f0a...] " in a key: an address, each process's own.
size_t address_in(std::string_view key, size_t *len) {
    for (size_t at = key.find('['); at != std::string_view::npos; at = key.find('[', at + 1)) {
        const size_t close = key.find("] ", at);
        if (close == std::string_view::npos) return std::string_view::npos;
        const std::string_view inside = key.substr(at + 1, close - at - 1);
        if (!inside.empty() && inside.find_first_not_of("0123456789abcdef") == std::string_view::npos) {
            *len = close + 2 - at;
            return at;
        }
    }
    return std::string_view::npos;
}

} // namespace

std::string sum_hists(const std::vector<std::string> &texts) {
    if (texts.empty()) return "";
    struct Entry {
        std::string key; // "{ __probe_ip: malloc      }": the line up to "hitcount:"
        uint64_t hits = 0;
    };
    std::vector<Entry> entries;
    std::map<std::string, size_t> by_key;
    uint64_t dropped = 0;
    std::string header;
    bool by_hits = false;
    for (const std::string &text : texts) {
        std::istringstream in(text);
        bool first = &text == &texts.front();
        for (std::string line; std::getline(in, line);) {
            if (line.starts_with("#") && first) {
                header += line + "\n";
                by_hits = by_hits || line.find("sort=hitcount.descending") != std::string::npos;
                continue;
            }
            if (line.starts_with("    Dropped: ")) dropped += std::stoull(line.substr(13));
            if (!line.starts_with("{ ")) continue;
            const size_t h = line.find("} hitcount:");
            if (h == std::string::npos) return "";
            size_t end = 0;
            const uint64_t hits = std::stoull(line.substr(h + 11), &end);
            if (line.find_first_not_of(' ', h + 11 + end) != std::string::npos) return ""; // other values
            std::string key = line.substr(0, h + 1);
            size_t len = 0;
            if (const size_t at = address_in(key, &len); at != std::string::npos) {
                key.erase(at, len);
                key.insert(key.size() - 1, len, ' '); // the closing brace where it was
            }
            const auto [it, fresh] = by_key.try_emplace(key, entries.size());
            if (fresh) entries.push_back({key, 0});
            entries[it->second].hits += hits;
        }
    }
    // The key's first number: a bucket's start ("~ 1000-1249", "~ 2^11").
    const auto number = [](const std::string &key) {
        const size_t d = key.find_first_of("0123456789", key.find(':'));
        return d == std::string::npos ? 0ull : std::strtoull(key.c_str() + d, nullptr, 10);
    };
    std::stable_sort(entries.begin(), entries.end(), [&](const Entry &a, const Entry &b) {
        return by_hits ? a.hits > b.hits : number(a.key) < number(b.key);
    });
    std::string out = header + "\n";
    uint64_t hits = 0;
    for (const Entry &e : entries) {
        out += fmt::format("{} hitcount: {:>10}\n", e.key, e.hits);
        hits += e.hits;
    }
    return out +
           fmt::format("\nTotals:\n    Hits: {}\n    Entries: {}\n    Dropped: {}\n", hits, entries.size(), dropped);
}

Expansion expand_calls(const std::string &spec) {
    const std::string funcs = functions_of(spec);
    Expansion x;
    x.definitions.push_back(fmt::format("f:{}/calls {}", kGroup, funcs));
    // A library has thousands of functions: the kernel's 2048 entries would drop some.
    x.after.push_back(
        {true, trigger_path(kGroup, "calls"), "hist:keys=__probe_ip.sym:sort=hitcount.descending:size=8192"});
    x.answers.push_back(hist_path(kGroup, "calls"));
    return x;
}

Expansion expand_latency(const std::string &spec, unsigned buckets) {
    const std::string target = functions_of(spec);
    const size_t colon = target.rfind(':');
    const std::string func = colon == std::string::npos ? target : target.substr(colon + 1);
    if (func.empty() || func.find_first_of("*?[],!") != std::string::npos)
        throw std::runtime_error(
            fmt::format("latency: '{}' is not one function (a latency is of one function; `calls` takes globs)", spec));
    const std::string name = event_name(func), entry = name + "__entry", exit = name + "__exit",
                      synth = name + "_latency";
    Expansion x;
    x.before.push_back({true, "synthetic_events", synth + " u64 lat; pid_t pid"});
    x.definitions.push_back(fmt::format("f:{}/{} {}", kGroup, entry, target));
    x.definitions.push_back(fmt::format("f:{}/{} {}%return", kGroup, exit, target));
    // histogram.rst's wakeup latency: the entry's time kept per thread, the exit's minus it.
    x.after.push_back({true, trigger_path(kGroup, entry), "hist:keys=common_pid:ts0=common_timestamp.usecs"});
    x.after.push_back({true, trigger_path(kGroup, exit),
                       fmt::format("hist:keys=common_pid:lat=common_timestamp.usecs-$ts0:onmatch({}.{}).{}($lat,"
                                   "common_pid)",
                                   kGroup, entry, synth)});
    x.after.push_back({true, trigger_path("synthetic", synth),
                       buckets != 0 ? fmt::format("hist:keys=lat.buckets={}:sort=lat", buckets)
                                    : std::string("hist:keys=lat.log2:sort=lat")});
    x.answers.push_back(hist_path("synthetic", synth));
    return x;
}

std::string expansion_text(const std::string &question, const Expansion &x) {
    std::string s = fmt::format("# {} is, in /sys/kernel/tracing:\n", question);
    const auto write = [&](const FileWrite &w) {
        s += fmt::format("echo {} {} {}\n", quoted(w.text), w.append ? ">>" : ">", w.path);
    };
    for (const FileWrite &w : x.before) write(w);
    for (const std::string &d : x.definitions) write({true, "dynamic_events", d});
    for (const FileWrite &w : x.after) write(w);
    for (const std::string &a : x.answers) s += "cat " + a + "\n";
    return s;
}

void add_to_run(const Expansion &x, RunOptions *o) {
    o->definitions.insert(o->definitions.end(), x.definitions.begin(), x.definitions.end());
    o->setup.insert(o->setup.end(), x.before.begin(), x.before.end());
    o->setup.insert(o->setup.end(), x.after.begin(), x.after.end());
    // `run` enables what it defines; these events only feed their triggers.
    o->setup.push_back({false, fmt::format("events/{}/enable", kGroup), "0"});
    o->answers.insert(o->answers.end(), x.answers.begin(), x.answers.end());
    if (o->output.empty()) o->output = "/dev/null"; // nothing is recorded but what ran before
}

std::string sdt_list(const std::vector<std::string> &paths, int pid) {
    std::vector<std::string> files = paths;
    if (pid > 0) {
        std::set<std::string> seen;
        const bool ok = ukp::platform::for_each_mapping(pid, [&](const ukp::platform::Mapping &m) {
            if (m.inode != 0 && m.path.starts_with('/') && seen.insert(std::string(m.path)).second)
                files.emplace_back(m.path);
            return true;
        });
        if (!ok) throw std::runtime_error(fmt::format("cannot read the mappings of process {}", pid));
    }
    std::string out;
    for (const std::string &path : files) {
        ukp::sym::Object obj;
        obj.path = path;
        obj.name = path.substr(path.rfind('/') + 1);
        if (pid <= 0 && access(path.c_str(), R_OK) != 0)
            throw std::runtime_error(fmt::format("cannot read {}: {}", path, strerror(errno)));
        struct Probe {
            size_t sites = 0;
            std::string args;
        };
        std::map<std::pair<std::string, std::string>, Probe> probes; // by provider and name
        for (const ukp::sym::SdtProbe &p : ukp::sym::sdt_probes(obj)) {
            Probe &q = probes[{p.provider, p.name}];
            if (q.sites++ != 0) continue;
            size_t n = 0;
            for (size_t at = 0; at < p.args.size();) {
                const size_t end = std::min(p.args.find(' ', at), p.args.size());
                if (end > at)
                    q.args += fmt::format(" $arg{}:{}", ++n, sdt_type(std::string_view(p.args).substr(at, end - at)));
                at = end + 1;
            }
        }
        for (const auto &[key, q] : probes)
            out += fmt::format("{}:{}:{}  {} site{}{}\n", obj.name, key.first, key.second, q.sites,
                               q.sites == 1 ? "" : "s", q.args);
    }
    return out;
}

} // namespace ukprobe
