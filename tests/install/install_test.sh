#!/usr/bin/env bash
# The installation as its users get it (tests/install/CMakeLists.txt registers each mode):
#
#   install_test.sh files|consumer|ukprobe|man|deb BUILD_DIR SOURCE_DIR LIBDIR [SANITIZE]
#
# files:    `cmake --install BUILD_DIR --prefix TMP` puts the headers, both libraries (the
#           shared one with its SONAME), ukprobe, its manual page, the documents, gdb's
#           script, the CMake package and ukprobes.pc in place.
# consumer: a program (consumer/consumer.c) that probes a function of its own is built
#           against the installed files only, with find_package(ukprobes CONFIG) (shared
#           and static library) and with pkg-config, and each build runs and passes.
# ukprobe:  the installed ukprobe preloads the installed agent, not the build tree's, and
#           the build tree's ukprobe still preloads the build tree's agent.
# man:      the installed manual page ukprobe(1) renders without a warning from groff, and
#           names every command and every option that the installed ukprobe's --help and
#           `ukprobe COMMAND --help` list.
# deb:      cpack -G DEB makes a package holding those files, with its dependencies.
#
# LIBDIR is the library directory relative to the prefix (CMAKE_INSTALL_LIBDIR). SANITIZE
# is the build's UKP_SANITIZE: programs built against a sanitized library are built with
# the same sanitizers. Exit status 77: skipped (ctest SKIP_RETURN_CODE).
set -euo pipefail
mode=$1 build=$2 src=$3 libdir=$4 sanitize=${5:-}
consumer_src=$src/tests/install/consumer

tmp=$(mktemp -d /tmp/ukp-install-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
unset UKP_AGENT LD_PRELOAD

fail() {
	echo "FAIL: $*" >&2
	exit 1
}

install_prefix() {
	cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1 ||
		{ cat "$tmp/install.log" >&2; fail "cmake --install $build --prefix $prefix"; }
}

sanitize_flags=()
if [ -n "$sanitize" ]; then sanitize_flags=("-fsanitize=$sanitize" -fno-omit-frame-pointer); fi

case $mode in
files)
	install_prefix
	for f in include/ukprobes/kprobes.h include/ukprobes/hw_breakpoint.h include/ukprobes/trace.h include/ukprobes/ukprobes.hpp \
		bin/ukprobe "$libdir/libukprobes.so" "$libdir/libukprobes.so.0" "$libdir/libukprobes.a" \
		"$libdir/cmake/ukprobes/ukprobesConfig.cmake" "$libdir/cmake/ukprobes/ukprobesConfigVersion.cmake" \
		"$libdir/cmake/ukprobes/ukprobesTargets.cmake" "$libdir/cmake/ukprobes/ukprobesStaticTargets.cmake" \
		"$libdir/pkgconfig/ukprobes.pc" share/man/man1/ukprobe.1.gz share/doc/ukprobes/README.md \
		share/doc/ukprobes/cli.md share/doc/ukprobes/tracer.md share/doc/ukprobes/guide.md \
		share/doc/ukprobes/reference.md; do
		[ -e "$prefix/$f" ] || fail "$f is not installed"
	done
	[ -x "$prefix/bin/ukprobe" ] || fail "bin/ukprobe is not executable"
	soname=$(readelf -d "$prefix/$libdir/libukprobes.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
	[ "$soname" = libukprobes.so.0 ] || fail "SONAME is '$soname', not libukprobes.so.0"
	find "$prefix/share/gdb/auto-load" -name 'libukprobes.so.*-gdb.py' | grep -q . ||
		fail "gdb's auto-load script is not installed"
	# Nothing of the build tree or the sources leaks into the installed package files.
	if grep -rlE "$build|$src/(src|include)" "$prefix/$libdir/cmake" "$prefix/$libdir/pkgconfig"; then
		fail "the installed package files name the build or source tree"
	fi
	# The shared library's users get its headers and nothing else: no decoder, libelf or fmt.
	if grep -E 'INTERFACE_LINK_LIBRARIES' "$prefix/$libdir/cmake/ukprobes/ukprobesTargets.cmake"; then
		fail "ukprobes::ukprobes passes link dependencies on to its users"
	fi
	echo "installed: headers, libukprobes.so ($soname), libukprobes.a, ukprobe, ukprobe(1), the documents, the CMake package, ukprobes.pc"
	;;

consumer)
	install_prefix
	# With CMake, from the installed package only (no package registry, no other prefix).
	cmake -S "$consumer_src" -B "$tmp/cmake" -DCMAKE_PREFIX_PATH="$prefix" \
		-DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
		-DCMAKE_C_FLAGS="${sanitize_flags[*]}" -DCMAKE_CXX_FLAGS="${sanitize_flags[*]}" \
		-DCMAKE_EXE_LINKER_FLAGS="${sanitize_flags[*]}" >"$tmp/cmake.log" 2>&1 ||
		{ cat "$tmp/cmake.log" >&2; fail "the consumer project does not configure"; }
	found=$(sed -n 's/^ukprobes_DIR:PATH=//p' "$tmp/cmake/CMakeCache.txt")
	[ "$found" = "$prefix/$libdir/cmake/ukprobes" ] || fail "find_package found ukprobes in '$found'"
	cmake --build "$tmp/cmake" >"$tmp/build.log" 2>&1 ||
		{ cat "$tmp/build.log" >&2; fail "the consumer project does not build"; }
	[ -x "$tmp/cmake/consumer_static" ] || fail "ukprobes::ukprobes_static is not defined"
	LD_LIBRARY_PATH="$prefix/$libdir" "$tmp/cmake/consumer" || fail "consumer (find_package, shared) failed"
	"$tmp/cmake/consumer_static" || fail "consumer (find_package, static) failed"
	ldd "$tmp/cmake/consumer_static" | grep -q libukprobes && fail "consumer_static loads libukprobes.so"

	# With pkg-config and the compiler alone.
	export PKG_CONFIG_PATH="$prefix/$libdir/pkgconfig"
	incdir=$(pkg-config --variable=includedir ukprobes)
	[ "$(realpath "$incdir")" = "$prefix/include" ] || fail "pkg-config's includedir is $incdir"
	# shellcheck disable=SC2046 # pkg-config's flags are words
	cc "${sanitize_flags[@]}" -o "$tmp/consumer_pc" "$consumer_src/consumer.c" $(pkg-config --cflags --libs ukprobes) ||
		fail "the consumer does not build with pkg-config's flags"
	LD_LIBRARY_PATH="$prefix/$libdir" "$tmp/consumer_pc" || fail "consumer (pkg-config) failed"
	;;

