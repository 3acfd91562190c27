#!/usr/bin/env bash
# For every layer L and every other layer M of the build's table (build/layers/table): a
# file of L's that includes a header of M's preprocesses with L's include path exactly when
# L lists M among the layers it uses. And no source reaches around the paths with "../".
set -uo pipefail
cxx=$1 views=$2 src=$3
table=$views/table
[ -s "$table" ] || { echo "no layer table at $table"; exit 1; }
declare -A folder uses
names=()
while read -r name dir rest; do
    names+=("$name")
    folder[$name]=$dir
    uses[$name]=" $rest "
done < "$table"
[ "${#names[@]}" -ge 7 ] || { echo "only ${#names[@]} layers in $table"; exit 1; }

# One header of each layer, to include.
declare -A header
for m in "${names[@]}"; do
    h=$(cd "$src/src" && find "${folder[$m]}" -name '*.hpp' | sort | head -1)
    [ -n "$h" ] || { echo "layer $m has no header"; exit 1; }
    header[$m]=$h
done

fail=0 checked=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for l in "${names[@]}"; do
    for m in "${names[@]}"; do
        [ "$l" = "$m" ] && continue
        printf '#include "%s"\n' "${header[$m]}" > "$tmp/probe.cpp"
        if "$cxx" -std=c++20 -E -I"$src/include" -I"$views/$l" "$tmp/probe.cpp" -o /dev/null 2> "$tmp/err"; then
            seen=yes
        elif grep -q 'No such file or directory' "$tmp/err"; then
            seen=no
        else
            echo "layer $l including ${header[$m]}: an error other than a missing file:"; cat "$tmp/err"; fail=1; continue
        fi
        case "${uses[$l]}" in *" $m "*) want=yes ;; *) want=no ;; esac
        checked=$((checked + 1))
        if [ "$seen" != "$want" ]; then
            echo "layer $l: ${header[$m]} is visible=$seen, but the table says uses $m=$want"
            fail=1
        fi
    done
done
if grep -rn --include='*.cpp' --include='*.hpp' --include='*.S' --include='*.inc' '#include "\.\./' "$src/src" "$src/tools"; then
    echo 'an #include "../" reaches around the layers'
    fail=1
fi
echo "$checked pairs of layers checked"
exit $fail
