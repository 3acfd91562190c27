// A function's parameters and types from its object's debug information (DWARF, in the
// object or in a separate file found by build-id or .gnu_debuglink under /usr/lib/debug):
// what an f: event's arguments by name read, as fprobetrace.rst's BTF arguments in the
// kernel; and structs by name, for an e: event's typecast (eprobetrace.rst's
// (STRUCT)FIELD->MEMBER). docs/tracer.md, "Arguments by name" and "Event probes".
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ukp::sym {

// Why an access expression cannot be read (each is one of the kernel's BTF errors).
enum class AccessFail {
    kNone,
    kNoVariable,         // NAME is no parameter of the function
    kNotPointerToStruct, // "->" after something that is no pointer to a struct or union
    kNoField,            // no such member
    kStructByValue,      // a struct or union read as a value (a parameter passed by value)
    kUnsupportedType,    // a float, a 128-bit integer, an array of other than char
    kVoid,               // $retval of a function that returns void
    kBadHyphen,          // "-" not followed by ">"
    kNotInRegister,      // a parameter the calling convention does not put where $argN reads
    kNoType,             // no struct or union of that name (a typecast's)
};

// How an expression is read, in the kprobe language.
struct TypedAccess {
    std::string fetch;        // its value: "$arg2", "+8($arg1)", "+0(+16($retval))"
    std::string type;         // its value's type: "s32", "u64", "x64" (a pointer)
    bool stringable = false;  // a char * or a char []: ":string" reads the characters
    std::string string_fetch; // then, the address of the characters: "+0($arg2)", "+16($arg1)"
    std::string name;         // the expression's last name: the argument's default name
};

class FunctionTypes {
public:
    virtual ~FunctionTypes() = default;
    // EXPR: a parameter's NAME or $retval, then "->FIELD" and ".FIELD" (an anonymous
    // struct's or union's members found through it, as C does). kNone and *out, or the
    // failure and *pos, where in EXPR it is.
    virtual AccessFail access(std::string_view expr, TypedAccess *out, size_t *pos) const = 0;
    // The parameters' names in order ($arg*).
    virtual std::vector<std::string> parameters() const = 0;
};

// Structs and unions by name, in the debug information of some objects.
class StructTypes {
public:
    virtual ~StructTypes() = default;
    // The value BASE reads (a fetch in the kprobe language: "$ptr") taken as a pointer to
    // the struct or union TYPE_NAME (or a typedef of one), then EXPR from it: "->FIELD",
    // then "->FIELD" and ".FIELD" as FunctionTypes::access reads them. kNone and *out, or
    // the failure and *pos, where in EXPR it is (kNoType: TYPE_NAME is not found).
    virtual AccessFail access(std::string_view type_name, std::string_view base, std::string_view expr,
                              TypedAccess *out, size_t *pos) const = 0;
};

// The structs of the objects at `paths`, looked for in that order; null when none of them
// has debug information.
std::shared_ptr<const StructTypes> struct_types(const std::vector<std::string> &paths);

// The types of the function at file address `file_addr` (its symbol's value, the load
// bias subtracted) of the object at `path`; null when no debug information covers it.
// The object's debug information stays open for the process's life once read.
std::shared_ptr<const FunctionTypes> function_types(const std::string &path, uint64_t file_addr);

} // namespace ukp::sym
