from inventory.models import Item


def total_quantity(items: list[Item]) -> int:
    return sum(i.quantity for i in items)
