#!/bin/sh
cat > linestats.sh <<'SH'
#!/bin/sh
# linestats.sh FILE: "lines N", "nonempty N", "longest N" of FILE
awk '{ n++; if (length($0) > 0) e++; if (length($0) > m) m = length($0) }
     END { printf "lines %d\nnonempty %d\nlongest %d\n", n, e, m }' "$1"
SH
