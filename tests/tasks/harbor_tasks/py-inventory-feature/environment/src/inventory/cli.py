import argparse

from inventory.models import Item
from inventory.report import total_quantity


def load(path: str) -> list[Item]:
    items = []
    for line in open(path):
        parts = line.strip().split(",")
        if len(parts) >= 2:
            items.append(Item(parts[0], int(parts[1])))
    return items


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="inventory")
    parser.add_argument("file")
    args = parser.parse_args(argv)
    print(total_quantity(load(args.file)))


if __name__ == "__main__":
    main()
