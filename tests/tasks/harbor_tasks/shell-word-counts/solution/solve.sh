#!/bin/bash
cat > topwords.sh <<'SH'
#!/bin/bash
# topwords.sh FILE N: the N most frequent words of FILE as "COUNT WORD"
tr -cs 'A-Za-z' '\n' < "$1" | tr 'A-Z' 'a-z' | grep -v '^$' | sort | uniq -c \
  | sort -k1,1nr -k2,2 | head -n "$2" | awk '{print $1, $2}'
SH
