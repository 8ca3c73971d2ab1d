#!/usr/bin/env bash
# Instructions per request of each `benches/layer.rs` case, counted by callgrind: unlike time,
# the count does not depend on what else the machine is doing. Each case runs twice (N1 and
# N2 requests, built and run the same way); the difference divided by N2 - N1 removes start-up.
#
#   bash benches/instructions.sh            (needs valgrind; builds the bench first)
set -euo pipefail
cd "$(dirname "$0")/.."
exe=$(cargo bench --bench layer --no-run --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*layer-[^"]*\)".*/\1/p' | tail -1)
[ -x "$exe" ] || { echo "bench executable not found" >&2; exit 1; }
n1=1000 n2=3000
count() {
    LAYER_PROFILE=$1 LAYER_PROFILE_N=$2 valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        "$exe" 2>&1 | sed -n 's/.*I *refs: *\([0-9,]*\).*/\1/p' | tr -d ,
}
echo "| case | instructions/request | added by the layer |"
echo "|---|---:|---:|"
for group in header stripe-4KiB; do
    bare=0
    for path in bare new duplicate; do
        a=$(count "$group/$path" $n1) b=$(count "$group/$path" $n2)
        per=$(((b - a) / (n2 - n1)))
        [ "$path" = bare ] && bare=$per
        echo "| $group/$path | $per | $((per - bare)) |"
    done
done
