#!/usr/bin/env bash
# Formats the C and C++ sources with clang-format 14 and the project's .clang-format;
# with --check, changes nothing and fails if a file is not formatted (scripts/test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files -- src tools tests bench examples include | grep -E '\.(c|cc|cpp|h|hpp)$')
if [ "${1:-}" = "--check" ]; then
    clang-format-14 --dry-run --Werror "${files[@]}"
else
    clang-format-14 -i "${files[@]}"
fi
