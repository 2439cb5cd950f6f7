import argparse
import csv
import sys


def main() -> None:
    parser = argparse.ArgumentParser(prog="csvcut")
    parser.add_argument("file")
    args = parser.parse_args()
    with open(args.file, newline="") as f:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        for row in csv.reader(f):
            writer.writerow(row)


if __name__ == "__main__":
    main()
