# For tests/compat/watch.txt: a script whose words bash allocates (WORD_DESC), flags, and
# disposes of, in loops, parameter expansions and word splitting.
for i in 1 2 3; do echo "$i $HOME" >/dev/null; done
x="a b"; set -- $x; echo "$# ${x%% *}"
