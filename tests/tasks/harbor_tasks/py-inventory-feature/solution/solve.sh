#!/bin/bash
cd /app/src/inventory
cat > models.py <<'PY'
from dataclasses import dataclass


@dataclass
class Item:
    name: str
    quantity: int
    reorder_level: int = 0

    def is_low(self) -> bool:
        return self.quantity <= self.reorder_level
PY
cat >> report.py <<'PY'


def low_stock(items: list[Item]) -> list[str]:
    return sorted(i.name for i in items if i.is_low())
PY
python - <<'PY'
src = open("cli.py").read()
src = src.replace("from inventory.report import total_quantity",
                  "from inventory.report import low_stock, total_quantity")
src = src.replace("            items.append(Item(parts[0], int(parts[1])))",
                  "            level = int(parts[2]) if len(parts) > 2 else 0\n"
                  "            items.append(Item(parts[0], int(parts[1]), level))")
src = src.replace('    parser.add_argument("file")\n',
                  '    parser.add_argument("file")\n    parser.add_argument("--low", action="store_true")\n')
src = src.replace("    print(total_quantity(load(args.file)))",
                  "    items = load(args.file)\n"
                  "    if args.low:\n"
                  "        for name in low_stock(items):\n"
                  "            print(name)\n"
                  "    else:\n"
                  "        print(total_quantity(items))")
open("cli.py", "w").write(src)
PY