ukprobe)
	if [ -n "$sanitize" ]; then
		echo "skipped: built with -fsanitize=$sanitize; its agent cannot be preloaded into uninstrumented programs"
		exit 77
	fi
	install_prefix
	# cat prints its own mappings: the agent ukprobe run preloaded into it, and only that one.
	loaded() {
		"$1" run -e 'p:t/m libc.so.6:malloc' -- /bin/cat /proc/self/maps >"$tmp/out" 2>"$tmp/err" ||
			{ cat "$tmp/out" "$tmp/err" >&2; fail "$1 run failed"; }
		grep -o '/[^ ]*libukprobes[^ ]*' "$tmp/out" | sort -u
	}
	agent=$(loaded "$prefix/bin/ukprobe")
	[ "$agent" = "$(realpath "$prefix/$libdir/libukprobes.so.0")" ] ||
		fail "the installed ukprobe preloaded '$agent', not the agent installed beside it"
	# The event fired in cat and its count is in kprobe_profile.
	grep -qE '^ *cat-[0-9]+ .* m: \(malloc' "$tmp/out" || { cat "$tmp/out" >&2; fail "no trace line of t/m"; }
	grep -qE '^ *m +[1-9][0-9]* +0$' "$tmp/err" ||
		{ cat "$tmp/err" >&2; fail "no hits of t/m in kprobe_profile"; }
	echo "installed ukprobe: $agent"
	agent=$(loaded "$build/tools/ukprobe/ukprobe")
	[ "$agent" = "$(realpath "$build/src/libukprobes.so")" ] ||
		fail "the build tree's ukprobe preloaded '$agent', not the build tree's agent"
	echo "build tree's ukprobe: $agent"
	;;

