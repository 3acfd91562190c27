#!/bin/sh
# tests/compat/shell.txt: shell pipelines (fork, exec, pipes, wait) whose output is fixed.
# With an argument N, does it all N times (the attach records need a shell that works a while).
n=${1:-1}
i=0
while [ $i -lt $n ]; do
    i=$((i + 1))
    seq 1 200000 | awk '{ s += $1 } END { printf "sum %.0f\n", s }'
    seq 1 50000 | sort -rn | head -3 | tr '\n' ' '; echo
    yes abcdefgh | head -c 1000000 | wc -c
    for j in 1 2 3 4 5 6 7 8; do echo "line $j" | tr a-z A-Z; done | sort -r | uniq -c | sed 's/^ *//' | tr '\n' ';'; echo
    printf '%s\n' one two three two one | sort | uniq -c | sort -rn | awk '{ print $2 "=" $1 }' | tr '\n' ' '; echo
    x=$(echo hello | cat | cat | rev); echo "sub $x"
    seq 1 3000 | while read -r k; do [ $((k % 1000)) = 0 ] && echo "loop $k"; done
    cat /etc/passwd | grep -c . >/dev/null && echo "grep ok"
done
echo done
