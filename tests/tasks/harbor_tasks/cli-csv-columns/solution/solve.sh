#!/bin/bash
cat > /app/csvcut.py <<'PY'
import argparse
import csv
import sys


def main() -> None:
    parser = argparse.ArgumentParser(prog="csvcut")
    parser.add_argument("file")
    parser.add_argument("--columns", help="comma-separated header names to keep, in order")
    args = parser.parse_args()
    with open(args.file, newline="") as f:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        rows = csv.reader(f)
        header = next(rows, [])
        keep = list(range(len(header)))
        if args.columns:
            keep = []
            for name in args.columns.split(","):
                if name not in header:
                    print(f"unknown column: {name}", file=sys.stderr)
                    sys.exit(2)
                keep.append(header.index(name))
        writer.writerow([header[i] for i in keep])
        for row in rows:
            writer.writerow([row[i] for i in keep])


if __name__ == "__main__":
    main()
PY