man)
	command -v groff >/dev/null || fail "groff is not installed (scripts/install-deps.sh installs groff-base)"
	install_prefix
	page=$(find "$prefix" -path '*/man1/ukprobe.1.gz')
	[ -n "$page" ] || fail "ukprobe.1.gz is not installed in a man1 directory"
	# Rendered as man(1) would, with every warning on: none may come.
	zcat "$page" | groff -man -ww -z 2>"$tmp/warnings" || fail "groff failed on ${page#"$prefix"/}"
	[ ! -s "$tmp/warnings" ] || { cat "$tmp/warnings" >&2; fail "groff warns about ${page#"$prefix"/}"; }
	# The text a reader sees: no hyphenation, lines long enough that no option is broken.
	zcat "$page" | groff -man -Tascii -rLL=200n -rHY=0 -P-cbou >"$tmp/page" 2>/dev/null
	# The tags of the COMMANDS section's entries (indented 7 columns): one per command.
	sed -n '/^COMMANDS$/,/^[A-Z]/p' "$tmp/page" | sed -n 's/^       \([a-z][^ ]*\).*/\1/p' >"$tmp/entries"
	ukprobe=$prefix/bin/ukprobe
	# The commands and options of a --help text: its "Subcommands:" lines' first words, its
	# "Options:" lines' flags (-h,--help INT ...).
	section() { awk -v s="$1" '$0 == s {on = 1; next} /^[^ ]/ {on = 0} on && /^  [^ ]/ {print $1}'; }
	"$ukprobe" --help >"$tmp/help" || fail "ukprobe --help failed"
	commands=$(section Subcommands: <"$tmp/help")
	[ -n "$commands" ] || { cat "$tmp/help" >&2; fail "no command in ukprobe --help"; }
	missing=() options=0
	for c in "" $commands; do
		if [ -n "$c" ]; then
			"$ukprobe" "$c" --help >"$tmp/help" || fail "ukprobe $c --help failed"
			grep -qxF "$c" "$tmp/entries" || missing+=("the command $c")
		fi
		for flag in $(section Options: <"$tmp/help" | tr ',' ' '); do
			options=$((options + 1))
			# A whole word of the page: --to is not --top, -o is not -on.
			grep -qE -- "(^|[^-[:alnum:]_])$flag([^-[:alnum:]_]|\$)" "$tmp/page" ||
				missing+=("${c:-ukprobe}'s $flag")
		done
	done
	if [ ${#missing[@]} -gt 0 ]; then
		printf '  %s\n' "${missing[@]}" >&2
		fail "${page#"$prefix"/} does not describe what --help lists (docs/ukprobe.1)"
	fi
	echo "ukprobe(1): $(wc -w <<<"$commands") commands and $options options of the help described, no warning"
	;;

deb)
	(cd "$tmp" && cpack -G DEB --config "$build/CPackConfig.cmake" -B "$tmp/pkg" >"$tmp/cpack.log" 2>&1) ||
		{ cat "$tmp/cpack.log" >&2; fail "cpack -G DEB failed"; }
	deb=$(find "$tmp/pkg" -maxdepth 1 -name 'ukprobes_*_amd64.deb' | head -n1)
	[ -n "$deb" ] || { ls -R "$tmp/pkg" >&2; fail "no ukprobes_*_amd64.deb"; }
	echo "package: $(basename "$deb")"
	dpkg-deb -c "$deb" | awk '{print $6}' | sed 's,^\./,/,' >"$tmp/contents"
	p=$(sed -n 's/^set(CPACK_PACKAGING_INSTALL_PREFIX "\(.*\)")$/\1/p' "$build/CPackConfig.cmake")
	for f in "$p/bin/ukprobe" "$p/$libdir/libukprobes.so" "$p/$libdir/libukprobes.so.0" "$p/$libdir/libukprobes.a" \
		"$p/include/ukprobes/kprobes.h" "$p/include/ukprobes/hw_breakpoint.h" "$p/include/ukprobes/trace.h" "$p/include/ukprobes/ukprobes.hpp" \
		"$p/$libdir/cmake/ukprobes/ukprobesConfig.cmake" "$p/$libdir/cmake/ukprobes/ukprobesConfigVersion.cmake" \
		"$p/$libdir/pkgconfig/ukprobes.pc" "$p/share/man/man1/ukprobe.1.gz" "$p/share/doc/ukprobes/cli.md"; do
		grep -qxF "$f" "$tmp/contents" || { cat "$tmp/contents" >&2; fail "the package lacks $f"; }
	done
	dpkg-deb -x "$deb" "$tmp/root"
	soname=$(readelf -d "$tmp/root$p/$libdir/libukprobes.so.0" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
	[ "$soname" = libukprobes.so.0 ] || fail "the packaged library's SONAME is '$soname'"
	depends=$(dpkg-deb -f "$deb" Depends)
	echo "Depends: $depends"
	for lib in libc6 libelf1 libdw1 libfmt libzydis libfuse3; do
		grep -q "$lib" <<<"$depends" || fail "Depends lacks $lib"
	done
	[ -n "$(dpkg-deb -f "$deb" Maintainer)" ] || fail "no Maintainer"
	[ -n "$(dpkg-deb -f "$deb" Description)" ] || fail "no Description"
	dpkg-deb --ctrl-tarfile "$deb" | tar -t | grep -q shlibs || fail "the package has no shlibs file"
	;;

*)
	fail "unknown mode $mode"
	;;
esac
echo "PASS: $mode"
