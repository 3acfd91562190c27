#!/usr/bin/env bash
# Installs the Debian 12 packages ukprobes needs. Idempotent: when every package is
# already present it returns without touching apt.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config
  dpkg-dev               # cpack -G DEB: dpkg-shlibdeps finds the package's dependencies
  groff-base             # tests/install: the manual page ukprobe(1) is rendered and checked
  libzydis-dev           # x86-64 decoder and encoder (relocator)
  libelf-dev             # ELF symbol tables
  libdw-dev              # DWARF: the types of f: arguments given by name
  libc6-dbg              # tests: glibc's separate debug information (f: arguments by name on libc)
  libfmt-dev             # formatting (GCC 12 has no <format>)
  libcli11-dev           # command line of the ukprobe tool
  libfuse3-dev fuse3     # ukprobe mount: libfuse3, and fusermount3 for mounts by non-root users
  libgtest-dev libgmock-dev googletest
  libbenchmark-dev
  libpython3.11          # bench/fprobe_bench: a large library loaded while the program runs
  libunwind8             # tests: another unwinder through kretprobed frames
  gdb                    # tests: gdb walks through kretprobed frames (JIT interface)
  clang libclang-rt-dev  # scripts/fuzz.sh: libFuzzer and its sanitizer runtimes
  clang-format-14        # scripts/format.sh: the sources checked against .clang-format
  sqlite3 python3        # tests/e2e/compare.txt: real programs traced by ukprobes and the kernel
  # tests/compat (scripts/compat.sh): real programs run plain, preloaded, under ukprobe run
  # and attached: PostgreSQL 15 + pgbench, MariaDB + mysqlslap, Redis + redis-benchmark,
  # nginx + ApacheBench, python3's own regression tests, node, perl, make, a JVM (java runs
  # tests/compat/Spawner.java from source: the JDK's compiler)
  postgresql postgresql-contrib redis-server redis-tools libjemalloc2 libpython3.11-testsuite nodejs perl make
  nginx apache2-utils mariadb-server mariadb-client
  openjdk-17-jdk-headless
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
